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
