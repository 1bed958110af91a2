"""Alignment keys: name each allocation of a step by what it is, so the same allocation can be found at another scale.

A key is unique within one step and comparable across traces of the same program. ``KEYERS`` lists
the ways of naming allocations, best first; ``allocsim.scale.align`` uses the first one that every
input trace supports:

1. ``code-site`` -- the allocation's code site (its stack, see ``sites``) and its ordinal among
   the step's allocations from that site. Used where every input has real allocation stacks
   (PyTorch snapshots).
2. ``operator`` -- the same with the chain of enclosing operators as the site (the Kineto reader's
   pseudo-frames, e.g. ``aten::linear > aten::addmm``). Used where every input has them.
3. ``position`` -- the allocation's ordinal in the step. Used only between steps with the same
   number of allocations (otherwise one extra allocation would misalign everything after it).

With a site, an allocation that appears at some scale (a kernel that needs a workspace past some
size) shifts only the later allocations *from its own site*: those then align with the next one of
that site in the other input (harmless when, as for repeated layers, its size follows the same
law), and the last one aligns only with inputs that have the extra allocation too (counted as "in
some inputs"). Allocations without frames (outside every operator) share the empty site, so they
are keyed by their order among themselves.

Keys are computed forwards (ordinals from the start of the step) or, for a prologue that is the
tail of a step, backwards (ordinals from its end).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Hashable, Sequence


@dataclasses.dataclass
class KeySource:
    """What a keyer may look at for one trace: where its frames come from and each allocation's site."""

    origin: str = "none"                 #: ``sites.frame_origin``: "code", "operators" or "none"
    sites: list[str] | None = None       #: the site of allocation k (``sites.allocation_sites``)


@dataclasses.dataclass(frozen=True)
class Keyer:
    """One way of naming allocations: ``keys(source, alloc_ks, backward)`` -> one key per allocation."""

    name: str
    available: Callable[[KeySource], bool]
    keys: Callable[[KeySource, Sequence[int], bool], list[Hashable]]
    #: True when keys only mean something between steps with equal allocation counts.
    needs_equal_counts: bool = False


def site_keys(source: KeySource, alloc_ks: Sequence[int], backward: bool) -> list[Hashable]:
    """``(site, ordinal among the step's allocations from that site)`` for allocations ``alloc_ks`` of one step."""
    assert source.sites is not None
    sites = source.sites
    seen: Counter = Counter()
    out: list[Hashable] = [None] * len(alloc_ks)
    order = range(len(alloc_ks) - 1, -1, -1) if backward else range(len(alloc_ks))
    for i in order:
        site = sites[alloc_ks[i]]
        out[i] = (site, seen[site])
        seen[site] += 1
    return out


def position_keys(source: KeySource, alloc_ks: Sequence[int], backward: bool) -> list[Hashable]:
    """The allocation's ordinal within the step (from its end when ``backward``)."""
    n = len(alloc_ks)
    return [("#", n - 1 - i) if backward else ("#", i) for i in range(n)]


KEYERS: tuple[Keyer, ...] = (
    Keyer("code-site", lambda source: source.origin == "code" and source.sites is not None, site_keys),
    Keyer("operator", lambda source: source.origin == "operators" and source.sites is not None, site_keys),
    Keyer("position", lambda source: True, position_keys, needs_equal_counts=True),
)
