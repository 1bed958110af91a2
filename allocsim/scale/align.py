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


def _candidates(item: ScaleInput) -> list[int]:
    body = [i for i, s in enumerate(item.steps.steps) if not s.prologue]
    return (body or list(range(len(item.steps.steps))))[:MAX_CANDIDATE_STEPS]


def _typical_step_allocs(item: ScaleInput) -> int | None:
    counts = [len(item.step_allocs(i)) for i in _candidates(item)]
    return Counter(counts).most_common(1)[0][0] if counts else None


def align(reference: ScaleInput, others: Sequence[ScaleInput], keyer: Keyer | None = None) -> Alignment:
    """Match every allocation of ``reference`` with its counterpart in each of ``others``."""
    keyer = keyer or choose_keyer([reference, *others])
    n_ref = len(reference.alloc_id)
    partner = np.full((n_ref, len(others)), -1, dtype=np.int64)
    matches: list[StepMatch] = []
    ref_typical = _typical_step_allocs(reference)
    for j, other in enumerate(others):
        cache: dict[tuple[int, bool], dict[Hashable, int]] = {}
        candidates = _candidates(other)
        for r, step in enumerate(reference.steps.steps):
            ks = reference.step_allocs(r)
            if not len(ks):
                continue
            backward = step.prologue
            ref_keys = keyer.keys(reference.key_source, ks, backward)
            best: tuple[int, int | None, dict] = (-1, None, {})
            for c in candidates:
                if keyer.needs_equal_counts and len(other.step_allocs(c)) != ref_typical:
                    continue
                key_map = cache.get((c, backward))
                if key_map is None:
                    key_map = cache[(c, backward)] = _key_map(keyer, other, c, backward)
                hits = sum(1 for key in ref_keys if key in key_map)
                if hits > best[0]:
                    best = (hits, c, key_map)
            hits, chosen, key_map = best
            if chosen is not None:
                for k, key in zip(ks, ref_keys):
                    hit = key_map.get(key)
                    if hit is not None:
                        partner[k, j] = hit
            matches.append(StepMatch(r, j, chosen, max(hits, 0), len(ks),
                                     len(other.step_allocs(chosen)) if chosen is not None else 0))
    return Alignment(keyer.name, partner, matches)
