"""PyTorch memory-snapshot reader: real files against counted ground truth, hostile and broken input."""

from __future__ import annotations

import atexit
import bisect
import copy
import functools
import gzip
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.errors import TraceFormatError, UnsafePickleError
from allocsim.trace import read_trace
from allocsim.trace.reading.safe_pickle import load_pickle
from allocsim.trace.schema import EventKind, Trace, check_schema
from allocsim.trace.formats.snapshot.reader import read_snapshot, round_size

MiB = 1 << 20
#: ``../shared`` beside the repository root (the ``shared_dir`` fixture skips when it is absent).
SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"
SNAPSHOT_DIR = SHARED_DIR / "traces" / "pytorch-snapshots"

FILES = {
    "Constructor-Sun": "Constructor-Sun__memory_snapshot.pickle",
    "MAGMA27": "MAGMA27__memory_snapshot.pickle",
    "Maphsge4": "Maphsge4__snapshot.pickle",
    "MercuryB1": "MercuryB1__cuda_memory_snapshot.pickle",
    "Wedsonlin 128 inference": "Wedsonlin__medium_128_inference_memory_snapshot.pickle",
    "Wedsonlin 128 training": "Wedsonlin__medium_128_training_memory_snapshot.pickle",
    "kkaitlyn111 ctx128 fullstep": "kkaitlyn111__memory_ctx128_fullstep.pickle",
    "silmont2000 mem_snapshot": "silmont2000__mem_snapshot.pickle",
    "silmont2000 forward bf16": "silmont2000__memory_forward_bf16_128.pickle",
    "silmont2000 forward fp32": "silmont2000__memory_forward_fp32_128.pickle",
}

# Ground truth, copied from ../shared/traces/README.md ("What is in them"), counted independently:
# file, dev, entries, streams, time_us, allocs, segment allocs/maps, segment frees/unmaps, oom,
# frees of unknown blocks, reserved at start, peak reserved, final reserved.
README_ROWS = [
    ("Constructor-Sun", 0, 6445, 1, True, 2434, 175, 0, 0, 0, 0, 8_541_700_096, 8_541_700_096),
    ("Constructor-Sun", 1, 596, 1, True, 199, 40, 6, 1, 0, 0, 84_202_749_952, 84_202_749_952),
    ("Constructor-Sun", 2, 882, 1, True, 392, 78, 0, 0, 0, 0, 21_883_781_120, 21_883_781_120),
    ("MAGMA27", 0, 5163, 1, True, 1721, 0, 0, 0, 2, 14_180_941_824, 14_180_941_824, 14_180_941_824),
    ("Maphsge4", 0, 10327, 10, False, 3058, 584, 579, 0, 0, 14_036_238_336, 22_519_218_176, 18_566_086_656),
    ("MercuryB1", 0, 9576, 1, True, 2912, 420, 420, 0, 1, 230_686_720, 5_802_819_584, 230_686_720),
    ("Wedsonlin 128 inference", 0, 3840, 1, True, 1280, 0, 0, 0, 0, 1_763_704_832, 1_763_704_832, 1_763_704_832),
    ("Wedsonlin 128 training", 0, 19136, 1, True, 6526, 0, 0, 0, 438, 7_235_174_400, 7_235_174_400, 7_235_174_400),
    ("kkaitlyn111 ctx128 fullstep", 0, 19342, 1, True, 6771, 783, 0, 0, 0, 13_763_608_576, 61_111_009_280, 61_111_009_280),
    ("silmont2000 mem_snapshot", 0, 97, 1, True, 36, 9, 0, 0, 0, 0, 3_781_165_056, 3_781_165_056),
    ("silmont2000 forward bf16", 0, 2811, 1, True, 937, 0, 0, 0, 0, 861_929_472, 861_929_472, 861_929_472),
    ("silmont2000 forward fp32", 0, 2043, 1, True, 681, 0, 0, 0, 0, 610_271_232, 610_271_232, 610_271_232),
]
ROW_IDS = [f"{r[0]}-dev{r[1]}" for r in README_ROWS]
EXPANDABLE = {"Constructor-Sun"}


@functools.lru_cache(maxsize=None)
def _load(name: str) -> Trace:
    return read_trace(SNAPSHOT_DIR / FILES[name])   # format detection + dispatch to read_snapshot


@functools.lru_cache(maxsize=None)
def _raw(name: str):
    return load_pickle(SNAPSHOT_DIR / FILES[name])


@pytest.fixture(scope="module")
def snapshots(shared_dir):
    if not SNAPSHOT_DIR.is_dir():
        pytest.skip(f"{SNAPSHOT_DIR} is absent")
    return _load


def _device(trace: Trace, dev: int):
    ev = trace.events[trace.events["device"] == dev]
    de = trace.decisions[trace.decisions["device"] == dev]
    return ev, de


# ---------------------------------------------------------------------- real snapshots
@pytest.mark.shared
def test_every_shared_snapshot_loads(snapshots):
    files = sorted(SNAPSHOT_DIR.glob("*"))
    assert {f.name for f in files} >= set(FILES.values())
    by_file = {v: k for k, v in FILES.items()}
    for f in files:
        trace = snapshots(by_file[f.name]) if f.name in by_file else read_trace(f)
        check_schema(trace)
        assert trace.meta.format == "pytorch-snapshot"
        assert trace.meta.source == f.name
        assert len(trace.events) > 0


@pytest.mark.shared
@pytest.mark.parametrize("row", README_ROWS, ids=ROW_IDS)
def test_counts_match_readme(snapshots, row):
    name, dev, entries, streams, has_time, allocs, seg_up, seg_down, ooms, orphans = row[:10]
    trace = snapshots(name)
    ev, de = _device(trace, dev)
    kinds = ev["kind"].to_numpy()
    actions = de["action"].value_counts().to_dict()
    # The README gives entries, not frees: every entry here is alloc, free_requested,
    # free_completed, segment_* or oom (no snapshot entries), and every free is requested and completed.
    frees = (entries - allocs - seg_up - seg_down - ooms) // 2
    # Each recorded OOM's failed request is an ALLOC event too (it left no alloc entry).
    assert int((kinds == EventKind.ALLOC).sum()) == allocs + ooms
    assert int((kinds == EventKind.FREE_REQUESTED).sum()) == frees
    assert int((kinds == EventKind.FREE_COMPLETED).sum()) == frees
    assert actions.get("segment_alloc", 0) + actions.get("segment_map", 0) == seg_up
    assert actions.get("segment_free", 0) + actions.get("segment_unmap", 0) == seg_down
    assert actions.get("oom", 0) == ooms
    # Every entry is accounted for exactly once: as a decision or as a marker event.
    assert len(de) + int((kinds == EventKind.MARKER).sum()) == entries
    assert len(set(ev["stream"].tolist()) | set(de["stream"].tolist())) == streams
    assert trace.meta.time_synthesized == (not has_time)
    assert trace.meta.version_hints["time_us"] == has_time
    # Orphan frees: initial allocations of this device that the window frees.
    ia = trace.initial_allocs[trace.initial_allocs["device"] == dev]
    freed = set(ev.loc[kinds == EventKind.FREE_REQUESTED, "alloc_id"].tolist())
    assert sum(1 for a in ia["alloc_id"].tolist() if a in freed) == orphans
    assert dev in trace.meta.devices
    if ooms:
        oom = de[de["action"] == "oom"]
        assert (oom["device_free_bytes"] > 0).all() and (oom["addr"] == -1).all()
    else:
        assert (de["device_free_bytes"] == -1).all()


@pytest.mark.shared
@pytest.mark.parametrize("row", README_ROWS, ids=ROW_IDS)
def test_reserved_start_peak_final_match_readme(snapshots, row):
    name, dev = row[0], row[1]
    start, peak, final = row[10:13]
    trace = snapshots(name)
    segs = trace.initial_segments[trace.initial_segments["device"] == dev]
    reserved = int(segs["size_bytes"].sum())
    assert reserved == start
    _, de = _device(trace, dev)
    sign = de["action"].map({"segment_alloc": 1, "segment_map": 1,
                             "segment_free": -1, "segment_unmap": -1}).fillna(0).to_numpy()
    walk = reserved + np.cumsum(sign.astype(np.int64) * de["size_bytes"].to_numpy())
    assert max(reserved, int(walk.max(initial=reserved))) == peak
    assert (int(walk[-1]) if len(walk) else reserved) == final
    assert set(segs["is_expandable"].tolist()) <= {name in EXPANDABLE}


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("row", README_ROWS, ids=ROW_IDS)
def test_replay_from_start_state_reaches_final_segments(snapshots, row):
    """Replaying decisions from the reconstructed start reproduces the snapshot's final state."""
    name, dev = row[0], row[1]
    trace, raw = snapshots(name), _raw(name)
    page = 2 * MiB
    segs = trace.initial_segments[trace.initial_segments["device"] == dev]
    fixed = {int(a): int(s) for a, s, e in zip(segs["addr"], segs["size_bytes"], segs["is_expandable"]) if not e}
    mapped: set[int] = set()
    for a, s, e in zip(segs["addr"], segs["size_bytes"], segs["is_expandable"]):
        if e:
            mapped.update(range(int(a) // page, (int(a) + int(s)) // page))
    live = set(trace.initial_allocs.loc[trace.initial_allocs["device"] == dev, "addr"].tolist())
    _, de = _device(trace, dev)
    for action, a, s in zip(de["action"].tolist(), de["addr"].tolist(), de["size_bytes"].tolist()):
        if action == "alloc":
            assert a not in live
            live.add(a)
            starts = sorted(fixed)
            k = bisect.bisect_right(starts, a) - 1
            assert (k >= 0 and a < starts[k] + fixed[starts[k]]) or a // page in mapped
        elif action == "free_completed":
            live.remove(a)
        elif action == "segment_alloc":
            assert a not in fixed
            fixed[a] = s
        elif action == "segment_free":
            assert fixed.pop(a) == s
        elif action == "segment_map":
            mapped.update(range(a // page, (a + s) // page))
        elif action == "segment_unmap":
            mapped.difference_update(range(a // page, (a + s) // page))
    final = [sg for sg in raw["segments"] if sg["device"] == dev]
    assert fixed == {sg["address"]: sg["total_size"] for sg in final if not sg["is_expandable"]}
    final_pages: set[int] = set()
    for sg in final:
        if sg["is_expandable"]:
            final_pages.update(range(sg["address"] // page, (sg["address"] + sg["total_size"]) // page))
    assert mapped == final_pages
    assert live == {b["address"] for sg in final for b in sg["blocks"] if b["state"] != "inactive"}


@pytest.mark.full
@pytest.mark.shared
@pytest.mark.parametrize("name", [n for n in FILES if n not in EXPANDABLE and n != "Maphsge4"])
def test_initial_blocks_tile_initial_segments(snapshots, name):
    trace = snapshots(name)
    segs, blocks = trace.initial_segments, trace.initial_blocks
    assert len(blocks) or not len(segs)
    for dev, seg_addr, size in zip(segs["device"], segs["addr"], segs["size_bytes"]):
        b = blocks[(blocks["device"] == dev) & (blocks["segment_addr"] == seg_addr)].sort_values("addr")
        addrs, sizes = b["addr"].to_numpy(), b["size_bytes"].to_numpy()
        assert len(b) and addrs[0] == seg_addr
        assert int(sizes.sum()) == size
        assert (addrs[1:] == addrs[:-1] + sizes[:-1]).all()
        assert (sizes > 0).all()
    ia = trace.initial_allocs
    assert (ia["addr"].to_numpy() % 512 == 0).all()
    assert (ia["block_size_bytes"].to_numpy() >= ia["size_bytes"].to_numpy()).all()
    live = blocks[blocks["state"] != "inactive"]
    assert sorted(live["alloc_id"].tolist()) == sorted(ia["alloc_id"].tolist())
    assert (blocks.loc[blocks["state"] == "inactive", "alloc_id"] == -1).all()


@pytest.mark.shared
def test_metadata_of_real_snapshots(snapshots):
    cs = snapshots("Constructor-Sun")
    assert cs.meta.devices == [0, 1, 2]
    assert cs.meta.allocator_settings["expandable_segments"] is True
    assert cs.meta.version_hints["external_annotations"] and cs.meta.version_hints["compile_context"]
    ma = snapshots("Maphsge4")
    assert ma.meta.allocator_settings is None and not ma.meta.version_hints["allocator_settings"]
    assert any("time_us" in n for n in ma.meta.notes)
    assert (np.diff(ma.events["t_ns"].to_numpy()) >= 0).all()
    wt = snapshots("Wedsonlin 128 training")
    assert wt.meta.version_hints["user_metadata"]
    assert any("438 frees" in n for n in wt.meta.notes)


# ---------------------------------------------------------------------- synthetic snapshot
S = 0x10000000       # a 2 MiB small-pool segment that exists before the window
L = 0x20000000       # a 20 MiB large-pool segment created inside the window


def make_snapshot() -> dict:
    """A small, fully valid snapshot exercising every action and the start-state reconstruction."""
    def e(action, addr, size, t, **kw):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1000 + t,
                "frames": [{"filename": "x.py", "line": t, "name": "f"}], **kw}

    trace = [
        e("segment_alloc", L, 20 * MiB, 0),
        e("alloc", L, 5_000_000, 1),
        e("free_requested", S + 512, 1000, 2),     # orphan: allocated before the window
        e("free_completed", S + 512, 1000, 3),
        e("alloc", S + 512, 600, 3),
        e("snapshot", 0, 512 + 1024, 4),
        {"action": "oom", "size": 40 * MiB, "stream": 0, "time_us": 1005, "device_free": 1234, "frames": []},
        e("free_requested", L, 5_000_000, 6),
        e("free_completed", L, 5_000_000, 7),
    ]
    segments = [
        {"device": 0, "address": S, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
         "allocated_size": 1536, "active_size": 1536, "requested_size": 700, "is_expandable": False,
         "segment_pool_id": (0, 0), "frames": [],
         "blocks": [
             {"address": S, "size": 512, "requested_size": 100, "state": "active_allocated", "frames": []},
             {"address": S + 512, "size": 1024, "requested_size": 600, "state": "active_allocated", "frames": []},
             {"address": S + 1536, "size": 2 * MiB - 1536, "requested_size": 0, "state": "inactive", "frames": []},
         ]},
        {"device": 0, "address": L, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "allocated_size": 0, "active_size": 0, "requested_size": 0, "is_expandable": False,
         "segment_pool_id": (0, 0), "frames": [],
         "blocks": [{"address": L, "size": 20 * MiB, "requested_size": 5_000_000, "state": "inactive",
                     "frames": []}]},
    ]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "roundup_power2_divisions": {"1": 0}}}


def write(path: Path, obj, *, compress: bool = False) -> Path:
    data = pickle.dumps(obj, protocol=4)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_round_size():
    assert [round_size(n) for n in (0, 1, 512, 513, 1000, 5_000_000)] == [512, 512, 512, 1024, 1024, 5_000_192]


@pytest.mark.parametrize("compress", [False, True])
def test_synthetic_snapshot_reconstruction(tmp_path, compress):
    trace = read_trace(write(tmp_path / "snap.pickle", make_snapshot(), compress=compress))
    check_schema(trace)
    assert trace.meta.format == "pytorch-snapshot" and not trace.meta.repairs
    assert trace.meta.allocator_settings == {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                             "roundup_power2_divisions": {"1": 0}}
    ev = trace.events
    # The oom entry's failed request is an ALLOC event at the oom's time (it left no alloc entry).
    assert ev["kind"].tolist() == [1, 2, 3, 1, 5, 1, 2, 3]
    assert ev["t_ns"].tolist() == [1_001_000, 1_002_000, 1_003_000, 1_003_000, 1_004_000, 1_005_000,
                                   1_006_000, 1_007_000]
    assert ev["size_bytes"].tolist()[5] == 40 * MiB
    assert trace.labels == ["snapshot"]
    de = trace.decisions
    assert de["action"].tolist() == ["segment_alloc", "alloc", "free_requested", "free_completed", "alloc",
                                     "oom", "free_requested", "free_completed"]
    assert de["event_index"].tolist() == [0, 0, 1, 2, 3, 5, 6, 7]
    oom = de[de["action"] == "oom"].iloc[0]
    assert oom["addr"] == -1 and oom["device_free_bytes"] == 1234 and oom["size_bytes"] == 40 * MiB
    # Start of window: only the small segment, with the surviving block and the orphan in it.
    segs = trace.initial_segments
    assert segs[["addr", "size_bytes", "pool", "is_expandable"]].values.tolist() == [[S, 2 * MiB, "small", False]]
    ia = trace.initial_allocs.sort_values("addr")
    assert ia[["addr", "size_bytes", "block_size_bytes"]].values.tolist() == [[S, 100, 512], [S + 512, 1000, 1024]]
    blocks = trace.initial_blocks
    assert blocks[["addr", "size_bytes", "state"]].values.tolist() == [
        [S, 512, "active_allocated"], [S + 512, 1024, "active_allocated"],
        [S + 1536, 2 * MiB - 1536, "inactive"]]
    assert blocks["alloc_id"].tolist()[:2] == ia["alloc_id"].tolist()
    assert trace.meta.devices == [0]
    assert trace.meta.version_hints["allocator_settings"] and not trace.meta.version_hints["user_metadata"]


def test_segment_free_in_window_is_initial_segment(tmp_path):
    snap = make_snapshot()
    t = snap["device_traces"][0]
    t.append({"action": "segment_free", "addr": L, "size": 20 * MiB, "stream": 0, "time_us": 2000})
    t.append({"action": "segment_free", "addr": 0x30000000, "size": 2 * MiB, "stream": 7, "time_us": 2001})
    snap["segments"].pop()  # the large segment is gone at the end
    trace = read_snapshot(write(tmp_path / "s.pickle", snap))
    segs = trace.initial_segments
    # L was created and freed in the window; the 2 MiB one was freed and so existed at the start.
    assert segs[["addr", "size_bytes", "stream", "pool"]].values.tolist() == [
        [S, 2 * MiB, 0, "small"], [0x30000000, 2 * MiB, 7, "small"]]
    assert trace.initial_blocks[trace.initial_blocks["segment_addr"] == 0x30000000][
        ["size_bytes", "state"]].values.tolist() == [[2 * MiB, "inactive"]]


def test_expandable_segments_map_unmap(tmp_path):
    base, pg = 0x7000000000, 20 * MiB

    def e(action, addr, size, t):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t}

    trace = [
        e("segment_unmap", base + 2 * pg, pg, 1),      # was mapped before the window
        e("segment_map", base + 3 * pg, 2 * pg, 2),
        e("alloc", base + 3 * pg, 2 * pg, 3),
        e("segment_map", base + 2 * pg, pg, 4),
        e("segment_unmap", base + 6 * pg, pg, 5),      # a separate mapped run before the window
    ]
    segments = [{"device": 0, "address": base, "total_size": 5 * pg, "stream": 0, "segment_type": "large",
                 "is_expandable": True,
                 "blocks": [{"address": base, "size": pg, "requested_size": pg, "state": "active_allocated"},
                            {"address": base + pg, "size": 2 * pg, "requested_size": 0, "state": "inactive"},
                            {"address": base + 3 * pg, "size": 2 * pg, "requested_size": 2 * pg,
                             "state": "active_allocated"}]}]
    trace_ = read_snapshot(write(tmp_path / "x.pickle", {"segments": segments, "device_traces": [trace]}))
    segs = trace_.initial_segments
    assert segs[["addr", "size_bytes", "pool", "is_expandable"]].values.tolist() == [
        [base, 3 * pg, "large", True], [base + 6 * pg, pg, "large", True]]
    assert trace_.initial_blocks[["addr", "size_bytes", "state"]].values.tolist() == [
        [base, pg, "active_allocated"], [base + pg, 2 * pg, "inactive"], [base + 6 * pg, pg, "inactive"]]
    assert not any("reconstruction" in n for n in trace_.meta.notes)


def test_multi_device_interleaving_and_synthesised_time(tmp_path):
    def e(action, addr, size, t=None):
        d = {"action": action, "addr": addr, "size": size, "stream": 0}
        if t is not None:
            d["time_us"] = t
        return d

    timed = {"segments": [], "device_traces": [
        [e("alloc", 0x1000, 512, 5), e("free_requested", 0x1000, 512, 7), e("free_completed", 0x1000, 512, 7)],
        [e("alloc", 0x1000, 1024, 5), e("free_requested", 0x1000, 1024, 6), e("free_completed", 0x1000, 1024, 9)],
    ]}
    tr = read_snapshot(write(tmp_path / "timed.pickle", timed))
    assert list(zip(tr.events["t_ns"] // 1000, tr.events["device"], tr.events["kind"])) == [
        (5, 0, 1), (5, 1, 1), (6, 1, 2), (7, 0, 2), (7, 0, 3), (9, 1, 3)]
    assert tr.meta.devices == [0, 1] and not tr.meta.time_synthesized

    untimed = {"segments": [], "device_traces": [[{k: v for k, v in x.items() if k != "time_us"}
                                                   for x in dev] for dev in timed["device_traces"]]}
    tr = read_snapshot(write(tmp_path / "untimed.pickle", untimed))
    assert tr.meta.time_synthesized
    for dev in (0, 1):
        assert tr.events.loc[tr.events["device"] == dev, "kind"].tolist() == [1, 2, 3]
    assert (np.diff(tr.events["t_ns"].to_numpy()) >= 0).all()


def test_bare_segment_list_is_initial_state(tmp_path):
    segments = make_snapshot()["segments"]
    trace = read_snapshot(write(tmp_path / "old.pickle", segments))
    assert len(trace.events) == 0
    assert trace.initial_segments["size_bytes"].tolist() == [2 * MiB, 20 * MiB]
    assert sorted(trace.initial_allocs["size_bytes"].tolist()) == [100, 600]
    assert any("bare list" in n for n in trace.meta.notes)
    assert len(trace.initial_blocks) == 4


# ---------------------------------------------------------------------- hostile and broken input
class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Evil(marker)]]}))
    for reader in (read_snapshot, read_trace):
        with pytest.raises(UnsafePickleError) as info:
            reader(path)
        assert "evil.pickle" in str(info.value)
        assert "system" in str(info.value)
    assert not marker.exists()
    # Same through gzip, and for a persistent id.
    gz = tmp_path / "evil.pickle.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(UnsafePickleError):
        read_snapshot(gz)
    assert not marker.exists()
    pid = tmp_path / "pid.pickle"
    pid.write_bytes(b"\x80\x02X\x01\x00\x00\x00xQ.")   # PROTO 2, BINUNICODE 'x', BINPERSID, STOP
    with pytest.raises(UnsafePickleError, match="persistent"):
        read_snapshot(pid)


@pytest.mark.full
def test_resource_bombs_are_cheap(tmp_path):
    """Tiny pickles that make a naive loader use gigabytes or exponential time fail fast."""
    # LONG_BINPUT 0xffffffff: CPython's C unpickler would zero a 32 GiB memo table.
    memo = tmp_path / "memo.pickle"
    memo.write_bytes(b"\x80\x02]r\xff\xff\xff\xff.")
    assert len(read_snapshot(memo).events) == 0    # an empty bare segment list: valid, and instant
    # A dict keyed by a tuple that nests shared tuples 64 deep: hashing it takes 2**64 steps.
    t: tuple = ()
    for _ in range(64):
        t = (t, t)
    body = pickle.dumps(t, protocol=2)[2:-1]
    bomb = tmp_path / "hash.pickle"
    bomb.write_bytes(b"\x80\x02}" + body + b"K\x01s.")
    with pytest.raises(TraceFormatError, match="dict key of type tuple"):
        read_snapshot(bomb)
    # 30,000 devices sharing one 1,000-entry list: 30 million entries from a ~100 kB file.
    entry = {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}
    shared = [entry] * 1000
    big = write(tmp_path / "shared.pickle", {"segments": [], "device_traces": [shared] * 30_000})
    with pytest.raises(TraceFormatError, match="more list elements than the file has bytes"):
        read_snapshot(big)
    # Refused opcodes that would call something, even without a global.
    call = tmp_path / "call.pickle"
    call.write_bytes(b"\x80\x02]))R.")      # EMPTY_LIST, EMPTY_TUPLE, EMPTY_TUPLE, REDUCE
    with pytest.raises(UnsafePickleError):
        read_snapshot(call)


def test_size_limit(tmp_path):
    path = write(tmp_path / "big.pickle", make_snapshot())
    with pytest.raises(TraceFormatError, match="limit"):
        load_pickle(path, max_bytes=100)
    gz = write(tmp_path / "big.pickle.gz", make_snapshot(), compress=True)
    limit = gz.stat().st_size + 10        # the file fits, its decompressed content does not
    assert path.stat().st_size > limit
    with pytest.raises(TraceFormatError, match="decompressed"):
        load_pickle(gz, max_bytes=limit)
    assert isinstance(load_pickle(gz, max_bytes=path.stat().st_size), dict)


def _mutated(mutate):
    snap = make_snapshot()
    mutate(snap)
    return snap


BAD_CASES = {
    "list of ints": ([1, 2, 3], "not a dict"),
    "no device_traces": ({"segments": []}, "device_traces"),
    "not a snapshot": ("hello", "not a PyTorch memory snapshot"),
    "unknown action": (_mutated(lambda s: s["device_traces"][0][1].update(action="teleport")),
                       "device 0 entry 1: unknown action"),
    "negative size": (_mutated(lambda s: s["device_traces"][0][4].update(size=-5)),
                      "device 0 entry 4: negative size"),
    "absurd size": (_mutated(lambda s: s["device_traces"][0][4].update(size=1 << 60)),
                    "device 0 entry 4: absurd size"),
    "non-int size": (_mutated(lambda s: s["device_traces"][0][4].update(size="600")),
                     "device 0 entry 4: 'size' is not an integer"),
    "non-int addr": (_mutated(lambda s: s["device_traces"][0][4].update(addr=1.5)),
                     "device 0 entry 4: 'addr' is not an integer"),
    "entry not a dict": (_mutated(lambda s: s["device_traces"][0].insert(2, [1, 2])),
                         "device 0 entry 2: not a dict"),
    "entry lacks action": (_mutated(lambda s: s["device_traces"][0][2].pop("action")),
                           "device 0 entry 2: lacks 'action'"),
    "entry lacks size": (_mutated(lambda s: s["device_traces"][0][2].pop("size")),
                         "device 0 entry 2: lacks 'size'"),
    "entry lacks time_us": (_mutated(lambda s: s["device_traces"][0][3].pop("time_us")),
                            "device 0 entry 3: lacks 'time_us'"),
    "bad segment": (_mutated(lambda s: s["segments"][0].update(total_size=None)),
                    "segment 0: 'total_size' is not an integer"),
}


@pytest.mark.full
@pytest.mark.parametrize("case", list(BAD_CASES))
def test_malformed_input_raises_trace_format_error(tmp_path, case):
    obj, expected = BAD_CASES[case]
    path = write(tmp_path / "bad_case.pickle", obj)
    with pytest.raises(TraceFormatError) as info:
        read_snapshot(path)
    assert "bad_case.pickle" in str(info.value)
    assert expected in str(info.value)


@pytest.mark.full
@pytest.mark.parametrize("case", ["unknown action", "negative size", "absurd size", "non-int size",
                                  "non-int addr", "entry not a dict", "entry lacks action",
                                  "entry lacks size", "entry lacks time_us", "bad segment",
                                  "no device_traces"])
def test_lenient_repairs(tmp_path, case):
    obj, _ = BAD_CASES[case]
    trace = read_snapshot(write(tmp_path / "bad_case.pickle", obj), lenient=True)
    check_schema(trace)
    assert trace.meta.repairs


def test_truncated_and_empty_files(tmp_path):
    data = pickle.dumps(make_snapshot())
    for name, blob in (("empty.pickle", b""), ("trunc.pickle", data[: len(data) // 2]),
                       ("one.pickle", data[:1]), ("garbage.pickle", b"\x80\x04garbage!"),
                       ("trunc.pickle.gz", gzip.compress(data)[:40])):
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(TraceFormatError) as info:
            read_snapshot(tmp_path / name)
        assert name in str(info.value) and info.value.reason


# ---------------------------------------------------------------------- fuzzing
_VALID = pickle.dumps(make_snapshot(), protocol=4)
_FUZZ_DIR = Path(tempfile.mkdtemp(prefix="allocsim-fuzz-"))
atexit.register(shutil.rmtree, _FUZZ_DIR, True)
_FIELD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True), st.text(max_size=5), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                     "segment_map", "segment_unmap", "oom", "snapshot", "inactive",
                     "active_allocated", "active_pending_free", "small", "large"]),
)
_ENTRY_KEYS = ["action", "addr", "size", "stream", "time_us", "device_free"]
_SEG_KEYS = ["device", "address", "total_size", "stream", "segment_type", "is_expandable", "blocks"]
_BLOCK_KEYS = ["address", "size", "requested_size", "state"]


def _check(blob: bytes) -> None:
    path = _FUZZ_DIR / "fuzz.pickle"
    path.write_bytes(blob)
    try:
        trace = read_snapshot(path)
    except TraceFormatError:
        return
    assert isinstance(trace, Trace)
    check_schema(trace)


@pytest.mark.full
@settings(max_examples=70, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(min_value=0, max_value=len(_VALID)))
def test_fuzz_truncation(cut):
    _check(_VALID[:cut])


@pytest.mark.full
@settings(max_examples=70, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=len(_VALID) - 1), st.integers(0, 255)),
                min_size=1, max_size=4))
def test_fuzz_byte_flips(flips):
    blob = bytearray(_VALID)
    for pos, value in flips:
        blob[pos] = value
    _check(bytes(blob))


def _pick_target(snap, where: str, data):
    """The dict to mutate (an entry, segment, block or the top level), or None if it is gone."""
    try:
        if where == "entry":
            entries = snap["device_traces"][0]
            return entries[data.draw(st.integers(0, len(entries) - 1))], _ENTRY_KEYS
        if where == "segment":
            return snap["segments"][data.draw(st.integers(0, len(snap["segments"]) - 1))], _SEG_KEYS
        if where == "block":
            blocks = snap["segments"][0]["blocks"]
            return blocks[data.draw(st.integers(0, len(blocks) - 1))], _BLOCK_KEYS
        return snap, ["segments", "device_traces", "allocator_settings"]
    except (TypeError, IndexError, KeyError, AttributeError):
        return None, None


@pytest.mark.full
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_field_mutations(data):
    snap = copy.deepcopy(make_snapshot())
    for _ in range(data.draw(st.integers(1, 3))):
        target, keys = _pick_target(snap, data.draw(st.sampled_from(["entry", "segment", "block", "top"])), data)
        if not isinstance(target, dict):
            continue
        key = data.draw(st.sampled_from(keys))
        if data.draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = data.draw(_FIELD_VALUES)
    blob = pickle.dumps(snap, protocol=4)
    _check(blob)
    # Lenient mode must not fail in any other way either.
    path = _FUZZ_DIR / "fuzz_lenient.pickle"
    path.write_bytes(blob)
    try:
        check_schema(read_snapshot(path, lenient=True))
    except TraceFormatError:
        pass
