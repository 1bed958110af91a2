"""Fuzz snapshot_scan (pvm.c + snapshot_scan.c) with raw pickle bytes; diff both routes when it accepts.

``python -m tests.fuzz.fuzz_snapshot --seconds 600`` on the sanitizer build (README.md here).
Seeds: the shared real snapshots cut down to a few segments and entries (their keys, frames,
settings and sharing kept) and pickled with protocols 2, 4 and 5, plus the attack suite's snapshot
files. Every input is scanned twice (with frames and a generous budget; without frames and a budget
of a few bytes per input byte, so the over-budget exits run too); when the scan accepts it, the
whole file is read on both routes and must give the same trace or the same error.
"""

from __future__ import annotations

import pickle
import zlib

from tests.fuzz import common, engine

from allocsim.trace.reading import compiled
from allocsim.trace.reading.limits import DEFAULT_LIMITS as L
from allocsim.trace.reading.safe_pickle import loads_fast
from allocsim.trace.formats.snapshot.reader import _MAX_TIME_US, SYNTHETIC_STEP_NS

KEYS = ["action", "size", "stream", "addr", "time_us", "frames", "device_free", "user_metadata", "compile_context",
        "address", "total_size", "blocks", "device", "segment_type", "is_expandable", "segment_pool_id", "state",
        "requested_size", "filename", "line", "name", "segments", "device_traces", "allocator_settings",
        "external_annotations", "alloc", "free_requested", "free_completed", "segment_alloc", "oom", "snapshot",
        "active_allocated", "inactive", "small", "large", "max_split_size", "roundup_power2_divisions"]
TOKENS = [b"\x8c" + bytes([len(k)]) + k.encode() for k in KEYS] + [
    b"}", b"]", b")", b"(", b"u", b"e", b"t", b"s", b"a", b".", b"N", b"\x88", b"\x89", b"\x94", b"h\x00", b"q\x00",
    b"J\xff\xff\xff\x7f", b"\x8a\x09" + b"\xff" * 9, b"\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80", b"G\x7f\xf8" + b"\0" * 6,
    b"\x85", b"\x86", b"\x87", b"\x95" + bytes(8), b"\x80\x04", b"}\x94(", b"]\x94(", b"\x8c\x00"]


def _cut(obj):
    """A few segments, blocks and entries of a snapshot object, everything else as it was."""
    if isinstance(obj, list):
        return [_cut_segment(s) for s in obj[:3]]
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    if isinstance(obj.get("segments"), list):
        out["segments"] = [_cut_segment(s) for s in obj["segments"][:3]]
    if isinstance(obj.get("device_traces"), list):
        out["device_traces"] = [d[:24] if isinstance(d, list) else d for d in obj["device_traces"][:2]]
    return out


def _cut_segment(seg):
    if isinstance(seg, dict) and isinstance(seg.get("blocks"), list):
        return dict(seg, blocks=seg["blocks"][:4])
    return seg


def seeds():
    for path in common.shared_files("*/*.pickle"):
        obj = _cut(loads_fast(common.read_maybe_gz(path), path))
        for protocol in (2, 4, 5):
            yield pickle.dumps(obj, protocol=protocol)
    yield from common.attack_seeds(["snapshot", "settings types", "huge string", "snapshot devices"])


def target(data: bytes) -> None:
    common.watchdog()
    scan = compiled.ext.snapshot_scan(data, L.memory_bytes, L.frames, L.string_chars, L.segments, L.devices,
                                      L.events, _MAX_TIME_US, SYNTHETIC_STEP_NS, True)
    compiled.ext.snapshot_scan(data, 4 * len(data), 50, 40, 20, 4, 200, _MAX_TIME_US, SYNTHETIC_STEP_NS, False)
    if scan is not None or zlib.crc32(data) % 32 == 0:
        common.compare_routes(data, ".pickle")


if __name__ == "__main__":
    engine.main("snapshot", target, seeds, TOKENS)
