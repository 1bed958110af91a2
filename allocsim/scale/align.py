"""Align the allocations of a reference trace with those of the other inputs, step by step.

Use ``align(reference, others)``. Every step of the reference (its prologue included) is matched
with the best-matching step of each other input -- the one that shares the most keys (see
``keys``), among up to ``MAX_CANDIDATE_STEPS`` of its steps -- so traces recorded from different
windows of a run align by step, not by file position. A pair of steps is keyed from the end when
either is a prologue (the tail of a step cut by the start of the window) or a whole window without
boundaries (which ends where the recording was dumped), and from the start otherwise. The result
says, for every reference allocation, which allocation (and so which size) it is in each other
input, or that it has none there.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Hashable, Sequence

import numpy as np

from .inputs import ScaleInput
from .keys import KEYERS, Keyer

#: Steps of another input considered as the counterpart of a reference step.
MAX_CANDIDATE_STEPS = 8


@dataclasses.dataclass
class StepMatch:
    """Which step of input ``input_index`` a reference step was matched with, and how well."""

    ref_step: int
    input_index: int
    other_step: int | None
    matched: int
    ref_allocs: int
    other_allocs: int


@dataclasses.dataclass
class Alignment:
    """``partner[k, j]``: the allocation ordinal in ``others[j]`` of reference allocation k, or -1."""

    keyer: str
    partner: np.ndarray
    step_matches: list[StepMatch]

    def matched_counts(self) -> np.ndarray:
        """Per reference allocation, in how many other inputs it was found."""
        return (self.partner >= 0).sum(axis=1) if self.partner.size else np.zeros(len(self.partner), dtype=np.int64)


def choose_keyer(inputs: Sequence[ScaleInput]) -> Keyer:
    """The first keyer of ``KEYERS`` that every input supports."""
    for keyer in KEYERS:
        if all(keyer.available(item.key_source) for item in inputs):
            return keyer
    raise AssertionError("the position keyer is always available")


def _key_map(keyer: Keyer, item: ScaleInput, step_index: int, backward: bool) -> dict[Hashable, int]:
    ks = item.step_allocs(step_index)
    keys = keyer.keys(item.key_source, ks, backward)
    return {key: int(k) for key, k in zip(keys, ks)}


def _candidates(item: ScaleInput, backward: bool = False) -> list[int]:
    """Steps of ``item`` a reference step may match: its full steps, and its prologue for a prologue."""
    body = [i for i, s in enumerate(item.steps.steps) if not s.prologue]
    chosen = (body or list(range(len(item.steps.steps))))[:MAX_CANDIDATE_STEPS]
    prologues = [i for i, s in enumerate(item.steps.steps) if s.prologue and i not in chosen]
    return chosen + prologues if backward else chosen


def _from_end(item: ScaleInput, step_index: int) -> bool:
    return item.steps.steps[step_index].from_end


def _typical_step_allocs(item: ScaleInput) -> int | None:
    counts = [len(item.step_allocs(i)) for i in _candidates(item)]
    return Counter(counts).most_common(1)[0][0] if counts else None


def _score(reference: ScaleInput, other: ScaleInput, ks, ref_keys, key_map: dict[Hashable, int]) -> tuple[int, int]:
    """(keys found, keys found with the same size): most keys first, then most unchanged sizes.

    The second term separates candidates that share every key (position keys of equal-length
    steps): the step that really corresponds keeps most sizes (most allocations are constant).
    """
    hits = same = 0
    ref_sizes, other_sizes = reference.size_bytes, other.size_bytes
    for k, key in zip(ks, ref_keys):
        hit = key_map.get(key)
        if hit is not None:
            hits += 1
            same += int(ref_sizes[k] == other_sizes[hit])
    return hits, same


def for_keyer(inputs: Sequence[ScaleInput], keyer: Keyer) -> list[ScaleInput]:
    """The inputs with the steps ``keyer`` needs: live-byte troughs for position keys, whole windows for sites."""
    return [item.with_troughs(keyer.needs_equal_counts) for item in inputs]


def align(reference: ScaleInput, others: Sequence[ScaleInput], keyer: Keyer | None = None) -> Alignment:
    """Match every allocation of ``reference`` with its counterpart in each of ``others``."""
    keyer = keyer or choose_keyer([reference, *others])
    reference, *others = for_keyer([reference, *others], keyer)
    n_ref = len(reference.alloc_id)
    partner = np.full((n_ref, len(others)), -1, dtype=np.int64)
    matches: list[StepMatch] = []
    ref_typical = _typical_step_allocs(reference)
    ref_steps = [(r, step.from_end, reference.step_allocs(r)) for r, step in enumerate(reference.steps.steps)]
    ref_keys: dict[tuple[int, bool], list[Hashable]] = {}
    for j, other in enumerate(others):
        cache: dict[tuple[int, bool], dict[Hashable, int]] = {}
        for r, ref_from_end, ks in ref_steps:
            if not len(ks):
                continue
            best: tuple[tuple[int, int], int | None, bool] = ((-1, -1), None, False)
            for c in _candidates(other, ref_from_end):
                backward = ref_from_end or _from_end(other, c)
                # Steps keyed from their end may differ in length (a tail, a window): only
                # ordinals from the start need equal counts.
                if keyer.needs_equal_counts and not backward and len(other.step_allocs(c)) != ref_typical:
                    continue
                mine = ref_keys.get((r, backward))
                if mine is None:
                    mine = ref_keys[(r, backward)] = keyer.keys(reference.key_source, ks, backward)
                key_map = cache.get((c, backward))
                if key_map is None:
                    key_map = cache[(c, backward)] = _key_map(keyer, other, c, backward)
                score = _score(reference, other, ks, mine, key_map)
                if score > best[0]:
                    best = (score, c, backward)
            (hits, _), chosen, backward = best
            if chosen is not None:
                key_map = cache[(chosen, backward)]
                for k, key in zip(ks, ref_keys[(r, backward)]):
                    hit = key_map.get(key)
                    if hit is not None:
                        partner[k, j] = hit
            matches.append(StepMatch(r, j, chosen, max(hits, 0), len(ks),
                                     len(other.step_allocs(chosen)) if chosen is not None else 0))
    return Alignment(keyer.name, partner, matches)
