"""Find and build policies by name: ``build_policy("pytorch", device=dev, params={"max_split_size": "256MiB"})``.

Each policy lists its parameters as ``ParamSpec``s. Values may be typed or strings from the
command line: unit ``"bytes"`` goes through ``parse_bytes`` (``"256MiB"``; ``"unlimited"`` /
``"none"`` / ``-1`` where the default is None), ``"fraction"`` through ``float``, ``"bool"``
accepts true/false/yes/no/on/off/1/0. A bytes parameter ``x`` is the constructor's ``x_bytes``
and may also be given under that name.

``deferred-gc`` wraps another policy: ``inner`` names it (default ``paddle``, because
``FLAGS_eager_delete_tensor_gb`` is PaddlePaddle's GC and sits over Paddle's allocator),
``threshold`` is the batch size in bytes, and every other parameter goes to the inner policy.
For ``pytorch`` a trace's ``allocator_settings`` set the defaults and explicit ``params`` win;
other policies ignore ``allocator_settings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import math

from .adaptors import DeferredGC
from ..errors import quote
from ..units import MiB, parse_bytes
from ..settings.values import finite_number, size_in_range, whole_number
from ..settings.divisions import parse_roundup_power2_divisions
from ..settings.recorded import allocator_settings_to_kwargs
from .base import Policy
from .cuda_async import CudaAsyncPolicy
from .cupy import CuPyPolicy
from .direct import DirectPolicy
from .paddle import PaddlePolicy
from .paddle_naive import PaddleNaivePolicy
from .pool import PoolPolicy
from .pytorch import PyTorchPolicy
from .stream_bound import StreamBoundPolicy


@dataclass(frozen=True)
class ParamSpec:
    """One knob of a policy: its name, default, unit (``bytes``, ``fraction``, ``bool`` or ``""``), doc and type."""

    name: str
    default: Any
    unit: str
    doc: str
    type: type


@dataclass(frozen=True)
class PolicySpec:
    """A registered policy: its name, a one-line description and its parameters."""

    name: str
    description: str
    params: tuple[ParamSpec, ...]


def _bytes(name: str, default: int | None, doc: str) -> ParamSpec:
    return ParamSpec(name, default, "bytes", doc, int)


def _flag(name: str, doc: str, default: bool = False) -> ParamSpec:
    return ParamSpec(name, default, "bool", doc, bool)


_POOL_PARAMS = (
    _bytes("alignment", 512, "requests round up to a multiple of this"),
    ParamSpec("growth", "exact", "", "new segment size: exact | chunk (max(request, chunk)) | round "
              "(up to a multiple of chunk) | pytorch (get_allocation_size, small/large pools)", str),
    _bytes("chunk", 2 * MiB, "chunk size for growth=chunk or rounding step for growth=round"),
    _bytes("min_split_remainder", 512, "split a block only if at least this much is left over"),
)

_SPECS: dict[str, tuple[type, PolicySpec]] = {}


def _register(cls: type, description: str, *params: ParamSpec) -> None:
    _SPECS[cls.name] = (cls, PolicySpec(cls.name, description, tuple(params)))


_register(DirectPolicy, "no cache: every request is a cudaMalloc, every completed free a cudaFree")
_register(PoolPolicy, "generic best-fit pool: rounding, split, coalescing, growth rule, release + retry on OOM",
          *_POOL_PARAMS,
          _bytes("small_pool_max", None, "requests up to this use a separate small pool (none = one pool; "
                                         "growth=pytorch implies 1 MiB)"),
          _flag("stream_bound", "free blocks are reused only by the stream that allocated their segment"),
          _flag("carve_from_high_end", "hand out the top of a free block (Paddle) instead of the bottom"),
          ParamSpec("oom_release", "all", "", "released before retrying a failed cudaMalloc: all | "
                    "stream-then-all | none", str))
_register(StreamBoundPolicy, "per-stream pools: frees go back to the allocating stream; reports stranded bytes",
          *_POOL_PARAMS,
          _flag("cross_stream_reuse", "on a miss, reuse blocks other streams freed (completed frees only)"),
          ParamSpec("oom_release", "all", "", "released before retrying a failed cudaMalloc: all | "
                    "stream-then-all | none", str))
_register(DeferredGC, "PaddlePaddle eager-deletion GC over another policy: completed frees are batched",
          ParamSpec("inner", "paddle", "", "the wrapped policy (its parameters may be set too)", str),
          _bytes("threshold", 0, "free the queued blocks once they add up to this (0 = free at once); "
                                 "FLAGS_eager_delete_tensor_gb"))
_register(PyTorchPolicy, "PyTorch CUDACachingAllocator (native backend), rule for rule",
          _bytes("max_split_size", None, "blocks this large are never split (none = unlimited; "
                                         "max_split_size_mb)"),
          _bytes("max_non_split_rounding", 20 * MiB, "an oversize request may take a cached block at most "
                                                     "this much larger (max_non_split_rounding_mb)"),
          ParamSpec("roundup_power2_divisions", None, "", "power-of-two rounding: one int, or "
                    "[256:1,512:2,>:8] as in PYTORCH_CUDA_ALLOC_CONF (none = off)", str),
          ParamSpec("garbage_collection_threshold", 0.0, "fraction", "free old cached blocks above this "
                    "share of the allowed memory (acts only with memory_fraction)", float),
          ParamSpec("memory_fraction", None, "fraction", "set_per_process_memory_fraction: cap reserved "
                    "memory at this share of the device capacity (none = no cap)", float),
          _flag("expandable_segments", "one growing segment per stream and pool, mapped in 2/20 MiB pages"),
          _flag("record_decisions", "keep every segment alloc/free/map/unmap in policy.decisions"))
_register(PaddlePolicy, "PaddlePaddle auto_growth best fit: 256 B alignment, per-stream pools, high-end carving",
          _bytes("chunk_size", 0, "a miss allocates max(request, this) (FLAGS_auto_growth_chunk_size_in_mb)"),
          _bytes("alignment", 256, "requests round up to a multiple of this (GpuMinChunkSize)"),
          _flag("free_idle_chunk", "return wholly free chunks after every free (FLAGS_free_idle_chunk)"),
          _flag("free_when_no_cache_hit", "return idle chunks before every cudaMalloc "
                                          "(FLAGS_free_when_no_cache_hit)"),
          _flag("stream_safe", "one pool per stream (FLAGS_use_stream_safe_cuda_allocator); false: one pool for "
                               "all streams", default=True))
_register(PaddleNaivePolicy, "PaddlePaddle naive_best_fit: refill chunks of a fraction of free GPU memory",
          ParamSpec("fraction_of_gpu_memory_to_use", 0.92, "fraction", "each refill takes this share of "
                    "free memory (minus 5 %)", float),
          _bytes("initial_gpu_memory", 0, "first chunk size instead of the fraction (0 = use the fraction)"),
          _bytes("reallocate_gpu_memory", 0, "later chunk size instead of the fraction (0 = use the fraction)"),
          _bytes("gpu_memory", None, "device memory to assume when the device has no capacity (none = 80 GiB)"),
          _bytes("block_header", 64, "bytes of block header added to each request"))
_register(CuPyPolicy, "CuPy MemoryPool: 512 B units, per-stream arenas, free_all_blocks and retry on OOM",
          _bytes("limit", 0, "cap on the pool's cudaMalloc'd bytes, set_limit (0 = none)"))
_register(CudaAsyncPolicy, "cudaMallocAsync pool: memory above the release threshold returns at each sync",
          _bytes("release_threshold", 0, "bytes the pool keeps at a sync (cudaMemPoolAttrReleaseThreshold)"),
          _bytes("alignment", 512, "requests round up to a multiple of this"),
          _bytes("growth_granularity", 32 * MiB, "the pool grows in multiples of this"))

_INT64_MAX = (1 << 63) - 1
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}
_NONE = {"none", "unlimited", "null", "-1", "inf", "off", ""}
_CUSTOM: dict[str, Callable[[Any], Any]] = {"roundup_power2_divisions": parse_roundup_power2_divisions}


def policy_specs() -> list[PolicySpec]:
    """Return every registered policy with its parameters, in registration order."""
    return [spec for _cls, spec in _SPECS.values()]


def accepted_params(name: str, params: Mapping[str, Any] | None = None) -> tuple[ParamSpec, ...]:
    """Return every parameter ``build_policy(name, params=...)`` accepts: for ``deferred-gc`` its own plus its inner's.

    The inner policy is ``params["inner"]`` (default ``paddle``), so a CLI can validate
    ``--set inner=pytorch --set max_split_size=256MiB`` before building anything.
    """
    cls, spec = _spec(name)
    if cls is not DeferredGC:
        return spec.params
    inner = str((params or {}).get("inner", "paddle"))
    if inner == DeferredGC.name:
        raise ValueError("deferred-gc cannot wrap itself")
    return spec.params + _spec(inner)[1].params


def parse_param(spec: ParamSpec, value: Any) -> Any:
    """Turn a typed or string value into what the constructor takes; raise ValueError naming the parameter.

    Numbers go through the settings' one number syntax (``settings.values``: ASCII digits, finite):
    sizes up to 1 PiB here; each policy checks its own narrower ranges (fractions) in its allocator's words.
    """
    try:
        if spec.name in _CUSTOM:
            return _CUSTOM[spec.name](value)
        text = value.strip().lower() if isinstance(value, str) else None
        if spec.default is None and (value is None or text in _NONE
                                     or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                         and value < 0)):
            return None
        if spec.unit == "bytes":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool):
                raise ValueError("a size cannot be a bool")
            size = parse_bytes(value)
            return size_in_range(spec.name, size, quote(value) if isinstance(value, str) else f"{size:,}")
        if spec.type is bool:
            if isinstance(value, bool):
                return value
            if text is not None and text in _TRUE | _FALSE:
                return text in _TRUE
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError("expected true or false")
        if spec.type is float:        # each policy checks its fraction's range, in its allocator's words
            if isinstance(value, str):
                return finite_number(spec.name, value)
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"{spec.name} takes a finite number, got {number}")
            return number
        if spec.type is int:
            return whole_number(spec.name, value, high=_INT64_MAX) if isinstance(value, str) else int(value)
        return str(value)
    except (TypeError, ValueError, OverflowError) as exc:
        said = str(exc)
        if said.startswith(spec.name + " ") or said.startswith(spec.name + ":"):
            said = said[len(spec.name):].lstrip(": ")        # the shared parsers name it already
        raise ValueError(f"parameter {spec.name}={quote(value)}: {said}") from None


def _kwarg_name(spec: ParamSpec) -> str:
    return spec.name + "_bytes" if spec.unit == "bytes" else spec.name


def _lookup(policy: PolicySpec) -> dict[str, ParamSpec]:
    table = {spec.name: spec for spec in policy.params}
    table.update({_kwarg_name(spec): spec for spec in policy.params})
    return table


def _spec(name: str) -> tuple[type, PolicySpec]:
    if name not in _SPECS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(_SPECS)}")
    return _SPECS[name]


def _check_keys(policy: PolicySpec, keys: list[str], extra: tuple[ParamSpec, ...] = ()) -> None:
    valid = _lookup(policy)
    valid.update({spec.name: spec for spec in extra})
    unknown = [key for key in keys if key not in valid]
    if unknown:
        from ..settings.alloc_conf import setting_hint

        names = [spec.name for spec in (*extra, *policy.params)]
        hints = "".join(f"; {hint}" for hint in map(setting_hint, unknown) if hint)
        raise ValueError(f"unknown parameter(s) {', '.join(map(repr, unknown))} for policy {policy.name!r}; "
                         f"valid: {', '.join(names) if names else '(none)'}{hints}")


def build_policy(name: str, *, device: Any, params: Mapping[str, Any] | None = None,
                 allocator_settings: Mapping[str, Any] | None = None) -> Policy:
    """Build the policy ``name`` over ``device``; unknown names or parameters raise ValueError listing the valid ones."""
    cls, spec = _spec(name)
    params = dict(params or {})
    if cls is DeferredGC:
        lookup = _lookup(spec)
        inner_name = parse_param(lookup["inner"], params.pop("inner", "paddle"))
        threshold = parse_param(lookup["threshold"], params.pop("threshold", params.pop("threshold_bytes", 0)))
        if inner_name == DeferredGC.name:
            raise ValueError("deferred-gc cannot wrap itself")
        _check_keys(_spec(inner_name)[1], list(params), extra=spec.params)
        inner = build_policy(inner_name, device=device, params=params, allocator_settings=allocator_settings)
        return DeferredGC(inner, threshold_bytes=threshold)
    _check_keys(spec, list(params))
    kwargs: dict[str, Any] = {}
    if cls is PyTorchPolicy:
        kwargs.update(allocator_settings_to_kwargs(allocator_settings))
    lookup = _lookup(spec)
    for key, value in params.items():
        param = lookup[key]
        kwargs[_kwarg_name(param)] = parse_param(param, value)
    return cls(device, **kwargs)
