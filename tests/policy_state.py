"""Test helpers: a policy's whole state as plain values, and its layout as a start state for ``load_state``.

Used to hold the compiled kernel against the Python reference: two policies that made the same
decisions have equal ``policy_state`` (live blocks and their addresses, counters, every free-list
index, the device's ranges and counters, PyTorch's recorded device calls).
"""

from __future__ import annotations

from typing import Any

from allocsim.policies.freelist import ADDR_BITS

COUNTERS = ("requested_bytes", "allocated_bytes", "pending_free_bytes", "n_mallocs", "n_ooms", "n_pool_hits",
            "n_splits", "n_merges", "n_gc_batches", "last_stream", "n_released_segments", "released_bytes",
            "total_allocated_memory", "num_alloc_retries", "n_cross_stream_hits", "n_trims", "queued_bytes")


def pool_state(pool) -> tuple:
    """Every index of one free list (either implementation) as plain dicts and lists."""
    inserted = pool.inserted_at
    return (dict(pool.size_at), dict(pool.start_ending_at), {k: list(v) for k, v in pool.by_stream.items()},
            dict(pool.segment_size_at), dict(pool.segment_stream_at), pool.segment_bytes, pool.clock,
            None if inserted is None else dict(inserted))


def policy_state(policy) -> dict[str, Any]:
    """Everything a policy stack and its device hold, as plain comparable values."""
    pools = getattr(policy, "pools", ())
    index = {id(pool): k for k, pool in enumerate(pools)}
    dev = policy.device
    state = {
        "live": (dict(policy.live), len(policy.live)), "pending": (set(policy.pending), len(policy.pending)),
        "counters": {name: getattr(policy, name) for name in COUNTERS if hasattr(policy, name)},
        "pools": [pool_state(pool) for pool in pools],
        "pool_of": {addr: index[id(pool)] for addr, pool in getattr(policy, "_pool_of", {}).items()},
        "foreign": dict(getattr(policy, "_foreign", {})),
        "huge": dict(getattr(policy, "_huge", {})),
        "idle": set(getattr(policy, "_idle", ())),
        "decisions": list(getattr(policy, "decisions", ())),
        "device": (dev.reserved_bytes, dev.peak_reserved_bytes, dev.n_mallocs, dev.malloc_bytes, dev.n_frees,
                   dev.freed_bytes, dev.n_maps, dev.map_bytes, dev.n_unmaps, dev.unmapped_bytes,
                   dev.n_failed_mallocs, dev.n_failed_maps, dict(dev._sizes), dict(dev._mapped),
                   dict(dev._address_spaces)),
    }
    expandable = getattr(policy, "_expandable", None)
    if expandable:
        state["unmapped"] = [(dict(e.unmapped.size_at), dict(e.unmapped.stream_at)) for e in expandable.values()]
    upstream = getattr(policy, "upstream", None)
    if upstream is not None and hasattr(upstream, "upstream"):
        state["upstream"] = policy_state(upstream)
        state["queue"] = list(getattr(policy, "_queue", ()))
    return state


def export_start_state(policy) -> tuple[list[dict], list[dict]]:
    """The layout of a ``PyTorchPolicy`` as ``load_state`` tables (segments, blocks): a snapshot of our own.

    Plain segments are the pool's segments; with expandable segments each maximal mapped range is a
    segment row. Live blocks keep their ids (pending ones are ``active_pending_free``).
    """
    segments: list[dict] = []
    blocks: list[dict] = []
    owner = {addr: (aid, req, alloc) for aid, (addr, req, alloc, _s) in policy.live.items() if alloc}
    for pool, name in ((policy.small, "small"), (policy.large, "large")):
        expandable = policy._expandable[id(pool)] if policy._expandable else None
        free = {addr: size for addr, size, _ in pool.blocks()}
        for base, size in sorted(pool.segment_size_at.items()):
            stream = pool.segment_stream(base)
            ranges = [(base, size)]
            if expandable is not None:
                holes = sorted((a, s) for a, s in expandable.unmapped.size_at.items() if base <= a < base + size)
                ranges, cursor = [], base
                for hole, hole_size in holes:
                    if hole > cursor:
                        ranges.append((cursor, hole - cursor))
                    cursor = hole + hole_size
                if cursor < base + size:
                    ranges.append((cursor, base + size - cursor))
            for start, length in ranges:
                segments.append({"addr": start, "size_bytes": length, "stream": stream, "pool": name,
                                 "is_expandable": expandable is not None})
                cursor = start
                while cursor < start + length:
                    if cursor in free:
                        blocks.append({"segment_addr": start, "addr": cursor, "size_bytes": free[cursor],
                                       "requested_bytes": 0, "state": "inactive", "alloc_id": -1})
                        cursor += free[cursor]
                        continue
                    aid, req, alloc = owner[cursor]
                    state = "active_pending_free" if aid in policy.pending else "active_allocated"
                    blocks.append({"segment_addr": start, "addr": cursor, "size_bytes": alloc,
                                   "requested_bytes": req, "state": state, "alloc_id": aid})
                    cursor += alloc
    return segments, blocks


def keys_of(pool, stream_key: int) -> list[tuple[int, int]]:
    """(size, addr) of one stream's free blocks, best-fit order (readable in assertion messages)."""
    return [(key >> ADDR_BITS, key & ((1 << ADDR_BITS) - 1)) for key in pool.keys(stream_key)]
