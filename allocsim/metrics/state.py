"""What a snapshot with no recorded history still tells: ``state_report(trace)`` reads its final state.

Many snapshots are dumped at an out-of-memory without ``_record_memory_history``: the segments
and their blocks, no trace to replay. For each device the report gives, from the recorded blocks
alone (exact sums, no simulation):

- reserved, allocated, active (allocated + blocks whose free waits on a stream), requested, per
  pool (small / large) and per stream;
- the free bytes by cause: ``cached_segments`` (wholly free segments, or whole free pages of an
  expandable segment: what ``empty_cache`` would return), ``free_slivers`` (the other free pieces
  of partly used segments); and ``rounding`` (allocated - requested inside live blocks);
- the largest free block, and against the request that failed (the snapshot's ``oom`` entry, or
  ``request_bytes``) whether the OOM was *fragmentation* (enough free bytes in total, no block or
  device range large enough) or *exhaustion* (not enough free bytes at all), judged by PyTorch's
  rules (rounding, pools, ``max_split_size``, release of cached segments before the last cudaMalloc);
- what the same live blocks would leave free packed perfectly;
- the code sites of the live blocks (``sites.site_rows``: the innermost frame of the program each
  block was allocated from; blocks recorded without frames are ``unattributed``).

What-if replays (another setting, another capacity) need the history; ``HOW_TO_RECORD`` says how.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..settings.pytorch_sizes import K_LARGE_BUFFER, K_SMALL_BUFFER, K_SMALL_SIZE
from ..policies.pytorch_rules import SIZE_MAX, get_allocation_size, oversize_rejects, round_size
from ..settings.recorded import allocator_settings_to_kwargs
from ..trace.inference.recorded import recorded_run
from ..trace.schema import EventKind, Trace
from ..units import format_bytes
from .sites.report import format_rows
from .sites.rule import SiteFilter
from .sites.rows import DEFAULT_TOP, site_rows

HOW_TO_RECORD = ("what-if replays (other settings, another capacity) need a recorded history: call "
                 "torch.cuda.memory._record_memory_history(max_entries=100000) before the run and "
                 "torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") at the end (or in the OOM handler)")
LIVE_STATES = ("active_allocated", "active_pending_free")
FRAGMENTATION, EXHAUSTION, NOT_AN_OOM, UNKNOWN = "fragmentation", "exhaustion", "fits", "unknown"


def has_history(trace: Trace) -> bool:
    """True when the trace records requests to replay (a recorded OOM's failed request alone is none)."""
    kind = trace.column("kind")
    if np.isin(kind, [int(EventKind.FREE_REQUESTED), int(EventKind.FREE_COMPLETED)]).any():
        return True
    failed = sum(len(run.get("ooms") or []) for run in trace.meta.recorded.values())
    return int(np.count_nonzero(kind == int(EventKind.ALLOC))) > failed


def is_state_only(trace: Trace) -> bool:
    """A snapshot with a recorded state and no history: what ``state_report`` is for."""
    return len(trace.table("initial_segments")) > 0 and not has_history(trace)


# ----------------------------------------------------------------------------- blocks
def _free_parts(block_addr: int, block_bytes: int, seg_addr: int, seg_bytes: int, expandable: bool,
                page_bytes: int) -> tuple[int, int]:
    """(cached, sliver) bytes of one free block: releasable by ``empty_cache`` vs not."""
    if not expandable:
        return (block_bytes, 0) if block_bytes == seg_bytes else (0, block_bytes)
    begin = seg_addr + -(-(block_addr - seg_addr) // page_bytes) * page_bytes
    end = seg_addr + (block_addr + block_bytes - seg_addr) // page_bytes * page_bytes
    pages = max(end - begin, 0)
    return pages, block_bytes - pages


def _blank() -> dict[str, int]:
    return {"segments": 0, "reserved_bytes": 0, "allocated_bytes": 0, "pending_free_bytes": 0,
            "active_bytes": 0, "requested_bytes": 0, "free_bytes": 0, "largest_free_block_bytes": 0}


def _block_table(trace: Trace) -> list[tuple]:
    """(pool, stream, seg_addr, seg_bytes, expandable, addr, size, requested, state) of every block."""
    segs = trace.initial_segments
    seg_at = {int(a): (str(p), int(s), int(n), bool(e)) for a, p, s, n, e in zip(
        segs["addr"].to_numpy().tolist(), segs["pool"].tolist(), segs["stream"].to_numpy().tolist(),
        segs["size_bytes"].to_numpy().tolist(), segs["is_expandable"].to_numpy().tolist())}
    blocks = trace.initial_blocks
    out = []
    for seg_addr, addr, size, requested, state in zip(
            blocks["segment_addr"].to_numpy().tolist(), blocks["addr"].to_numpy().tolist(),
            blocks["size_bytes"].to_numpy().tolist(), blocks["requested_bytes"].to_numpy().tolist(),
            blocks["state"].tolist()):
        pool, stream, seg_bytes, expandable = seg_at[seg_addr]
        out.append((pool, stream, seg_addr, seg_bytes, expandable, addr, size, requested, state))
    return out


def _add_block(acc: dict[str, int], size: int, requested: int, state: str) -> None:
    if state == "active_allocated":
        acc["allocated_bytes"] += size
        acc["requested_bytes"] += requested
    elif state in LIVE_STATES:
        acc["pending_free_bytes"] += size
    else:
        acc["free_bytes"] += size
        acc["largest_free_block_bytes"] = max(acc["largest_free_block_bytes"], size)


# ----------------------------------------------------------------------------- one device
def device_state(trace: Trace, *, request_bytes: int | None = None, capacity_bytes: int | None = None,
                 site_filter: SiteFilter | None = None, top_sites: int = DEFAULT_TOP) -> dict[str, Any]:
    """The recorded state of ``trace``'s one device (see the module doc); JSON-ready."""
    device = trace.devices[0] if trace.devices else 0
    segs = trace.initial_segments
    totals = _blank()
    pools: dict[str, dict[str, int]] = {}
    streams: dict[int, dict[str, int]] = {}
    waste = {"cached_segments": 0, "free_slivers": 0, "pending_free": 0, "rounding": 0}
    free_blocks: list[tuple[int, str, int]] = []   # (size, pool, stream)
    for pool, stream, size, in zip(segs["pool"].tolist(), segs["stream"].to_numpy().tolist(),
                                   segs["size_bytes"].to_numpy().tolist()):
        for acc in (totals, pools.setdefault(pool, _blank()), streams.setdefault(stream, _blank())):
            acc["segments"] += 1
            acc["reserved_bytes"] += size
    for pool, stream, seg_addr, seg_bytes, expandable, addr, size, requested, state in _block_table(trace):
        for acc in (totals, pools[pool], streams[stream]):
            _add_block(acc, size, requested, state)
        if state == "active_allocated":
            waste["rounding"] += size - requested
        elif state in LIVE_STATES:
            waste["pending_free"] += size
        else:
            page = K_SMALL_BUFFER if pool == "small" else K_LARGE_BUFFER
            cached, sliver = _free_parts(addr, size, seg_addr, seg_bytes, expandable, page)
            waste["cached_segments"] += cached
            waste["free_slivers"] += sliver
            free_blocks.append((size, pool, stream))
    for acc in (totals, *pools.values(), *streams.values()):
        acc["active_bytes"] = acc["allocated_bytes"] + acc["pending_free_bytes"]
    blocks_known = len(trace.initial_blocks) > 0
    report: dict[str, Any] = {"device": int(device), **totals, "blocks_recorded": blocks_known,
                              "waste_bytes": waste,
                              "per_pool": {name: pools[name] for name in sorted(pools)},
                              "per_stream": {str(s): streams[s] for s in sorted(streams)}}
    largest = max(free_blocks, default=None)
    report["largest_free_block"] = (None if largest is None else
                                    {"bytes": largest[0], "pool": largest[1], "stream": largest[2]})
    capacity, capacity_source = _capacity(trace, int(device), capacity_bytes)
    if capacity_source == "given" and capacity < totals["reserved_bytes"]:
        # The recording itself proves the device held this much: a smaller one cannot be this run's.
        raise ValueError(f"--capacity {format_bytes(capacity)} ({capacity:,} bytes) is below the "
                         f"{format_bytes(totals['reserved_bytes'])} ({totals['reserved_bytes']:,} bytes) device "
                         f"{device} had reserved when the snapshot was taken: the device held at least that much")
    report["capacity_bytes"], report["capacity_source"] = capacity, capacity_source
    request = _request(trace, int(device), request_bytes)
    report["request"] = None if request is None else judge_request(trace, report, free_blocks, request, capacity)
    report["packed"] = _packed(report, capacity, request)
    init = trace.initial_allocs
    sites = site_rows(trace, init["alloc_id"].to_numpy(), init["size_bytes"].to_numpy(), top=top_sites,
                      site_filter=site_filter)
    report["sites"] = {**sites.to_dict(), "rule": (site_filter or SiteFilter()).rule(),
                       "live_bytes": sites.total_bytes}
    if not blocks_known:
        report["note"] = ("the recorded blocks could not be placed in the segments (see the trace notes): "
                          "allocated, free and waste figures are not available")
    return report


def _capacity(trace: Trace, device: int, given: int | None) -> tuple[int | None, str | None]:
    """The device memory the allocator could use: given, else reserved + driver-free at a recorded OOM."""
    if given is not None:
        return given, "given"
    run = recorded_run(trace, device)
    if run is not None and run.ooms and run.ooms[-1].device_free_bytes >= 0:
        oom = run.ooms[-1]
        return oom.reserved_bytes + oom.device_free_bytes, "recorded OOM (reserved + the free bytes the driver reported)"
    if run is not None and run.capacity_bytes is not None:
        return run.capacity_bytes, "inferred from the recording"
    return None, None


def _request(trace: Trace, device: int, given: int | None) -> dict[str, Any] | None:
    """The failed request to judge: ``--request``, else the last OOM the snapshot records."""
    if given is not None:
        return {"bytes": int(given), "source": "given", "stream": None, "device_free_bytes": None}
    run = recorded_run(trace, device)
    if run is None or not run.ooms:
        return None
    oom = run.ooms[-1]
    return {"bytes": oom.requested_bytes, "source": "recorded OOM", "stream": oom.stream,
            "device_free_bytes": oom.device_free_bytes if oom.device_free_bytes >= 0 else None}


def judge_request(trace: Trace, report: dict[str, Any], free_blocks: list[tuple[int, str, int]],
                  request: dict[str, Any], capacity: int | None) -> dict[str, Any]:
    """Was a failed request fragmentation or exhaustion? PyTorch's rules applied to the recorded state."""
    kwargs = allocator_settings_to_kwargs(trace.meta.allocator_settings)
    size = round_size(request["bytes"], kwargs.get("roundup_power2_divisions"))
    pool = "small" if size <= K_SMALL_SIZE else "large"
    max_split = kwargs.get("max_split_size_bytes") or SIZE_MAX
    candidates = [(b, s) for b, p, s in free_blocks
                  if p == pool and (request["stream"] is None or s == request["stream"]) and b >= size
                  and not (pool == "large" and oversize_rejects(b, size, max_split_size_bytes=max_split))]
    device_free = request["device_free_bytes"]
    if device_free is None and capacity is not None:
        device_free = max(capacity - report["reserved_bytes"], 0)
    alloc_size = get_allocation_size(size)
    releasable = report["waste_bytes"]["cached_segments"]
    cache_free = report["reserved_bytes"] - report["active_bytes"]
    out = {"request_bytes": int(request["bytes"]), "rounded_bytes": size, "source": request["source"],
           "stream": request["stream"], "pool": pool, "cudamalloc_bytes": alloc_size,
           "largest_fitting_free_block_bytes": max((b for b, _ in candidates), default=None),
           "largest_free_block_in_pool_bytes": max((b for b, p, s in free_blocks if p == pool
                                                    and (request["stream"] is None or s == request["stream"])),
                                                   default=0),
           "free_in_cache_bytes": cache_free, "releasable_bytes": releasable, "device_free_bytes": device_free}
    where = f"the {pool} pool" + ("" if request["stream"] is None else f" of stream {request['stream']}")
    shown = "the request"
    if candidates:
        out["kind"] = NOT_AN_OOM
        out["line"] = (f"not an OOM here: a free block of {format_bytes(out['largest_fitting_free_block_bytes'])} in {where} "
                       "holds it, so this state alone does not explain an out-of-memory")
    elif device_free is not None and device_free + releasable >= alloc_size:
        out["kind"] = NOT_AN_OOM
        out["line"] = (f"not an OOM here: the device has {format_bytes(device_free)} free and the cache "
                       f"{format_bytes(releasable)} releasable, enough for its {format_bytes(alloc_size)} cudaMalloc")
    elif device_free is not None and cache_free + device_free >= size:
        out["kind"] = FRAGMENTATION
        out["line"] = (f"fragmentation: {format_bytes(cache_free + device_free)} free in total "
                       f"({format_bytes(cache_free)} inside the cache, of which {format_bytes(releasable)} "
                       f"releasable; {format_bytes(device_free)} on the device), but no free block in {where} "
                       f"holds {shown} (largest {format_bytes(out['largest_free_block_in_pool_bytes'])}) "
                       f"and its {format_bytes(alloc_size)} cudaMalloc does not fit")
    elif device_free is not None:
        out["kind"] = EXHAUSTION
        out["line"] = (f"exhaustion: only {format_bytes(cache_free + device_free)} free in total "
                       f"({format_bytes(cache_free)} inside the cache, {format_bytes(device_free)} on the device) "
                       f"for {shown}")
    else:
        out["kind"] = FRAGMENTATION if cache_free >= size else UNKNOWN
        inside = (f"{format_bytes(cache_free)} free inside the cache but no free block in {where} holds "
                  f"{shown} (largest {format_bytes(out['largest_free_block_in_pool_bytes'])})")
        out["line"] = ((f"fragmentation inside the cache: {inside}" if cache_free >= size else
                        f"the cache has only {format_bytes(cache_free)} free for {shown}")
                       + "; the device's free memory is not recorded: give --capacity SIZE to judge it")
    return out


def _packed(report: dict[str, Any], capacity: int | None, request: dict[str, Any] | None) -> dict[str, Any]:
    """What the same live blocks would leave free packed perfectly (no slivers, no cached segments)."""
    live = report["active_bytes"]
    room = (capacity if capacity is not None else report["reserved_bytes"]) - live
    within = "the device" if capacity is not None else "what is reserved now"
    out = {"live_bytes": live, "free_bytes": room, "within": within, "request_fits": None}
    line = (f"packed perfectly, the same live blocks ({format_bytes(live)}) would leave {format_bytes(room)} "
            f"free in one piece within {within}")
    if request is not None:
        size = request["bytes"]
        out["request_fits"] = size <= room
        line += f": the {format_bytes(size)} request would {'have fitted' if size <= room else 'still not fit'}"
    out["line"] = line
    return out


# ----------------------------------------------------------------------------- every device
#: The first key of a state report (and of ``run -o``'s ``state.json``).
STATE_SCHEMA = "allocsim-state/1"


def state_report(trace: Trace, *, request_bytes: int | None = None, capacity_bytes: int | None = None,
                 site_filter: SiteFilter | None = None, top_sites: int = DEFAULT_TOP) -> dict[str, Any]:
    """The recorded state of every device of ``trace``: ``{"schema", "history", "devices": {...}, "how_to_record"}``."""
    devices = trace.devices or [0]
    per_device = {}
    for device in devices:
        part = trace.for_device(device) if len(devices) > 1 else trace
        per_device[str(device)] = device_state(part, request_bytes=request_bytes, capacity_bytes=capacity_bytes,
                                               site_filter=site_filter, top_sites=top_sites)
    return {"schema": STATE_SCHEMA, "history": has_history(trace), "source": trace.meta.source, "devices": per_device,
            "how_to_record": HOW_TO_RECORD}


# ----------------------------------------------------------------------------- text
_TABLE_KEYS = ("segments", "reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes", "free_bytes",
               "largest_free_block_bytes")
_TABLE_HEAD = ("segments", "reserved", "allocated", "active", "requested", "free", "largest free")


def _table(title: str, rows: dict[str, dict[str, int]]) -> list[str]:
    lines = [f"  {title:<14}" + "".join(f"{h:>13}" for h in _TABLE_HEAD)]
    for name, acc in rows.items():
        cells = [f"{acc['segments']:>13,}"] + [f"{format_bytes(acc[k]):>13}" for k in _TABLE_KEYS[1:]]
        lines.append(f"    {name:<12}" + "".join(cells))
    return lines


def format_device_state(state: dict[str, Any]) -> str:
    """One device's state as text lines."""
    w = state["waste_bytes"]
    lines = [f"Recorded state of device {state['device']} (the snapshot's final segments; no history to replay)",
             f"  reserved      {format_bytes(state['reserved_bytes'])} in {state['segments']:,} segments "
             f"({state['reserved_bytes']:,} bytes)",
             f"  allocated     {format_bytes(state['allocated_bytes'])} ({state['allocated_bytes']:,} bytes; "
             f"requested {format_bytes(state['requested_bytes'])})",
             f"  active        {format_bytes(state['active_bytes'])} (allocated + {format_bytes(state['pending_free_bytes'])}"
             " freed, waiting on a stream)",
             f"  free          {format_bytes(state['free_bytes'])}: cached free segments "
             f"{format_bytes(w['cached_segments'])} (empty_cache returns them), free slivers of partly used segments "
             f"{format_bytes(w['free_slivers'])}",
             f"  rounding      {format_bytes(w['rounding'])} inside live blocks (allocated - requested)"]
    largest = state["largest_free_block"]
    lines.append("  largest free block  " + ("none" if largest is None else
                 f"{format_bytes(largest['bytes'])} ({largest['pool']} pool, stream {largest['stream']})"))
    if state.get("note"):
        lines.append(f"  note: {state['note']}")
    lines += _table("per pool", state["per_pool"])
    lines += _table("per stream", state["per_stream"])
    if state["capacity_bytes"] is not None:
        lines.append(f"  capacity      {format_bytes(state['capacity_bytes'])} ({state['capacity_source']})")
    if state["request"] is not None:
        req = state["request"]
        lines.append(f"  request       {format_bytes(req['request_bytes'])} ({req['source']}): {req['line']}")
    else:
        lines.append("  request       no failed request recorded: give --request SIZE (the 'Tried to allocate' of "
                     "the error) to judge fragmentation against exhaustion")
    lines.append(f"  packed        {state['packed']['line']}")
    sites = state["sites"]
    if sites["rows"] and any(r["bytes"] or r["count"] for r in sites["rows"]):
        lines.append(f"  top sites of live blocks ({format_bytes(sites['live_bytes'])} requested; the innermost "
                     "frame of the program each was allocated from)")
        if sites.get("note"):
            lines.append(f"    note: {sites['note']}")
        lines += format_rows(sites["rows"])
    else:
        lines.append(f"  sites         {sites['note'] or 'no live blocks'}")
    return "\n".join(lines)


def format_state_report(report: dict[str, Any]) -> str:
    """The whole report as text: each device, then how to record a history."""
    parts = [format_device_state(state) for state in report["devices"].values()]
    parts.append(report["how_to_record"][0].upper() + report["how_to_record"][1:])
    return "\n\n".join(parts)
