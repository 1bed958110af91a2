"""Build the trace at an unrun scale from traces at other scales: ``scale_inputs``, or ``Scaler`` for many targets.

The output is the *reference* input (the one whose value is nearest the target; the larger on a
tie) with every size replaced by its fitted law evaluated at the target:

* sizes -- each reference allocation aligned with allocations of the other inputs gets the law
  (``laws.fit_law``) through all its sizes; an allocation found in no other input keeps its
  reference size (the unaligned rule);
* order -- the reference's events, in its order: lifetimes keep their order;
* times -- ``t0 + (t - t0) * D(target) / D(reference)``, where ``D(v)`` is the least-squares line
  through the inputs' mean step durations (ratio 1 when that is not positive);
* start-of-window state -- the reference's initial allocations, paired with the other inputs' by
  what they are (``initial``: stream and site, equal sizes, then size class -- never by position),
  scaled by the same laws; their layout (segments, blocks) is predicted by ``start_layout`` (weights
  where the reference run had them, the rest as the window's steps leave them); the reference run's
  allocator decisions are dropped.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from fractions import Fraction
from typing import Sequence

import numpy as np

from ..errors import AllocsimError
from ..trace.inference.completeness import predicted_reason
from ..trace.reading.builder import MAX_SIZE_BYTES
from ..trace.schema import Trace, TraceMeta, check_schema, empty_frame, INITIAL_ALLOC_DTYPES
from .align import Alignment, align, choose_keyer, for_keyer
from .initial import initial_partners
from .consistency import MixedInputs, fit_differences, input_differences
from .inputs import ScaleInput, recording_digest
from .laws import LAW_KINDS, SizeLaw, fit_law
from .ranges import encode_range, layout_miss_bytes, new_sizes, prediction_range, widen_by_layout
from .report import InputSummary, ScaleReport
from .sites import frame_origin
from .evaluate import peaks
from .start_layout import as_predicted, one_cache
from .steps import live_bytes

UNALIGNED_RULE = "kept at the reference input's size (assumed constant)"
INITIAL_RULE = ("paired by stream and code site, then size class c*v^k (classes every input holds most of first), "
                "in order, never by position; unpaired ones kept at the reference size")
LAYOUT_STEADY = ("start allocations that keep their size (weights) where the reference run had them; the rest as "
                 "one step of the window and the part of the next up to where it opens leave them (the window "
                 "repeats itself)")
LAYOUT_CACHED = ("the reference run's recorded start layout, cached segments and all (each input's start segments hold "
                 "every smaller input's: one process ran them in turn and kept its cache); start allocations that keep "
                 "their size (weights) in place, the rest placed anew")
LAYOUT_PLACED = ("start allocations that keep their size (weights) where the reference run had them; the rest placed "
                 "anew in id order (the window does not repeat itself)")
TIME_RULE = "reference times scaled by D(target)/D(reference), D = least-squares line through mean step durations"


class TargetTooFar(AllocsimError):
    """The laws give a size (or a time) at the target that no trace can hold: the target is too far out."""


@dataclasses.dataclass
class ScaleResult:
    """The synthesized trace and the report of how it was built."""

    trace: Trace
    report: ScaleReport


@dataclasses.dataclass
class _Fits:
    """Predicted sizes plus the counts the report needs."""

    sizes: np.ndarray
    laws: Counter
    assumed: Counter
    rounded: int = 0
    clamped: int = 0
    #: Least and most size any law consistent with the points allows (``SizeLaw.bounds``).
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    #: Aligned allocations whose size falls as the value grows, and those no monomial fits.
    shrinking: int = 0
    no_monomial: int = 0
    #: (path-independent) example of a shrinking allocation: its points, for the refusal line.
    shrinking_example: tuple | None = None


def pick_reference(inputs: Sequence[ScaleInput], target: Fraction) -> int:
    """Index of the input nearest the target (the larger value on a tie)."""
    return min(range(len(inputs)), key=lambda i: (abs(inputs[i].value - target), -inputs[i].value))


def _check(inputs: Sequence[ScaleInput], scale_name: str) -> None:
    if len(inputs) < 2:
        raise AllocsimError("scale needs at least two traces at different values (TRACE@VALUE TRACE@VALUE)")
    values = [item.value for item in inputs]
    if len(set(values)) != len(values):
        dup = sorted(v for v, c in Counter(values).items() if c > 1)
        raise AllocsimError(f"two inputs have the same scale value {dup[0]}")
    # The same recording at two values (one file twice, a copy, a conversion) would make every size look
    # constant: "the range is the point", whatever the program does at other values.
    seen: dict[str, ScaleInput] = {}
    for item in inputs:
        first = seen.setdefault(recording_digest(item.trace), item)
        if first is not item:
            raise AllocsimError(
                f"{_said(first)} and {_said(item)} hold the same events (one recording given twice, or a copy of "
                f"it), so nothing tells how memory grows with {scale_name}: record the program once per value (run "
                f"it at {scale_name} {first.value} and again at {scale_name} {item.value}) and give each recording "
                "as TRACE@VALUE")


def _said(item: ScaleInput) -> str:
    """``name@value`` of an input, for messages."""
    return f"{os.path.basename(item.path) or item.path}@{item.value}"


def _fit_sizes(points_per_alloc: list[list[tuple[Fraction, int]]], scale_name: str, target: Fraction) -> _Fits:
    """Fit and evaluate one law per allocation (allocations with the same points share the fit)."""
    n = len(points_per_alloc)
    fits = _Fits(np.zeros(n, dtype=np.int64), Counter(), Counter(), low=np.zeros(n, dtype=np.int64),
                 high=np.zeros(n, dtype=np.int64))
    memo: dict[tuple, tuple[SizeLaw, int, bool, bool, int, int]] = {}
    for k, points in enumerate(points_per_alloc):
        signature = tuple(points)
        hit = memo.get(signature)
        if hit is None:
            law = fit_law(points, scale_name, target)
            size, rounded, _ = law.predict(target)
            if size > MAX_SIZE_BYTES:
                raise TargetTooFar(f"at {scale_name} {target} an allocation's law ({law.describe()}) gives "
                                   f"{size:,} bytes, more than any device holds ({MAX_SIZE_BYTES:,}): the target is "
                                   "too far from the inputs")
            clamped = size < 1   # no allocation has fewer than one byte
            if clamped:
                size = min(s for _, s in points)
            low, high = law.bounds(target)
            low, high = min(low, size), min(max(high, size), MAX_SIZE_BYTES)
            hit = memo[signature] = (law, size, rounded, clamped, low, high)
        law, size, rounded, clamped, low, high = hit
        fits.sizes[k] = size
        fits.low[k], fits.high[k] = low, high
        if len(points) == 1:
            fits.laws["unaligned"] += 1   # nothing to fit: the unaligned rule
        else:
            fits.laws[law.kind] += 1
            for term in law.assumed_zero:
                fits.assumed[term] += 1
            fits.no_monomial += law.follows_no_monomial
            if law.shrinking:
                fits.shrinking += 1
                fits.shrinking_example = fits.shrinking_example or tuple((str(v), s) for v, s in sorted(points))
        fits.rounded += rounded
        fits.clamped += clamped
    return fits


def _points(reference: ScaleInput, others: Sequence[ScaleInput], alignment: Alignment) -> list[list[tuple[Fraction, int]]]:
    out = []
    for k in range(len(reference.alloc_id)):
        pts = [(reference.value, int(reference.size_bytes[k]))]
        for j, other in enumerate(others):
            hit = alignment.partner[k, j]
            if hit >= 0:
                pts.append((other.value, int(other.size_bytes[hit])))
        out.append(pts)
    return out


def _initial_points(reference: ScaleInput, others: Sequence[ScaleInput]
                    ) -> tuple[list[list[tuple[Fraction, int]]], int, dict[int, tuple[int, ...]]]:
    """Points for each start-of-window allocation of the reference, paired by what it is (``initial``)."""
    ref_sizes = reference.trace.initial_allocs["size_bytes"].to_numpy()
    points = [[(reference.value, int(s))] for s in ref_sizes]
    partner, open_powers = initial_partners(reference.trace, reference.value, [(o.trace, o.value) for o in others])
    for j, other in enumerate(others):
        sizes = other.trace.initial_allocs["size_bytes"].to_numpy()
        for a in np.flatnonzero(partner[:, j] >= 0).tolist():
            points[a].append((other.value, int(sizes[partner[a, j]])))
    aligned = (partner >= 0).any(axis=1) if len(ref_sizes) else np.zeros(0, dtype=bool)
    return points, int(aligned.sum()), open_powers


def _widen_open(fits: _Fits, prepared: _Prepared, reference: ScaleInput, target: Fraction) -> None:
    """Widen the range of start-of-window rows whose size class is open to every class they allow."""
    sizes = reference.trace.initial_allocs["size_bytes"].to_numpy()
    for row, powers in prepared.init_open.items():
        ends = [min(MAX_SIZE_BYTES, max(1, int((Fraction(int(sizes[row])) * (target / reference.value) ** k
                                                + Fraction(1, 2)) // 1))) for k in powers]
        fits.low[row] = min(int(fits.low[row]), *ends)
        fits.high[row] = max(int(fits.high[row]), *ends)


def _time_ratio(inputs: Sequence[ScaleInput], reference: ScaleInput, target: Fraction) -> float:
    """D(target)/D(reference), D the least-squares line through the inputs' mean step durations (1.0 if not > 0).

    The line is fitted in exact rationals and rounded to a float once at the end: inputs whose steps
    all last the same give exactly 1.0 (no stretch), where a float fit gives 1 - 2**-52 or 1 + 2**-52
    depending on the BLAS underneath.
    """
    pairs = [(item.value, d) for item in inputs if (d := item.step_duration_ns()) is not None]
    ref_d = reference.step_duration_ns()
    if len(pairs) < 2 or not ref_d or ref_d <= 0:
        return 1.0
    n = len(pairs)
    sum_v = sum(v for v, _ in pairs)
    sum_d = sum(d for _, d in pairs)
    spread = n * sum(v * v for v, _ in pairs) - sum_v * sum_v
    if spread == 0:                       # every input at one value: no line, no stretch
        return 1.0
    slope = (n * sum(v * d for v, d in pairs) - sum_v * sum_d) / spread
    predicted = (sum_d - slope * sum_v) / n + slope * target
    return float(predicted / ref_d) if predicted > 0 else 1.0


#: Scaled times must stay well inside int64 nanoseconds.
MAX_SPAN_NS = 1 << 62


def _scaled_times(t_ns: np.ndarray, ratio: float) -> np.ndarray:
    if not len(t_ns) or ratio == 1.0:
        return t_ns.copy()
    t0 = int(t_ns[0])
    if (int(t_ns[-1]) - t0) * ratio + abs(t0) > MAX_SPAN_NS:
        raise TargetTooFar(f"times stretched {ratio:.3g}x leave the range of a trace: the target is too far from "
                           "the inputs")
    # Multiplying by a positive constant and flooring keeps the order of events.
    return t0 + np.floor((t_ns - t0).astype(np.float64) * ratio).astype(np.int64)


@dataclasses.dataclass
class _Prepared:
    """What a target needs from one reference input and does not depend on the target."""

    ref_index: int
    others: list[ScaleInput]
    alignment: Alignment
    points: list[list[tuple[Fraction, int]]]
    init_points: list[list[tuple[Fraction, int]]]
    init_aligned: int
    #: Start-of-window rows whose size class the inputs' sizes leave open: the powers k they allow.
    init_open: dict[int, tuple[int, ...]]


class Scaler:
    """The trace at any target from one set of inputs: ``Scaler(inputs, "seq").at(Fraction(8))``.

    Alignment depends on the reference input only, not on the target, so it is done once per
    reference and reused: building at many targets (``find_max``) costs a law evaluation each.
    """

    def __init__(self, inputs: Sequence[ScaleInput], scale_name: str = "batch", *, allow_mixed: bool = False):
        _check(inputs, scale_name)
        self.inputs = for_keyer(inputs, choose_keyer(inputs))
        self.scale_name = scale_name
        self.allow_mixed = allow_mixed
        #: How the inputs differ in more than the scale value (``consistency``); refused unless ``allow_mixed``.
        self.differences = input_differences(self.inputs)
        #: One process ran the inputs in turn and kept its cache (``start_layout.one_cache``).
        self.one_cache = one_cache([item.trace for item in sorted(self.inputs, key=lambda item: item.value)])
        if self.differences and not allow_mixed:
            raise MixedInputs(self.differences)
        #: Why the prediction stops early ("" when every input records its script to the end).
        self.incomplete = predicted_reason([(f"{item.path}@{item.value}", item.trace.meta.incomplete)
                                            for item in self.inputs])
        self._prepared: dict[int, _Prepared] = {}
        self._layout_misses: dict[str, tuple[int, int]] | None = None

    def layout_misses(self) -> dict[str, tuple[int, int]]:
        """Per input (``path@value``) with a recorded start layout: ``ranges.layout_miss_bytes`` (computed once)."""
        if self._layout_misses is None:
            self._layout_misses = {}
            for item in self.inputs:
                miss = layout_miss_bytes(item.trace)
                if miss is not None:
                    self._layout_misses[f"{item.path}@{item.value}"] = miss
        return self._layout_misses

    def _prepare(self, ref_index: int) -> _Prepared:
        found = self._prepared.get(ref_index)
        if found is None:
            reference = self.inputs[ref_index]
            others = [item for i, item in enumerate(self.inputs) if i != ref_index]
            alignment = align(reference, others)
            init_points, init_aligned, init_open = _initial_points(reference, others)
            found = self._prepared[ref_index] = _Prepared(ref_index, others, alignment,
                                                          _points(reference, others, alignment),
                                                          init_points, init_aligned, init_open)
        return found

    def at(self, target: Fraction | int, with_range: bool = True) -> ScaleResult:
        """The trace at ``target`` (see module doc), with its report (and its range unless ``with_range`` is False)."""
        target = Fraction(target)
        if target <= 0:
            raise AllocsimError(f"target value must be > 0, got {target}")
        prepared = self._prepare(pick_reference(self.inputs, target))
        result = _build(self.inputs, prepared, target, self.scale_name, self.one_cache)
        report = result.report
        n_ref = max(len(prepared.alignment.partner), 1)
        shares = [float((prepared.alignment.partner[:, j] >= 0).sum()) / n_ref for j in range(len(prepared.others))]
        differences = self.differences + fit_differences(self.inputs[prepared.ref_index], prepared.others, shares,
                                                         report.shrinking, report.shrinking_example, self.scale_name)
        if differences and not self.allow_mixed:
            raise MixedInputs(differences)
        report.consistent = not differences
        report.differences = [d.text for d in differences]
        if with_range:
            rng = result.report.prediction_range = prediction_range(result.trace)
            if self.one_cache:
                # The same process after the reference, or a fresh one: the range holds both.
                fresh_process = peaks(as_predicted(result.trace, self.inputs[prepared.ref_index].trace)[0])
                reserved = rng["peak_reserved_bytes"]
                reserved["low"] = min(reserved["low"], fresh_process["peak_reserved_bytes"])
                reserved["high"] = max(reserved["high"], fresh_process["peak_reserved_bytes"])
            misses = self.layout_misses()
            rng["start_layout_miss_bytes"] = {name: miss for name, (miss, _) in misses.items()}
            widen_by_layout(rng, misses)
            if any(miss for miss, _ in misses.values()):
                low = min(miss / recorded for miss, recorded in misses.values())
                high = max(miss / recorded for miss, recorded in misses.values())
                report.checks.append(
                    f"laid out as the prediction is, the inputs' start-of-window state misses their recorded peak "
                    f"reserved by {100 * low:+.2f}% .. {100 * high:+.2f}% (segments cached by earlier work in the same "
                    "process show here): the peak reserved range is widened by as much")
        return result


def scale_inputs(inputs: Sequence[ScaleInput], target: Fraction, scale_name: str = "batch", *,
                 allow_mixed: bool = False) -> ScaleResult:
    """The trace at ``target`` built from ``inputs`` (see module doc), with its report."""
    return Scaler(inputs, scale_name, allow_mixed=allow_mixed).at(target)


#: What the reference run's meta says about the GPU its trace was made for, kept in the output trace.
_CARRIED_HINTS = ("gpu", "torch", "capture")


def _carried_hints(reference_meta: TraceMeta) -> dict:
    """The hints the predicted trace keeps from its reference: whether the cuBLAS workspaces are in it (so
    ``run --gpu`` and ``--find-max --gpu`` do not add them twice) and the card a capture was made for."""
    from ..trace.inference.workspaces import cublas_workspaces_in_trace

    hints = reference_meta.version_hints or {}
    out = {key: hints[key] for key in _CARRIED_HINTS if key in hints}
    if cublas_workspaces_in_trace(reference_meta):
        out["cublas_workspaces"] = "in trace"
    return out


def _build(inputs: Sequence[ScaleInput], prepared: _Prepared, target: Fraction, scale_name: str,
           keep_cached: bool = False) -> ScaleResult:
    ref_index, others, alignment = prepared.ref_index, prepared.others, prepared.alignment
    reference = inputs[ref_index]
    fits = _fit_sizes(prepared.points, scale_name, target)
    init_fits = _fit_sizes(prepared.init_points, scale_name, target) if prepared.init_points else None
    if init_fits is not None:
        _widen_open(init_fits, prepared, reference, target)
    init_ids = reference.trace.initial_allocs["alloc_id"].to_numpy()

    events = reference.trace.events.copy()
    kind = events["kind"].to_numpy()
    ids = np.concatenate([reference.alloc_id, init_ids]).astype(np.int64)
    sizes = np.concatenate([fits.sizes, init_fits.sizes if init_fits else np.zeros(0, dtype=np.int64)])
    events["size_bytes"] = new_sizes(events["alloc_id"].to_numpy(), kind, events["size_bytes"].to_numpy(), ids, sizes)
    empty = np.zeros(0, dtype=np.int64)
    low = np.concatenate([fits.low, init_fits.low if init_fits else empty])
    high = np.concatenate([fits.high, init_fits.high if init_fits else empty])
    ratio = _time_ratio(inputs, reference, target)
    events["t_ns"] = _scaled_times(events["t_ns"].to_numpy(), ratio)

    initial = reference.trace.initial_allocs.copy() if len(init_ids) else empty_frame(INITIAL_ALLOC_DTYPES)
    if len(init_ids):
        initial["size_bytes"] = init_fits.sizes
        initial["addr"] = -1               # the layout at the target scale is unknown
        initial["block_size_bytes"] = -1

    report = _report(inputs, ref_index, others, alignment, fits, init_fits, prepared.init_aligned, ratio, target,
                     scale_name, LAYOUT_PLACED)
    meta = TraceMeta(
        format="allocsim-scale",
        source=f"{reference.path}@{target} ({scale_name})",
        devices=list(reference.trace.meta.devices),
        version_hints={"scale": {"scale_name": scale_name, "target": str(target),
                                 "inputs": [f"{item.path}@{item.value}" for item in inputs],
                                 "reference": f"{reference.path}@{reference.value}", "keyer": alignment.keyer,
                                 "frames": frame_origin(reference.trace),
                                 "aligned_share": round(report.aligned_share, 6),
                                 "aligned_bytes_share": round(report.aligned_bytes_share, 6),
                                 "range": encode_range(ids, low, high)}},
        allocator_settings=reference.trace.meta.allocator_settings,
        # a law fitted to captures that stop early predicts a run that stops early too
        incomplete=predicted_reason([(f"{item.path}@{item.value}", item.trace.meta.incomplete) for item in inputs]),
        notes=[f"synthesized by allocsim scale at {scale_name}={target} from "
               + ", ".join(f"{item.path}@{item.value}" for item in inputs),
               f"unaligned allocations {UNALIGNED_RULE}", f"times: {TIME_RULE} (ratio {ratio:.6g})",
               "the reference run's allocator decisions are not carried over"],
    )
    meta.version_hints.update(_carried_hints(reference.trace.meta))
    trace = Trace(events=events, meta=meta, labels=list(reference.trace.labels), initial_allocs=initial,
                  frames=reference.trace.frames, stacks=reference.trace.stacks)
    # Where the start-of-window allocations sit: weights where the reference run had them, the rest
    # as the window's own steps leave them when it repeats itself (a ring buffer's tail), else anew.
    trace, steady = as_predicted(trace, reference.trace, keep_cached)
    layout_rule = LAYOUT_CACHED if keep_cached else LAYOUT_STEADY if steady else LAYOUT_PLACED
    meta.version_hints["scale"]["start_layout"] = "cached" if keep_cached else "steady" if steady else "placed"
    report.initial["layout"] = layout_rule
    meta.notes.append(f"start-of-window layout: {layout_rule}")
    check_schema(trace)
    report.output_events = len(events)
    report.output_peak_live_bytes = int(live_bytes(trace).max()) if len(events) else int(initial["size_bytes"].sum())
    return ScaleResult(trace, report)


def _report(inputs, ref_index, others, alignment: Alignment, fits: _Fits, init_fits: _Fits | None,
            init_aligned: int, ratio: float, target: Fraction, scale_name: str, layout_rule: str) -> ScaleReport:
    reference = inputs[ref_index]
    found = alignment.matched_counts()
    ref_sizes = reference.size_bytes.astype(np.int64)
    every = found == len(others)
    none = found == 0
    some = ~every & ~none
    per_input = []
    for j, other in enumerate(others):
        rows = [m for m in alignment.step_matches if m.input_index == j]
        matched = sum(m.matched for m in rows)
        seen = sum(m.other_allocs for m in rows)
        per_input.append({"path": other.path, "value": str(other.value), "matched": matched,
                          "allocations_in_matched_steps": seen, "only_here": seen - matched})
    summaries = []
    for i, item in enumerate(inputs):
        live = live_bytes(item.trace)
        summaries.append(InputSummary(item.path, str(item.value), len(item.alloc_id), len(item.steps.steps),
                                      item.steps.source, int(live.max()) if len(live) else 0, i == ref_index))
    laws = Counter(fits.laws)
    assumed = Counter(fits.assumed)
    notes = []
    if init_fits is not None:
        notes.append("start-of-window laws: " + ", ".join(f"{k} {v}" for k, v in init_fits.laws.items()))
    if alignment.keyer == "position":
        notes.append("no operator or code-site information in some input: aligned by position in the step "
                     "(steps with a different number of allocations are not aligned)")
    return ScaleReport(
        scale_name=scale_name, target=str(target), inputs=summaries, keyer=alignment.keyer,
        allocations=len(ref_sizes), aligned_all=int(every.sum()), aligned_some=int(some.sum()),
        unaligned=int(none.sum()), bytes_reference=int(ref_sizes.sum()),
        bytes_aligned_all=int(ref_sizes[every].sum()), bytes_aligned_some=int(ref_sizes[some].sum()),
        bytes_unaligned=int(ref_sizes[none].sum()),
        laws={kind: int(laws.get(kind, 0)) for kind in
              LAW_KINDS + ("unaligned",)},
        assumed={term: int(assumed.get(term, 0)) for term in ("b", "c")},
        rounded=fits.rounded, clamped=fits.clamped, per_input=per_input,
        initial={"allocations": len(init_fits.sizes) if init_fits else 0, "aligned": init_aligned,
                 "rule": INITIAL_RULE, "layout": layout_rule},
        time_rule=TIME_RULE, time_ratio=ratio, unaligned_rule=UNALIGNED_RULE,
        output_events=0, output_peak_live_bytes=0, notes=notes,
        extrapolation=float(target / max(item.value for item in inputs)),
        checks=_checks(inputs, reference, target, scale_name, laws, assumed, int(none.sum()),
                       int(ref_sizes[none].sum()), int(ref_sizes.sum()), fits.clamped),
        shrinking=fits.shrinking + (init_fits.shrinking if init_fits else 0),
        shrinking_example=fits.shrinking_example or (init_fits.shrinking_example if init_fits else None),
        no_monomial=fits.no_monomial + (init_fits.no_monomial if init_fits else 0),
        undetermined=int((fits.low != fits.high).sum()) + (int((init_fits.low != init_fits.high).sum())
                                                            if init_fits else 0),
    )


def _checks(inputs, reference: ScaleInput, target: Fraction, scale_name: str, laws: Counter, assumed: Counter,
            unaligned: int, unaligned_bytes: int, total_bytes: int, clamped: int) -> list[str]:
    """What to check in this prediction: where it goes beyond what the inputs show."""
    values = sorted(item.value for item in inputs)
    out = []
    if target > values[-1]:
        ratio = float(target / values[-1])
        out.append(f"{scale_name} {target} is {ratio:.3g}x the largest input ({values[-1]})"
                   + ("; the leave-one-out check (docs/scale.md) covers 2x: record an input nearer the target to confirm"
                      if ratio > 2 else ""))
    elif target < values[0]:
        out.append(f"{scale_name} {target} is below the smallest input ({values[0]}): kernels often take other paths "
                   "at small sizes (the captures show it at batch 1)")
    if laws.get("irregular"):
        out.append(f"{laws['irregular']} allocations follow no law of degree <= 2 through their sizes (a kernel that "
                   "switches between the inputs): their prediction is the quadratic through the 3 nearest points")
    if assumed:
        terms = ", ".join(f"{term} in {count}" for term, count in sorted(assumed.items()))
        out.append(f"terms assumed zero ({terms}): record a third input to determine every law of degree <= 2")
    if unaligned:
        out.append(f"{unaligned} allocations ({100 * unaligned_bytes / max(total_bytes, 1):.1f}% of the bytes) were "
                   "found in no other input and keep the reference size")
    if clamped:
        out.append(f"{clamped} allocations fell below 1 byte by their law and were clamped to their smallest input size")
    if reference.trace.meta.format == "kineto" or (reference.trace.meta.version_hints or {}).get(
            "converted_from") == "kineto":
        out.append("a torch.profiler capture holds no memory allocated before profiling began (weights, optimizer "
                   "state): add it before comparing with a device's capacity")
    return out
