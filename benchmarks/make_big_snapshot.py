"""Build a large PyTorch snapshot from a real one by repeating its trace: the loader's big-file case.

    python benchmarks/make_big_snapshot.py -o /tmp/big.pickle                 # ~300 MB (default)
    python benchmarks/make_big_snapshot.py -o /tmp/big.pickle --target-mb 100 --source FILE

Each repetition is the source's device-0 trace with addresses moved to a fresh 1 TiB range and
times moved past the previous repetition, so it stays a valid request stream; every entry is a
new dict with a new frames list (the frame dicts stay shared, as PyTorch's pickles share them).
The final ``segments`` are the source's, so the start-state reconstruction notes that the window
does not fit them; loading, the subject of this benchmark, reads every entry all the same.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocsim.trace.reading.safe_pickle import load_pickle  # noqa: E402

DEFAULT_SOURCE = REPO.parent / "shared" / "traces" / "pytorch-snapshots" / "Wedsonlin__medium_128_training_memory_snapshot.pickle"
_SHIFT = 1 << 40


def repeated(entries: list[dict], rep: int, t_offset_us: int) -> list[dict]:
    """One repetition of ``entries``: addresses and times moved, frames lists copied."""
    out = []
    for e in entries:
        new = dict(e)
        if "addr" in e and e.get("action") != "oom":
            new["addr"] = e["addr"] + rep * _SHIFT
        if "time_us" in e:
            new["time_us"] = e["time_us"] + t_offset_us
        if isinstance(e.get("frames"), list):
            new["frames"] = list(e["frames"])
        out.append(new)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, type=Path)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--target-mb", type=float, default=300.0)
    args = parser.parse_args()

    snap = load_pickle(args.source)
    entries = snap["device_traces"][0]
    times = [e["time_us"] for e in entries if "time_us" in e]
    span_us = (max(times) - min(times) + 1) if times else len(entries)
    one = len(pickle.dumps(repeated(entries, 1, span_us), protocol=4))
    reps = max(1, int(args.target_mb * 1e6 / one))
    trace = []
    for rep in range(reps):
        trace.extend(repeated(entries, rep, rep * span_us))
    big = dict(snap, device_traces=[trace] + snap["device_traces"][1:])
    with open(args.output, "wb") as fh:
        pickle.dump(big, fh, protocol=4)
    print(f"wrote {args.output}: {os.path.getsize(args.output) / 1e6:.1f} MB, {len(trace):,} entries "
          f"({reps} repetitions of {args.source.name})")


if __name__ == "__main__":
    main()
