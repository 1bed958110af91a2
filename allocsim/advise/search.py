"""The search: ``grid_search`` finds the settings that fit, ``smallest_capacities`` how small a device they need.

``grid_search(preset, runs, capacity)``:

1. the recorded settings, then each knob's other values one at a time (the rest recorded);
2. a knob none of whose values changes anything on this trace alone (``rank.signature`` equal to
   the recorded run's) is reported as having no effect and stays at its recorded value;
3. every combination of the other knobs' values (recorded ones included) is run: the search is
   complete for that grid, which the report prints.

``smallest_capacities`` bisects capacities (``capacity.Bisection``) for the recommendations, from
the lower bound up to the capacity asked about; ``closest_misses`` does it upward for settings
that do not fit, from that capacity up to where each fits with no limit (its unlimited peak, or
that over the memory fraction). Capacity probes replay without timing: memory answers follow the
recorded stream order in both modes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction

from .capacity import STEP_BYTES, Bisection, probes_per_search
from .knobs import Knob, Preset
from .rank import Outcome, fits, nearest_misses, signature
from .runs import Point, Runs


@dataclass
class GridResult:
    """What the grid search ran and found."""

    knobs: list[Knob]
    effective: list[Knob]                 #: knobs combined in the grid
    no_effect: list[Knob]                 #: knobs that changed nothing alone (left at their recorded value)
    baseline: Outcome                     #: the recorded settings' run
    outcomes: list[Outcome] = field(default_factory=list)   #: every point of the grid, in grid order

    @property
    def configurations(self) -> int:
        """Points in the grid (the product of the effective knobs' values)."""
        return len(self.outcomes)


def _outcome(point: Point, row: dict) -> Outcome:
    return Outcome(changes=point.changes, params=point.param_dict, row=row, order=point.order)


def grid_search(preset: Preset, runs: Runs, capacity_bytes: int, *, fast: bool = False) -> GridResult:
    """Steps 1-3 of the module doc, at ``capacity_bytes``."""
    knobs = preset.knobs()
    base = Point.of([], {}, 0)
    singles = [(knob, Point.of([(knob.name, choice.text)], dict(choice.params)))
               for knob in knobs for choice in knob.choices[1:]]
    rows = runs.run([(base, capacity_bytes, fast)] + [(p, capacity_bytes, fast) for _, p in singles])
    reference = signature(rows[0])
    changed = {knob.name for (knob, _), row in zip(singles, rows[1:]) if signature(row) != reference}
    effective = [k for k in knobs if k.name in changed]
    no_effect = [k for k in knobs if k.name not in changed]
    points = []
    for order, combo in enumerate(itertools.product(*(k.choices for k in effective))):
        changes = [(k.name, c.text) for k, c in zip(effective, combo) if not c.recorded]
        params: dict = {}
        for choice in combo:
            params.update(choice.params)
        points.append(Point.of(changes, params, order))
    grid_rows = runs.run([(p, capacity_bytes, fast) for p in points])
    outcomes = [_outcome(p, r) for p, r in zip(points, grid_rows)]
    return GridResult(knobs, effective, no_effect, _outcome(base, rows[0]), outcomes)


def _point(outcome: Outcome) -> Point:
    return Point.of(list(outcome.changes), outcome.params, outcome.order)


def _bisect(searches: list[Bisection], runs: Runs, workers: int) -> None:
    """Run probe rounds until every search is done."""
    while True:
        active = [s for s in searches if not s.done]
        if not active:
            return
        k = probes_per_search(workers, len(active))
        items = [(s, c) for s in active for c in s.probes(k)]
        rows = runs.run([(_point(s.key), c, True) for s, c in items])
        answers: dict[int, dict[int, bool]] = {}
        for (search, capacity), row in zip(items, rows):
            answers.setdefault(id(search), {})[capacity] = fits(row, capacity)
        for search in active:
            search.update(answers.get(id(search), {}))


def smallest_capacities(outcomes: list[Outcome], runs: Runs, *, lower_bound_bytes: int, capacity_bytes: int,
                        workers: int = 1, step_bytes: int = STEP_BYTES) -> dict[int, Bisection]:
    """``id(outcome)`` -> its finished ``Bisection`` (``fit_bytes`` is the smallest capacity that fits)."""
    searches = [Bisection(o, fail_bytes=lower_bound_bytes - 1, fit_bytes=capacity_bytes, step_bytes=step_bytes)
                for o in outcomes]
    _bisect(searches, runs, workers)
    return {id(s.key): s for s in searches}


@dataclass
class Miss:
    """A setting that does not fit, and the smallest capacity at which it does (None: not found)."""

    outcome: Outcome
    min_capacity_bytes: int | None
    search: Bisection | None = None
    note: str = ""


def closest_misses(outcomes: list[Outcome], runs: Runs, *, capacity_bytes: int, workers: int = 1,
                   candidates: int = 3, step_bytes: int = STEP_BYTES) -> list[Miss]:
    """For the ``candidates`` failing settings nearest to fitting (``rank.nearest_misses``): the smallest
    capacity at which each fits, searched upward from ``capacity_bytes``; closest first."""
    near = nearest_misses(outcomes, capacity_bytes, candidates)
    if not near:
        return []
    unlimited = runs.run([(_point(o), None, True) for o in near])
    misses: list[Miss] = []
    tops: list[tuple[Outcome, int]] = []
    for outcome, row in zip(near, unlimited):
        if not fits(row, None):
            misses.append(Miss(outcome, None, note="runs out of memory even on an unlimited device "
                                                   "(a limit in its settings)"))
            continue
        fraction = row.get("params.memory_fraction")
        need = int(row["peak_reserved_bytes"])
        if fraction:   # the fraction caps what the allocator may reserve: the device must be larger
            need = math.ceil(Fraction(need) / Fraction(str(fraction)))
        top = max(-(-need // step_bytes) * step_bytes, capacity_bytes + step_bytes)
        tops.append((outcome, top))
    confirmed = runs.run([(_point(o), top, True) for o, top in tops])
    searches = []
    for (outcome, top), row in zip(tops, confirmed):
        if fits(row, top):
            searches.append(Bisection(outcome, fail_bytes=capacity_bytes, fit_bytes=top, step_bytes=step_bytes))
        else:
            misses.append(Miss(outcome, None, note=f"does not fit at {top:,} bytes, where its unlimited run would"))
    _bisect(searches, runs, workers)
    misses += [Miss(s.key, s.fit_bytes, s) for s in searches]
    return sorted(misses, key=lambda m: (m.min_capacity_bytes is None, m.min_capacity_bytes or 0))
