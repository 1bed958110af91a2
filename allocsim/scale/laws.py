"""Size laws: fit ``size(v)`` exactly through an allocation's sizes at the input scale values.

Use ``fit_law(points, scale_name)`` and then ``law.predict(v)``. Arithmetic is exact (rational):
the fitted law reproduces every input size byte for byte, and a prediction is rounded to whole
bytes only at the end.

Rules, in order (the first that reproduces every input point wins):

* ``constant``   -- every input has the same size (weights, optimizer scalars). A single point
  (an allocation seen in one input only) is also carried as a constant, with ``b`` and ``c``
  assumed zero.
* two points only: a single power ``c * v**p`` with ``p = 1`` (``proportional``) or, for
  ``seq``, ``p = 2`` (``quadratic-only``); else ``linear`` ``a + b*v``. The terms not
  determined by two points are *assumed* zero and the law says which.
* three or more points: ``linear`` ``a + b*v``, then ``quadratic`` ``a + b*v + c*v**2``.
* ``irregular``  -- nothing of degree <= 2 goes through four or more points; the quadratic
  through the three points nearest the target is used and the law says so.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Sequence

#: Scale names the two-point rule knows: batch never gets a pure quadratic (per-sample memory is
#: linear in the batch); sequence length may (attention scores grow with seq**2).
TWO_POINT_POWERS = {"batch": (1,), "seq": (1, 2)}
DEFAULT_TWO_POINT_POWERS = (1, 2)

LAW_KINDS = ("constant", "proportional", "quadratic-only", "linear", "quadratic", "irregular")


@dataclasses.dataclass(frozen=True)
class SizeLaw:
    """``size(v) = a + b*v + c*v**2`` with exact rational coefficients and how it was chosen."""

    kind: str
    a: Fraction
    b: Fraction = Fraction(0)
    c: Fraction = Fraction(0)
    #: Terms not determined by the data and set to zero (two-point fits), e.g. ``("c",)``.
    assumed_zero: tuple[str, ...] = ()

    def value(self, v: Fraction) -> Fraction:
        """The exact (rational) size at ``v``."""
        return self.a + self.b * v + self.c * v * v

    def predict(self, v: Fraction, floor_bytes: int = 0) -> tuple[int, bool, bool]:
        """Whole bytes at ``v``: (size_bytes, was_rounded, was_clamped).

        Rounds half up; a value below ``floor_bytes`` (a law falling under the smallest size seen)
        is clamped to it.
        """
        exact = self.value(v)
        size = int((exact + Fraction(1, 2)) // 1)
        rounded = exact.denominator != 1
        if size < floor_bytes:
            return floor_bytes, rounded, True
        return size, rounded, False

    def describe(self) -> str:
        """The law as text, e.g. ``"12 + 3*v"``."""
        terms = []
        for coef, suffix in ((self.a, ""), (self.b, "*v"), (self.c, "*v^2")):
            if coef:
                terms.append(f"{coef}{suffix}")
        return " + ".join(terms) or "0"


def _fits(law: SizeLaw, points: Sequence[tuple[Fraction, int]]) -> bool:
    return all(law.value(v) == s for v, s in points)


def _poly_through(points: Sequence[tuple[Fraction, int]], degree: int) -> tuple[Fraction, Fraction, Fraction]:
    """Coefficients (a, b, c) of the degree-``degree`` polynomial through the first degree+1 points."""
    pts = points[: degree + 1]
    if degree == 0:
        return Fraction(pts[0][1]), Fraction(0), Fraction(0)
    if degree == 1:
        (v0, s0), (v1, s1) = pts
        b = Fraction(s1 - s0) / (v1 - v0)
        return s0 - b * v0, b, Fraction(0)
    (v0, s0), (v1, s1), (v2, s2) = pts
    # Newton divided differences: exact and simple for three points.
    d01 = Fraction(s1 - s0) / (v1 - v0)
    d12 = Fraction(s2 - s1) / (v2 - v1)
    c = (d12 - d01) / (v2 - v0)
    b = d01 - c * (v0 + v1)
    a = s0 - b * v0 - c * v0 * v0
    return a, b, c


def fit_law(points: Sequence[tuple[Fraction, int]], scale_name: str = "", target: Fraction | None = None) -> SizeLaw:
    """The simplest law (see module doc) through ``points`` = [(scale value, size_bytes), ...].

    Values must be distinct. ``target`` picks the three points used by an ``irregular`` fit
    (those nearest to it; the largest values when None).
    """
    pts = sorted((Fraction(v), int(s)) for v, s in points)
    if not pts:
        raise ValueError("no points to fit")
    if len({v for v, _ in pts}) != len(pts):
        raise ValueError("two points share one scale value")
    if all(s == pts[0][1] for _, s in pts):
        # One point determines nothing; two equal points leave the curvature open.
        assumed = ("b", "c") if len(pts) == 1 else ("c",) if len(pts) == 2 else ()
        return SizeLaw("constant", Fraction(pts[0][1]), assumed_zero=assumed)
    if len(pts) == 2:
        return _two_point_law(pts, scale_name)
    for degree, kind in ((1, "linear"), (2, "quadratic")):
        law = SizeLaw(kind, *_poly_through(pts, degree))
        if _fits(law, pts):
            return law
    if target is None:
        nearest = pts[-3:]
    else:
        nearest = sorted(sorted(pts, key=lambda p: (abs(p[0] - target), -p[0]))[:3])
    return SizeLaw("irregular", *_poly_through(nearest, 2))


def _two_point_law(pts: Sequence[tuple[Fraction, int]], scale_name: str) -> SizeLaw:
    (v0, s0), (v1, s1) = pts
    powers = TWO_POINT_POWERS.get(scale_name, DEFAULT_TWO_POINT_POWERS)
    for power in powers:
        if v0 != 0 and s0 != 0 and Fraction(s1, s0) == (v1 / v0) ** power:
            k = Fraction(s0) / v0 ** power
            if power == 1:
                return SizeLaw("proportional", Fraction(0), k, Fraction(0), assumed_zero=("c",))
            return SizeLaw("quadratic-only", Fraction(0), Fraction(0), k, assumed_zero=("b",))
    a, b, _ = _poly_through(pts, 1)
    return SizeLaw("linear", a, b, Fraction(0), assumed_zero=("c",))
