"""The largest scale value that fits a capacity: ``find_max(scaler, capacity_bytes)``.

The search (``SEARCH_RULE``, printed with every answer):

* values are whole multiples of ``multiple`` (1: every integer; 64: sequence lengths in steps of
  64), from ``multiple`` up to ``max_value``;
* every question is answered on the trace built at that value (``build.Scaler``), and assumed
  *monotone*: if a value fits, every smaller one does (memory grows with the scale value). Each
  search is galloping then bisection over the multiples, so it asks about log2(range) values,
  never each one;
* first the bound no allocator beats: the largest value whose peak live bytes fit (no replay,
  just the sizes). Nothing above it can fit, whatever the setting;
* then the recorded allocator settings: a replay (no timing) of the trace at each probed value,
  with the verdict ``allocsim run`` would print, up to that bound;
* then, between that answer and the bound, whether *any* setting fits: ``allocsim advise`` at
  each probed value (the recorded settings are among those it tries, so it never does worse).

Where the inputs leave sizes open (``ranges``), the search is done again on the high end of the
range with the recorded settings (``high_end``: the value that fits whatever the open laws are),
and the best answer is replayed at both ends (``ends``: "fits at the low end, not at the high end").

The answer is a prediction at a value nobody ran; how far it lies beyond the largest input is
reported (``extrapolation``), with the limits of the prediction (``report.LIMITS``).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from fractions import Fraction
from typing import Any, Callable

from ..errors import AllocsimError
from ..metrics.summary import lower_bound_bytes
from ..metrics.verdict import GIVEN
from ..runner import Capacity, simulate_trace
from ..trace.reading.builder import MAX_SIZE_BYTES
from ..units import format_bytes
from .build import Scaler, TargetTooFar
from .ranges import end_traces, judge_ends

#: Search at most this many times the largest input value when nothing else bounds it.
DEFAULT_MAX_FACTOR = 1024
SEARCH_RULE = ("values are whole multiples of {multiple} from {multiple} to {max_value}; each question is answered on "
               "the trace built at that value, by galloping then bisection, assuming that a value that fits means "
               "every smaller one fits (memory grows with the value)")


@dataclasses.dataclass
class Probe:
    """One value asked about, and the answer."""

    value: int
    fits: bool
    peak_live_bytes: int
    peak_reserved_bytes: int | None = None      #: recorded settings' replay
    line: str = ""                              #: the verdict line, or the best setting's paste line
    run_args: list[str] = dataclasses.field(default_factory=list)   #: ``allocsim run`` options of the best setting
    params: dict[str, Any] | None = None       #: the policy settings of ``run_args`` (None: the recorded ones)
    #: How a fit was found: "" (the probe's own search), or "replay": a setting that fitted a smaller value
    #: was replayed here and fits (advise's full search is then run only where the answer lands).
    by: str = ""


@dataclasses.dataclass
class Answer:
    """The largest value that fits under one rule (None: not even the smallest), and the first that does not."""

    rule: str
    value: int | None
    first_failing: int | None
    at_value: Probe | None = None
    at_failing: Probe | None = None


@dataclasses.dataclass
class FindMax:
    """Everything ``--find-max`` found; ``to_dict()`` for JSON, ``format_text()`` for people."""

    scale_name: str
    capacity_bytes: int
    policy: str
    multiple: int
    max_value: int
    largest_input: Fraction
    bound: Answer
    recorded: Answer
    advised: Answer | None
    probes: dict[str, list[Probe]]
    search_rule: str
    #: The largest value whose high end of the range fits with the recorded settings (None: the range is a
    #: point at every probed value, so this is ``recorded``).
    high_end: Answer | None = None
    #: Both ends of the range at the best answer (``ranges.judge_ends``; None when the range is a point).
    ends: dict[str, Any] | None = None

    @property
    def fits_both_ends(self) -> bool:
        """True when the best answer fits at both ends of its range (or its range is a point)."""
        return self.ends is None or self.ends.get("fits") is not False

    @property
    def best(self) -> Answer:
        """The advised answer when it was searched, else the recorded settings'."""
        return self.advised if self.advised is not None else self.recorded

    def extrapolation(self) -> float | None:
        """How many times the largest input value the best answer is."""
        value = self.best.value
        return None if value is None else float(Fraction(value) / self.largest_input)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = dataclasses.asdict(self)
        data["largest_input"] = str(self.largest_input)
        data["extrapolation"] = self.extrapolation()
        return data

    def format_text(self) -> str:
        """The answer for people."""
        name, cap = self.scale_name, format_bytes(self.capacity_bytes)
        lines = [f"find-max: the largest {name} that fits in {cap} ({self.policy} policy)",
                 f"  search: {self.search_rule}"]
        bound = self.bound
        if bound.value is None:
            lines.append(f"  no value fits: at {name} {bound.first_failing} the peak live bytes alone "
                         f"({format_bytes(bound.at_failing.peak_live_bytes)}) exceed {cap}")
            return "\n".join(lines)
        past = ("" if bound.first_failing is None else
                f"; at {bound.first_failing}: {format_bytes(bound.at_failing.peak_live_bytes)}")
        lines.append(f"  no setting can fit past {name} {bound.value}: peak live "
                     f"{format_bytes(bound.at_value.peak_live_bytes)}{past}"
                     + (" (the search limit)" if bound.first_failing is None else ""))
        lines += self._answer_lines(self.recorded, "recorded settings")
        if self.advised is not None:
            lines += self._answer_lines(self.advised, "best setting (advise)")
        if self.high_end is not None:
            lines += self._answer_lines(self.high_end, "recorded settings, high end of the range")
        if self.ends is not None:
            lines.append(f"  at {name} {self.best.value}: {self.ends['line']}")
        ratio = self.extrapolation()
        if ratio is not None:
            lines.append(f"  extrapolation: {self.best.value} is {ratio:.3g}x the largest input ({self.largest_input})"
                         + ("; the leave-one-out check covers 2x: record an input nearer the answer to confirm it"
                            if ratio > 2 else ""))
        counts = ", ".join(f"{len(v)} {k}" for k, v in self.probes.items() if v)
        lines.append(f"  probes: {counts}")
        return "\n".join(lines)

    def _answer_lines(self, answer: Answer, title: str) -> list[str]:
        name = self.scale_name
        if answer.value is None:
            return [f"  {title}: nothing fits, not even {name} {answer.first_failing}: {answer.at_failing.line}"]
        out = [f"  {title}: {name} {answer.value} fits: {answer.at_value.line}"]
        if answer.at_failing is not None:
            out.append(f"    {name} {answer.first_failing} does not: {answer.at_failing.line}")
        return out


class _Search:
    """The largest k with ``ask(k).fits``, for ``ask`` monotone (fits up to some k, not above); answers cached."""

    def __init__(self, ask: Callable[[int], Probe]):
        self.ask = ask
        self.seen: dict[int, Probe] = {}

    def probe(self, k: int) -> Probe:
        if k not in self.seen:
            self.seen[k] = self.ask(k)
        return self.seen[k]

    def largest(self, fit: int, fail: int | None, limit: int, start: int = 1) -> tuple[int, int | None]:
        """``(largest k that fits, smallest that does not)``, given ``fit`` (0: none known) and ``fail``.

        Without a known ``fail``, gallops from ``start`` doubling up to ``limit``; the second value
        is None when everything up to ``limit`` fits. Then bisects between the two.
        """
        k = max(start, fit + 1)
        while fail is None:
            k = min(k, limit)
            if not self.probe(k).fits:
                fail = k
            elif k == limit:
                return k, None
            else:
                fit, k = k, 2 * k
        while fail - fit > 1:
            mid = (fit + fail) // 2
            if self.probe(mid).fits:
                fit = mid
            else:
                fail = mid
        return fit, fail


def largest_fitting(fits: Callable[[int], bool], fit: int, fail: int | None, limit: int,
                    start: int = 1) -> tuple[int, int | None]:
    """``(largest k that fits, smallest that does not)`` for a monotone ``fits(k)``, by the search above.

    ``fit``: a k known to fit (0: none known); ``fail``: one known not to (None: gallop up to ``limit``).
    """
    return _Search(lambda k: Probe(k, bool(fits(k)), 0)).largest(fit, fail, limit, start)


def find_max(scaler: Scaler, capacity_bytes: int, *, policy: str = "pytorch", multiple: int = 1,
             max_value: int | None = None, advise: bool = True, executor: Any = None,
             log: Callable[[str], None] = lambda message: None) -> FindMax:
    """Search the largest value of ``scaler``'s scale parameter that fits ``capacity_bytes`` (see module doc)."""
    if capacity_bytes <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity_bytes}")
    if multiple < 1:
        raise ValueError(f"--multiple-of must be >= 1, got {multiple}")
    largest_input = max(item.value for item in scaler.inputs)
    if max_value is None:
        max_value = int(largest_input * DEFAULT_MAX_FACTOR)
    limit = max_value // multiple
    if limit < 1:
        raise ValueError(f"--max-value {max_value} is below one multiple of {multiple}")
    capacity = Capacity(capacity_bytes, GIVEN)
    traces: dict[int, Any] = {}

    def trace_at(k: int):
        if k not in traces:
            traces.clear()    # one trace at a time: each is the size of the reference input
            traces[k] = scaler.at(Fraction(k * multiple), with_range=False).trace
        return traces[k]

    def high_replay(k: int) -> Probe:
        ends = end_traces(trace_at(k))
        if ends is None:
            return replay(k)
        summary = simulate_trace(ends[1], policy, capacity=capacity, fast=True).summary
        verdict = summary["verdict"]
        return Probe(k * multiple, bool(verdict["fits"]), int(summary["peak_live_lower_bound_bytes"]),
                     int(summary["peak_reserved_bytes"]), verdict["line"], ["--policy", policy])

    def live(k: int) -> Probe:
        try:
            peak = lower_bound_bytes(trace_at(k))
        except TargetTooFar as exc:   # sizes past any device: certainly too big
            return Probe(k * multiple, False, MAX_SIZE_BYTES, None, str(exc))
        line = (f"peak live {format_bytes(peak)}" if peak <= capacity_bytes else
                f"no allocator setting can fit: peak live {format_bytes(peak)} > {format_bytes(capacity_bytes)}")
        return Probe(k * multiple, peak <= capacity_bytes, peak, None, line)

    def replay(k: int) -> Probe:
        summary = simulate_trace(trace_at(k), policy, capacity=capacity, fast=True).summary
        verdict = summary["verdict"]
        return Probe(k * multiple, bool(verdict["fits"]), int(summary["peak_live_lower_bound_bytes"]),
                     int(summary["peak_reserved_bytes"]), verdict["line"], ["--policy", policy])

    def answer(rule: str, searches: list[_Search], fit: int, fail: int | None) -> Answer:
        def known(k: int | None) -> Probe | None:
            return next((s.seen[k] for s in searches if k in s.seen), None) if k else None
        return Answer(rule, fit * multiple if fit else None, fail * multiple if fail else None, known(fit), known(fail))

    start = max(1, int(largest_input) // multiple)
    log("searching the largest value whose peak live bytes fit")
    bound_search = _Search(live)
    bound_fit, bound_fail = bound_search.largest(0, None, limit, start)
    bound = answer("peak live bytes within the capacity (no setting can do better)", [bound_search],
                   bound_fit, bound_fail)
    probes = {"peak live": list(bound_search.seen.values())}

    # Above the bound nothing fits: the searches below only look at 1 .. bound_fit.
    beyond = bound_fit + 1
    log("searching the largest value that fits with the recorded settings")
    rec_search = _Search(replay)
    rec_fit, rec_fail = rec_search.largest(0, beyond, bound_fit) if bound_fit else (0, 1)
    fail_of = (lambda fail: bound_fail if fail == beyond else fail)
    recorded = answer("recorded settings", [rec_search, bound_search], rec_fit, fail_of(rec_fail))
    probes["replays"] = list(rec_search.seen.values())

    advised = None
    if advise and bound_fit:
        log("searching the largest value at which some setting fits (allocsim advise at each probe)")
        fitted: list[dict[str, Any]] = []      # settings advise found at smaller values, newest first

        def advise_probe(k: int) -> Probe:
            # A setting that fitted a smaller value is replayed first: one replay answers "some setting fits"
            # where it still fits; advise's whole grid runs only where none of them does.
            for params in fitted:
                probe = _setting_probe(trace_at(k), k * multiple, capacity, capacity_bytes, policy, params)
                if probe.fits:
                    return probe
            probe = _advise_probe(trace_at(k), k * multiple, capacity_bytes, policy, executor)
            if probe.fits and probe.params is not None and probe.params not in fitted:
                fitted.insert(0, probe.params)
            return probe

        adv_search = _Search(advise_probe)
        adv_fit, adv_fail = adv_search.largest(rec_fit, beyond, bound_fit)
        if adv_fit and adv_search.seen.get(adv_fit) is not None and adv_search.seen[adv_fit].by:
            # the answer's setting is advise's best there, as at every other probe it ran on
            adv_search.seen[adv_fit] = _advise_probe(trace_at(adv_fit), adv_fit * multiple, capacity_bytes, policy,
                                                     executor)
        advised = answer("best setting (advise)", [adv_search, rec_search, bound_search], adv_fit, fail_of(adv_fail))
        probes["advise searches"] = list(adv_search.seen.values())
    high_end = None
    if rec_fit and any(end_traces(trace_at(k)) is not None for k in (rec_fit,)):
        log("searching the largest value whose high end of the range fits with the recorded settings")
        high_search = _Search(high_replay)
        high_fit, high_fail = high_search.largest(0, rec_fit + 1, rec_fit)
        high_end = answer("recorded settings, high end of the range", [high_search, rec_search], high_fit,
                          rec_fail if high_fail == rec_fit + 1 else high_fail)
        probes["high-end replays"] = list(high_search.seen.values())
    found = FindMax(scaler.scale_name, capacity_bytes, policy, multiple, max_value, largest_input, bound, recorded,
                    advised, probes, SEARCH_RULE.format(multiple=multiple, max_value=max_value), high_end)
    best = found.best
    if best.value is not None:
        params = best.at_value.params if best.at_value is not None else None
        found.ends = judge_ends(lambda end: simulate_trace(end, policy, params, capacity=capacity, fast=True).summary,
                                trace_at(best.value // multiple))
    return found


def _setting_probe(trace, value: int, capacity: Capacity, capacity_bytes: int, policy: str,
                   params: dict[str, Any]) -> Probe:
    """Does ``trace`` fit with the one setting ``params``? One replay, no timing."""
    from ..advise.knobs import preset_for

    summary = simulate_trace(trace, policy, params, capacity=capacity, fast=True).summary
    preset = preset_for(policy, trace.meta.allocator_settings, capacity_bytes)
    reserved = int(summary["peak_reserved_bytes"])
    return Probe(value, bool(summary["verdict"]["fits"]), int(summary["peak_live_lower_bound_bytes"]), reserved,
                 f"{preset.paste_line(params)} (peak reserved {format_bytes(reserved)})", preset.run_args(params),
                 dict(params), by="replay")


def _advise_probe(trace, value: int, capacity_bytes: int, policy: str, executor: Any) -> Probe:
    """Does any setting of ``policy`` fit ``trace`` at ``capacity_bytes``? ``allocsim advise`` on it, no timing."""
    from ..advise.advice import advise
    from ..sweep.executors import InProcessExecutor
    from ..trace import write_trace

    with tempfile.TemporaryDirectory(prefix="allocsim-findmax-") as tmp:
        path = os.path.join(tmp, f"at_{value}.parquet")
        write_trace(trace, path)
        try:
            advice = advise(path, policy=policy, capacity_bytes=capacity_bytes, fast=True, top=1,
                            executor=executor or InProcessExecutor(), output=os.path.join(tmp, "runs.parquet"))
        except ValueError as exc:
            raise AllocsimError(f"advise at {value}: {exc}") from None
    peak = int(advice.lower_bound_bytes)
    if not advice.recommendations:
        return Probe(value, False, peak, None, "no setting of the grid fits")
    best = advice.recommendations[0]
    return Probe(value, True, peak, best.outcome.peak_reserved_bytes,
                 f"{best.line} (peak reserved {format_bytes(best.outcome.peak_reserved_bytes)})",
                 advice.preset.run_args(best.outcome.params), dict(best.outcome.params))


def largest_with_setting(scaler: Scaler, capacity_bytes: int, policy: str, params: dict[str, Any] | None,
                         start_value: int, multiple: int, limit_value: int) -> tuple[int | None, int | None]:
    """``(largest value, first that does not fit)`` at ``capacity_bytes`` with the one setting ``params``.

    ``start_value`` (a multiple of ``multiple``) is where the search starts: the answer at a smaller
    capacity, so the search gallops up from it (a value that fits means every smaller one does).
    Used for the answer at the point estimate of the unknown terms, beside the high end's answer.
    """
    capacity = Capacity(capacity_bytes, GIVEN)

    def fits(k: int) -> bool:
        trace = scaler.at(Fraction(k * multiple), with_range=False).trace
        return bool(simulate_trace(trace, policy, params, capacity=capacity, fast=True).summary["verdict"]["fits"])

    start = max(1, start_value // multiple)
    limit = max(start, limit_value // multiple)
    if not fits(start):
        fit, fail = largest_fitting(fits, 0, start, limit)
    else:
        fit, fail = largest_fitting(fits, start, None, limit, start)
    return (fit * multiple if fit else None), (fail * multiple if fail else None)
