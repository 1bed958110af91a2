"""A small coverage-guided mutation fuzzer for the compiled readers (used by the fuzz_*.py targets).

Run a target under the sanitizer build (README.md here): ``python -m tests.fuzz.fuzz_snapshot
--seconds 600 --out build/fuzz/snapshot``. The loop takes an input from the corpus, mutates its
bytes, runs the target on it and keeps it when it reaches edges of the C code never reached
before (the readers built with ``--coverage`` count edges in ``allocsim_cov_map``; without that
build the loop is plain mutation fuzzing). AddressSanitizer / UBSan abort the process on a memory
error, so the input being run is written to ``OUT/current-input`` first: after a crash that file
reproduces it. A target's exception other than the ones it expects (a differential mismatch
included) is a finding: the input goes to ``OUT/finding-N.bin`` with the traceback beside it, and
the loop goes on. At the end it prints inputs run, CPU seconds, corpus size, edges and findings.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import random
import resource
import time
import traceback
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x20, 0x2C, 0x0A, 0x22, 0x5C]
INTERESTING_NUMBERS = [b"0", b"-1", b"1", b"9223372036854775807", b"9223372036854775808", b"-9223372036854775808",
                       b"18446744073709551615", b"1125899906842624", b"1e308", b"-0", b"4294967295", b"1.5",
                       b"99999999999999999999999999999999999999999"]
MAX_INPUT_BYTES = 1 << 20


class Coverage:
    """The edge map of the readers' coverage build, or nothing when the build has none."""

    def __init__(self) -> None:
        from allocsim.trace.reading import compiled

        self.map = None
        if compiled.ext is None:
            return
        lib = ctypes.CDLL(compiled.ext.__file__)
        try:
            size = ctypes.c_size_t.in_dll(lib, "allocsim_cov_map_size").value
            raw = (ctypes.c_uint8 * size).in_dll(lib, "allocsim_cov_map")
        except ValueError:       # no such symbol: built without --coverage
            return
        self.map = np.frombuffer(raw, dtype=np.uint8)
        self.seen = np.zeros(size, dtype=np.uint8)   # bucketed hit counts seen so far, as bits

    def reset(self) -> None:
        if self.map is not None:
            self.map[:] = 0

    def new_edges(self) -> int:
        """How many (edge, hit-count bucket) pairs the last run reached for the first time."""
        if self.map is None:
            return 0
        hit = self.map.nonzero()[0]
        if not len(hit):
            return 0
        # AFL's buckets: 1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+ hits, one bit each
        bucket = np.left_shift(1, np.minimum(np.ceil(np.log2(self.map[hit].astype(np.float64) + 1)), 7).astype(np.uint8)
                               ).astype(np.uint8)
        fresh = bucket & ~self.seen[hit]
        self.seen[hit] |= bucket
        return int(np.count_nonzero(fresh))

    def edges(self) -> int:
        return 0 if self.map is None else int(np.count_nonzero(self.seen))


def mutate(data: bytes, rng: random.Random, corpus: list[bytes], tokens: list[bytes]) -> bytes:
    """One to eight stacked byte-level edits of ``data``."""
    out = bytearray(data)
    for _ in range(1 << rng.randrange(4)):
        n = len(out)
        choice = rng.randrange(11)
        pos = rng.randrange(n + 1)
        if choice == 0 and n:                                     # flip one bit
            out[pos % n] ^= 1 << rng.randrange(8)
        elif choice == 1 and n:                                   # an interesting or random byte
            out[pos % n] = rng.choice(INTERESTING_BYTES) if rng.random() < 0.5 else rng.randrange(256)
        elif choice == 2 and n:                                   # delete a range
            del out[pos:pos + rng.randrange(1, 1 + min(64, n))]
        elif choice == 3 and n:                                   # duplicate a range
            k = rng.randrange(1, 1 + min(256, n))
            start = rng.randrange(max(1, n - k + 1))
            out[pos:pos] = out[start:start + k]
        elif choice == 4:                                         # insert random bytes
            out[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif choice == 5 and tokens:                              # insert or overwrite with a token
            token = rng.choice(tokens)
            if rng.random() < 0.5:
                out[pos:pos] = token
            else:
                out[pos:pos + len(token)] = token
        elif choice == 6:                                         # a number's text replaced
            digits = [i for i in range(max(0, pos - 64), min(n, pos + 64)) if 0x30 <= out[i] <= 0x39]
            if digits:
                i = rng.choice(digits)
                j = i
                while j < n and 0x30 <= out[j] <= 0x39:
                    j += 1
                out[i:j] = rng.choice(INTERESTING_NUMBERS)
        elif choice == 7 and n >= 4:                              # a little-endian int field set
            width = rng.choice([1, 2, 4, 8])
            value = rng.choice([0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 62, (1 << 64) - 1, n, n + 1])
            out[pos:pos + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
        elif choice == 8 and corpus:                              # splice with another input
            other = rng.choice(corpus)
            if other:
                cut = rng.randrange(len(other))
                out = out[:pos] + other[cut:cut + rng.randrange(1, 1 + min(4096, len(other) - cut))] + out[pos:]
        elif choice == 9 and n > 1:                               # truncate
            del out[rng.randrange(1, n):]
        elif choice == 10 and n:                                  # repeat a short range many times
            k = rng.randrange(1, 1 + min(16, n))
            start = rng.randrange(max(1, n - k + 1))
            out[pos:pos] = bytes(out[start:start + k]) * rng.randrange(2, 200)
    return bytes(out[:MAX_INPUT_BYTES])


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fuzz(name: str, target: Callable[[bytes], None], seeds: Iterable[bytes], *, seconds: float, out: Path,
         tokens: Iterable[bytes] = (), seed: int = 0) -> dict:
    """Run ``target`` on mutated inputs for ``seconds`` of CPU time; returns the counts it prints."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    cov = Coverage()
    tokens = list(tokens)
    current = os.open(out / "current-input", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    findings: dict[str, int] = {}
    corpus: list[bytes] = []
    execs = 0

    def run_one(data: bytes) -> int:
        nonlocal execs
        os.ftruncate(current, 0)
        os.pwrite(current, data, 0)
        cov.reset()
        execs += 1
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - every unexpected exception is a finding
            key = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if key not in findings:
                findings[key] = len(findings)
                stem = out / f"finding-{findings[key]}"
                stem.with_suffix(".bin").write_bytes(data)
                stem.with_suffix(".txt").write_text(traceback.format_exc())
                print(f"[{name}] finding {findings[key]}: {key}", flush=True)
        return cov.new_edges()

    start_cpu = cpu_seconds()
    for data in seeds:
        run_one(data)
        corpus.append(data)
    print(f"[{name}] {len(corpus)} seeds, {cov.edges()} edges", flush=True)
    last_report = time.monotonic()
    while cpu_seconds() - start_cpu < seconds:
        # favour small and recent inputs: they run fast and sit near new code
        pick = corpus[min(len(corpus) - 1, int(len(corpus) * (1 - rng.random() ** 2)))] if rng.random() < 0.5 \
            else rng.choice(corpus)
        data = mutate(pick, rng, corpus, tokens)
        if run_one(data):
            corpus.append(data)
        if time.monotonic() - last_report > 60:
            last_report = time.monotonic()
            print(f"[{name}] {execs} inputs, {cpu_seconds() - start_cpu:.0f} s CPU, corpus {len(corpus)}, "
                  f"{cov.edges()} edges", flush=True)
    os.close(current)
    corpus_dir = out / "corpus"
    corpus_dir.mkdir(exist_ok=True)
    for data in corpus:
        (corpus_dir / hashlib.sha1(data).hexdigest()).write_bytes(data)
    from tests.fuzz import common

    summary = {"target": name, "inputs": execs, "cpu_seconds": round(cpu_seconds() - start_cpu, 1),
               "corpus": len(corpus), "edges": cov.edges(), "findings": len(findings),
               "same_trace_both_routes": common.COMPARED["trace"], "same_error_both_routes": common.COMPARED["error"]}
    print(f"[{name}] done: {summary}", flush=True)
    return summary


def main(name: str, target: Callable[[bytes], None], seeds: Callable[[], Iterable[bytes]],
         tokens: Iterable[bytes] = ()) -> None:
    """Command line of a fuzz_*.py target: --seconds (CPU), --out, --seed, or --replay FILE..."""
    parser = argparse.ArgumentParser(description=f"Fuzz the compiled {name} reader.")
    parser.add_argument("--seconds", type=float, default=60.0, help="CPU seconds to fuzz (default 60)")
    parser.add_argument("--out", type=Path, default=Path("build/fuzz") / name, help="corpus and findings folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", type=Path, nargs="*", help="run the target once on each file and stop")
    args = parser.parse_args()
    if args.replay:
        for path in args.replay:
            target(path.read_bytes())
            print(f"{path}: ok")
        return
    corpus_dir = args.out / "corpus"
    previous = [p.read_bytes() for p in sorted(corpus_dir.iterdir())] if corpus_dir.is_dir() else []
    fuzz(name, target, [*seeds(), *previous], seconds=args.seconds, out=args.out, tokens=tokens, seed=args.seed)
