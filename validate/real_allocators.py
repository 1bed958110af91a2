"""The real allocators on the same trace, each against the preset that models it (GPU only).

| name | what runs | preset |
|---|---|---|
| ``cupy-pool`` | ``cupy.cuda.MemoryPool().malloc(size)`` under the trace stream's ``cupy.cuda.Stream`` | ``cupy`` |
| ``cupy-async`` | ``cupy.cuda.MemoryAsyncPool().malloc(size)`` (cudaMallocAsync), stream synchronised after each completed free | ``cuda-async`` |
| ``torch`` | ``torch.empty(size, dtype=torch.uint8, device='cuda')`` under the trace stream's ``torch.cuda.Stream`` | ``pytorch`` |

The replay loop is ``validate.replay.drive``, the same as for the policies: each allocation keeps
its handle (``MemoryPointer`` / tensor) until its ``FREE_COMPLETED`` event, when the handle is
dropped; ``EMPTY_CACHE`` calls ``free_all_blocks()`` / ``torch.cuda.empty_cache()``. Memory is
measured two ways, both sampled outside the timed calls: ``cudaMemGetInfo``'s drop since the start
(``measured_peak_bytes``, what the driver really reserved) and the allocator's own accounting
(``measured_pool_peak_bytes``: ``total_bytes()`` / ``max_memory_reserved()``), which is compared with
the preset's own accounting (segment bytes before device rounding).

``cupy-async``: the preset treats every completed free as a synchronisation point (where the
driver returns memory above the release threshold, 0 by default); the replay synchronises the
freeing stream after each completed free (untimed) so the real pool sees the same syncs.
PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` once, at its first CUDA allocation; a trace's recorded
``allocator_settings`` apply to the preset but not to the real allocator unless that variable was
set before the process started.
"""

from __future__ import annotations

import time
from typing import Any

from allocsim.cost import CostModel
from allocsim.errors import OutOfMemory
from allocsim.trace.schema import Trace

from .devices import GpuUnavailable
from .replay import (
    ALLOC,
    FREE_COMPLETED,
    ReplayOptions,
    compare,
    cost_model_for_policy,
    drive,
    error_pct,
    explain,
    footprint_rule,
    is_calibrated,
    latency_stats,
    predict,
    scale_time,
)

REAL_ALLOCATORS = {"cupy-pool": "cupy", "cupy-async": "cuda-async", "torch": "pytorch"}
_perf_ns = time.perf_counter_ns


class _Meter:
    """cudaMemGetInfo drop and the allocator's own bytes, sampled outside the timed calls."""

    def __init__(self, mem_get_info, pool_bytes):
        self._mem_get_info = mem_get_info
        self._pool_bytes = pool_bytes
        self.baseline_free = int(mem_get_info()[0])
        self.peak_measured = 0
        self.peak_pool = 0
        self.last_pool = -1
        self.overhead_ns = 0
        self.samples = 0

    def sample(self, force: bool = False) -> None:
        t0 = _perf_ns()
        pool = int(self._pool_bytes())
        if pool > self.peak_pool:
            self.peak_pool = pool
        if force or pool != self.last_pool:
            self.last_pool = pool
            used = self.baseline_free - int(self._mem_get_info()[0])
            if used > self.peak_measured:
                self.peak_measured = used
            self.samples += 1
        self.overhead_ns += _perf_ns() - t0


class CupyPoolTarget:
    """``cupy.cuda.MemoryPool`` driven by a trace."""

    name = "cupy-pool"

    def __init__(self, backend: Any):
        cp = backend.cp
        self.cp = cp
        self.pool = cp.cuda.MemoryPool()
        self.held: dict[int, Any] = {}
        self._oom = (cp.cuda.memory.OutOfMemoryError,)
        self.n_device_allocs = 0

    def malloc(self, alloc_id: int, size: int, stream: int) -> None:
        try:
            self.held[alloc_id] = self.pool.malloc(size)
        except self._oom as exc:
            raise OutOfMemory(size, f"cupy MemoryPool: {exc}") from None

    def free_requested(self, alloc_id: int) -> None:
        """The pool has no notion of a pending free."""

    def free_completed(self, alloc_id: int) -> None:
        self.held.pop(alloc_id, None)

    def empty_cache(self) -> None:
        self.pool.free_all_blocks()

    def pool_bytes(self) -> int:
        return self.pool.total_bytes()

    def close(self) -> None:
        self.held.clear()
        self.pool.free_all_blocks()


class CupyAsyncTarget(CupyPoolTarget):
    """``cupy.cuda.MemoryAsyncPool`` (cudaMallocAsync on the current stream)."""

    name = "cupy-async"

    def __init__(self, backend: Any):
        cp = backend.cp
        self.cp = cp
        self.pool = cp.cuda.MemoryAsyncPool()
        self.held = {}
        self._oom = (cp.cuda.memory.OutOfMemoryError,)

    def close(self) -> None:
        self.held.clear()
        self.cp.cuda.runtime.deviceSynchronize()
        self.pool.free_all_blocks()


class TorchTarget:
    """PyTorch's CUDA caching allocator, one ``torch.empty`` per request."""

    name = "torch"

    def __init__(self, backend: Any):
        import torch  # noqa: PLC0415

        self.torch = torch
        self.dev = torch.device("cuda", backend.device_id)
        self.held: dict[int, Any] = {}
        self.streams: dict[int, Any] = {}
        torch.cuda.init()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.dev)
        stats = torch.cuda.memory_stats(self.dev)
        self._base_allocs = stats.get("num_device_alloc", 0)
        self._base_frees = stats.get("num_device_free", 0)
        self._empty = torch.empty
        self._u8 = torch.uint8

    def use_stream(self, stream: int) -> None:
        s = self.streams.get(stream)
        if s is None:
            s = self.streams[stream] = self.torch.cuda.Stream(device=self.dev)
        self.torch.cuda.set_stream(s)

    def malloc(self, alloc_id: int, size: int, stream: int) -> None:
        try:
            self.held[alloc_id] = self._empty(size, dtype=self._u8, device=self.dev)
        except self.torch.cuda.OutOfMemoryError as exc:
            raise OutOfMemory(size, f"torch: {str(exc).splitlines()[0]}") from None

    def free_requested(self, alloc_id: int) -> None:
        """Tensors have no pending free."""

    def free_completed(self, alloc_id: int) -> None:
        self.held.pop(alloc_id, None)

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()

    def pool_bytes(self) -> int:
        # memory_stats() builds a large dict (tens of us); the reserved peak comes from
        # max_memory_reserved() at the end instead, and memGetInfo is sampled after every call.
        return 0

    def device_calls(self) -> tuple[int, int]:
        stats = self.torch.cuda.memory_stats(self.dev)
        return (stats.get("num_device_alloc", 0) - self._base_allocs,
                stats.get("num_device_free", 0) - self._base_frees)

    def close(self) -> None:
        self.held.clear()
        self.torch.cuda.synchronize(self.dev)
        self.torch.cuda.set_stream(self.torch.cuda.default_stream(self.dev))
        self.torch.cuda.empty_cache()


class _TorchBackend:
    """The CuPy backend's streams swapped for torch streams (compute kernels stay CuPy's)."""

    def __init__(self, backend: Any, target: TorchTarget):
        self._b = backend
        self._t = target
        self.name = backend.name
        self._external: dict[int, Any] = {}

    def prepare_streams(self, stream_ids) -> None:
        self._b.prepare_streams(stream_ids)
        for sid in stream_ids:
            self._t.use_stream(int(sid))

    def use_stream(self, stream: int) -> None:
        self._t.use_stream(stream)

    def launch_work(self, stream: int, ns: int) -> None:
        # Queue the spin kernel on the torch stream so the caching allocator's stream sees it.
        if ns < 5_000:
            return
        ext = self._external.get(stream)
        if ext is None:
            ext = self._external[stream] = self._b.cp.cuda.ExternalStream(self._t.streams[stream].cuda_stream)
        with ext:
            self._b.spin_kernel()((1,), (1,), (self._b.cp.uint64(int(ns)),))

    def synchronize(self) -> None:
        self._b.synchronize()


def available(backend: Any) -> dict[str, str | None]:
    """Real allocator name -> None if it can run here, else the reason it is skipped."""
    out: dict[str, str | None] = {}
    if getattr(backend, "name", None) != "cupy":
        reason = "needs a CUDA GPU with CuPy (backend cupy); this run is on the host"
        return {name: reason for name in REAL_ALLOCATORS}
    out["cupy-pool"] = None
    out["cupy-async"] = None if hasattr(backend.cp.cuda, "MemoryAsyncPool") else "CuPy has no MemoryAsyncPool"
    try:
        import torch  # noqa: PLC0415

        out["torch"] = None if torch.cuda.is_available() else "torch sees no CUDA device"
    except Exception as exc:
        out["torch"] = f"torch is not importable ({type(exc).__name__})"
    return out


def validate_real(trace: Trace, name: str, backend: Any, *, cost_model: CostModel | None = None,
                  options: ReplayOptions | None = None) -> dict[str, Any]:
    """Replay ``trace`` through the real allocator ``name`` and compare it with its preset's prediction."""
    if name not in REAL_ALLOCATORS:
        raise ValueError(f"unknown real allocator {name!r}; known: {', '.join(REAL_ALLOCATORS)}")
    preset = REAL_ALLOCATORS[name]
    reason = available(backend).get(name)
    row: dict[str, Any] = {"name": name, "preset": preset, "backend": getattr(backend, "name", "?")}
    if reason:
        row["skipped"] = reason
        return row
    options = options or ReplayOptions()
    base_model = cost_model or CostModel()
    g, sg = footprint_rule(cost_model, backend, options)
    try:
        measured = _measure(trace, name, backend, options)
    except GpuUnavailable as exc:
        row["skipped"] = str(exc)
        return row
    model = cost_model_for_policy(base_model, preset, real_allocator=name)
    sim_trace = scale_time(trace, options.time_scale) if options.compute else trace
    predicted = predict(sim_trace, preset, params=None, cost_model=model, capacity_bytes=options.capacity_bytes,
                        granularity_bytes=g, small_granularity_bytes=sg, with_pool_peak=True)
    row.update(granularity_bytes=g, small_granularity_bytes=sg)
    row.update(compare(predicted, measured))
    row["predicted_pool_peak_bytes"] = predicted.get("pool_peak_bytes")
    row["measured_pool_peak_bytes"] = measured.get("measured_pool_peak_bytes")
    row["pool_peak_error_pct"] = error_pct(row["predicted_pool_peak_bytes"], row["measured_pool_peak_bytes"])
    row["allocs"] = measured.get("allocs")
    row["pool_hits"] = predicted.get("pool_hits")
    row["oom_measured"] = measured.get("oom")
    row["oom_predicted"] = predicted.get("oom")
    row["measured"] = measured
    row["cost_model_used"] = model.to_dict()
    row["notes"] = explain(row, backend="cupy", calibrated=is_calibrated(cost_model))
    if name == "cupy-async":
        row["notes"].append("cudaMallocAsync's pool growth and release rules are driver-internal; the preset "
                            "assumes 32 MiB growth steps and release at every sync")
    return row


def _measure(trace: Trace, name: str, backend: Any, options: ReplayOptions) -> dict[str, Any]:
    cp = backend.cp
    backend.prepare_streams(sorted(set(trace.column("stream").tolist())
                                   | set(trace.initial_allocs["stream"].tolist())))
    cp.cuda.runtime.deviceSynchronize()
    if name == "torch":
        target: Any = TorchTarget(backend)
        drive_backend: Any = _TorchBackend(backend, target)
        mem_get_info = lambda: target.torch.cuda.mem_get_info(target.dev)  # noqa: E731
    else:
        target = CupyPoolTarget(backend) if name == "cupy-pool" else CupyAsyncTarget(backend)
        drive_backend = backend
        mem_get_info = cp.cuda.runtime.memGetInfo
    meter = _Meter(mem_get_info, target.pool_bytes)
    is_async = name == "cupy-async"

    def after_call(kind: int, stream: int) -> None:
        t0 = _perf_ns()
        if is_async and kind == FREE_COMPLETED:
            cp.cuda.get_current_stream().synchronize()
        meter.overhead_ns += _perf_ns() - t0
        meter.sample(force=is_async or name == "torch")

    try:
        run = drive(trace, target, drive_backend, compute=options.compute, time_scale=options.time_scale,
                    after_call=after_call)
        meter.sample(force=True)
        measured: dict[str, Any] = {
            "measured_peak_bytes": int(meter.peak_measured),
            "measured_pool_peak_bytes": int(meter.peak_pool),
            "total_ns": run.total_ns, "compute": options.compute, "events_replayed": run.events_replayed,
            "oom": run.oom, "samples": meter.samples,
            "allocs": int(((run.kinds == ALLOC) & (run.latency_ns >= 0)).sum()),
        }
        if name == "torch":
            allocs, frees = target.device_calls()
            measured["device_mallocs"], measured["device_frees"] = allocs, frees
            measured["measured_pool_peak_bytes"] = max(
                measured["measured_pool_peak_bytes"], int(target.torch.cuda.max_memory_reserved(target.dev)))
        measured.update(latency_stats(run))
        return measured
    finally:
        target.close()
        backend.close()
