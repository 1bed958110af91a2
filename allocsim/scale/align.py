"""Align the allocations of a reference trace with those of the other inputs, step by step.

Use ``align(reference, others)``. Every step of the reference (its prologue included) is matched
with the best-matching step of each other input -- the one that shares the most keys (see
``keys``), among up to ``MAX_CANDIDATE_STEPS`` of its steps -- so traces recorded from different
windows of a run align by step, not by file position. A prologue (the tail of a step cut by the
start of the window) is keyed from its end. The result says, for every reference allocation,
which allocation (and so which size) it is in each other input, or that it has none there.
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


def align(reference: ScaleInput, others: Sequence[ScaleInput], keyer: Keyer | None = None) -> Alignment:
    """Match every allocation of ``reference`` with its counterpart in each of ``others``."""
    keyer = keyer or choose_keyer([reference, *others])
    n_ref = len(reference.alloc_id)
    partner = np.full((n_ref, len(others)), -1, dtype=np.int64)
    matches: list[StepMatch] = []
    ref_typical = _typical_step_allocs(reference)
    ref_steps = []
    for r, step in enumerate(reference.steps.steps):
        ks = reference.step_allocs(r)
        if len(ks):
            ref_steps.append((r, step.prologue, ks, keyer.keys(reference.key_source, ks, step.prologue)))
    for j, other in enumerate(others):
        cache: dict[tuple[int, bool], dict[Hashable, int]] = {}
        for r, backward, ks, ref_keys in ref_steps:
            best: tuple[tuple[int, int], int | None, dict] = ((-1, -1), None, {})
            for c in _candidates(other, backward):
                # A prologue is a tail of a step: it is keyed from its end, so lengths may differ.
                if keyer.needs_equal_counts and not backward and len(other.step_allocs(c)) != ref_typical:
                    continue
                key_map = cache.get((c, backward))
                if key_map is None:
                    key_map = cache[(c, backward)] = _key_map(keyer, other, c, backward)
                score = _score(reference, other, ks, ref_keys, key_map)
                if score > best[0]:
                    best = (score, c, key_map)
            (hits, _), chosen, key_map = best
            if chosen is not None:
                for k, key in zip(ks, ref_keys):
                    hit = key_map.get(key)
                    if hit is not None:
                        partner[k, j] = hit
            matches.append(StepMatch(r, j, chosen, max(hits, 0), len(ks),
                                     len(other.step_allocs(chosen)) if chosen is not None else 0))
    return Alignment(keyer.name, partner, matches)
