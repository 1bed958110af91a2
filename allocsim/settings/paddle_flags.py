"""PaddlePaddle's allocator settings in Paddle's own words: ``parse_flags("FLAGS_allocator_strategy=naive_best_fit")``.

Paddle users set ``FLAGS_*`` environment variables (or ``paddle.set_flags``); this module reads
the allocator ones and maps each onto the ``paddle`` presets (``paddle``, ``paddle-naive``, and
``deferred-gc`` over them). Every flag Paddle's memory code reads is either modelled or refused with
one line saying why; a name Paddle does not define is refused with the nearest known one.

Where each default and rule comes from (PaddlePaddle/Paddle sources; see also the research notes
``paddle_cupy.md`` §1-2):

* ``FLAGS_allocator_strategy`` = ``auto_growth`` (``paddle/common/flags.cc``,
  ``kDefaultAllocatorStrategy``; the values are checked by ``GetAllocatorStrategy`` in
  ``paddle/phi/core/memory/allocation/allocator_strategy.cc``): ``auto_growth`` -> ``paddle``,
  ``naive_best_fit`` -> ``paddle-naive``; ``thread_local`` is refused (not modelled).
* ``FLAGS_auto_growth_chunk_size_in_mb`` = 0 (``flags.cc``; used by
  ``AllocatorFacadePrivate::InitAutoGrowthCUDAAllocator`` in ``allocator_facade.cc`` as
  ``chunk_size = FLAGS_auto_growth_chunk_size_in_mb << 20``) -> ``paddle`` ``chunk_size``.
* ``FLAGS_fraction_of_gpu_memory_to_use`` = 0.92 on Linux, ``FLAGS_initial_gpu_memory_in_mb`` = 0,
  ``FLAGS_reallocate_gpu_memory_in_mb`` = 0 (``flags.cc``; read by ``GpuAllocSize`` in
  ``paddle/phi/core/platform/device/gpu/gpu_info.cc`` for ``naive_best_fit_allocator.cc``'s
  ``BuddyAllocator``) -> ``paddle-naive``'s parameters of the same names. Under ``auto_growth``
  Paddle never reads them: they are accepted and change nothing (``ignored`` lists them).
* ``FLAGS_gpu_memory_limit_mb`` = 0, no limit (``flags.cc``; enforced by
  ``RecordedGpuMallocHelper::Malloc`` in ``gpu_info.cc``: a cap on cudaMalloc'd bytes) -> the
  device capacity (``limit_bytes``; with ``--capacity`` too, the smaller one).
* ``FLAGS_free_idle_chunk`` = false, ``FLAGS_free_when_no_cache_hit`` = false (defined in
  ``auto_growth_best_fit_allocator.cc``; ``AutoGrowthBestFitAllocator::FreeImpl`` /
  ``AllocateImpl``) -> ``paddle``'s flags of the same names.
* ``FLAGS_use_stream_safe_cuda_allocator`` = true (``allocator_facade.cc``,
  ``WrapStreamSafeCUDAAllocatorForDefault``): per-stream pools -> ``paddle`` ``stream_safe``.
* ``FLAGS_eager_delete_tensor_gb`` = 0.0 (``flags.cc``, ``kDefaultEagerDeleteTensorGB``; the
  threshold is ``GetEagerDeletionThreshold`` = ``int64(gb * 2**30)`` in
  ``paddle/fluid/framework/garbage_collector.cc``): 0 frees at once (the preset alone), > 0
  batches frees (``GarbageCollector::Add``) -> ``deferred-gc`` with that ``threshold`` over the
  strategy's preset; < 0 (no GC) is refused: tensors then live until their scope ends, which a
  trace does not record.
* ``FLAGS_fast_eager_deletion_mode`` = true (``flags.cc``; ``CreateGarbageCollector`` picks
  ``UnsafeFastGPUGarbageCollector``: frees reach the allocator at once, as a replay has them);
  false (``DefaultStreamGarbageCollector``: frees wait for the stream's kernels) is refused.
* ``FLAGS_memory_fraction_of_eager_deletion`` = 1.0 (``flags.cc``; only ParallelExecutor's
  ``ShrinkGCVars`` reads it): other values are refused (they pick variables by size, which a
  trace does not name).
* ``FLAGS_use_virtual_memory_auto_growth`` = false (``allocator_facade.cc``): true selects
  ``VirtualMemoryAutoGrowthBestFitAllocator``, which no preset models: refused.

The static-graph executors run the eager-deletion GC; dygraph programs free tensors by reference
count, so ``FLAGS_eager_delete_tensor_gb`` reproduces what it does to a static-graph run.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..units import GiB, MiB
from .values import LARGEST_SETTING_BYTES, LARGEST_WHY, finite_number, whole_number

PREFIX = "FLAGS_"
STRATEGIES = {"auto_growth": "paddle", "naive_best_fit": "paddle-naive"}


@dataclass(frozen=True)
class PaddleFlags:
    """Parsed flags: the policy they select, its parameters (registry names), and the device limit."""

    policy: str                                    #: "paddle", "paddle-naive" or "deferred-gc"
    params: dict[str, Any] = field(default_factory=dict)
    text: str = ""                                 #: the flags as given, canonical (``FLAGS_a=v,...``)
    limit_bytes: int | None = None                 #: FLAGS_gpu_memory_limit_mb (None: no limit)
    ignored: tuple[str, ...] = ()                  #: flags Paddle accepts but never reads under this strategy


# ----------------------------------------------------------------------------- value readers (gflags)
def _bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "t", "yes", "y"):
        return True
    if low in ("false", "0", "f", "no", "n"):
        return False
    raise ValueError(f"{name} takes true or false, got {text!r}")


def _uint_mb(name: str, text: str) -> int:
    return whole_number(name, text, high=LARGEST_SETTING_BYTES // MiB, unit="MB (MiB)", why=LARGEST_WHY)


def _fraction(name: str, text: str) -> float:
    """FLAGS_fraction_of_gpu_memory_to_use: a share of free memory, in (0, 1]."""
    return finite_number(name, text, low=0.0, high=1.0, low_open=True)


def _gb(name: str, text: str) -> float:
    """FLAGS_eager_delete_tensor_gb: GB (GiB) up to 1 PiB; negative values are read (and refused later)."""
    return finite_number(name, text, high=LARGEST_SETTING_BYTES // GiB, why=LARGEST_WHY)


def _share(name: str, text: str) -> float:
    return finite_number(name, text, low=0.0, high=1.0)


@dataclass(frozen=True)
class Flag:
    """One allocator flag Paddle defines: its default, how to read it, or why it is refused."""

    name: str
    default: Any = None
    read: Callable[[str, str], Any] | None = None
    refused: str = ""


_MODELLED = (
    Flag("FLAGS_allocator_strategy", "auto_growth", lambda n, t: t.strip()),
    Flag("FLAGS_auto_growth_chunk_size_in_mb", 0, _uint_mb),
    Flag("FLAGS_fraction_of_gpu_memory_to_use", 0.92, _fraction),
    Flag("FLAGS_initial_gpu_memory_in_mb", 0, _uint_mb),
    Flag("FLAGS_reallocate_gpu_memory_in_mb", 0, _uint_mb),
    Flag("FLAGS_gpu_memory_limit_mb", 0, _uint_mb),
    Flag("FLAGS_free_idle_chunk", False, _bool),
    Flag("FLAGS_free_when_no_cache_hit", False, _bool),
    Flag("FLAGS_use_stream_safe_cuda_allocator", True, _bool),
    Flag("FLAGS_eager_delete_tensor_gb", 0.0, _gb),
    Flag("FLAGS_fast_eager_deletion_mode", True, _bool),
    Flag("FLAGS_memory_fraction_of_eager_deletion", 1.0, _share),
    Flag("FLAGS_use_virtual_memory_auto_growth", False, _bool),
)
_HOST = "concerns host (CPU or pinned) memory, which the paddle presets do not simulate"
_REFUSED = (
    Flag("FLAGS_use_cuda_malloc_async_allocator", refused="selects CUDAMallocAsyncAllocator: say --policy cuda-async"),
    Flag("FLAGS_cuda_memory_async_pool_release_threshold", refused="tunes CUDAMallocAsyncAllocator: say --policy "
         "cuda-async --set release_threshold=..."),
    Flag("FLAGS_cuda_malloc_async_pool_memory_throttle_ratio", refused="tunes CUDAMallocAsyncAllocator's "
         "throttling, which the cuda-async preset does not model"),
    Flag("FLAGS_gpu_allocator_retry_time", refused="sets how long a failed allocation waits for frees from other "
         "threads; a replay has no other threads, so the wait frees nothing"),
    Flag("FLAGS_use_system_allocator", refused="bypasses every pool (unit tests only): say --policy direct"),
    Flag("FLAGS_use_auto_growth_v2", refused="selects AutoGrowthBestFitAllocatorV2, which no preset models"),
    Flag("FLAGS_use_multi_scale_virtual_memory_auto_growth", refused="selects a virtual-memory allocator no preset "
         "models"),
    Flag("FLAGS_use_cuda_managed_memory", refused="allocates CUDA managed (unified) memory, which allocsim does not "
         "simulate"),
    Flag("FLAGS_small_pool_size_in_mb", refused="splits the auto_growth pool into small and large pools, which the "
         "paddle preset does not model"),
    Flag("FLAGS_alignment_size", refused="changes the per-stream alignment: say --set alignment=SIZE"),
    Flag("FLAGS_initial_cpu_memory_in_mb", refused=_HOST),
    Flag("FLAGS_fraction_of_cpu_memory_to_use", refused=_HOST),
    Flag("FLAGS_fraction_of_cuda_pinned_memory_to_use", refused=_HOST),
    Flag("FLAGS_use_auto_growth_pinned_allocator", refused=_HOST),
    Flag("FLAGS_eager_delete_scope", refused="deletes executor scopes, not tensors: a trace does not record scopes"),
)
#: Every allocator flag Paddle defines -> how allocsim treats it.
FLAGS: dict[str, Flag] = {flag.name: flag for flag in (*_MODELLED, *_REFUSED)}
#: Flags that act only under naive_best_fit (Paddle accepts them under auto_growth and never reads them).
NAIVE_ONLY = ("FLAGS_fraction_of_gpu_memory_to_use", "FLAGS_initial_gpu_memory_in_mb",
              "FLAGS_reallocate_gpu_memory_in_mb")
AUTO_GROWTH_ONLY = ("FLAGS_auto_growth_chunk_size_in_mb", "FLAGS_free_idle_chunk", "FLAGS_free_when_no_cache_hit",
                    "FLAGS_use_stream_safe_cuda_allocator")


def _canonical(name: str) -> str:
    name = name.strip()
    return name if name.startswith(PREFIX) else PREFIX + name


def unknown_flag_message(name: str, where: str) -> str:
    """One line for a flag Paddle's allocator does not read, with the nearest known flag."""
    close = difflib.get_close_matches(name, list(FLAGS), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{where}: {name} is not one of Paddle's allocator flags{hint} (see docs/paddle.md)"


def split_items(text: str, where: str) -> list[tuple[str, str]]:
    """``FLAGS_a=1,FLAGS_b=x`` (commas or whitespace between items) -> [(name, value)]."""
    items = []
    for part in text.replace(",", " ").split():
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise ValueError(f"{where}: expected FLAGS_NAME=VALUE, got {part!r}")
        items.append((_canonical(name), value.strip()))
    if not items:
        raise ValueError(f"{where}: no flags given")
    return items


def flags_from_items(items: list[tuple[str, str]], where: str) -> PaddleFlags:
    """Read (name, value) pairs; ``ValueError`` (one line naming ``where``) for a flag Paddle would refuse or
    allocsim does not model. A flag given twice keeps its last value, as with environment variables."""
    values: dict[str, Any] = {}
    for name, text in items:
        flag = FLAGS.get(name)
        if flag is None:
            raise ValueError(unknown_flag_message(name, where))
        if flag.refused:
            raise ValueError(f"{where}: {name} is not modelled: it {flag.refused}")
        try:
            values[name] = flag.read(name, text)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return _to_policy(values, where, items)


def _to_policy(values: dict[str, Any], where: str, items: list[tuple[str, str]]) -> PaddleFlags:
    get = lambda name: values.get(name, FLAGS[name].default)
    strategy = get("FLAGS_allocator_strategy")
    if strategy not in STRATEGIES:
        known = ", ".join(STRATEGIES)
        why = ("thread_local is Paddle's strategy but no preset models it" if strategy == "thread_local"
               else "Paddle knows naive_best_fit, auto_growth, thread_local")
        raise ValueError(f"{where}: FLAGS_allocator_strategy={strategy}: {why}; modelled: {known}")
    policy = STRATEGIES[strategy]
    if get("FLAGS_use_virtual_memory_auto_growth"):
        raise ValueError(f"{where}: FLAGS_use_virtual_memory_auto_growth=true selects "
                         "VirtualMemoryAutoGrowthBestFitAllocator, which no preset models")
    if not get("FLAGS_fast_eager_deletion_mode"):
        raise ValueError(f"{where}: FLAGS_fast_eager_deletion_mode=false frees after the stream's kernels "
                         "(DefaultStreamGarbageCollector); a trace records no kernel times, so it is not modelled")
    if get("FLAGS_memory_fraction_of_eager_deletion") != 1.0:
        raise ValueError(f"{where}: FLAGS_memory_fraction_of_eager_deletion below 1.0 picks variables by size "
                         "(ParallelExecutor only); a trace does not name variables, so it is not modelled")
    gb = get("FLAGS_eager_delete_tensor_gb")
    if gb < 0:
        raise ValueError(f"{where}: FLAGS_eager_delete_tensor_gb={gb:g} disables the garbage collector: tensors "
                         "then live until their scope ends, which a trace does not record")
    fraction = get("FLAGS_fraction_of_gpu_memory_to_use")
    params: dict[str, Any] = {}
    ignored = tuple(n for n in values if n in (NAIVE_ONLY if policy == "paddle" else AUTO_GROWTH_ONLY))
    if policy == "paddle":
        params["chunk_size"] = get("FLAGS_auto_growth_chunk_size_in_mb") * MiB
        params["free_idle_chunk"] = get("FLAGS_free_idle_chunk")
        params["free_when_no_cache_hit"] = get("FLAGS_free_when_no_cache_hit")
        params["stream_safe"] = get("FLAGS_use_stream_safe_cuda_allocator")
    else:
        params["fraction_of_gpu_memory_to_use"] = fraction
        params["initial_gpu_memory"] = get("FLAGS_initial_gpu_memory_in_mb") * MiB
        params["reallocate_gpu_memory"] = get("FLAGS_reallocate_gpu_memory_in_mb") * MiB
    # Only flags that were given become parameters, so --set and defaults stay in charge of the rest.
    given = {_PARAM_OF.get(n) for n in values}
    params = {k: v for k, v in params.items() if k in given}
    threshold = int(gb * GiB)       # GetEagerDeletionThreshold: int64(gb * (1 << 30))
    if threshold > 0:
        params = {"inner": policy, "threshold": threshold, **params}
        policy = "deferred-gc"
    limit_mb = get("FLAGS_gpu_memory_limit_mb")
    text = ",".join(f"{name}={value}" for name, value in dict(items).items())
    return PaddleFlags(policy, params, text, limit_mb * MiB if limit_mb else None, ignored)


_PARAM_OF = {
    "FLAGS_auto_growth_chunk_size_in_mb": "chunk_size", "FLAGS_free_idle_chunk": "free_idle_chunk",
    "FLAGS_free_when_no_cache_hit": "free_when_no_cache_hit", "FLAGS_use_stream_safe_cuda_allocator": "stream_safe",
    "FLAGS_fraction_of_gpu_memory_to_use": "fraction_of_gpu_memory_to_use",
    "FLAGS_initial_gpu_memory_in_mb": "initial_gpu_memory", "FLAGS_reallocate_gpu_memory_in_mb": "reallocate_gpu_memory",
}


def parse_flags(text: str, *, where: str = "--flags") -> PaddleFlags:
    """Read ``FLAGS_a=v,FLAGS_b=v``; ``ValueError`` (one line, naming ``where``) if Paddle would refuse it
    or allocsim does not model a flag."""
    return flags_from_items(split_items(text, where), where)


def env_flags(environ: Mapping[str, str] | None = None) -> PaddleFlags | None:
    """The allocator ``FLAGS_*`` environment variables, parsed; None when none is set.

    Other ``FLAGS_*`` variables (cuDNN, NCCL, executor flags) are Paddle's but not the allocator's:
    they are left alone, as they change nothing allocsim simulates.
    """
    env = os.environ if environ is None else environ
    items = [(name, value) for name, value in sorted(env.items()) if name in FLAGS]
    return flags_from_items(items, "environment") if items else None


# ----------------------------------------------------------------------------- back to Paddle's words
def format_flags(policy: str, params: Mapping[str, Any]) -> list[str] | None:
    """``FLAGS_name=value`` strings for a ``paddle`` / ``paddle-naive`` / ``deferred-gc`` preset's
    non-default parameters; None if one cannot be said in Paddle's flags."""
    out: list[str] = []
    inner = policy
    if policy == "deferred-gc":
        inner = str(params.get("inner", "paddle"))
        threshold = int(params.get("threshold_bytes", params.get("threshold", 0)) or 0)
        if threshold:
            gb = threshold / GiB
            if int(gb * GiB) != threshold:
                return None
            out.append(f"FLAGS_eager_delete_tensor_gb={gb:g}")
    if inner not in STRATEGIES.values():
        return None
    strategy = next(k for k, v in STRATEGIES.items() if v == inner)
    if inner != "paddle":
        out.insert(0, f"FLAGS_allocator_strategy={strategy}")
    for key, value in params.items():
        name = key[:-len("_bytes")] if key.endswith("_bytes") else key
        if name in ("inner", "threshold"):
            continue
        if name in ("chunk_size", "initial_gpu_memory", "reallocate_gpu_memory"):
            if value % MiB:
                return None
            flag = {"chunk_size": "FLAGS_auto_growth_chunk_size_in_mb",
                    "initial_gpu_memory": "FLAGS_initial_gpu_memory_in_mb",
                    "reallocate_gpu_memory": "FLAGS_reallocate_gpu_memory_in_mb"}[name]
            out.append(f"{flag}={value // MiB}")
        elif name in ("free_idle_chunk", "free_when_no_cache_hit"):
            out.append(f"FLAGS_{name}={str(bool(value)).lower()}")
        elif name == "stream_safe":
            out.append(f"FLAGS_use_stream_safe_cuda_allocator={str(bool(value)).lower()}")
        elif name == "fraction_of_gpu_memory_to_use":
            out.append(f"FLAGS_fraction_of_gpu_memory_to_use={value:g}")
        else:
            return None
    return out
