"""One input of ``allocsim scale``: a trace recorded at a known scale value, split into steps.

Use ``load_input(path, value)`` for a file or ``prepare_input(trace, value)`` for a ``Trace``
already in memory; either way each allocation is named by its code site or its enclosing operators
when the trace's frames tell them (``sites``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import AllocsimError
from ..metrics.state import HOW_TO_RECORD, is_state_only
from ..trace import read_trace
from ..trace.schema import EventKind, Trace
from .keys import KeySource
from .sites import allocation_sites
from .steps import Steps, find_steps

_VALUE_RE = re.compile(r"\d+(\.\d+)?")


@dataclasses.dataclass
class ScaleInput:
    """A single-device trace at scale ``value``, with its allocations listed in order.

    ``alloc_event[k]``, ``alloc_id[k]``, ``size_bytes[k]`` and ``alloc_step[k]`` describe the k-th
    allocation of the trace (its event index, id, size and the index of its step in ``steps``).
    ``troughs`` says whether a trace without step markers was split at live-byte troughs (for
    position keys) or kept as one window (for site keys); ``with_troughs`` switches.
    """

    path: str
    value: Fraction
    trace: Trace
    steps: Steps
    alloc_event: np.ndarray
    alloc_id: np.ndarray
    size_bytes: np.ndarray
    alloc_step: np.ndarray
    key_source: KeySource
    troughs: bool = True

    def with_troughs(self, troughs: bool) -> "ScaleInput":
        """This input with its steps found with or without live-byte troughs (itself if unchanged)."""
        if troughs == self.troughs:
            return self
        steps = find_steps(self.trace, troughs=troughs)
        return dataclasses.replace(self, steps=steps, troughs=troughs,
                                   alloc_step=_step_of_event(steps, len(self.trace.events))[self.alloc_event])

    def step_allocs(self, step_index: int) -> np.ndarray:
        """Allocation ordinals (k) of one step, in order (steps are contiguous: a binary search)."""
        first = np.searchsorted(self.alloc_step, step_index, side="left")
        end = np.searchsorted(self.alloc_step, step_index, side="right")
        return np.arange(first, end, dtype=np.int64)

    def step_duration_ns(self) -> Fraction | None:
        """Mean time from first to last event over the steps that start at a boundary, if any (exact)."""
        t = self.trace.column("t_ns")
        spans = [int(t[s.end - 1]) - int(t[s.first]) for s in self.steps.body if len(s) > 1]
        if not spans:
            spans = [int(t[s.end - 1]) - int(t[s.first]) for s in self.steps.steps if len(s) > 1]
        return Fraction(sum(spans), len(spans)) if spans else None


#: The columns that make two recordings the same one: every event's time, kind, id, size and stream, and the
#: allocations alive at the start. Two runs of a program differ in their times even where sizes agree.
_SAME_RECORDING_COLUMNS = (("events", ("t_ns", "kind", "alloc_id", "size_bytes", "stream")),
                           ("initial_allocs", ("alloc_id", "size_bytes")))


def recording_digest(trace: Trace) -> str:
    """A digest of the trace's events and start allocations: equal digests mean the same recording (or a copy).

    Paths and formats do not count (a copy, a conversion to Parquet, a renamed file are the same recording);
    one pass over the columns, memory for one column at a time.
    """
    digest = hashlib.sha256()
    for table_name, columns in _SAME_RECORDING_COLUMNS:
        table = trace.table(table_name)
        digest.update(f"{table_name}:{len(table)}".encode())
        for name in columns:
            digest.update(np.ascontiguousarray(table[name]).astype("<i8", copy=False).tobytes())
    return digest.hexdigest()


def parse_value(text: str) -> Fraction:
    """A positive scale value from text (``"8"``, ``"2.5"``), exactly."""
    text = text.strip()
    if not _VALUE_RE.fullmatch(text) or len(text) > 30:
        raise ValueError(f"scale value {text!r} is not a positive number")
    value = Fraction(text)
    if value <= 0:
        raise ValueError(f"scale value {text!r} must be > 0")
    return value


def parse_spec(spec: str) -> tuple[str, Fraction]:
    """Split ``"TRACE@VALUE"`` at its last ``@``."""
    path, sep, value = spec.rpartition("@")
    if not sep or not path:
        raise ValueError(f"{spec!r}: expected TRACE@VALUE, e.g. bert_b4.json.gz@4")
    return path, parse_value(value)


def single_device(trace: Trace, device: int | None, path: str) -> Trace:
    """The part of ``trace`` on ``device`` (required when it has several)."""
    devices = sorted(set(int(d) for d in np.unique(trace.column("device"))) |
                     set(int(d) for d in trace.initial_allocs["device"]))
    if device is None:
        if len(devices) > 1:
            raise AllocsimError(f"{path}: several devices {devices}; choose one with --device")
        return trace
    if device not in devices:
        raise AllocsimError(f"{path}: no device {device} in this trace (devices: {devices})")
    return trace.for_device(device)


def load_input(path: str, value: Fraction, *, device: int | None = None, lenient: bool = False,
               limits: Any = None) -> ScaleInput:
    """Read ``path`` (one device of it) and prepare it."""
    trace = single_device(read_trace(path, lenient=lenient, limits=limits), device, path)
    return prepare_input(trace, value, path=path)


def _step_of_event(steps: Steps, n_events: int) -> np.ndarray:
    step_of_event = np.zeros(n_events, dtype=np.int64)
    for index, step in enumerate(steps.steps):
        step_of_event[step.first:step.end] = index
    return step_of_event


def prepare_input(trace: Trace, value: Fraction, *, path: str = "") -> ScaleInput:
    """Split ``trace`` into steps and list its allocations (see ``ScaleInput``)."""
    if is_state_only(trace):
        # A final state alone has no allocation to align: without this, every pair of such inputs
        # reads as two programs ("0.0% of the allocations ... found").
        raise AllocsimError(f"{path or trace.meta.source} records the final state only, no history to scale: "
                            f"{HOW_TO_RECORD}")
    origin, sites = allocation_sites(trace)
    # Sites pair allocations without step boundaries; a trough guess could cut a window mid-step.
    troughs = sites is None
    steps = find_steps(trace, troughs=troughs)
    kind = trace.column("kind")
    alloc_event = np.flatnonzero(kind == EventKind.ALLOC)
    step_of_event = _step_of_event(steps, len(kind))
    return ScaleInput(
        path=path or trace.meta.source,
        value=Fraction(value),
        trace=trace,
        steps=steps,
        alloc_event=alloc_event,
        alloc_id=trace.column("alloc_id")[alloc_event],
        size_bytes=trace.column("size_bytes")[alloc_event],
        alloc_step=step_of_event[alloc_event],
        key_source=KeySource(origin=origin, sites=sites),
        troughs=troughs,
    )
