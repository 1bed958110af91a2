"""Hostile and valid trace files for the attack suite, one generator per class of attack.

Each generator writes a file into a folder and returns ``(path, expected)``: ``expected`` is None
for a hostile file (any clean outcome will do) or the counts an independent recount of a valid
file gives (``allocs``, ``frees``, ``peak_live_bytes``), which ``allocsim info --json`` must match.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import random
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MiB = 1 << 20

Generator = Callable[[Path, random.Random], tuple[Path, dict | None]]


def _recount(ops: list[tuple[str, int, int]]) -> dict:
    """Allocs, frees and peak live bytes of (action, addr, size) requests, counted plainly."""
    live: dict[int, int] = {}
    peak = cur = allocs = frees = 0
    for action, addr, size in ops:
        if action == "alloc":
            live[addr] = size
            cur += size
            allocs += 1
            peak = max(peak, cur)
        else:
            cur -= live.pop(addr)
            frees += 1
    return {"allocs": allocs, "frees": frees, "peak_live_bytes": peak}


def _random_ops(rng: random.Random, n: int) -> list[tuple[str, int, int]]:
    ops, live = [], []
    next_addr = 1 << 30
    for _ in range(n):
        if live and rng.random() < 0.45:
            addr, size = live.pop(rng.randrange(len(live)))
            ops.append(("free", addr, size))
        else:
            size = rng.choice([512, 4096, 1 << 20, 3 << 20])
            ops.append(("alloc", next_addr, size))
            live.append((next_addr, size))
            next_addr += 32 * MiB
    return ops


# ------------------------------------------------------------------------------- valid files
def valid_snapshot(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    ops = _random_ops(rng, rng.randint(5, 60))
    entries = []
    for i, (action, addr, size) in enumerate(ops):
        frames = [{"filename": "train.py", "line": 10 + i % 3, "name": "step"}]
        if action == "alloc":
            entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": i, "frames": frames})
        else:
            for act in ("free_requested", "free_completed"):
                entries.append({"action": act, "addr": addr, "size": size, "stream": 0, "time_us": i, "frames": frames})
    path = folder / f"valid_{rng.randrange(1 << 30)}.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    return path, _recount(ops)


def valid_kineto(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    ops = _random_ops(rng, rng.randint(5, 60))
    events = [{"ph": "i", "name": "[memory]", "ts": i + 0.5, "pid": 1, "tid": 1,
               "args": {"Addr": addr, "Bytes": size if action == "alloc" else -size, "Device Type": 1,
                        "Device Id": 0}} for i, (action, addr, size) in enumerate(ops)]
    path = folder / f"valid_{rng.randrange(1 << 30)}.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path, _recount(ops)


def valid_rmm(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    ops = _random_ops(rng, rng.randint(5, 60))
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i, (action, addr, size) in enumerate(ops):
        lines.append(f"1,10:00:{i // 1000:02d}.{i % 1000:06d},{'allocate' if action == 'alloc' else 'free'},"
                     f"0x{addr:x},{size},0x0")
    path = folder / f"valid_{rng.randrange(1 << 30)}.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, _recount(ops)


VALID: dict[str, Generator] = {"snapshot": valid_snapshot, "kineto": valid_kineto, "rmm": valid_rmm}


# ------------------------------------------------------------------------------- hostile files
def bomb_json_gz(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Decompression bomb: a few hundred KB of gzip expanding to hundreds of MB of whitespace."""
    path = folder / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [')
        chunk = b" " * (16 * MiB)
        for _ in range(rng.choice([16, 24])):
            fh.write(chunk)
        fh.write(b"]}")
    return path, None


def bomb_pickle_gz(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Decompression bomb: a pickle of one huge string, gzipped."""
    body = b"\x80\x04\x8d" + struct.pack("<Q", 400 * MiB)
    path = folder / "bomb.pickle.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(body)
        chunk = b"a" * (16 * MiB)
        for _ in range(25):
            fh.write(chunk)
        fh.write(b".")
    return path, None


def amplified_csv_gz(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Amplification: a small gzip of millions of tiny RMM rows."""
    path = folder / "many_rows.csv.gz"
    with gzip.open(path, "wt", compresslevel=9) as fh:
        fh.write("Action,Pointer,Size\n")
        fh.write("allocate,0x1,0\nfree,0x1,0\n" * 5_000_000)
    return path, None


def empty_containers_pickle(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Amplification: a pickle made of millions of empty containers."""
    n = 2_000_000
    path = folder / "empty.pickle"
    path.write_bytes(b"\x80\x04}(X\x08\x00\x00\x00segments](" + b"}" * n
                     + b"eX\x0d\x00\x00\x00device_traces]u.")
    return path, None


def many_devices_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Quadratic structure: a snapshot with tens of thousands of devices."""
    entry = {"action": "alloc", "addr": 512, "size": 512, "stream": 0, "time_us": 1}
    traces = [[dict(entry, addr=512 * (d + 1))] for d in range(rng.choice([2000, 32000]))]
    path = folder / "devices.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": traces}, protocol=4))
    return path, None


def many_devices_kineto(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Quadratic structure: a Kineto file with thousands of device ids."""
    events = [{"ph": "i", "name": "[memory]", "ts": i, "args": {"Addr": 4096 * (i + 1), "Bytes": 512,
                                                               "Device Type": 2 + i // 250, "Device Id": i % 250}}
              for i in range(20000)]
    path = folder / "devices.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path, None


def colliding_addresses_rmm(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Hash collisions: addresses equal modulo 2**61 - 1 and spread over the low bits of dict slots."""
    p = (1 << 61) - 1
    lines = ["Action,Pointer,Size"]
    for i in range(50_000):
        addr = (i << 40) % p + (1 << 20)
        lines.append(f"allocate,{addr:x},512")
    path = folder / "collide.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, None


def many_segments_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Quadratic structure: 40k map events and as many unmaps of one expandable segment."""
    n = 40_000
    entries = [{"action": "segment_map", "addr": (1 << 40) + i * 20 * MiB, "size": 20 * MiB, "stream": 0,
                "time_us": i} for i in range(n)]
    entries += [{"action": "segment_unmap", "addr": (1 << 40) + i * 20 * MiB, "size": 20 * MiB, "stream": 0,
                 "time_us": n + i} for i in range(n)]
    path = folder / "maps.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    return path, None


def corrupt_deflate(folder: Path, rng: random.Random) -> tuple[Path, None]:
    data = bytearray(gzip.compress(b"Action,Pointer,Size\n" + b"allocate,0x100,512\n" * 5000))
    for _ in range(8):
        data[rng.randrange(20, len(data) - 10)] = rng.randrange(256)
    path = folder / "corrupt.csv.gz"
    path.write_bytes(bytes(data))
    return path, None


def bad_settings_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    settings = rng.choice([{"max_split_size": None}, {"max_split_size": [1]},
                           {"garbage_collection_threshold": [0.6]}, {"roundup_power2_divisions": {"1": [2]}}])
    entries = [{"action": "alloc", "addr": 512, "size": 512, "stream": 0, "time_us": 1}]
    path = folder / "settings.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries], "allocator_settings": settings}))
    return path, None


def wrapping_sums_parquet(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """Silent wrong numbers: live bytes past 2**63, or times near the int64 limit."""
    n = 9000
    t = np.arange(n, dtype=np.int64)
    if rng.random() < 0.5:
        t = t + ((1 << 63) - n - 1)
    table = pa.table({"t_ns": t, "kind": np.ones(n, np.uint8), "alloc_id": np.arange(n, dtype=np.int64),
                      "size_bytes": np.full(n, 1 << 50, np.int64), "stream": np.zeros(n, np.int64),
                      "device": np.zeros(n, np.int16)})
    path = folder / "wrap.parquet"
    pq.write_table(table, path)
    return path, None


def side_table_bomb_parquet(folder: Path, rng: random.Random) -> tuple[Path, None]:
    n = 8_000_000
    frame = pa.table({"alloc_id": np.zeros(n, np.int64), "size_bytes": np.zeros(n, np.int64),
                      "stream": np.zeros(n, np.int64), "device": np.zeros(n, np.int16),
                      "addr": np.zeros(n, np.int64), "block_size_bytes": np.zeros(n, np.int64)})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, frame.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(frame)
    events = pa.table({"t_ns": np.zeros(1, np.int64), "kind": np.ones(1, np.uint8), "alloc_id": np.zeros(1, np.int64),
                       "size_bytes": np.full(1, 512, np.int64), "stream": np.zeros(1, np.int64),
                       "device": np.zeros(1, np.int16)})
    path = folder / "side.parquet"
    pq.write_table(events.replace_schema_metadata({b"allocsim.initial_allocs": sink.getvalue()}), path)
    return path, None


def huge_string_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    entries = [{"action": "x" * 5_000_000, "addr": 512, "size": 512, "stream": 0}]
    path = folder / "string.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}))
    return path, None


def huge_number_kineto(folder: Path, rng: random.Random) -> tuple[Path, None]:
    path = folder / "number.json"
    path.write_text('{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Addr": 4096, "Bytes": '
                    + "9" * 4300 + ', "Device Type": 1, "Device Id": 0}}]}')
    return path, None


def special_directory(folder: Path, rng: random.Random) -> tuple[Path, None]:
    path = folder / "a_directory.pickle"
    path.mkdir(exist_ok=True)
    return path, None


def special_fifo(folder: Path, rng: random.Random) -> tuple[Path, None]:
    path = folder / "fifo.pickle"
    if not path.exists():
        os.mkfifo(path)
    return path, None


# ------------------------------------------------------------- impossible final states and misnamed files
_A = 1 << 40
_FRAMES = [{"filename": "train.py", "line": 1, "name": "step"}]


def _snapshot_with_state(folder: Path, name: str, segment: dict) -> Path:
    """A snapshot whose final state is ``segment`` and whose history allocates and frees one block."""
    addr = segment["address"] + segment["total_size"] - 512
    history = [{"action": act, "addr": addr, "size": 512, "stream": 0, "time_us": t, "frames": _FRAMES}
               for t, act in enumerate(("alloc", "free_requested", "free_completed"))]
    path = folder / name
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [history]}, protocol=4))
    return path


def _segment(total: int, pool: str, live_size: int, requested: int) -> dict:
    return {"device": 0, "address": _A, "total_size": total, "stream": 0, "segment_type": pool,
            "blocks": [{"address": _A, "size": live_size, "requested_size": requested, "state": "active_allocated",
                        "frames": _FRAMES},
                       {"address": _A + live_size, "size": total - live_size, "requested_size": 0,
                        "state": "inactive"}]}


def requested_over_size_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A live block whose requested_size exceeds its size (was an AttributionError in ``run``)."""
    size = rng.choice([512, 1024, 4096])
    return _snapshot_with_state(folder, "requested.pickle", _segment(2 * MiB, "small", size, size + 512 * rng.randint(1, 8))), None


def small_block_large_pool_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A 512 B live block in a large-pool segment (was an AttributionError / SiteAccountingError)."""
    return _snapshot_with_state(folder, "pool.pickle", _segment(20 * MiB, "large", 512 * rng.randint(1, 2048), 512)), None


def tiny_segment_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A 2 KiB segment (was a SiteAccountingError once one 512 B block came and went)."""
    total = rng.choice([2048, 4096, 3 * MiB])
    return _snapshot_with_state(folder, "tiny.pickle", _segment(total, "small", 512, 512)), None


def odd_block_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A live block whose size is not a multiple of 512 (was an AssertionError in ``validate``)."""
    size = rng.choice([1000, 513, 4097])
    return _snapshot_with_state(folder, "odd.pickle", _segment(2 * MiB, "small", size, size)), None


def png_named_pickle(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A PNG image renamed ``.pickle`` (was "refused persistent id")."""
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    side = rng.randint(1, 16)
    pixels = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(3 * side)) for _ in range(side))
    path = folder / "picture.pickle"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(pixels)) + chunk(b"IEND", b""))
    return path, None


def bytearray_pickle(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """BYTEARRAY8 with a length past the data (printed a stray SystemError line before the error)."""
    path = folder / "bytearray.pickle"
    path.write_bytes(b"\x80\x05\x96" + struct.pack("<Q", rng.choice([1 << 40, 1 << 62])) + b"0123.")
    return path, None


def hex_size_rmm(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """RMM sizes written in hex: one rule on both routes (Arrow's cast read them silently)."""
    n = rng.randint(1, 50)
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i in range(n):
        size = f"0x{512 * (i + 1):x}" if i == n - 1 else str(512 * (i + 1))
        lines.append(f"1,10:00:00.{i:06d},allocate,0x{4096 * (i + 1):x},{size},0x0")
    path = folder / "hex.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, None


def deep_json_kineto(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """JSON nested past ``--limits depth`` inside a Kineto event (only the compiled route capped it)."""
    depth = rng.randint(70, 5000)
    event = ('{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Addr": 4096, "Bytes": 512, "Device Type": 1, '
             '"Device Id": 0, "x": ' + "[" * depth + "]" * depth + "}}")
    path = folder / "deep.json"
    path.write_text('{"traceEvents": [' + event + "]}")
    return path, None


#: Generator -> what ``allocsim info`` must say about its file (exit 2, the same line on both routes).
EXPECTED_REFUSALS: dict[str, str] = {
    "requested over size": "is more than the block's size",
    "small block in large pool": "is in the large pool",
    "tiny segment": "is not a multiple of 2 MiB",
    "odd live block": "is not a multiple of 512",
    "png named pickle": "not a pickle: it is a PNG image",
    "bytearray opcode": "bytearray / out-of-band buffer opcodes",
    "rmm hex size": "RMM logs sizes in decimal",
    "deep json": "over the limit depth=64",
}

#: Class of attack -> its generators.
HOSTILE: dict[str, dict[str, Generator]] = {
    "decompression bomb": {"json.gz": bomb_json_gz, "pickle.gz": bomb_pickle_gz, "parquet side table": side_table_bomb_parquet},
    "amplification": {"csv.gz rows": amplified_csv_gz, "empty containers": empty_containers_pickle},
    "quadratic structure": {"snapshot devices": many_devices_snapshot, "kineto devices": many_devices_kineto,
                            "address collisions": colliding_addresses_rmm, "map events": many_segments_snapshot},
    "traceback": {"corrupt deflate": corrupt_deflate, "settings types": bad_settings_snapshot,
                  "directory": special_directory, "fifo": special_fifo,
                  "requested over size": requested_over_size_snapshot,
                  "small block in large pool": small_block_large_pool_snapshot,
                  "tiny segment": tiny_segment_snapshot, "odd live block": odd_block_snapshot,
                  "deep json": deep_json_kineto},
    "wrong numbers": {"wrapping sums": wrapping_sums_parquet, "rmm hex size": hex_size_rmm},
    "messages": {"huge string": huge_string_snapshot, "huge number": huge_number_kineto,
                 "png named pickle": png_named_pickle, "bytearray opcode": bytearray_pickle},
}


# ------------------------------------------------------------------------------- round 2: wrong numbers
# These files are valid: each returns the recount that ``info --json`` must report, so a reader that
# reads a gzip member twice or drops the rest of a file fails on the numbers, not only on a crash.
def _rmm_text(ops: list[tuple[str, int, int]]) -> bytes:
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i, (action, addr, size) in enumerate(ops):
        lines.append(f"1,10:{i // 60_000_000:02d}:{i // 1_000_000 % 60:02d}.{i % 1_000_000:06d},"
                     f"{'allocate' if action == 'alloc' else 'free'},0x{addr:x},{size},0x0")
    return ("\n".join(lines) + "\n").encode()


def _kineto_text(ops: list[tuple[str, int, int]]) -> bytes:
    events = [{"ph": "i", "name": "[memory]", "ts": i + 0.5, "pid": 1, "tid": 1,
               "args": {"Addr": addr, "Bytes": size if action == "alloc" else -size, "Device Type": 1,
                        "Device Id": 0}} for i, (action, addr, size) in enumerate(ops)]
    return json.dumps({"traceEvents": events}).encode()


def _split_members(text: bytes, cuts: list[int], level: int = 6) -> bytes:
    """``text`` as concatenated gzip members (``gzip -c a b > c``) cut at the byte offsets ``cuts``."""
    bounds = [0, *sorted(cuts), len(text)]
    return b"".join(gzip.compress(text[a:b], compresslevel=level) for a, b in zip(bounds, bounds[1:]))


def members_kineto(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """Two or three gzip members of one Kineto file, each inflating past the 1 MiB read step."""
    ops = _random_ops(rng, 30_000)
    text = _kineto_text(ops)
    cuts = rng.sample(range(1, len(text)), rng.choice([1, 2]))
    path = folder / "members.json.gz"
    path.write_bytes(_split_members(text, cuts))
    return path, _recount(ops)


def members_big_then_small_rmm(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """A big member then a small one holding the last row, which a double read counts twice."""
    ops = _random_ops(rng, 30_001)
    text = _rmm_text(ops)
    last_row = text.rindex(b"\n", 0, len(text) - 1) + 1
    path = folder / "big_small.csv.gz"
    path.write_bytes(_split_members(text, [last_row]))
    return path, _recount(ops)


def _member(payload: bytes, comment_bytes: int = 0) -> bytes:
    """One gzip member of ``payload`` whose header carries a comment of ``comment_bytes`` (to size it)."""
    flags = 0x10 if comment_bytes else 0
    header = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\xff"
    if comment_bytes:
        header += b"c" * (comment_bytes - 1) + b"\0"
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = deflate.compress(payload) + deflate.flush()
    return header + body + struct.pack("<II", zlib.crc32(payload), len(payload) & 0xFFFFFFFF)


def members_empty_on_boundary_rmm(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """A member and an empty one ending exactly on the 1 MiB read step, then the rest, which holds the peak."""
    ops = _random_ops(rng, 600)
    sizes = {}
    for i, (action, addr, size) in enumerate(ops):
        sizes.setdefault(addr, size << 15 if i >= 500 else size)   # the tail's allocations reach ~100 GiB
    ops = [(action, addr, sizes[addr]) for action, addr, _ in ops]
    text = _rmm_text(ops)
    cut = text.index(b"\n", len(text) * 5 // 6) + 1
    empty = _member(b"")
    first = _member(text[:cut])
    first = _member(text[:cut], MiB - len(first) - len(empty))
    assert len(first) + len(empty) == MiB
    path = folder / "empty_member.csv.gz"
    path.write_bytes(first + empty + _member(text[cut:]))
    return path, _recount(ops)


def members_many_empty_rmm(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """200k empty gzip members between two halves of a file (each member once copied the rest)."""
    ops = _random_ops(rng, 200)
    text = _rmm_text(ops)
    cut = text.index(b"\n", len(text) // 2) + 1
    path = folder / "many_members.csv.gz"
    path.write_bytes(gzip.compress(text[:cut]) + gzip.compress(b"") * 200_000 + gzip.compress(text[cut:]))
    return path, _recount(ops)


HOSTILE["gzip members"] = {"kineto": members_kineto, "big then small": members_big_then_small_rmm,
                           "empty on boundary": members_empty_on_boundary_rmm, "many empty": members_many_empty_rmm}


# ------------------------------------------------------------------------------- round 2: output targets
# What ``-o`` names can be hostile too. Each generator makes a target in ``folder`` and returns it with
# a check that it is untouched afterwards; every command must refuse it with one line naming it.
OutputTarget = Callable[[Path], tuple[str, Callable[[], bool]]]


def target_fifo(folder: Path) -> tuple[str, Callable[[], bool]]:
    path = folder / "pipe.parquet"
    os.mkfifo(path)
    return str(path), lambda: path.is_fifo() and not Path(f"{path}.parts").exists()


def target_link_to_device(folder: Path) -> tuple[str, Callable[[], bool]]:
    """A link to /dev/null (through a link, so a broken check replaces the link, never the device)."""
    path = folder / "null.parquet"
    path.symlink_to("/dev/null")
    return str(path), lambda: path.is_symlink() and Path("/dev/null").is_char_device() \
        and not Path(f"{path}.parts").exists()


def target_foreign_file(folder: Path) -> tuple[str, Callable[[], bool]]:
    """A regular file this program did not write (a user's notes named like a results file)."""
    path = folder / "notes.parquet"
    path.write_bytes(b"precious")
    return str(path), lambda: path.read_bytes() == b"precious" and not Path(f"{path}.parts").exists()


def target_missing_parent(folder: Path) -> tuple[str, Callable[[], bool]]:
    path = folder / "no" / "such" / "out.parquet"
    return str(path), lambda: not (folder / "no").exists()


def target_proc(folder: Path) -> tuple[str, Callable[[], bool]]:
    """A folder that exists but takes no new files (permission bits do not tell, as root)."""
    return "/proc/nope.parquet", lambda: not os.path.exists("/proc/nope.parquet")


#: Output targets every ``-o`` must refuse (see ``tests/test_attack.py``).
OUTPUT_TARGETS: dict[str, OutputTarget] = {
    "fifo": target_fifo, "link to /dev/null": target_link_to_device, "foreign file": target_foreign_file,
    "missing parent": target_missing_parent, "/proc": target_proc}


# ------------------------------------------------------------------------------- round 2: bombs and slow paths
def variable_width_parquet(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A few-KB Parquet whose dictionary string column repeats one 2 MiB value on every row (GBs decoded)."""
    n = 1000
    value = "7" * (2 * MiB) if rng.random() < 0.5 else "x" * (2 * MiB)
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))
    table = pa.table({"t_ns": np.arange(n, dtype=np.int64), "kind": np.ones(n, np.uint8),
                      "alloc_id": np.arange(n, dtype=np.int64), "size_bytes": column,
                      "stream": np.zeros(n, np.int64), "device": np.zeros(n, np.int16)})
    path = folder / "wide.parquet"
    pq.write_table(table, path, compression="zstd")
    return path, None


HOSTILE["bombs round 2"] = {"parquet variable width": variable_width_parquet}


def shared_filename_snapshot(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """20k frames sharing one 65,000-character filename (one pickled string, memoised): a small file."""
    filename = "f" * 65_000
    n = 20_000
    entries = [{"action": "alloc", "addr": 512 * (i + 1), "size": 512, "stream": 0, "time_us": i,
                "frames": [{"filename": filename, "line": i, "name": "step"}]} for i in range(n)]
    path = folder / "shared_filename.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    return path, None


HOSTILE["bombs round 2"]["shared filename"] = shared_filename_snapshot


def _unmix(h: int) -> int:
    """The inverse of the splitmix64 finaliser (``u64_mix``): the id whose plain mix is ``h``."""
    mask = (1 << 64) - 1

    def unshift(x: int, s: int) -> int:
        y = x
        for _ in range(64 // s + 1):
            y = x ^ (y >> s)
        return y & mask

    h = unshift(h, 31)
    h = (h * pow(0x94d049bb133111eb, -1, 1 << 64)) & mask
    h = unshift(h, 27)
    h = (h * pow(0xbf58476d1ce4e5b9, -1, 1 << 64)) & mask
    return unshift(h, 30)


def colliding_ids_parquet(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """Allocation ids whose unkeyed mix shares its low 24 bits: one probe run for the live table."""
    n = 40_000
    ids = [_unmix(k << 24) for k in range(1, n + 1)]
    ids = [i - (1 << 64) if i >= 1 << 63 else i for i in ids]
    order = ids + ids[::-1]
    kinds = [1] * n + [2] * n          # every allocation, then every free (latest first)
    table = pa.table({"t_ns": np.arange(2 * n, dtype=np.int64), "kind": np.array(kinds, np.uint8),
                      "alloc_id": np.array(order, np.int64), "size_bytes": np.full(2 * n, 512, np.int64),
                      "stream": np.zeros(2 * n, np.int64), "device": np.zeros(2 * n, np.int16)})
    path = folder / "colliding_ids.parquet"
    pq.write_table(table, path)
    return path, {"allocs": n, "frees": n, "peak_live_bytes": 512 * n}


HOSTILE["bombs round 2"]["colliding ids"] = colliding_ids_parquet


def opcodes_pickle_gz(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """A small gzip file of 64 MiB of pickle opcodes (a snapshot with one huge list of small ints):
    the C unpickler's time must be sized from the decompressed bytes, not the file's."""
    batch = b"(" + b"K\x01" * 1000 + b"e"
    body = (b"\x80\x04}(X\x08\x00\x00\x00segments]X\x0d\x00\x00\x00device_traces]]aX\x04\x00\x00\x00junk]"
            + batch * (32 * MiB // len(batch) * 2) + b"u.")
    path = folder / "opcodes.pickle.gz"
    path.write_bytes(gzip.compress(body, compresslevel=6))
    return path, None


# Seconds of CPU even when right: under -m slow only.
HOSTILE["slow bombs round 2"] = {"pickle opcodes": opcodes_pickle_gz}


def nested_ops_kineto(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """4,400 nested ops, each allocating inside its parent: every stack is one deeper (millions of
    frame rows in the stacks table), which ``convert`` must write so that it reads back."""
    depth = 4400
    events = []
    for i in range(depth):   # op i spans [i, 2 * depth - i): each one encloses the next
        events.append({"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i, "dur": 2 * (depth - i),
                       "pid": 1, "tid": 1})
    ops = []
    for i in range(depth):
        addr = (1 << 30) + i * 4096
        ops.append(("alloc", addr, 512))
        events.append({"ph": "i", "name": "[memory]", "ts": i + 0.5, "pid": 1, "tid": 1,
                       "args": {"Addr": addr, "Bytes": 512, "Device Type": 1, "Device Id": 0}})
    path = folder / "nested_ops.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path, _recount(ops)


def colliding_keys_pickle(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """100,000 dict keys that are multiples of 2**61 - 1: one hash for all of them in CPython."""
    p = (1 << 61) - 1
    items = []
    for k in range(1, 100_001):       # written as opcodes: building the dict here would be quadratic
        raw = (k * p).to_bytes(11, "little", signed=True)
        items.append(b"\x8a\x0b" + raw + b"K\x00")          # LONG1 key, BININT1 0
    body = (b"\x80\x04}(X\x08\x00\x00\x00segments]X\x0d\x00\x00\x00device_traces]]aX\x04\x00\x00\x00junk}("
            + b"".join(items) + b"uu.")
    path = folder / "colliding_keys.pickle"
    path.write_bytes(body)
    return path, None


HOSTILE["bombs round 2"]["colliding keys"] = colliding_keys_pickle


def many_streams_rmm(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """60k streams, one allocation each: every new peak asked every stream for its largest free block."""
    n = 60_000
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i in range(2 * n):
        k = i if i < n else 2 * n - 1 - i
        lines.append(f"1,10:00:{i // 1_000_000:02d}.{i % 1_000_000:06d},{'allocate' if i < n else 'free'},"
                     f"0x{(1 << 30) + k * 4096:x},512,0x{k + 1:x}")
    path = folder / "streams.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, {"allocs": n, "frees": n, "peak_live_bytes": 512 * n}


HOSTILE["slow bombs round 2"]["many streams"] = many_streams_rmm


def many_initial_segments_snapshot(folder: Path, rng: random.Random, n_segments: int = 40_000) -> tuple[Path, dict]:
    """40k initial segments, each holding live blocks whose stacks are shared among thousands of sites:
    charging waste to code sites asked every free block for a copy of every segment (quadratic)."""
    sites = [[{"filename": f"model/layer{(s * 7 + d) % 50}.py", "line": (s * 13 + d) % 997, "name": f"fn{(s + d) % 300}"}
              for d in range(rng.randint(2, 8))] for s in range(max(1, n_segments // 8))]
    segments, baseline = [], 0
    for k in range(n_segments):
        base, offset, blocks = _A + k * 2 * MiB, 0, []
        for _ in range(rng.randint(1, 4)):
            size = 512 * rng.randint(1, 64)
            blocks.append({"address": base + offset, "size": size, "requested_size": size, "state": "active_allocated",
                           "frames": rng.choice(sites)})   # one list object: pickled once, shared
            offset += size
            baseline += size
        blocks.append({"address": base + offset, "size": 2 * MiB - offset, "requested_size": 0, "state": "inactive"})
        segments.append({"device": 0, "address": base, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
                         "blocks": blocks})
    ops = _random_ops(rng, 400)
    live = {addr: size for action, addr, size in ops if action == "alloc"}
    for action, addr, _size in ops:
        if action == "free":
            del live[addr]
    ops += [("free", addr, size) for addr, size in live.items()]   # the final segments are the initial ones
    top = _A + n_segments * 2 * MiB                    # the history's blocks lie past the initial segments
    history = []
    for t, (action, addr, size) in enumerate(ops):
        frames = rng.choice(sites)
        acts = ("alloc",) if action == "alloc" else ("free_requested", "free_completed")
        history += [{"action": act, "addr": top + addr, "size": size, "stream": 0, "time_us": t, "frames": frames}
                    for act in acts]
    path = folder / "initial_segments.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [history]}, protocol=4))
    return path, {**_recount(ops), "initial_segments": n_segments, "baseline_live_bytes": baseline}


HOSTILE["slow bombs round 2"]["many initial segments"] = many_initial_segments_snapshot


def streams_taking_the_largest_rmm(folder: Path, rng: random.Random, n: int = 60_000) -> tuple[Path, dict]:
    """Each of 60k streams caches one 32 MiB block, then takes it back and at once needs a new segment:
    every new reserved peak followed the take of the largest free block, which made the free list look
    for the next largest over every stream (quadratic on both routes)."""
    size = 32 * MiB                  # a whole large-pool segment: the cached block is exactly the size asked
    requests = [("alloc", (1 << 30) + k * size, size, k + 1) for k in range(n)]
    requests += [("free", addr, s, stream) for _a, addr, s, stream in requests]
    for k in range(n):
        requests += [("alloc", (1 << 30) + k * size, size, k + 1), ("alloc", (1 << 46) + k * size, size, k + 1)]
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i, (action, addr, s, stream) in enumerate(requests):
        lines.append(f"1,10:{i // 60_000_000:02d}:{i // 1_000_000 % 60:02d}.{i % 1_000_000:06d},"
                     f"{'allocate' if action == 'alloc' else 'free'},0x{addr:x},{s},0x{stream:x}")
    path = folder / "streams_largest.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, _recount([r[:3] for r in requests])


HOSTILE["slow bombs round 2"]["streams taking the largest"] = streams_taking_the_largest_rmm


def tiny_blocks_snapshot(folder: Path, rng: random.Random, n_blocks: int = 10_000_000) -> tuple[Path, dict | None]:
    """10^7 live 512 B blocks (130 MB of pickle): under a 4 GiB address-space cap the compiled scan
    ran out of memory the budget allowed, and the file went to the reference route for minutes, which
    then blamed ``memory_bytes``. It must be refused at once, naming the process's limit."""
    per_segment = 4096                                      # 2 MiB small-pool segments, tiled by 512 B blocks
    n_segments = -(-n_blocks // per_segment)
    segments = [{"device": 0, "address": _A + k * 2 * MiB, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
                 "blocks": [{"size": 512, "state": "active_allocated"} for _ in range(per_segment)]}
                for k in range(n_segments)]
    path = folder / f"tiny_blocks_{n_blocks}.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [[]]}, protocol=4))
    recount = {"allocs": 0, "frees": 0, "baseline_live_bytes": 512 * per_segment * n_segments}
    return path, recount if n_blocks < 5_000_000 else None     # 10^7: refused under the suite's cap


def fitting_tiny_blocks_snapshot(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """10^6 live 512 B blocks: under a 4 GiB cap they fit, and must be read (on the compiled route where built)."""
    return tiny_blocks_snapshot(folder, rng, 1_000_000)


HOSTILE["slow bombs round 2"]["tiny blocks over the process limit"] = tiny_blocks_snapshot
HOSTILE["slow bombs round 2"]["tiny blocks within the process limit"] = fitting_tiny_blocks_snapshot


def _odd_columns(n: int) -> dict[str, Callable[[], pa.Array]]:
    """Arrow types a Parquet column can hold that are no integer: each must give one clean line."""
    import datetime
    import decimal

    def ext(make_type: str, storage: pa.Array, *args) -> pa.Array:
        return pa.ExtensionArray.from_storage(getattr(pa, make_type)(*args), storage)

    return {
        "decimal128": lambda: pa.array([decimal.Decimal(512)] * n, pa.decimal128(20, 0)),
        "decimal256": lambda: pa.array([decimal.Decimal(10) ** 70] * n, pa.decimal256(76, 0)),
        "decimal256 fraction": lambda: pa.array([decimal.Decimal("512.5")] * n, pa.decimal256(60, 1)),
        "list": lambda: pa.array([[512]] * n, pa.list_(pa.int64())),
        "list of lists": lambda: pa.array([[[[512]]]] * n),
        "fixed-size list": lambda: pa.array([[512, 1]] * n, pa.list_(pa.int64(), 2)),
        "struct": lambda: pa.array([{"a": 512}] * n, pa.struct([("a", pa.int64())])),
        "map": lambda: pa.array([[("a", 512), ("a", 1)]] * n, pa.map_(pa.string(), pa.int64())),
        "dictionary of ints": lambda: pa.array([512] * n).dictionary_encode(),
        "dictionary with nulls": lambda: pa.DictionaryArray.from_arrays(pa.array([0, None] * (n // 2), pa.int32()),
                                                                        pa.array(["512"])),
        "fixed-size binary": lambda: pa.array([b"12345678"] * n, pa.binary(8)),
        "float16": lambda: pa.array(np.full(n, np.inf, np.float16)),
        "date32": lambda: pa.array([datetime.date(9999, 12, 31)] * n),
        "time64": lambda: pa.array([1000] * n, pa.time64("us")),
        "timestamp, unknown zone": lambda: pa.array([1] * n, pa.timestamp("s", tz="Mars/Olympus")),
        "duration": lambda: pa.array([1 << 62] * n, pa.duration("s")),
        "null": lambda: pa.nulls(n),
        "uint64 past int64": lambda: pa.array([(1 << 64) - 1] * n, pa.uint64()),
        "extension uuid": lambda: ext("uuid", pa.array([b"0123456789abcdef"] * n, pa.binary(16))),
        "extension bool8": lambda: ext("bool8", pa.array([1] * n, pa.int8())),
        "extension json": lambda: ext("json_", pa.array(["512"] * n)),
        "extension tensor": lambda: ext("fixed_shape_tensor", pa.array([[512]] * n, pa.list_(pa.int64(), 1)),
                                        pa.int64(), [1]),
        "extension opaque": lambda: ext("opaque", pa.array([512] * n), pa.int64(), "x", "y"),
    }


def odd_type_parquet(folder: Path, rng: random.Random, kind: str | None = None, column: str | None = None) -> tuple[Path, None]:
    """An allocsim Parquet file whose event column holds a type pyarrow may not convert (was an
    ``ArrowException`` escaping as a traceback)."""
    n = 6
    odd = _odd_columns(n)
    kind = kind or rng.choice(sorted(odd))
    column = column or rng.choice(["size_bytes", "t_ns", "kind", "alloc_id", "stream", "device"])
    cols = {"t_ns": pa.array(np.arange(n, dtype=np.int64)), "kind": pa.array([1, 2] * (n // 2), pa.uint8()),
            "alloc_id": pa.array(np.arange(n, dtype=np.int64) // 2), "size_bytes": pa.array(np.full(n, 512, np.int64)),
            "stream": pa.array(np.zeros(n, np.int64)), "device": pa.array(np.zeros(n, np.int16))}
    cols[column] = odd[kind]()
    path = folder / f"odd_{kind.replace(' ', '_').replace(',', '')}_{column}.parquet"
    pq.write_table(pa.table(cols), path)
    return path, None


HOSTILE["bombs round 2"]["parquet odd column types"] = odd_type_parquet


def many_memory_events_kineto(folder: Path, rng: random.Random, n_events: int = 6_000_000) -> tuple[Path, dict | None]:
    """6M [memory] events (a 60 MB gzip of 640 MB of JSON): under a 4 GiB address-space cap the
    compiled scan only stopped at ``memory_bytes`` (32 GiB), so the read failed late, or the file went
    to the reference route for minutes. It must be refused at once, naming the process's limit."""
    per_member = min(n_events, 200_000)            # alloc then free each of 100k addresses, repeated
    addrs = [512 * a for a in rng.sample(range(1 << 21, 1 << 38), per_member // 2)]
    event = '{{"name":"[memory]","ph":"i","ts":1,"pid":1,"tid":1,"args":{{"Addr":{},"Bytes":{},"Device Type":1,"Device Id":0}}}},'
    body = "".join(event.format(a, 512) for a in addrs) + "".join(event.format(a, -512) for a in addrs)
    member = _member(body.encode())                 # one member written again and again: fast to make
    path = folder / f"memory_events_{n_events}.json.gz"
    with open(path, "wb") as fh:
        fh.write(_member(b'{"traceEvents":['))
        for _ in range(-(-n_events // per_member)):
            fh.write(member)
        fh.write(_member(b'{"name":"end","ph":"i","ts":2}]}'))
    n_members = -(-n_events // per_member)
    recount = {"allocs": n_members * (per_member // 2), "frees": n_members * (per_member // 2),
               "peak_live_bytes": 512 * (per_member // 2)}
    return path, recount if n_events < 1_000_000 else None     # 6M: refused under the suite's cap


def fitting_memory_events_kineto(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """200k [memory] events: under a 4 GiB cap they fit, and must be read (400k took the reference
    route's ``run --policy bestfit`` past the suite's 120 s at a load average near 7)."""
    return many_memory_events_kineto(folder, rng, 200_000)


HOSTILE["slow bombs round 2"]["memory events over the process limit"] = many_memory_events_kineto
HOSTILE["slow bombs round 2"]["memory events within the process limit"] = fitting_memory_events_kineto


def repeated_entry_snapshot(folder: Path, rng: random.Random, n_entries: int = 10_000_000) -> tuple[Path, dict | None]:
    """A 20 MB pickle whose trace is one entry dict (or one alloc / free_requested / free_completed
    cycle) referenced 10^7 times through the memo: the compiled scan ran out of work after reading the
    same dict a few million times and handed the file to the reference route, which failed after ~175 s.
    Both routes must refuse it at once, naming the entry that repeats an earlier one."""
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    cycle = rng.random() < 0.5
    acts = ("alloc", "free_requested", "free_completed") if cycle else ("alloc",)
    shared = [{"action": act, "addr": _A, "size": 512, "stream": 0, "time_us": 1, "frames": frames} for act in acts]
    entries = shared * (n_entries // len(shared))        # the same dicts again and again: memo references
    path = folder / f"repeated_entry_{len(acts)}.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    return path, None


HOSTILE["slow bombs round 2"]["repeated entry"] = repeated_entry_snapshot


def damaged_parquet(folder: Path, rng: random.Random, kind: str) -> Path:
    """A ``.parquet`` that is not one (random bytes between the magic), a valid one cut short, one
    of another schema, or a sweep results file whose column data is overwritten past its header:
    every command must name the file in its one line (``plot`` gave pyarrow's text alone)."""
    path = folder / f"{kind.replace(' ', '_')}.parquet"
    if kind == "broken":
        path.write_bytes(b"PAR1" + rng.randbytes(rng.randint(100, 5000)) + b"PAR1")
    elif kind == "truncated":
        pq.write_table(pa.table({"t_ns": np.arange(600, dtype=np.int64), "kind": np.ones(600, np.uint8),
                                 "alloc_id": np.arange(600, dtype=np.int64), "size_bytes": np.full(600, 512, np.int64),
                                 "stream": np.zeros(600, np.int64), "device": np.zeros(600, np.int16)}), path)
        data = path.read_bytes()
        path.write_bytes(data[:rng.randint(8, len(data) - 8)])
    elif kind == "wrong schema":
        pq.write_table(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}), path)
    else:                                     # "damaged results": a sweep's columns, data pages overwritten
        n = 2000
        pq.write_table(pa.table({"trace": ["t.pickle"] * n, "policy": ["pytorch"] * n,
                                 "params_json": [json.dumps({"max_split_size_mb": i}) for i in range(n)],
                                 "peak_reserved_bytes": np.arange(n, dtype=np.int64) * 512}),
                       path, compression="none")
        data = bytearray(path.read_bytes())
        start = 4 + len(data) // 8
        data[start:start + len(data) // 3] = rng.randbytes(len(data) // 3)
        path.write_bytes(bytes(data))
    return path
