"""One input of ``allocsim scale``: a trace recorded at a known scale value, split into steps.

Use ``load_input(path, value)`` for a file (Kineto captures also get operator attribution) or
``prepare_input(trace, value)`` for a ``Trace`` already in memory.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

import numpy as np

from ..errors import AllocsimError
from ..trace import read_trace
from ..trace.schema import EventKind, Trace
from .keys import KeySource
from .kineto_ops import OpPaths, op_paths
from .steps import Steps, find_steps

_VALUE_RE = re.compile(r"\d+(\.\d+)?")


@dataclasses.dataclass
class ScaleInput:
    """A single-device trace at scale ``value``, with its allocations listed in order.

    ``alloc_event[k]``, ``alloc_id[k]``, ``size_bytes[k]`` and ``alloc_step[k]`` describe the k-th
    allocation of the trace (its event index, id, size and the index of its step in ``steps``).
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

    def step_allocs(self, step_index: int) -> np.ndarray:
        """Allocation ordinals (k) of one step, in order (steps are contiguous: a binary search)."""
        first = np.searchsorted(self.alloc_step, step_index, side="left")
        end = np.searchsorted(self.alloc_step, step_index, side="right")
        return np.arange(first, end, dtype=np.int64)

    def step_duration_ns(self) -> float | None:
        """Mean time from first to last event over the steps that start at a boundary, if any."""
        t = self.trace.column("t_ns")
        spans = [int(t[s.end - 1]) - int(t[s.first]) for s in self.steps.body if len(s) > 1]
        if not spans:
            spans = [int(t[s.end - 1]) - int(t[s.first]) for s in self.steps.steps if len(s) > 1]
        return float(np.mean(spans)) if spans else None


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


def load_input(path: str, value: Fraction, *, device: int | None = None, lenient: bool = False) -> ScaleInput:
    """Read ``path`` and prepare it; Kineto files also get their allocations' enclosing ops."""
    trace = single_device(read_trace(path, lenient=lenient), device, path)
    ops = op_paths(path, trace) if trace.meta.format == "kineto" else None
    return prepare_input(trace, value, path=path, ops=ops)


def prepare_input(trace: Trace, value: Fraction, *, path: str = "", ops: OpPaths | None = None) -> ScaleInput:
    """Split ``trace`` into steps and list its allocations (see ``ScaleInput``)."""
    steps = find_steps(trace)
    kind = trace.column("kind")
    alloc_event = np.flatnonzero(kind == EventKind.ALLOC)
    step_of_event = np.zeros(len(kind), dtype=np.int64)
    for index, step in enumerate(steps.steps):
        step_of_event[step.first:step.end] = index
    return ScaleInput(
        path=path or trace.meta.source,
        value=Fraction(value),
        trace=trace,
        steps=steps,
        alloc_event=alloc_event,
        alloc_id=trace.column("alloc_id")[alloc_event],
        size_bytes=trace.column("size_bytes")[alloc_event],
        alloc_step=step_of_event[alloc_event],
        key_source=KeySource(ops=ops, trace=trace),
    )
