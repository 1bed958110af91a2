"""Predict an allocation trace at a scale nobody has run: ``scale_files(["a.json.gz@2", "b.json.gz@4"], 8)``.

Two or more traces of the same program at different values of one scale parameter (batch size,
sequence length) go in; allocations are aligned across them by what they are (``keys``), each
aligned allocation's size is fitted exactly as a law of the scale value (``laws``), and the
reference trace is replayed at the target value (``build``). ``findmax`` searches the largest
value that fits a capacity. ``allocsim scale`` is the command.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from .build import ScaleResult, Scaler, pick_reference, scale_inputs
from .findmax import FindMax, find_max
from .inputs import ScaleInput, load_input, parse_spec, parse_value, prepare_input
from .laws import SizeLaw, fit_law
from .report import ScaleReport

__all__ = [
    "FindMax", "ScaleInput", "ScaleReport", "ScaleResult", "Scaler", "SizeLaw", "find_max", "fit_law", "load_input",
    "parse_spec", "parse_value", "pick_reference", "prepare_input", "scale_files", "scale_inputs",
]


def scale_files(specs: Sequence[str], target: Fraction | int | str, scale_name: str = "batch", *,
                device: int | None = None, lenient: bool = False) -> ScaleResult:
    """Read every ``TRACE@VALUE`` of ``specs`` and build the trace at ``target``."""
    target = parse_value(target) if isinstance(target, str) else Fraction(target)
    inputs = [load_input(path, value, device=device, lenient=lenient)
              for path, value in (parse_spec(spec) for spec in specs)]
    return scale_inputs(inputs, target, scale_name)
