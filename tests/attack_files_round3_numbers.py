"""Hostile files and settings of round 3 that gave wrong numbers with a normal exit (issue 33, items 4-7).

Each trace generator writes a file into a folder and returns ``(path, expected)`` as the attack
suite's generators do (``tests/attack_files.py``): ``expected`` holds what an independent recount of
the events gives (``allocs``, ``frees``, ``peak_live_with_baseline_bytes``), which ``allocsim info
--json`` must match, or None where the file must be refused. The recount here follows the running
total the file itself records, not the reader's inference.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

MiB = 1 << 20
GiB = 1 << 30

Generator = Callable[[Path, random.Random], tuple[Path, dict | None]]


# ------------------------------------------------------------------ item 4: start bytes from one event
def _paddle_event(ts: int, tid: int, addr: int, inc: int, total: int) -> dict:
    return {"name": "[memory]", "pid": 7, "tid": f"{tid}(C++)", "ts": ts, "ph": "i",
            "cat": "Allocate" if inc > 0 else "Free",
            "args": {"place": "Place(gpu:0)", "addr": str(addr), "increase_bytes": inc, "current_allocated": total,
                     "current_reserved": 32 * GiB, "peak_allocated": 0, "peak_reserved": 0}}


def _kineto_event(ts: int, tid: int, addr: int, nbytes: int, total: int) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts,
            "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Total Reserved": 32 * GiB,
                     "Device Type": 1, "Device Id": 0}}


def _write(folder: Path, name: str, fmt: str, rows: list[tuple[int, int, int, int, int]]) -> Path:
    """A Paddle or Kineto file of ``(ts, tid, addr, bytes, total after)`` rows, in the order given."""
    if fmt == "paddle":
        events = [_paddle_event(*r) for r in rows]
        doc = {"schemaVersion": "1.0.2", "span_index": "0", "traceEvents": events, "ExtraInfo": {}}
    else:
        doc = {"schemaVersion": 1, "traceEvents": [_kineto_event(*r) for r in rows]}
    path = folder / f"{name}_{fmt}.json"
    path.write_text(json.dumps(doc))
    return path


def _first_total_too_high(fmt: str) -> Generator:
    def gen(folder: Path, rng: random.Random) -> tuple[Path, dict]:
        """The first event's total says 30 GiB more than the rest allow: the true peak is 4 MiB."""
        extra = 30 * GiB + rng.randrange(1 << 20) * 512
        a, b, c = 0x7F00_0000_0000, 0x7F00_1000_0000, 0x7F00_2000_0000
        rows = [(10, 1, a, MiB, MiB + extra), (11, 1, b, MiB, 2 * MiB), (12, 1, c, 2 * MiB, 4 * MiB),
                (13, 1, a, -MiB, 3 * MiB), (14, 1, b, -MiB, 2 * MiB), (15, 1, c, -2 * MiB, 0)]
        return _write(folder, "first_total_too_high", fmt, rows), {
            "allocs": 3, "frees": 3, "peak_live_with_baseline_bytes": 4 * MiB, "baseline_live_bytes": 0}
    gen.__name__ = f"first_total_too_high_{fmt}"
    return gen


def _swapped_threads(fmt: str) -> Generator:
    def gen(folder: Path, rng: random.Random) -> tuple[Path, dict]:
        """Two threads' events swapped in time, every total right: the trace peaks at 1 GiB over its start.

        Thread 1 allocates and frees A, then thread 2 allocates B; B's timestamp comes before A's free,
        while the totals record the order the allocator saw (A freed first).
        """
        start = rng.choice([0, 256 * MiB])
        a, b = 0x7F00_0000_0000, 0x7F00_4000_0000
        rows = [(10, 1, a, GiB, start + GiB), (11, 2, b, GiB, start + GiB), (12, 1, a, -GiB, start),
                (13, 2, b, -GiB, start)]
        expected = {"allocs": 2, "frees": 2, "peak_live_with_baseline_bytes": start + GiB,
                    "baseline_live_bytes": start}
        return _write(folder, "swapped_threads", fmt, rows), expected
    gen.__name__ = f"swapped_threads_{fmt}"
    return gen


def _contradicting_totals(fmt: str) -> Generator:
    def gen(folder: Path, rng: random.Random) -> tuple[Path, None]:
        """Totals no start and no swap explain: the window's own events hold 3 GiB where the total says 1 GiB."""
        a, b, c = 0x7F00_0000_0000, 0x7F00_4000_0000, 0x7F00_8000_0000
        rows = [(10, 1, a, GiB, GiB), (11, 1, b, GiB, GiB), (12, 1, c, GiB, GiB), (13, 1, a, -GiB, 0)]
        return _write(folder, "contradicting_totals", fmt, rows), None
    gen.__name__ = f"contradicting_totals_{fmt}"
    return gen


START_BYTES: dict[str, Generator] = {
    f"{kind} ({fmt})": make(fmt)
    for kind, make in (("first total too high", _first_total_too_high), ("swapped threads", _swapped_threads),
                       ("contradicting totals", _contradicting_totals))
    for fmt in ("paddle", "kineto")}


# ------------------------------------------------------------------ item 5: numbers outside ASCII digits
#: Digits Python's ``int`` / ``float`` read but no setting or trace writes: Arabic-Indic, fullwidth,
#: a superscript, an underscore.
ODD_DIGITS = {"arabic-indic": "١٠", "fullwidth": "１０", "superscript": "2²", "underscore": "1_0"}


def paddle_odd_number(folder: Path, rng: random.Random, field: str, digits: str) -> tuple[Path, None]:
    """A Paddle trace whose second event writes ``field`` (increase_bytes, addr or the place's index) in ``digits``."""
    rows = [(10, 1, 0x1000, MiB, MiB), (11, 1, 0x2000, MiB, 2 * MiB), (12, 1, 0x1000, -MiB, MiB)]
    events = [_paddle_event(*r) for r in rows]
    args = events[1]["args"]
    if field == "place":
        args["place"] = f"Place(gpu:{digits})"
    else:
        args[field] = digits + "48576" if field == "increase_bytes" else digits
    doc = {"schemaVersion": "1.0.2", "span_index": "0", "traceEvents": events, "ExtraInfo": {}}
    path = folder / f"odd_number_{field}_{rng.randrange(1 << 20)}.json"
    path.write_text(json.dumps(doc, ensure_ascii=rng.random() < 0.5))
    return path, None


#: Hostile numeric settings: (command-line options, what the one-line error must say). Each names the setting.
HOSTILE_SETTINGS: dict[str, tuple[list[str], str]] = {
    "flags limit past any device": (["--policy", "paddle", "--flags", "FLAGS_gpu_memory_limit_mb=" + "9" * 23],
                                    "FLAGS_gpu_memory_limit_mb must be in [0, 1,073,741,824]"),
    "flags gb 1e300": (["--policy", "paddle", "--flags", "FLAGS_eager_delete_tensor_gb=1e300"],
                       "FLAGS_eager_delete_tensor_gb must be <= 1,048,576"),
    "flags gb 1e400": (["--policy", "paddle", "--flags", "FLAGS_eager_delete_tensor_gb=1e400"],
                       "FLAGS_eager_delete_tensor_gb: '1e400' is past the range of a number"),
    "flags 5000 digits": (["--policy", "paddle", "--flags", "FLAGS_initial_gpu_memory_in_mb=" + "9" * 5000],
                          "FLAGS_initial_gpu_memory_in_mb must be in"),
    "policy threshold past any device": (["--policy", "deferred-gc:threshold:" + "9" * 23],
                                         "parameter threshold='" + "9" * 23 + "': must be <= 1,125,899,906,842,624"),
    "policy threshold 5000 digits": (["--policy", "deferred-gc:threshold:" + "9" * 5000], "parameter threshold="),
    "alloc-conf mb past any device": (["--policy", "pytorch", "--alloc-conf", "max_split_size_mb:" + "9" * 20],
                                      "max_split_size_mb must be in [0, 1,073,741,824]"),
    "alloc-conf fraction 1e400": (["--policy", "pytorch", "--alloc-conf", "per_process_memory_fraction:1e400"],
                                  "per_process_memory_fraction: '1e400' is past the range of a number"),
    **{f"flags {kind} mb": (["--policy", "paddle", "--flags", f"FLAGS_auto_growth_chunk_size_in_mb={d}"],
                            "FLAGS_auto_growth_chunk_size_in_mb takes a whole number of MB (MiB) in ASCII digits")
       for kind, d in ODD_DIGITS.items()},
    **{f"flags {kind} gb": (["--policy", "paddle", "--flags", f"FLAGS_eager_delete_tensor_gb={d}"],
                            "FLAGS_eager_delete_tensor_gb takes a number in ASCII digits")
       for kind, d in ODD_DIGITS.items()},
    **{f"alloc-conf {kind}": (["--policy", "pytorch", "--alloc-conf", f"garbage_collection_threshold:0.{d}"],
                              "garbage_collection_threshold takes a number in ASCII digits")
       for kind, d in ODD_DIGITS.items()},
    **{f"policy {kind} size": (["--policy", f"paddle:chunk_size:{d}MiB"], "parameter chunk_size=")
       for kind, d in ODD_DIGITS.items()},
    **{f"set {kind} size": (["--policy", "paddle", "--set", f"chunk_size={d}MiB"], "parameter chunk_size=")
       for kind, d in ODD_DIGITS.items()},
}


# ------------------------------------------------------------------ item 6: scale given one recording twice
def same_recording_twice(folder: Path, rng: random.Random) -> tuple[list[str], None]:
    """``scale`` specs naming one Kineto recording twice: once as written, once as a gzipped copy at another value."""
    import gzip

    rows, t, live = [], 10, []
    for i in range(rng.randint(4, 12)):
        addr = 0x7F00_0000_0000 + i * 0x100_0000
        size = rng.choice([512, 4096, MiB])
        live.append((addr, size))
        rows.append((t, 1, addr, size, sum(s for _, s in live)))
        t += 1
    while live:
        addr, size = live.pop()
        rows.append((t, 1, addr, -size, sum(s for _, s in live)))
        t += 1
    path = _write(folder, "one_recording", "kineto", rows)
    copy = folder / "renamed_copy.json.gz"
    copy.write_bytes(gzip.compress(path.read_bytes()))
    return [f"{path}@2", f"{copy}@4"], None


# ------------------------------------------------------------------ item 7: byte counts past 2**53 in the report
#: Nine live allocations of 2**50 - 1 bytes: 10,133,099,161,583,607 bytes live, a JavaScript Number reads ...608.
HUGE_ALLOCATIONS = 9
HUGE_SIZE_BYTES = (1 << 50) - 1


def huge_live_bytes_trace(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """An allocsim Parquet trace whose peak live bytes (and sums of them) are past 2**53, each exact in the file."""
    from allocsim.trace import write_trace
    from allocsim.trace.reading.builder import TraceBuilder

    builder = TraceBuilder("huge", "test")
    base = 1 << 52
    for i in range(HUGE_ALLOCATIONS):
        builder.alloc(i, 1000 * (i + 1), 0, 0, base + i * (1 << 51), HUGE_SIZE_BYTES - rng.randrange(2) * 512)
    for i in range(HUGE_ALLOCATIONS):
        builder.free(HUGE_ALLOCATIONS + i, 1000 * (HUGE_ALLOCATIONS + i + 1), 0, 0, base + i * (1 << 51))
    trace = builder.finish()
    path = folder / f"huge_live_{rng.randrange(1 << 20)}.parquet"
    write_trace(trace, path)
    sizes = trace.events.query("kind == 1")["size_bytes"].tolist()
    return path, {"allocs": HUGE_ALLOCATIONS, "frees": HUGE_ALLOCATIONS, "peak_live_bytes": sum(sizes)}
