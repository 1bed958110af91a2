#!/usr/bin/env python
"""Do windows of one recording, cut at different points, align by code site? Rates on real GPU snapshots.

A PyTorch snapshot's trace is a ring buffer: when it is full, the oldest entries are dropped, so
two runs of one program keep windows that start at different points of a step. This script makes
such windows from each real snapshot (the device's trace entries from some point on; the final
``segments`` unchanged, exactly what a smaller ``max_entries`` would have kept), aligns every
later window (as the reference) with every earlier one, and prints:

* the share of the reference's allocations aligned, and how many of those found *the same*
  allocation of the recording (the window's k-th allocation is the recording's k-th after the cut);
* which keyer was used: ``code-site`` where both windows hold allocations with frames (a snapshot
  recorded with ``stacks="python"`` has frames only for allocations made from Python, e.g. none in
  the backward pass, so a window cut after its forward pass has none and falls back to position);
* the same with the frames removed (the position keyer, what alignment falls back to without
  frames: step boundaries then come from live-byte troughs).

    python traces/scale_windows.py [SNAPSHOT ...] [--cuts 0,0.3,0.6] [--json]

Without arguments it reads every snapshot with frames in ``../shared/traces/pytorch-snapshots/``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

from allocsim.errors import AllocsimError  # noqa: E402
from allocsim.scale import load_input, prepare_input  # noqa: E402
from allocsim.scale.align import align  # noqa: E402
from allocsim.trace.reading.safe_pickle import load_pickle  # noqa: E402

SHARED = HERE.parent.parent / "shared" / "traces" / "pytorch-snapshots"
DEFAULT_CUTS = (0.0, 0.3, 0.6)
#: Device traces with fewer allocations are too small to say anything.
MIN_ALLOCS = 200


def ring_buffer_window(snapshot: dict, device: int, drop_entries: int) -> dict:
    """The snapshot a ring buffer would have kept without the first ``drop_entries`` entries of ``device``."""
    traces = list(snapshot["device_traces"])
    traces[device] = traces[device][drop_entries:]
    return {**snapshot, "device_traces": traces}


def allocs_before(entries: list, cut: int) -> int:
    """Allocations among the first ``cut`` entries: the window's k-th allocation is the recording's (this + k)-th."""
    return sum(1 for e in entries[:cut] if isinstance(e, dict) and e.get("action") == "alloc")


def without_frames(item):
    """The same input with every stack id removed: what alignment does without frames."""
    trace = item.trace
    tables = {}
    for name in ("events", "initial_allocs", "initial_blocks"):
        tables[name] = getattr(trace, name).copy()
        tables[name]["stack_id"] = np.full(len(tables[name]), -1, dtype=np.int32)
    return prepare_input(dataclasses.replace(trace, **tables), item.value, path=item.path)


def pair_rates(ref, ref_offset: int, other, other_offset: int) -> dict:
    """Share of ``ref``'s allocations aligned with ``other``, and how many are the same allocation."""
    alignment = align(ref, [other])
    partner = alignment.partner[:, 0]
    found = partner >= 0
    k = found.nonzero()[0]
    same = int(((partner[k] + other_offset) == (k + ref_offset)).sum())
    return {"keyer": alignment.keyer, "allocations": int(len(partner)), "aligned": int(found.sum()),
            "same_allocation": same}


def windows_rows(path: Path, cuts=DEFAULT_CUTS, workdir: Path | None = None) -> list[dict]:
    """One row per (device, reference window, other window) of one snapshot."""
    snapshot = load_pickle(path)
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for device, entries in enumerate(snapshot.get("device_traces") or []):
            n_allocs = allocs_before(entries, len(entries))
            if n_allocs < MIN_ALLOCS:
                continue
            windows = []
            for i, frac in enumerate(cuts):
                cut = int(len(entries) * frac)
                out = Path(tmp) / f"d{device}_w{i}.pickle"
                out.write_bytes(pickle.dumps(ring_buffer_window(snapshot, device, cut)))
                try:
                    item = load_input(str(out), Fraction(i + 1), device=device)
                except AllocsimError as exc:
                    print(f"{path.name} device {device} cut {frac}: {exc}", file=sys.stderr)
                    break
                windows.append((frac, allocs_before(entries, cut), item))
            if len(windows) < 2 or windows[0][2].key_source.origin != "code":
                continue     # no frames at all: nothing to compare
            bare = [without_frames(item) for _, _, item in windows]
            for r in range(len(windows)):
                for o in range(len(windows)):
                    if r == o:
                        continue
                    (fr, off_r, ref), (fo, off_o, other) = windows[r], windows[o]
                    rows.append({"snapshot": path.name, "device": device, "reference_cut": fr, "other_cut": fo,
                                 "site": pair_rates(ref, off_r, other, off_o),
                                 "position": pair_rates(bare[r], off_r, bare[o], off_o)})
    return rows


def _share(part: dict, key: str) -> str:
    return f"{100 * part[key] / part['allocations']:.1f}%" if part["allocations"] else "-"


def table(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    out = ["| snapshot | dev | reference cut | other cut | allocations | with frames: keyer | aligned | same allocation "
           "| frames removed: aligned | same allocation |", "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        s, p = r["site"], r["position"]
        out.append(f"| {r['snapshot']} | {r['device']} | {r['reference_cut']:.0%} | {r['other_cut']:.0%} | "
                   f"{s['allocations']:,} | {s['keyer']} | {_share(s, 'aligned')} | {_share(s, 'same_allocation')} | "
                   f"{_share(p, 'aligned')} | {_share(p, 'same_allocation')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshots", nargs="*", type=Path)
    p.add_argument("--cuts", default=",".join(str(c) for c in DEFAULT_CUTS),
                   help="where windows start, as shares of each device's trace entries")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    cuts = tuple(float(c) for c in args.cuts.split(","))
    paths = args.snapshots or sorted(SHARED.glob("*.pickle"))
    rows = [row for path in paths for row in windows_rows(path, cuts)]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
