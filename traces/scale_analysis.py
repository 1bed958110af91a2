#!/usr/bin/env python
"""Look at the scale captures before trusting a model of them: how sizes grow, what appears, what repeats.

For each series of ``traces/scales/`` (model x batch / sequence, inputs and held-out point together)
it prints:

* per capture: allocations, steps, and whether the profiled steps repeat exactly (same sizes in
  the same order);
* the laws that go exactly through every point of the series (constant / linear / quadratic /
  irregular), by allocation count and by bytes at the largest point, with the innermost operators
  of the quadratic ones;
* the allocations that appear or disappear between scales (aligned in some captures only), by
  innermost operator and size.

    python traces/scale_analysis.py [--dir traces/scales] [--model bert] [--series batch]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from allocsim.scale import load_input  # noqa: E402
from allocsim.scale.align import align  # noqa: E402
from allocsim.scale.laws import fit_law  # noqa: E402
from allocsim.scale.sites import innermost as innermost_frame  # noqa: E402
from capture_scales import (BATCH_HELD_OUT, BATCH_SERIES_SEQ, BATCH_VALUES, MODELS, SEQ_HELD_OUT,  # noqa: E402
                            SEQ_SERIES_BATCH, SEQ_VALUES, capture_name)


def series_files(directory: Path, model: str, series: str) -> list[tuple[Path, int]]:
    """(file, value) of one series, inputs then held-out point."""
    if series == "batch":
        return [(directory / f"{capture_name(model, b, BATCH_SERIES_SEQ)}.json.gz", b) for b in (*BATCH_VALUES, BATCH_HELD_OUT)]
    return [(directory / f"{capture_name(model, SEQ_SERIES_BATCH, s)}.json.gz", s) for s in (*SEQ_VALUES, SEQ_HELD_OUT)]


def steps_repeat(item) -> str:
    body = item.steps.body
    seqs = [tuple(item.size_bytes[item.step_allocs(item.steps.steps.index(s))].tolist()) for s in body]
    if len(seqs) < 2:
        return "one step"
    return "yes" if all(s == seqs[0] for s in seqs[1:]) else "NO"


def innermost(item, k: int) -> str:
    sites = item.key_source.sites
    if sites is None or not sites[k]:
        return "(no op)"
    return innermost_frame(sites[k])


def analyse(directory: Path, model: str, series: str) -> None:
    files = series_files(directory, model, series)
    missing = [str(p) for p, _ in files if not p.exists()]
    if missing:
        print(f"## {model} {series}: missing {missing}\n")
        return
    items = [load_input(str(p), Fraction(v)) for p, v in files]
    print(f"## {model}, {series} series ({', '.join(f'{p.name}@{v}' for p, v in files)})\n")
    for item in items:
        print(f"- {Path(item.path).name}: {len(item.alloc_id)} allocations, {len(item.steps.steps)} steps "
              f"({item.steps.source}), steps repeat exactly: {steps_repeat(item)}")
    largest, others = items[-1], items[:-1]
    alignment = align(largest, others)
    found = alignment.matched_counts()
    laws, law_bytes = Counter(), Counter()
    quad_ops, irregular = Counter(), []
    appear = defaultdict(list)
    for k in range(len(largest.alloc_id)):
        pts = [(largest.value, int(largest.size_bytes[k]))]
        pts += [(o.value, int(o.size_bytes[alignment.partner[k, j]])) for j, o in enumerate(others)
                if alignment.partner[k, j] >= 0]
        if found[k] < len(others):
            present = sorted(int(v) for v, _ in pts)
            appear[(innermost(largest, k), tuple(present))].append(int(largest.size_bytes[k]))
        if found[k] == len(others):
            law = fit_law(pts, series)
            laws[law.kind] += 1
            law_bytes[law.kind] += int(largest.size_bytes[k])
            if law.kind == "quadratic":
                quad_ops[innermost(largest, k)] += 1
            if law.kind == "irregular":
                irregular.append((innermost(largest, k), [s for _, s in sorted(pts)]))
    total = int(largest.size_bytes.sum())
    print(f"\nlaws through all {len(items)} points (allocations of {Path(largest.path).name} aligned everywhere: "
          f"{int((found == len(others)).sum())} of {len(found)}):")
    for kind, count in laws.most_common():
        print(f"  {kind:10s} {count:6d} allocations, {law_bytes[kind] / 2**20:10.1f} MiB "
              f"({100 * law_bytes[kind] / total:.1f}% of the bytes at {largest.value})")
    if quad_ops:
        print("  quadratic, by innermost op: " + ", ".join(f"{op} x{n}" for op, n in quad_ops.most_common(6)))
    for op, sizes in irregular[:8]:
        print(f"  irregular: {op}: {sizes}")
    if appear:
        print("\nallocations not in every capture (innermost op, values where present): count x sizes at the largest")
        for (op, present), sizes in sorted(appear.items(), key=lambda kv: -len(kv[1]))[:10]:
            print(f"  {op} present at {list(present)}: {len(sizes)} x {sorted(Counter(sizes).items())[:4]}")
    print()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=HERE / "scales")
    p.add_argument("--model", choices=MODELS)
    p.add_argument("--series", choices=("batch", "seq"))
    args = p.parse_args(argv)
    for model in [args.model] if args.model else MODELS:
        for series in [args.series] if args.series else ("batch", "seq"):
            analyse(args.dir, model, series)
    return 0


if __name__ == "__main__":
    sys.exit(main())
