"""Pair the start-of-window allocations of two inputs by what they are: ``initial_partners(reference, other)``.

The allocations alive when the recording began (weights, optimizer state, and in a ring-buffer
window the activations of the step it opened in) carry no order that means anything across runs:
a snapshot lists them by address, and addresses move when one tensor grows. So they are paired by
what they are, never by position:

1. *group* -- the same stream and the same code site (the block's stack, when the recording kept
   one; the empty site otherwise);
2. *same size* -- within a group, blocks of equal size pair first, in order: a block whose size does
   not depend on the scale (a weight) stays constant, whatever else grows around it;
3. *size class* -- the rest pair, in order, only with a block of the same size class: sizes ``s`` at
   ``v`` and ``s'`` at ``v'`` with ``s' = s * (v'/v)**k`` for k = 1 or 2 (the same monomial
   ``c * v**k``, see ``laws``). A block with no such partner is unpaired and keeps its size.
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import numpy as np

from ..trace.schema import Trace
from .sites import _frames_by_stack, frame_origin, site_text

#: Powers of the scale value a start-of-window block may grow by (``laws.MONOMIAL_POWERS`` less 0).
GROWING_POWERS = (1, 2)


def initial_sites(trace: Trace) -> list[str]:
    """The code site of each start-of-window allocation (``""`` where the recording kept no stack)."""
    init = trace.initial_allocs
    stack_ids = init["stack_id"].to_numpy() if "stack_id" in init else np.full(len(init), -1)
    distinct = np.unique(stack_ids[stack_ids >= 0])
    if not len(distinct):
        return [""] * len(init)
    origin = frame_origin(trace)
    site_of = {-1: ""}
    for sid, frames in _frames_by_stack(trace, distinct, 256).items():
        site_of[sid] = site_text(frames, origin)
    return [site_of.get(int(s), "") for s in stack_ids]


def same_class(size_a: int, value_a: Fraction, size_b: int, value_b: Fraction) -> bool:
    """True when ``size_b`` at ``value_b`` is ``size_a`` at ``value_a`` grown as ``c * v**k``, k in ``GROWING_POWERS``."""
    if size_a <= 0 or value_a == value_b:
        return False
    ratio = Fraction(size_b, size_a)
    return any(ratio == (value_b / value_a) ** k for k in GROWING_POWERS)


def initial_partners(reference: Trace, ref_value: Fraction, other: Trace, other_value: Fraction) -> np.ndarray:
    """For each start-of-window allocation of ``reference``, its row in ``other``'s, or -1 (see module doc)."""
    ref_groups = _groups(reference)
    other_groups = _groups(other)
    ref_sizes = reference.initial_allocs["size_bytes"].to_numpy()
    other_sizes = other.initial_allocs["size_bytes"].to_numpy()
    partner = np.full(len(ref_sizes), -1, dtype=np.int64)
    for key, mine in ref_groups.items():
        theirs = other_groups.get(key, [])
        if not theirs:
            continue
        # Same size first, in order of each input's listing.
        free_by_size: dict[int, list[int]] = defaultdict(list)
        for row in theirs:
            free_by_size[int(other_sizes[row])].append(row)
        taken: set[int] = set()
        left = []
        for row in mine:
            pool = free_by_size.get(int(ref_sizes[row]))
            if pool:
                hit = pool.pop(0)
                partner[row] = hit
                taken.add(hit)
            else:
                left.append(row)
        rest = [row for row in theirs if row not in taken]
        for row in left:
            size = int(ref_sizes[row])
            for i, cand in enumerate(rest):
                if same_class(size, ref_value, int(other_sizes[cand]), other_value):
                    partner[row] = cand
                    del rest[i]
                    break
    return partner


def _groups(trace: Trace) -> dict[tuple[int, str], list[int]]:
    init = trace.initial_allocs
    streams = init["stream"].to_numpy()
    out: dict[tuple[int, str], list[int]] = defaultdict(list)
    for row, (stream, site) in enumerate(zip(streams.tolist(), initial_sites(trace))):
        out[(int(stream), site)].append(row)
    return out
