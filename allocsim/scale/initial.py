"""Pair the start-of-window allocations of two inputs by what they are: ``initial_partners(reference, other)``.

The allocations alive when the recording began (weights, optimizer state, and in a ring-buffer
window the activations of the step it opened in) carry no order that means anything across runs:
a snapshot lists them by address, and addresses move when one tensor grows. So they are paired by
what they are, never by position:

1. *group* -- the same stream and the same code site (the block's stack, when the recording kept
   one; the empty site otherwise);
2. *size class* -- within a group, a block pairs only with one of the same size class: sizes ``s``
   at ``v`` and ``s'`` at ``v'`` with ``s' = s * (v'/v)**k`` for k = 0, 1 or 2 (the same monomial
   ``c * v**k``, see ``laws``); k = 0 (equal sizes) is a block that does not depend on the scale
   (a weight), and stays constant whatever grows around it;
3. *then order* -- classes are filled by how many blocks every input holds for them (so a block that
   grew into a weight's size does not take the weight's partner), and within a class blocks pair in
   each input's listing order. A block with no partner is unpaired and keeps its size.
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


def initial_partners(reference: Trace, ref_value: Fraction, others: list[tuple[Trace, Fraction]]) -> np.ndarray:
    """``partner[row, j]``: the row in ``others[j]``'s start-of-window allocations of reference row ``row``, or -1.

    See the module doc: every input at once first (a family present in all of them), then each
    other input alone for what is left.
    """
    ref_groups = _groups(reference)
    other_groups = [_groups(trace) for trace, _ in others]
    ref_sizes = reference.initial_allocs["size_bytes"].to_numpy()
    partner = np.full((len(ref_sizes), len(others)), -1, dtype=np.int64)
    for key, mine in ref_groups.items():
        free = [_rows_by_size(mine, ref_sizes)]
        for j, (trace, _) in enumerate(others):
            free.append(_rows_by_size(other_groups[j].get(key, []), trace.initial_allocs["size_bytes"].to_numpy()))
        values = [ref_value] + [value for _, value in others]
        _pair_families(free, values, list(range(len(others))), partner)
        for j in range(len(others)):
            _pair_families(free, values, [j], partner)
    return partner


def _rows_by_size(rows: list[int], sizes: np.ndarray) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for row in rows:
        out[int(sizes[row])].append(row)
    return out


def _pair_families(free: list[dict[int, list[int]]], values: list[Fraction], among: list[int],
                   partner: np.ndarray) -> None:
    """Pair the reference's free rows (``free[0]``) with those of the inputs ``among`` (``free[1 + j]``).

    A *family* is a reference size and a power k: the sizes ``s * (v/v_ref)**k`` expected in each
    input. Families are taken greedily by how many rows every input in ``among`` holds for them
    (constants first on a tie), so a size that matches by coincidence (a block that grew into
    another's size) does not take the rows of the family that really holds them.
    """
    ref_value = values[0]
    while True:
        best = None
        for size, rows in free[0].items():
            if not rows:
                continue
            for k in (0, *GROWING_POWERS):
                wanted = []
                for j in among:
                    exact = Fraction(size) * (values[1 + j] / ref_value) ** k
                    if exact.denominator != 1:
                        break
                    wanted.append(int(exact))
                else:
                    support = min([len(rows)] + [len(free[1 + j].get(w, ())) for j, w in zip(among, wanted)])
                    if support and (best is None or support > best[0]):
                        best = (support, size, wanted)
        if best is None:
            return
        support, size, wanted = best
        for _ in range(support):
            row = free[0][size].pop(0)
            for j, w in zip(among, wanted):
                partner[row, j] = free[1 + j][w].pop(0)


def _groups(trace: Trace) -> dict[tuple[int, str], list[int]]:
    init = trace.initial_allocs
    streams = init["stream"].to_numpy()
    out: dict[tuple[int, str], list[int]] = defaultdict(list)
    for row, (stream, site) in enumerate(zip(streams.tolist(), initial_sites(trace))):
        out[(int(stream), site)].append(row)
    return out
