"""Hostile Chrome traces of round 3 that confused format detection (issue 33, item 15).

Each generator writes a file into a folder and returns ``(path, expected)`` as the attack suite's
generators do (``tests/attack_files.py``): ``expected`` holds what an independent recount of the
file's ``[memory]`` events gives (``format``, ``allocs``, ``frees``, ``peak_live_bytes``), which
``allocsim info --json`` must match, or None where the file must be refused (``REFUSALS`` has the
words the one line must hold).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

MiB = 1 << 20

Generator = Callable[[Path, random.Random], tuple[Path, dict | None]]


def _sizes(rng: random.Random, n: int) -> list[int]:
    return [rng.choice([512, 4096, MiB, 3 * MiB]) for _ in range(n)]


def _paddle_memory(rng: random.Random, first_ts: int) -> tuple[list[dict], dict]:
    """Paddle ``[memory]`` events: n allocations on gpu:0, then their frees; and their recount."""
    sizes = _sizes(rng, rng.randint(2, 12))
    events, total, ts = [], 0, first_ts
    for i, size in enumerate(sizes):
        total += size
        events.append({"name": "[memory]", "pid": 7, "tid": "7(C++)", "ts": ts, "ph": "i", "cat": "Allocate",
                       "args": {"place": "Place(gpu:0)", "addr": str(0x7f00_0000 + i * 4 * MiB), "increase_bytes": size,
                                "current_allocated": total, "current_reserved": 64 * MiB, "peak_allocated": total,
                                "peak_reserved": 64 * MiB}})
        ts += 10
    peak = total
    for i, size in enumerate(sizes):
        total -= size
        events.append({"name": "[memory]", "pid": 7, "tid": "7(C++)", "ts": ts, "ph": "i", "cat": "Free",
                       "args": {"place": "Place(gpu:0)", "addr": str(0x7f00_0000 + i * 4 * MiB), "increase_bytes": -size,
                                "current_allocated": total, "current_reserved": 64 * MiB, "peak_allocated": peak,
                                "peak_reserved": 64 * MiB}})
        ts += 10
    return events, {"format": "paddle", "allocs": len(sizes), "frees": len(sizes), "peak_live_bytes": peak}


def _kineto_memory(rng: random.Random, first_ts: int) -> tuple[list[dict], dict]:
    """Kineto ``[memory]`` events on CUDA device 0: n allocations, then their frees; and their recount."""
    sizes = _sizes(rng, rng.randint(2, 12))
    events, total, ts = [], 0, first_ts
    for sign in (1, -1):
        for i, size in enumerate(sizes):
            total += sign * size
            events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                           "ts": ts, "args": {"Addr": 0x7f00_0000 + i * 4 * MiB, "Bytes": sign * size,
                                              "Total Allocated": total, "Device Type": 1, "Device Id": 0}})
            ts += 10
    return events, {"format": "kineto", "allocs": len(sizes), "frees": len(sizes), "peak_live_bytes": sum(sizes)}


def _annotation(name: str, ts: int) -> dict:
    return {"name": name, "pid": 7, "tid": "7(Python)", "ts": ts, "dur": 1, "ph": "X", "cat": "UserDefined", "args": {}}


def paddle_with_a_bytes_annotation(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """A Paddle trace whose first event is a user annotation named ``Bytes`` (Kineto's field name)."""
    memory, expected = _paddle_memory(rng, 1000)
    doc = {"displayTimeUnit": "us", "span_index": 0, "traceEvents": [_annotation("Bytes", 999), *memory]}
    path = folder / f"paddle_bytes_annotation_{rng.randrange(1 << 30)}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path, expected


def kineto_with_paddle_words(folder: Path, rng: random.Random) -> tuple[Path, dict]:
    """A Kineto trace with annotations named ``increase_bytes`` and ``current_allocated`` (Paddle's field names)."""
    memory, expected = _kineto_memory(rng, 1000)
    doc = {"schemaVersion": 1, "traceEvents": [*memory, _annotation("increase_bytes", 1001),
                                               _annotation("current_allocated", 1002)]}
    path = folder / f"kineto_paddle_words_{rng.randrange(1 << 30)}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path, expected


def kineto_and_paddle_memory(folder: Path, rng: random.Random) -> tuple[Path, None]:
    """``[memory]`` events of both profilers in one file (Kineto's first, or Paddle's first: the seed decides)."""
    paddle, _ = _paddle_memory(rng, 1000)
    kineto, _ = _kineto_memory(rng, 1005)
    events = [*kineto, *paddle] if rng.random() < 0.5 else [*paddle, *kineto]
    path = folder / f"kineto_and_paddle_{rng.randrange(1 << 30)}.json"
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return path, None


#: Files read as one profiler's, by their [memory] events' own args.
DETECTED: dict[str, Generator] = {"paddle with a Bytes annotation": paddle_with_a_bytes_annotation,
                                  "kineto with Paddle's field names": kineto_with_paddle_words}
#: Files refused, and the words their one line must hold.
REFUSED: dict[str, Generator] = {"kineto and paddle memory": kineto_and_paddle_memory}
REFUSALS = {"kineto and paddle memory": "its [memory] events come from two profilers"}
