"""How a scaled trace was built: ``ScaleReport.to_dict()`` (for ``--json``) and ``format_text()``.

The report names the reference input, the alignment key used, the share of allocations and bytes
that aligned, the size laws fitted (and the terms two-point fits assumed), the rules applied to
what did not align, to times and to the start-of-window state; then what to check in this
prediction (``checks``: how far it extrapolates, irregular laws, assumed terms, what did not align)
and the limits of every prediction (``LIMITS``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..units import format_bytes

#: What the prediction cannot know, printed with every report (text and JSON).
LIMITS = (
    "sizes are extrapolated per allocation as monomials c*v^k (k = 0, 1, 2) of the value; an allocation no "
    "monomial fits gets the polynomial through its points, and the range spans every law its points allow",
    "allocations that exist only at the target scale (a kernel that switches algorithm, a workspace that "
    "appears past some size) cannot be predicted: the output has the reference input's allocations only",
    "the order of allocations and frees is the reference input's; a program whose schedule changes with "
    "scale (e.g. a different number of micro-batches) is not modelled",
    "the start-of-window layout is predicted, not known: weights where the reference run had them, the rest as one "
    "step of a repeating window leaves them (else placed anew), the reference's cached segments kept when the "
    "inputs' start segments nest (one process ran them in turn); the peak reserved range is widened by how far "
    "that rule is from each input's recorded layout, and allocsim run judges the ends of the laws only",
    "memory alive before the recording window (e.g. weights in CPU Kineto captures) is not in the trace "
    "and so not in the prediction",
    "inputs must be one program in one configuration (same precision, dtypes, driver line, allocator "
    "settings): others are refused unless --allow-mixed",
    "checked at 2x the largest input (docs/scale.md): CPU captures exact; six real GPU snapshot series, one "
    "configuration each (cherryni2022 medium and small 1024, yyin-dev XL 512, Hyperion-shuo large 512, "
    "charliesabino 2.7B fp32 and mixed 512): peak live within 0.02%, peak reserved -2.98% .. +0.02% (the two "
    "charliesabino series carry caches of earlier runs: -2.98%, -1.28%; the others within 0.02%), the recording "
    "inside the range every time; further out it is unchecked",
)


@dataclasses.dataclass
class InputSummary:
    """One input as the report lists it."""

    path: str
    value: str
    allocations: int
    steps: int
    step_source: str
    peak_live_bytes: int
    reference: bool = False


@dataclasses.dataclass
class ScaleReport:
    """Everything ``allocsim scale`` did, in numbers; see the module doc."""

    scale_name: str
    target: str
    inputs: list[InputSummary]
    keyer: str
    allocations: int
    aligned_all: int
    aligned_some: int
    unaligned: int
    bytes_reference: int
    bytes_aligned_all: int
    bytes_aligned_some: int
    bytes_unaligned: int
    laws: dict[str, int]
    assumed: dict[str, int]
    rounded: int
    clamped: int
    per_input: list[dict[str, Any]]
    initial: dict[str, Any]
    time_rule: str
    time_ratio: float
    unaligned_rule: str
    output_events: int
    output_peak_live_bytes: int
    notes: list[str] = dataclasses.field(default_factory=list)
    #: The target over the largest input value (> 1: extrapolated).
    extrapolation: float = 1.0
    #: What to check in this prediction: where it goes beyond what the inputs show.
    checks: list[str] = dataclasses.field(default_factory=list)
    limits: tuple[str, ...] = LIMITS
    #: Aligned allocations whose size falls as the value grows (a configuration change).
    shrinking: int = 0
    #: One shrinking allocation's points ``((value, size_bytes), ...)``, for the refusal line.
    shrinking_example: tuple | None = None
    #: Aligned allocations no monomial ``c * v**k`` fits (their polynomial law is reported instead).
    no_monomial: int = 0
    #: Allocations (start-of-window ones included) whose size at the target the inputs leave open.
    undetermined: int = 0
    #: Peak live / peak reserved at the point and both ends of the range (``ranges.prediction_range``).
    prediction_range: dict[str, Any] | None = None
    #: Whether the inputs look like one program in one configuration, and how they differ if not.
    consistent: bool = True
    differences: list[str] = dataclasses.field(default_factory=list)

    @property
    def aligned_share(self) -> float:
        """Share of the reference's allocations found in every other input."""
        return self.aligned_all / self.allocations if self.allocations else 1.0

    @property
    def aligned_bytes_share(self) -> float:
        """Share of the reference's allocated bytes found in every other input."""
        return self.bytes_aligned_all / self.bytes_reference if self.bytes_reference else 1.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (shares included)."""
        data = dataclasses.asdict(self)
        data["limits"] = list(self.limits)
        data["aligned_share"] = round(self.aligned_share, 6)
        data["aligned_bytes_share"] = round(self.aligned_bytes_share, 6)
        return data

    def format_text(self) -> str:
        """The report for people."""
        lines = [f"allocsim scale: {self.scale_name} = {self.target}", "", "inputs:"]
        for item in self.inputs:
            mark = "  (reference)" if item.reference else ""
            cut = ("one whole window: no step markers" if item.step_source == "none" else
                   f"{item.steps} step{'' if item.steps == 1 else 's'} ({item.step_source})")
            lines.append(f"  {item.path} @ {item.value}: {item.allocations} allocations, {cut}, "
                         f"peak live {format_bytes(item.peak_live_bytes)}{mark}")
        n = self.allocations or 1
        b = self.bytes_reference or 1
        lines += [
            "",
            f"alignment by {self.keyer}:",
            f"  in every input : {self.aligned_all} allocations ({100 * self.aligned_all / n:.1f}%), "
            f"{format_bytes(self.bytes_aligned_all)} ({100 * self.bytes_aligned_all / b:.1f}% of bytes)",
            f"  in some inputs : {self.aligned_some} ({100 * self.aligned_some / n:.1f}%), "
            f"{format_bytes(self.bytes_aligned_some)} ({100 * self.bytes_aligned_some / b:.1f}%)",
            f"  in none        : {self.unaligned} ({100 * self.unaligned / n:.1f}%), "
            f"{format_bytes(self.bytes_unaligned)} ({100 * self.bytes_unaligned / b:.1f}%)",
        ]
        for row in self.per_input:
            lines.append(f"  {row['path']}: {row['matched']} of its {row['allocations_in_matched_steps']} "
                         f"allocations in the matched steps aligned ({row['only_here']} only there)")
        lines += ["", "size laws (allocations): " + ", ".join(f"{k} {v}" for k, v in self.laws.items() if v)]
        if any(self.assumed.values()):
            lines.append("  assumed zero: " + ", ".join(f"{term} in {count}" for term, count in self.assumed.items() if count)
                         + " (two points cannot determine a + b*v + c*v^2)")
        lines.append(f"  no monomial c*v^k fits: {self.no_monomial}; shrinking as the value grows: {self.shrinking}")
        if self.rounded or self.clamped:
            lines.append(f"  rounded to whole bytes: {self.rounded}; clamped: {self.clamped}")
        lines += [
            f"unaligned allocations: {self.unaligned_rule}",
            f"start-of-window state: {self.initial['aligned']} of {self.initial['allocations']} allocations "
            f"aligned ({self.initial['rule']})",
            f"start-of-window layout: {self.initial.get('layout', 'placed anew in id order')}",
            f"times: {self.time_rule} (ratio {self.time_ratio:.4f})",
            "",
            f"output: {self.output_events} events, peak live {format_bytes(self.output_peak_live_bytes)}",
        ]
        rng = self.prediction_range
        if rng is not None:
            live, res = rng["peak_live_bytes"], rng["peak_reserved_bytes"]
            if rng["determined"] and res["low"] != res["high"]:
                lines.append("range: every law is determined by the inputs; peak reserved is open by the "
                             "start-of-window layout (check: below):")
            elif rng["determined"]:
                lines.append("range: every law is determined by the inputs: the range is the point")
            else:
                lines.append(f"range ({self.undetermined} allocations the inputs leave open, every law consistent "
                             "with them):")
            lines.append(f"  peak live     {format_bytes(live['low'])} .. {format_bytes(live['high'])} "
                         f"(spread {format_bytes(live['high'] - live['low'])})")
            lines.append(f"  peak reserved {format_bytes(res['low'])} .. {format_bytes(res['high'])} "
                         f"(spread {format_bytes(res['high'] - res['low'])}, {rng['policy']} policy)")
        if not self.consistent:
            lines.append("NOT ONE CONFIGURATION (--allow-mixed): " + "; ".join(self.differences))
        lines += [f"note: {note}" for note in self.notes]
        if self.checks:
            lines += ["", "check:"] + [f"  - {text}" for text in self.checks]
        lines += ["", "limits:"] + [f"  - {text}" for text in self.limits]
        return "\n".join(lines)
