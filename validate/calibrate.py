"""Measure a device's allocation costs and granularity into a cost-model file ``allocsim run --cost-model`` reads.

``calibrate("cupy")`` (or ``"host"``) measures, with the same device classes the replay uses:

* **device calls**: the latency of malloc and free (``cudaMalloc``/``cudaFree``; host: ``mmap``/
  ``munmap``) at sizes from 512 B to 1 GiB (host: to 64 MiB), in batches, medians per size; a
  least-squares fit of ``base + per_MiB * MiB`` weighted by 1/latency (relative error, so the
  small sizes that dominate real traces count as much as the big ones) gives ``malloc_base_ns``,
  ``malloc_per_mib_ns``, ``free_base_ns``, ``free_per_mib_ns``; the same for the host's emulated
  expandable-segment ``map``/``unmap``;
* **device sync**: an idle ``cudaDeviceSynchronize`` (host: 0). It is part of every cudaFree, so it
  is taken out of ``free_base_ns`` and put in ``device_sync_ns``;
* **granularity**: how much the device's free memory drops for one allocation of 1 B, 4 KiB,
  1 MiB, 2 MiB + 1 and, amortised, for many of them (the driver packs small allocations), and the
  footprint rule (``granularity_bytes``, ``small_granularity_bytes``) that fits these best. Host:
  the page size, checked against RSS;
* **pool hits**: the latency of a policy malloc served from cache, for each caching policy (the
  Python code the replay runs), and on a GPU for CuPy's ``MemoryPool``/``MemoryAsyncPool`` and
  PyTorch's caching allocator, over a synthetic churn workload; plus the Python policies' own work
  on a miss (direct policy call minus the device call inside it).

The file's constants describe the device and a real allocator's hit (``pool_hit_ns`` is the
median over real allocators on a GPU, over the Python policies on the host). What the Python
policies add is kept under ``_harness`` for the replay harness (``validate.replay.
cost_model_for_policy``); the footprint rule under ``_granularity_bytes`` /
``_small_granularity_bytes``; raw tables under ``_measurements``.
"""

from __future__ import annotations

import datetime
import gc
import random
import time
from typing import Any, Callable

import numpy as np

from allocsim.cost import CostModel
from allocsim.device import SimulatedDevice
from allocsim.policies.registry import build_policy
from allocsim.units import GiB, KiB, MiB, align_up

from .devices import OP_FREE, OP_MALLOC, OP_MAP, OP_UNMAP, PAGE_BYTES, get_backend

_perf_ns = time.perf_counter_ns

HOST_SIZES = (512, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB)
GPU_SIZES = (512, 4 * KiB, 64 * KiB, 1 * MiB, 2 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1 * GiB)
GRANULARITY_PROBES = (1, 4 * KiB, 1 * MiB, 2 * MiB + 1)
#: Caching policies whose hit cost is measured (the ones a replay runs).
HIT_POLICIES = ("pytorch", "cupy", "paddle", "cuda-async", "deferred-gc", "bestfit", "stream-bound", "paddle-naive")


# ====================================================================== fitting
def fit_linear(sizes_bytes, latencies_ns) -> tuple[float, float]:
    """Fit ``ns = base + per_mib * MiB`` by least squares weighted by 1/ns; both clamped to >= 0."""
    x = np.asarray(sizes_bytes, dtype=float) / MiB
    y = np.asarray(latencies_ns, dtype=float)
    if len(x) == 0:
        raise ValueError("nothing to fit")
    w = 1.0 / np.maximum(y, 1.0)
    if len(x) == 1 or np.ptp(x) == 0:
        return float(max(np.median(y), 0.0)), 0.0
    a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (base, per_mib), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    if per_mib < 0:
        per_mib = 0.0
        base = float(np.sum(w * w * y) / np.sum(w * w))
    if base < 0:
        base = 0.0
        per_mib = float(np.sum(w * w * x * y) / np.sum(w * w * x * x))
    return float(base), float(max(per_mib, 0.0))


def _median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else 0.0


# ====================================================================== device calls
def measure_device_calls(device: Any, sizes, *, reps_small: int, reps_large: int,
                         large_from: int = 64 * MiB) -> list[dict[str, Any]]:
    """Malloc a batch of each size, then free it; return per-size medians from the device's call log."""
    rows = []
    for size in sizes:
        reps = reps_large if size >= large_from else reps_small
        start = len(device.call_ops)
        for _round in range(2):   # the first round warms the path; only the second is kept
            start = len(device.call_ops)
            addrs = [device.malloc(size) for _ in range(reps)]
            for addr in addrs:
                device.free(addr)
        ops = np.asarray(device.call_ops[start:])
        ns = np.asarray(device.call_ns[start:])
        rows.append({"size_bytes": int(size), "reps": reps,
                     "malloc_median_ns": _median(ns[ops == OP_MALLOC]),
                     "free_median_ns": _median(ns[ops == OP_FREE]),
                     "malloc_p90_ns": float(np.percentile(ns[ops == OP_MALLOC], 90)),
                     "free_p90_ns": float(np.percentile(ns[ops == OP_FREE], 90))})
    return rows


def measure_maps(device: Any, sizes, *, reps: int) -> list[dict[str, Any]] | None:
    """Map/unmap latency per size inside one reserved range; None where the device has no VMM."""
    try:
        base = device.reserve_address_space(max(sizes) * reps * 2)
    except NotImplementedError:
        return None
    rows = []
    try:
        for size in sizes:
            start = len(device.call_ops)
            for round_ in range(2):
                start = len(device.call_ops)
                addrs = [base + i * size for i in range(reps)]
                for addr in addrs:
                    device.map(addr, size)
                for addr in addrs:
                    device.unmap(addr, size)
            ops = np.asarray(device.call_ops[start:])
            ns = np.asarray(device.call_ns[start:])
            rows.append({"size_bytes": int(size), "reps": reps, "map_median_ns": _median(ns[ops == OP_MAP]),
                         "unmap_median_ns": _median(ns[ops == OP_UNMAP])})
    finally:
        device.release_address_space(base)
    return rows


# ====================================================================== granularity
def granularity_host(quick: bool) -> dict[str, Any]:
    """Host: the page size; RSS growth per allocation of each probe size (populated mappings) as a check."""
    from .devices import HostDevice

    table = []
    n = 16 if quick else 64
    for size in GRANULARITY_PROBES:
        dev = HostDevice(touch=True, sample_rss=True)
        before = dev._rss() if dev._rss else None
        addrs = [dev.malloc(size) for _ in range(n)]
        after = dev._rss() if dev._rss else None
        for a in addrs:
            dev.free(a)
        table.append({"size_bytes": size, "count": n,
                      "mapped_per_alloc_bytes": align_up(size, PAGE_BYTES),
                      "rss_per_alloc_bytes": (after - before) / n if before is not None else None})
    return {"granularity_bytes": PAGE_BYTES, "small_granularity_bytes": PAGE_BYTES, "page_bytes": PAGE_BYTES,
            "table": table, "rule": "mmap maps whole pages: footprint = size rounded up to the page size"}


def choose_rule(amortized: dict[int, float]) -> tuple[int, int, float]:
    """The (granularity, small granularity) of ``SimulatedDevice.footprint`` closest to the measured footprints.

    Minimises the sum of squared relative errors over the probe sizes; candidates are powers of two.
    """
    best = None
    for g in (64 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB):
        for sg_exp in range(9, int(np.log2(g)) + 1):
            sg = 1 << sg_exp
            err = 0.0
            for size, got in amortized.items():
                if got <= 0:
                    continue
                fp = align_up(size, g) if size >= g else align_up(max(size, 1), sg)
                err += ((fp - got) / got) ** 2
            if best is None or err < best[2] - 1e-12:
                best = (g, sg, err)
    assert best is not None
    return best


def granularity_cupy(cp: Any, quick: bool) -> dict[str, Any]:
    """GPU: cudaMemGetInfo's drop for one allocation of each probe size, and amortised over many."""
    rt = cp.cuda.runtime
    table = []
    amortized: dict[int, float] = {}
    for size in GRANULARITY_PROBES:
        rt.deviceSynchronize()
        free0 = rt.memGetInfo()[0]
        p = rt.malloc(size)
        single = free0 - rt.memGetInfo()[0]
        rt.free(p)
        budget = (64 if quick else 256) * MiB
        count = int(min(65536 if not quick else 8192, max(64, budget // max(size, 512))))
        rt.deviceSynchronize()
        free0 = rt.memGetInfo()[0]
        ptrs = [rt.malloc(size) for _ in range(count)]
        dropped = free0 - rt.memGetInfo()[0]
        spacing = np.diff(np.sort(np.asarray(ptrs, dtype=np.int64)))
        for p in ptrs:
            rt.free(p)
        amortized[size] = dropped / count
        table.append({"size_bytes": size, "single_drop_bytes": int(single), "count": count,
                      "amortized_drop_bytes": dropped / count,
                      "median_pointer_spacing_bytes": int(np.median(spacing)) if len(spacing) else None})
    g, sg, err = choose_rule(amortized)
    return {"granularity_bytes": g, "small_granularity_bytes": sg, "fit_sq_rel_error": err, "table": table,
            "rule": "footprint = round_up(size, granularity) at or above it, else round_up(size, small "
                    "granularity); chosen to fit the amortised memGetInfo drops best"}


# ====================================================================== pool hits
def churn_workload(n_steps: int, *, live: int = 200, seed: int = 1234) -> list[tuple[str, int, int]]:
    """A deterministic alloc/free churn: ``live`` allocations of log-uniform sizes (512 B .. 16 MiB).

    Returns ``("a", id, size)`` / ``("f", id, 0)`` steps; after the warm-up each step frees a random
    live allocation and allocates a new one, so most allocations after the first are pool hits.
    """
    rng = random.Random(seed)
    sizes = [int(2 ** rng.uniform(9, 24)) for _ in range(64)]
    steps: list[tuple[str, int, int]] = []
    alive: list[int] = []
    next_id = 0
    for _ in range(live):
        steps.append(("a", next_id, rng.choice(sizes)))
        alive.append(next_id)
        next_id += 1
    for _ in range(n_steps):
        victim = alive.pop(rng.randrange(len(alive)))
        steps.append(("f", victim, 0))
        steps.append(("a", next_id, rng.choice(sizes)))
        alive.append(next_id)
        next_id += 1
    for victim in alive:
        steps.append(("f", victim, 0))
    return steps


def _timed_churn(steps, malloc: Callable[[int, int], Any], free: Callable[[int], Any],
                 is_hit: Callable[[], bool], free_request: Callable[[int], Any] | None = None) -> dict[str, Any]:
    hits: list[int] = []
    misses: list[int] = []
    frees: list[int] = []
    requests: list[int] = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for op, aid, size in steps:
            if op == "a":
                before = is_hit()
                t0 = _perf_ns()
                malloc(aid, size)
                dt = _perf_ns() - t0
                (hits if is_hit() == before else misses).append(dt)
            else:
                if free_request is not None:
                    t0 = _perf_ns()
                    free_request(aid)
                    requests.append(_perf_ns() - t0)
                t0 = _perf_ns()
                free(aid)
                frees.append(_perf_ns() - t0)
    finally:
        if gc_was:
            gc.enable()
    return {"hit_median_ns": _median(hits), "hits": len(hits), "miss_median_ns": _median(misses),
            "misses": len(misses), "free_median_ns": _median(frees),
            "free_request_median_ns": _median(requests) if requests else None}


def policy_hits(policies=HIT_POLICIES, *, n_steps: int) -> dict[str, dict[str, Any]]:
    """Hit, miss and free costs of each Python policy over the churn workload (on a simulated device)."""
    steps = churn_workload(n_steps)
    out = {}
    for name in policies:
        dev = SimulatedDevice(None)
        pol = build_policy(name, device=dev, params={})
        out[name] = _timed_churn(steps, lambda aid, size: pol.malloc(aid, size, 0), pol.free_completed,
                                 lambda: dev.n_mallocs + dev.n_maps, free_request=pol.free_requested)
    return out


def python_miss_overhead(backend: Any, *, reps: int) -> dict[str, float]:
    """What a Python policy adds around a device call: direct policy call minus the device call inside it."""
    device = backend.make_device(None)
    pol = build_policy("direct", device=device)
    mal, fre = [], []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for i in range(reps):
            n0 = len(device.call_ns)
            t0 = _perf_ns()
            pol.malloc(i, 4 * KiB, 0)
            dt = _perf_ns() - t0 - (device.call_ns[n0])
            mal.append(dt)
            n0 = len(device.call_ns)
            t0 = _perf_ns()
            pol.free(i)
            fre.append(_perf_ns() - t0 - device.call_ns[n0])
    finally:
        if gc_was:
            gc.enable()
        device.close()
    # Measurement (memGetInfo/RSS reads) is part of the call time here but taken out in replays.
    ovh = device.overhead_ns / max(device.n_samples, 1)
    return {"malloc_overhead_ns": max(_median(mal) - ovh, 0.0), "free_overhead_ns": max(_median(fre) - ovh, 0.0)}


def real_allocator_hits(cp: Any, *, n_steps: int) -> dict[str, dict[str, Any]]:
    """Hit costs of CuPy's MemoryPool and MemoryAsyncPool, and of PyTorch's caching allocator if present."""
    steps = churn_workload(n_steps)
    out: dict[str, dict[str, Any]] = {}
    pool = cp.cuda.MemoryPool()
    held: dict[int, Any] = {}
    out["cupy-pool"] = _timed_churn(steps, lambda aid, size: held.__setitem__(aid, pool.malloc(size)),
                                    lambda aid: held.pop(aid), pool.total_bytes)
    held.clear()
    pool.free_all_blocks()
    try:
        apool = cp.cuda.MemoryAsyncPool()
        out["cupy-async"] = _timed_churn(steps, lambda aid, size: held.__setitem__(aid, apool.malloc(size)),
                                         lambda aid: held.pop(aid), apool.total_bytes)
        held.clear()
        cp.cuda.get_current_stream().synchronize()
        apool.free_all_blocks()
    except Exception as exc:  # a driver without mempools, or CuPy without MemoryAsyncPool
        out["cupy-async"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            dev = torch.device("cuda", cp.cuda.Device().id)
            tensors: dict[int, Any] = {}

            def reserved() -> int:
                return torch.cuda.memory_reserved(dev)

            out["torch"] = _timed_churn(
                steps, lambda aid, size: tensors.__setitem__(aid, torch.empty(size, dtype=torch.uint8, device=dev)),
                lambda aid: tensors.pop(aid), reserved)
            tensors.clear()
            torch.cuda.empty_cache()
    except ImportError:
        pass
    except Exception as exc:
        out["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def idle_sync_ns(cp: Any, reps: int = 200) -> float:
    """Median latency of ``cudaDeviceSynchronize`` on an idle device."""
    rt = cp.cuda.runtime
    rt.deviceSynchronize()
    times = []
    for _ in range(reps):
        t0 = _perf_ns()
        rt.deviceSynchronize()
        times.append(_perf_ns() - t0)
    return _median(times)


# ====================================================================== the whole calibration
def calibrate(backend_name: str = "host", *, quick: bool = False, touch: bool = False, device_id: int = 0,
              log: Callable[[str], None] | None = None) -> tuple[CostModel, dict[str, Any]]:
    """Measure ``backend_name`` (``host`` or ``cupy``); return the fitted ``CostModel`` and every measurement."""
    from .report import describe_machine

    say = log or (lambda _msg: None)
    backend = get_backend(backend_name, touch=touch, device_id=device_id)
    started = time.perf_counter()
    notes: list[str] = []
    if backend_name == "cupy":
        sizes = GPU_SIZES if not quick else GPU_SIZES[:-2]
        reps_small, reps_large = (50, 8) if not quick else (10, 3)
        large_from = 256 * MiB
    else:
        sizes = HOST_SIZES if not quick else HOST_SIZES[:-1]
        reps_small, reps_large = (200, 20) if not quick else (30, 5)
        large_from = 16 * MiB
    say(f"device calls at {len(sizes)} sizes")
    device = backend.make_device(None)
    try:
        calls = measure_device_calls(device, sizes, reps_small=reps_small, reps_large=reps_large,
                                     large_from=large_from)
        say("map/unmap")
        maps = measure_maps(device, (2 * MiB, 20 * MiB, 64 * MiB), reps=8 if not quick else 3)
    finally:
        device.close()
    mb, mp = fit_linear([r["size_bytes"] for r in calls], [r["malloc_median_ns"] for r in calls])
    fb, fp = fit_linear([r["size_bytes"] for r in calls], [r["free_median_ns"] for r in calls])
    values: dict[str, float] = {"malloc_base_ns": mb, "malloc_per_mib_ns": mp}
    if maps:
        values["map_base_ns"], values["map_per_mib_ns"] = fit_linear(
            [r["size_bytes"] for r in maps], [r["map_median_ns"] for r in maps])
        values["unmap_base_ns"], values["unmap_per_mib_ns"] = fit_linear(
            [r["size_bytes"] for r in maps], [r["unmap_median_ns"] for r in maps])
        values["unmap_stream_sync_ns"] = 0.0 if backend_name == "host" else values["unmap_base_ns"]
    else:
        notes.append("map/unmap not measured (no expandable-segment support on this backend): defaults kept")
    say("granularity")
    if backend_name == "cupy":
        cp = backend.cp
        gran = granularity_cupy(cp, quick)
        sync = idle_sync_ns(cp)
        notes.append("device_sync_ns is an idle cudaDeviceSynchronize; a cudaFree behind queued kernels waits "
                     "for them too (replay --compute measures that)")
    else:
        gran = granularity_host(quick)
        sync = 0.0
        notes.append("host: no device-wide synchronisation (device_sync_ns = 0)")
    values["device_sync_ns"] = sync
    values["free_base_ns"] = max(fb - sync, 0.0)
    values["free_per_mib_ns"] = fp
    say("pool hits (Python policies)")
    n_steps = 3000 if not quick else 600
    hits = policy_hits(n_steps=n_steps)
    overhead = python_miss_overhead(backend, reps=200 if not quick else 50)
    real: dict[str, dict[str, Any]] = {}
    if backend_name == "cupy":
        say("pool hits (real allocators)")
        real = real_allocator_hits(backend.cp, n_steps=n_steps)
    py_hit = {name: round(h["hit_median_ns"]) for name, h in hits.items()}
    py_req = {name: round(h["free_request_median_ns"] or 0) for name, h in hits.items()}
    py_hit["default"] = round(_median(list(py_hit.values())))
    py_req["default"] = round(_median(list(py_req.values())))
    real_ok = {k: v for k, v in real.items() if "hit_median_ns" in v and v.get("hits")}
    if real_ok:
        values["pool_hit_ns"] = _median([v["hit_median_ns"] for v in real_ok.values()])
        values["free_request_ns"] = _median([v["free_median_ns"] for v in real_ok.values()])
    else:
        values["pool_hit_ns"] = float(py_hit["default"])
        values["free_request_ns"] = float(py_req["default"])
        if backend_name == "host":
            notes.append("host: pool_hit_ns / free_request_ns are the Python policies' own (no real allocator)")
    values = {k: round(float(v), 1) for k, v in values.items()}
    machine = describe_machine(backend_name, device_id=device_id)
    provenance = {
        "_source": f"python -m validate calibrate --backend {backend_name}" + (" --quick" if quick else "")
                   + (" --touch" if touch else ""),
        "_date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "_device": machine,
        "_backend": backend_name,
        "_touch": bool(touch),
        "_granularity_bytes": int(gran["granularity_bytes"]),
        "_small_granularity_bytes": int(gran["small_granularity_bytes"]),
        "_harness": {
            "python_policy": {"pool_hit_ns": py_hit, "free_request_ns": py_req,
                              "malloc_overhead_ns": round(overhead["malloc_overhead_ns"], 1),
                              "free_overhead_ns": round(overhead["free_overhead_ns"], 1)},
            "real_allocators": {k: {"pool_hit_ns": round(v["hit_median_ns"], 1),
                                    "free_request_ns": round(v["free_median_ns"], 1)}
                                for k, v in real_ok.items()},
        },
        "_measurements": {"device_calls": calls, "maps": maps, "granularity": gran, "policy_churn": hits,
                          "real_allocator_churn": real, "fits": {
                              "malloc": {"base_ns": round(mb, 1), "per_mib_ns": round(mp, 3)},
                              "free_including_sync": {"base_ns": round(fb, 1), "per_mib_ns": round(fp, 3)}}},
        "_notes": notes,
        "_seconds": round(time.perf_counter() - started, 2),
    }
    model = CostModel.from_overrides({**values, **provenance})
    backend.close()
    return model, provenance
