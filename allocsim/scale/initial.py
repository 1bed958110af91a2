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
   each input's listing order. What is left of a group pairs in listing order only where both inputs
   have as many left (sizes that follow no monomial, e.g. ``a + b*v``). A block with no partner is
   unpaired and keeps its size.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
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


def initial_partners(reference: Trace, ref_value: Fraction,
                     others: list[tuple[Trace, Fraction]]) -> tuple[np.ndarray, dict[int, tuple[int, ...]]]:
    """``(partner, open_powers)``: ``partner[row, j]`` is the row in ``others[j]``'s start-of-window allocations
    of reference row ``row``, or -1; ``open_powers[row]`` lists the powers k of every size class the
    row could belong to by the inputs' sizes, for rows where that is more than one (the counts chose
    one; the range spans them all).

    See the module doc: every input at once first (a family present in all of them), then each
    other input alone for what is left.
    """
    ref_groups = _groups(reference)
    other_groups = [_groups(trace) for trace, _ in others]
    ref_sizes = reference.initial_allocs["size_bytes"].to_numpy()
    partner = np.full((len(ref_sizes), len(others)), -1, dtype=np.int64)
    open_powers: dict[int, tuple[int, ...]] = {}
    for key, mine in ref_groups.items():
        free = [_rows_by_size(mine, ref_sizes)]
        for j, (trace, _) in enumerate(others):
            free.append(_rows_by_size(other_groups[j].get(key, []), trace.initial_allocs["size_bytes"].to_numpy()))
        values = [ref_value] + [value for _, value in others]
        _pair_families(free, values, list(range(len(others))), partner, open_powers)
        # What every input does not hold, input by input: each starts from the same reference rows.
        left = free[0]
        for j in range(len(others)):
            free[0] = {size: deque(rows) for size, rows in left.items()}
            _pair_families(free, values, [j], partner, open_powers)
            _pair_in_order(free, j, partner)
    return partner, open_powers


def _pair_in_order(free: list[dict[int, deque[int]]], j: int, partner: np.ndarray) -> None:
    """What no size class paired, paired in listing order -- only when both sides have as many left."""
    mine = sorted(row for rows in free[0].values() for row in rows)
    theirs = sorted(row for rows in free[1 + j].values() for row in rows)
    if mine and len(mine) == len(theirs):
        for a, b in zip(mine, theirs):
            partner[a, j] = b


def _rows_by_size(rows: list[int], sizes: np.ndarray) -> dict[int, deque[int]]:
    out: dict[int, deque[int]] = defaultdict(deque)
    for row in rows:
        out[int(sizes[row])].append(row)
    return out


def _support(free: list[dict[int, deque[int]]], among: list[int], size: int, wanted: list[int]) -> int:
    """How many reference rows of ``size`` the family could pair now: the fewest rows any input holds for it."""
    return min([len(free[0].get(size, ()))] + [len(free[1 + j].get(w, ())) for j, w in zip(among, wanted)])


def _pair_families(free: list[dict[int, deque[int]]], values: list[Fraction], among: list[int],
                   partner: np.ndarray, open_powers: dict[int, tuple[int, ...]]) -> None:
    """Pair the reference's free rows (``free[0]``) with those of the inputs ``among`` (``free[1 + j]``).

    A *family* is a reference size and a power k: the sizes ``s * (v/v_ref)**k`` expected in each
    input. Families are taken greedily by how many rows every input in ``among`` holds for them
    (constants first on a tie, then the reference's first listed size), so a size that matches by
    coincidence (a block that grew into another's size) does not take the rows of the family that
    really holds them. Where another power of the same size has as much support, the counts cannot
    tell them apart: the rows taken get both powers in ``open_powers``.

    Near-linear in the number of families (at most three per reference size): supports only fall
    as rows are taken, so a heap keyed by the support last seen is corrected lazily when its top
    turns out stale. A take makes stale only the families that share its reference size or one of
    its wanted sizes (at most three per input each), so the heap sees O(families * inputs) pushes.
    """
    ref_value = values[0]
    wanted_of: dict[tuple[int, int], list[int]] = {}
    order: dict[int, int] = {}
    for index, (size, rows) in enumerate(free[0].items()):
        order[size] = index
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
                wanted_of[(size, k)] = wanted
    heap = [(-support, order[size], k) for (size, k), wanted in wanted_of.items()
            if (support := _support(free, among, size, wanted))]
    heapq.heapify(heap)
    sizes_by_order = list(free[0])
    # Sizes of the other inputs that a tie left to either of two families: whoever takes them later
    # could as well have been the other family.
    contested: list[set[int]] = [set() for _ in among]
    while heap:
        stale_support, index, k = heapq.heappop(heap)
        size = sizes_by_order[index]
        wanted = wanted_of[(size, k)]
        support = _support(free, among, size, wanted)
        if support != -stale_support:
            if support:
                heapq.heappush(heap, (-support, index, k))
            continue
        ties = tuple(t for t in (0, *GROWING_POWERS)
                     if (size, t) in wanted_of and _support(free, among, size, wanted_of[(size, t)]) >= support)
        if len(ties) > 1:
            for t in ties:
                for i, w in enumerate(wanted_of[(size, t)]):
                    contested[i].add(w)
        elif any(w in contested[i] for i, w in enumerate(wanted)):
            ties = tuple(t for t in (0, *GROWING_POWERS) if (size, t) in wanted_of and all(
                w in contested[i] for i, w in enumerate(wanted_of[(size, t)])))
        for _ in range(support):
            row = free[0][size].popleft()
            if len(ties) > 1:
                open_powers[row] = tuple(sorted(set(open_powers.get(row, ())) | set(ties)))
            for j, w in zip(among, wanted):
                partner[row, j] = free[1 + j][w].popleft()


def _groups(trace: Trace) -> dict[tuple[int, str], list[int]]:
    init = trace.initial_allocs
    streams = init["stream"].to_numpy()
    out: dict[tuple[int, str], list[int]] = defaultdict(list)
    for row, (stream, site) in enumerate(zip(streams.tolist(), initial_sites(trace))):
        out[(int(stream), site)].append(row)
    return out
