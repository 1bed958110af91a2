"""Alignment keys: name each allocation of a step by what it is, so the same allocation can be found at another scale.

A key is unique within one step and comparable across traces of the same program. ``KEYERS`` lists
the ways of naming allocations, best first; ``allocsim.scale.align`` uses the first one that every
input trace supports:

1. ``code-site`` -- the allocation's stack frames and its ordinal among the step's allocations
   from that site. **Not available yet** (see ``code_site_keys``: the trace model gains
   ``Trace.events.stack_id`` / ``Trace.stack(id)`` in a later version).
2. ``operator`` -- the chain of enclosing operator instances (Kineto CPU ops), each named by its op
   name and its ordinal among its siblings of that name, then the allocation's ordinal within its
   innermost op. An op that allocates once more at some scale shifts only the keys of its own
   later allocations, not the rest of the step. An op *instance* that appears at some scale shifts
   the ordinals of its later same-named siblings: those then align with the next same-named op of
   the other input (harmless when, as for repeated layers, its sizes follow the same law) and the
   last one aligns only with inputs that have the extra op too (counted as "in some inputs").
3. ``position`` -- the allocation's ordinal in the step. Used only between steps with the same
   number of allocations (otherwise one extra allocation would misalign everything after it).

Keys are computed forwards (ordinals from the start of the step) or, for a prologue that is the
tail of a step, backwards (ordinals from its end).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Hashable, Sequence

from .kineto_ops import OpPaths


@dataclasses.dataclass
class KeySource:
    """What a keyer may look at for one trace: its op attribution and (later) its code sites."""

    ops: OpPaths | None = None
    trace: object | None = None


@dataclasses.dataclass(frozen=True)
class Keyer:
    """One way of naming allocations: ``keys(source, alloc_ks, backward)`` -> one key per allocation."""

    name: str
    available: Callable[[KeySource], bool]
    keys: Callable[[KeySource, Sequence[int], bool], list[Hashable]]
    #: True when keys only mean something between steps with equal allocation counts.
    needs_equal_counts: bool = False


# --------------------------------------------------------------------------- code site (seam)
def code_site_available(source: KeySource) -> bool:
    """SEAM(code-site): True once the trace model carries stack frames; always False today.

    To enable: when ``source.trace`` has ``events["stack_id"]`` and ``Trace.stack(id)``, return
    True here and build keys in ``code_site_keys`` as ``(frames, ordinal)`` where ``frames`` is the
    tuple of (file, line, function) of ``trace.stack(stack_id)`` with per-run noise removed (object
    addresses in built-in method names), and ``ordinal`` counts earlier allocations of the step with
    the same frames (from the end when ``backward``). Nothing else in the scale package changes:
    ``align.choose_keyer`` already tries this keyer first.
    """
    return False


def code_site_keys(source: KeySource, alloc_ks: Sequence[int], backward: bool) -> list[Hashable]:
    """SEAM(code-site): keys by stack frames; see ``code_site_available``."""
    raise NotImplementedError("code-site keys need stack frames in the trace model")


# --------------------------------------------------------------------------- operator
def op_available(source: KeySource) -> bool:
    """True when the trace's allocations were attributed to operators."""
    return source.ops is not None


def op_keys(source: KeySource, alloc_ks: Sequence[int], backward: bool) -> list[Hashable]:
    """Hierarchical operator keys (see module doc) for allocations ``alloc_ks`` of one step, in order."""
    assert source.ops is not None
    names, paths = source.ops.names, source.ops.paths
    instance_key: dict[int, tuple] = {}
    sibling_count: Counter = Counter()
    alloc_count: Counter = Counter()
    order = range(len(alloc_ks) - 1, -1, -1) if backward else range(len(alloc_ks))
    out: list[Hashable] = [None] * len(alloc_ks)
    for i in order:
        parent: tuple | None = None
        for op in paths[alloc_ks[i]]:
            key = instance_key.get(op)
            if key is None:
                slot = (parent, names[op])
                key = (parent, names[op], sibling_count[slot])
                sibling_count[slot] += 1
                instance_key[op] = key
            parent = key
        out[i] = (parent, alloc_count[parent])
        alloc_count[parent] += 1
    return out


# --------------------------------------------------------------------------- position
def position_keys(source: KeySource, alloc_ks: Sequence[int], backward: bool) -> list[Hashable]:
    """The allocation's ordinal within the step (from its end when ``backward``)."""
    n = len(alloc_ks)
    return [("#", n - 1 - i) if backward else ("#", i) for i in range(n)]


KEYERS: tuple[Keyer, ...] = (
    Keyer("code-site", code_site_available, code_site_keys),
    Keyer("operator", op_available, op_keys),
    Keyer("position", lambda source: True, position_keys, needs_equal_counts=True),
)
