"""Are the inputs one program in one configuration? ``input_differences(inputs)`` and ``fit_differences(...)``.

A prediction from runs that differ in more than the scale value extrapolates the difference too (an
fp32 run and an autocast run make every cast look like growth), so ``allocsim scale`` refuses such
inputs (``MixedInputs``, exit 2) unless ``--allow-mixed`` is given. Each difference is one line that
names it and says what to record. Checked:

* ``precision`` -- autocast frames (``torch.autocast``) in some inputs only;
* ``casts`` -- allocations made by cast ops (``_to_copy``) in some inputs only;
* ``driver`` -- a different driver line (the outermost frame of the recording script);
* ``settings`` -- different recorded allocator settings;
* ``shrinking`` -- allocations whose size falls as the value grows: no tensor dimension does that,
  a change of dtype or of code path does;
* ``alignment`` -- less than ``MIN_ALIGNED_SHARE`` of the reference's allocations found in an input.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from fractions import Fraction
from typing import Sequence

from ..errors import AllocsimError
from .inputs import ScaleInput
from .sites import SEPARATOR

#: Below this share of the reference's allocations found in an input, the runs are not one program (kernels
#: that take workspaces past some size leave a few unmatched; two programs share almost none).
MIN_ALIGNED_SHARE = 0.5
#: Frame text that marks mixed precision, and the ops that cast.
AUTOCAST_MARK = "autocast"
CAST_MARKS = ("_to_copy",)
#: Settings a recording may hold that do not change what the allocator does.
IGNORED_SETTINGS = frozenset({"pinned_num_register_threads", "pinned_use_cuda_host_register"})


class MixedInputs(AllocsimError):
    """The inputs are not one program in one configuration (see module doc); ``--allow-mixed`` goes on anyway."""

    def __init__(self, differences: list["Difference"]):
        self.differences = differences
        more = f" (and {len(differences) - 1} more; --allow-mixed lists them)" if len(differences) > 1 else ""
        super().__init__(f"inputs are not one configuration: {differences[0].text}{more}; "
                         "or give --allow-mixed to predict anyway")


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way the inputs differ: ``kind`` (see module doc) and one line for people."""

    kind: str
    text: str


def _name(item: ScaleInput) -> str:
    return os.path.basename(item.path) or item.path


def _count_sites(item: ScaleInput, marks: Sequence[str]) -> int:
    sites = item.key_source.sites or []
    return sum(1 for site in sites if any(mark in site.lower() for mark in marks))


def _some_only(inputs: Sequence[ScaleInput], counts: list[int]) -> tuple[list[ScaleInput], list[ScaleInput]]:
    have = [item for item, n in zip(inputs, counts) if n]
    lack = [item for item, n in zip(inputs, counts) if not n]
    return (have, lack) if have and lack else ([], [])


def _driver_line(item: ScaleInput) -> str | None:
    """The most common outermost Python frame of the allocations (the line of the script that ran them)."""
    if item.key_source.origin != "code" or not item.key_source.sites:
        return None
    lines: Counter = Counter()
    for site in item.key_source.sites:
        for frame in reversed(site.split(SEPARATOR)):
            if ".py:" in frame:
                lines[frame] += 1
                break
    return lines.most_common(1)[0][0] if lines else None


def _settings(item: ScaleInput) -> dict | None:
    recorded = item.trace.meta.allocator_settings
    if not isinstance(recorded, dict):
        return None
    return {k: v for k, v in recorded.items() if k not in IGNORED_SETTINGS}


def input_differences(inputs: Sequence[ScaleInput]) -> list[Difference]:
    """What the inputs' frames and settings show differs between them (see module doc)."""
    out = []
    counts = [_count_sites(item, (AUTOCAST_MARK,)) for item in inputs]
    have, lack = _some_only(inputs, counts)
    if have:
        out.append(Difference("precision", f"autocast in {_name(have[0])} ({counts[inputs.index(have[0])]:,} "
                                           f"allocations under it), none in {_name(lack[0])}: record every input "
                                           "with the same precision"))
    counts = [_count_sites(item, CAST_MARKS) for item in inputs]
    have, lack = _some_only(inputs, counts)
    if have:
        out.append(Difference("casts", f"cast ops ({'/'.join(CAST_MARKS)}) make {counts[inputs.index(have[0])]:,} "
                                       f"allocations in {_name(have[0])}, none in {_name(lack[0])}: record every "
                                       "input with the same dtypes"))
    drivers = [(item, _driver_line(item)) for item in inputs]
    known = [(item, line) for item, line in drivers if line is not None]
    if len({line for _, line in known}) > 1:
        (a, la), (b, lb) = known[0], next((x for x in known if x[1] != known[0][1]))
        out.append(Difference("driver", f"driver line {la} in {_name(a)}, {lb} in {_name(b)}: record every input "
                                        "from the same script"))
    settings = [(item, _settings(item)) for item in inputs]
    known_settings = [(item, s) for item, s in settings if s is not None]
    for item, s in known_settings[1:]:
        first_item, first = known_settings[0]
        if s != first:
            key = next(k for k in sorted(set(s) | set(first)) if s.get(k) != first.get(k))
            out.append(Difference("settings", f"allocator setting {key} is {first.get(key)!r} in {_name(first_item)}, "
                                              f"{s.get(key)!r} in {_name(item)}: record every input with the same "
                                              "PYTORCH_CUDA_ALLOC_CONF"))
            break
    return out


def fit_differences(reference: ScaleInput, others: Sequence[ScaleInput], found_share: Sequence[float],
                    shrinking: int, example: tuple | None, scale_name: str) -> list[Difference]:
    """What the alignment and the laws show: shrinking sizes, inputs that share too few allocations."""
    out = []
    if shrinking:
        sample = ""
        if example:
            sample = " (e.g. " + ", ".join(f"{s:,} B at {_value(v)}" for v, s in example) + ")"
        out.append(Difference("shrinking", f"{shrinking:,} allocations shrink as {scale_name} grows{sample}, which no "
                                           "tensor dimension does: record every input with the same dtypes and "
                                           "code path"))
    for other, share in zip(others, found_share):
        if share < MIN_ALIGNED_SHARE:
            out.append(Difference("alignment", f"only {100 * share:.1f}% of the allocations of {_name(reference)} "
                                               f"are found in {_name(other)} (at least "
                                               f"{100 * MIN_ALIGNED_SHARE:.0f}% expected): record every input with "
                                               "the same program and script"))
    return out


def _value(v: Fraction) -> str:
    return str(v)
