"""What each allocator call costs in simulated time: build a ``CostModel`` and call ``call_cost``.

A policy call's latency is computed from the *differences* of the device counters (and the stack's
GC-batch count) before and after the call, so it is O(1) and needs no log:

- no device call at all: ``pool_hit_ns`` for a malloc served from cache, ``free_request_ns`` for
  the program's free call, nothing for a free completion or an empty-cache call that did nothing;
- each cudaMalloc: ``malloc_base_ns + malloc_per_mib_ns * MiB``;
- each cudaFree: ``free_base_ns + free_per_mib_ns * MiB``, plus **one** device drain of
  ``device_sync_ns`` per call (after the first cudaFree in a call the device is idle, so later ones
  in the same call have nothing left to wait for). A call that did a cudaFree is a *device-wide
  synchronisation*: the engine freezes every other stream for the whole duration of that call;
- each page map (expandable segments): ``map_base_ns + map_per_mib_ns * MiB``; each unmap:
  ``unmap_base_ns + unmap_per_mib_ns * MiB``, plus one ``unmap_stream_sync_ns`` per call (PyTorch
  synchronises the segment's stream, not the device, before unmapping);
- each GC batch (deferred GC, ``garbage_collection_threshold``): ``gc_batch_ns`` of bookkeeping;
- each failed cudaMalloc or map (the device said out of memory): ``malloc_base_ns``.

Defaults and their sources (``../shared/research/papers.md`` §4.1, beside the repository). No modern (Ampere/Hopper)
per-size table of cudaMalloc/cudaFree latency has been published, so the device-call constants are
placeholders of the right order of magnitude until the GPU harness writes a calibration file:

- ``pool_hit_ns = 500``: a hit in a pool allocator's own cache, CUDA.jl PR #792 (~500 ns).
- ``free_request_ns = 300``: the host side of a free into a cache (CUDA.jl PR #746 measured 1.19 µs
  per free including its pool; the request alone is cheaper). Placeholder.
- ``malloc_base_ns = 10_000``: between CUDA.jl PR #792 (8-byte cudaMalloc 1.8 µs, modern driver)
  and the GT200 curve (~50 µs flat from 4 KB to 512 KB, cs.virginia.edu Barracuda10); Cytnx PR #850
  measured 14 µs for a whole malloc→launch→free round trip. Placeholder.
- ``malloc_per_mib_ns = 1_000``: the GT200 curve grows "significantly" above 512 KB (maximum cut
  off); 1 µs per MiB makes a 1 GiB cudaMalloc ~1 ms. UNCONFIRMED placeholder.
- ``free_base_ns = 5_000``, ``free_per_mib_ns = 500``: CUDA.jl PR #746 (1.19 µs per free, small);
  large frees unmap pages. Placeholders.
- ``device_sync_ns = 20_000``: "cudaFree synchronizes the entire device on each call" (RMM blog;
  CUDA Programming Guide §4.3.1; CuPy PR #2898: cudaFree syncs, cudaMalloc does not). How long the
  drain takes depends on the work in flight, which an allocation trace does not record; a
  workload-level knob.
- ``map_base_ns = 2_000``, ``map_per_mib_ns = 2_000``, ``unmap_base_ns = 2_000``,
  ``unmap_per_mib_ns = 1_000``, ``unmap_stream_sync_ns = 10_000``: cuMemCreate/cuMemMap/
  cuMemSetAccess per 2 MiB page and its inverse; no published figures. Placeholders.
- ``gc_batch_ns = 2_000``: host bookkeeping of one batched release. Placeholder.

Calibration file (``CostModel.save`` / ``CostModel.load``): one flat JSON object whose keys are the
field names above (``pool_hit_ns``, ``free_request_ns``, ``malloc_base_ns``, ``malloc_per_mib_ns``,
``free_base_ns``, ``free_per_mib_ns``, ``device_sync_ns``, ``map_base_ns``, ``map_per_mib_ns``,
``unmap_base_ns``, ``unmap_per_mib_ns``, ``unmap_stream_sync_ns``, ``gc_batch_ns``), each a
non-negative number of nanoseconds (per MiB for ``*_per_mib_ns``). Missing keys keep their
default; keys starting with ``_`` are free-form provenance (``_format``, ``_device``,
``_source``, ...) and are kept in ``CostModel.provenance``; any other key is an error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import os
from typing import Any, Callable, Mapping

from .jsonfile import load_json_file
from .units import MiB

FORMAT = "allocsim-cost-model/1"

#: Kinds of policy call the engine charges (``op`` argument of ``call_cost``).
OP_MALLOC, OP_FREE_REQUESTED, OP_FREE_COMPLETED, OP_OTHER = 1, 2, 3, 4

#: Order of the values in a ``snapshot``.
COUNTER_NAMES = ("n_mallocs", "malloc_bytes", "n_frees", "freed_bytes",
                 "n_maps", "map_bytes", "n_unmaps", "unmapped_bytes", "n_gc_batches", "n_failed_mallocs")


def stack_counter(policy: Any, name: str) -> int:
    """Sum counter ``name`` over a policy stack (each layer counts the events that happen in it)."""
    total = 0
    layer = policy
    while layer is not None and hasattr(layer, "upstream"):
        total += getattr(layer, name, 0)
        layer = layer.upstream
    return total


_DEVICE_COUNTERS = ("n_mallocs", "malloc_bytes", "n_frees", "freed_bytes",
                    "n_maps", "map_bytes", "n_unmaps", "unmapped_bytes")


def snapshotter(policy: Any) -> Callable[[], tuple[int, ...]]:
    """Return a zero-argument function giving ``snapshot(policy)`` cheaply (the engine calls it twice per event)."""
    dev = policy.device
    present = tuple(name for name in _DEVICE_COUNTERS if hasattr(dev, name))
    layers: list[Any] = []
    layer = policy
    while layer is not None and hasattr(layer, "upstream"):
        layers.append(layer)
        layer = layer.upstream
    failed = tuple(name for name in ("n_failed_mallocs", "n_failed_maps") if hasattr(dev, name))
    if present != _DEVICE_COUNTERS or len(layers) != 1 or failed != ("n_failed_mallocs", "n_failed_maps"):
        return lambda: snapshot(policy)
    device_counters = operator.attrgetter(*_DEVICE_COUNTERS)
    top = policy

    def take() -> tuple[int, ...]:
        return device_counters(dev) + (top.n_gc_batches, dev.n_failed_mallocs + dev.n_failed_maps)

    return take


def snapshot(policy: Any) -> tuple[int, ...]:
    """Return the counters ``call_cost`` diffs, in ``COUNTER_NAMES`` order (O(stack depth))."""
    dev = policy.device
    return (dev.n_mallocs, dev.malloc_bytes, dev.n_frees, dev.freed_bytes,
            getattr(dev, "n_maps", 0), getattr(dev, "map_bytes", 0),
            getattr(dev, "n_unmaps", 0), getattr(dev, "unmapped_bytes", 0),
            stack_counter(policy, "n_gc_batches"),
            getattr(dev, "n_failed_mallocs", 0) + getattr(dev, "n_failed_maps", 0))


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Latency constants in nanoseconds; every field can be overridden (see the module docstring)."""

    pool_hit_ns: float = 500
    free_request_ns: float = 300
    malloc_base_ns: float = 10_000
    malloc_per_mib_ns: float = 1_000
    free_base_ns: float = 5_000
    free_per_mib_ns: float = 500
    device_sync_ns: float = 20_000
    map_base_ns: float = 2_000
    map_per_mib_ns: float = 2_000
    unmap_base_ns: float = 2_000
    unmap_per_mib_ns: float = 1_000
    unmap_stream_sync_ns: float = 10_000
    gc_batch_ns: float = 2_000
    #: Free-form ``_key`` entries of the calibration file this model came from.
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in self.constant_names():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"cost model {name}: expected a number of ns, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost model {name}: must be finite and >= 0, got {value!r}")

    # ------------------------------------------------------------------ costs
    def call_cost(self, before: tuple[int, ...], after: tuple[int, ...], op: int = OP_MALLOC) -> tuple[int, bool]:
        """Return ``(latency_ns, syncs_device)`` of one call from two ``snapshot`` tuples."""
        d_mallocs = after[0] - before[0]
        d_frees = after[2] - before[2]
        d_maps = after[4] - before[4]
        d_unmaps = after[6] - before[6]
        d_gc = after[8] - before[8]
        d_failed = after[9] - before[9]
        if not (d_mallocs or d_frees or d_maps or d_unmaps or d_gc or d_failed):
            if op == OP_MALLOC:
                return round(self.pool_hit_ns), False
            if op == OP_FREE_REQUESTED:
                return round(self.free_request_ns), False
            return 0, False
        ns = 0.0
        if d_mallocs:
            ns += d_mallocs * self.malloc_base_ns + (after[1] - before[1]) * self.malloc_per_mib_ns / MiB
        if d_frees:
            ns += d_frees * self.free_base_ns + (after[3] - before[3]) * self.free_per_mib_ns / MiB
            ns += self.device_sync_ns
        if d_maps:
            ns += d_maps * self.map_base_ns + (after[5] - before[5]) * self.map_per_mib_ns / MiB
        if d_unmaps:
            ns += d_unmaps * self.unmap_base_ns + (after[7] - before[7]) * self.unmap_per_mib_ns / MiB
            ns += self.unmap_stream_sync_ns
        ns += d_gc * self.gc_batch_ns
        ns += d_failed * self.malloc_base_ns
        return round(ns), bool(d_frees)

    def cost_ns(self, before: tuple[int, ...], after: tuple[int, ...], op: int = OP_MALLOC) -> int:
        """Latency in ns of one call, from ``snapshot`` tuples taken before and after it."""
        return self.call_cost(before, after, op)[0]

    # ------------------------------------------------------------------ construction and files
    @classmethod
    def constant_names(cls) -> tuple[str, ...]:
        """Names of the overridable constants (the calibration file's keys)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "provenance")

    def to_dict(self) -> dict[str, Any]:
        """The constants as a JSON-ready dict (ints where the value is whole)."""
        out: dict[str, Any] = {}
        for name in self.constant_names():
            value = getattr(self, name)
            out[name] = int(value) if float(value).is_integer() else float(value)
        return out

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None = None, *,
                       base: "CostModel | None" = None) -> "CostModel":
        """Return ``base`` (default: the defaults) with ``overrides`` applied; unknown keys raise ``ValueError``."""
        base = base or cls()
        overrides = dict(overrides or {})
        provenance = dict(base.provenance)
        for key in [k for k in overrides if k.startswith("_")]:
            provenance[key] = overrides.pop(key)
        unknown = sorted(set(overrides) - set(cls.constant_names()))
        if unknown:
            raise ValueError(f"unknown cost model keys {unknown}; known: {', '.join(cls.constant_names())}")
        values = {}
        for key, value in overrides.items():
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError(f"cost model {key}: not a number: {value!r}") from None
            values[key] = value
        return dataclasses.replace(base, provenance=provenance, **values)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CostModel":
        """Read a calibration file written by ``save`` (or by the GPU harness); see the module docstring."""
        data = load_json_file(path, f"{os.fspath(path)}: cannot read cost model")
        if not isinstance(data, dict):
            raise ValueError(f"{os.fspath(path)}: cost model must be a JSON object")
        try:
            return cls.from_overrides(data)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)}: {exc}") from None

    def save(self, path: str | os.PathLike, option: str = "-o") -> None:
        """Write the constants (and provenance) as one flat JSON object: ``"_format"`` first (allocsim's
        mark, ``output_marks.is_cost_model_file``), then the keys sorted; an existing file is replaced
        only if it is such a cost model (``output_write.open_output``; ValueError otherwise)."""
        from .output_file import open_output
        from .output_marks import is_cost_model_file

        data: dict[str, Any] = {k: v for k, v in self.provenance.items() if k != "_format"}
        data.update(self.to_dict())
        text = json.dumps({"_format": FORMAT, **dict(sorted(data.items()))}, indent=2) + "\n"
        with open_output(path, ours=is_cost_model_file, what="a cost model allocsim wrote", option=option,
                         text=True) as fh:
            fh.write(text)
