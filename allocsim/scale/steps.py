"""Training steps of a trace: where each step starts, so that traces are aligned step by step.

Use ``find_steps(trace)``. Step boundaries come from the trace's step markers when it has any (e.g.
Kineto ``ProfilerStep#N``, see ``STEP_LABEL_RE``: a step runs from its marker to the next one, the
last to the end of the trace). The events before the first boundary are the *prologue*: in a
window cut from a longer run (a ring buffer) this is the tail of a step whose start was not
recorded, so it is aligned from its end (``Step.from_end``).

Without markers, ``troughs=True`` takes boundaries from the repeating structure of the trace: a
training step ends when the memory it allocated has been freed, so a boundary is placed where live
bytes leave a trough (within 1% of the live range above the window's minimum). That is a guess a
window can fool: one that starts mid-step has no real trough, and its minimum is some dip inside
the step (measured on a real snapshot: a window cut inside the optimizer step splits into 150
"steps", one per parameter update). So callers that can name allocations by site ask for
``troughs=False``: a trace without markers is then one *whole window*, aligned from its end -- the
moment the recording was dumped, the same point of the program at every scale, whereas a ring
buffer's start falls anywhere.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..trace.schema import EventKind, Trace

#: A trough is where live bytes are within this share of the live range above their minimum.
TROUGH_SHARE = 0.01
#: Marker labels that start a training step (``ProfilerStep#3``, ``step 12``, ``Iteration_4``); other
#: markers (a snapshot's ``snapshot``) are not step boundaries.
STEP_LABEL_RE = re.compile(r"(?i)(step|iteration|iter)\s*[#_ ]?\s*\d+")


@dataclasses.dataclass(frozen=True)
class Step:
    """Events ``[first, end)`` of ``Trace.events``; prologues and whole windows are aligned from their end."""

    first: int
    end: int
    label: str
    #: The events before the first boundary (the tail of a step cut by the start of the window).
    prologue: bool = False
    #: Ordinals count from the end: a prologue, or a whole window without boundaries.
    from_end: bool = False

    def __len__(self) -> int:
        return self.end - self.first


@dataclasses.dataclass(frozen=True)
class Steps:
    """The steps of one trace and how their boundaries were found: ``markers``, ``troughs`` or ``none``."""

    steps: list[Step]
    source: str

    @property
    def body(self) -> list[Step]:
        """The steps that start at a boundary (every step but the prologue)."""
        return [s for s in self.steps if not s.prologue]


def find_steps(trace: Trace, troughs: bool = True) -> Steps:
    """Split ``trace`` into steps (see module doc); a trace without boundaries is one whole window."""
    kind = trace.column("kind")
    n = len(kind)
    markers = np.flatnonzero(kind == EventKind.MARKER)
    label_ids = trace.column("alloc_id")[markers]
    names = [trace.labels[int(i)] if 0 <= int(i) < len(trace.labels) else "" for i in label_ids]
    keep = [k for k, name in enumerate(names) if STEP_LABEL_RE.search(name)]
    boundaries = markers[keep]
    labels = [names[k] for k in keep]
    source = "markers"
    if len(boundaries) == 0:
        boundaries = trough_boundaries(trace) if troughs else np.zeros(0, dtype=np.int64)
        labels = [f"step {k + 1} (trough)" for k in range(len(boundaries))]
        source = "troughs" if len(boundaries) else "none"
    return Steps(_split(n, [int(b) for b in boundaries], labels), source)


def _split(n: int, boundaries: list[int], labels: list[str]) -> list[Step]:
    steps: list[Step] = []
    if not boundaries:
        return [Step(0, n, "whole window", from_end=True)] if n else []
    if boundaries[0] > 0:
        steps.append(Step(0, boundaries[0], "prologue", prologue=True, from_end=True))
    for k, start in enumerate(boundaries):
        end = boundaries[k + 1] if k + 1 < len(boundaries) else n
        if end > start:
            steps.append(Step(start, end, labels[k]))
    return steps


def live_bytes(trace: Trace) -> np.ndarray:
    """Live bytes after each event (the start-of-window allocations included)."""
    kind = trace.column("kind")
    size = trace.column("size_bytes")
    delta = np.where(kind == EventKind.ALLOC, size, 0) - np.where(kind == EventKind.FREE_REQUESTED, size, 0)
    start = int(trace.initial_allocs["size_bytes"].sum())
    return start + np.cumsum(delta, dtype=np.int64)


def trough_boundaries(trace: Trace) -> np.ndarray:
    """Event indices where live bytes leave a trough: the first allocation after each low stretch."""
    if not len(trace.events):
        return np.zeros(0, dtype=np.int64)
    live = live_bytes(trace)
    low, high = int(live.min()), int(live.max())
    if high == low:
        return np.zeros(0, dtype=np.int64)
    in_trough = live <= low + (high - low) * TROUGH_SHARE
    # The event right after a trough event that is not itself in the trough leaves the trough.
    leaving = np.flatnonzero(in_trough[:-1] & ~in_trough[1:]) + 1
    return leaving.astype(np.int64)
