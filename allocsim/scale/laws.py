"""Size laws: an allocation's size as a law of the scale value, with the evidence for it and the range it leaves open.

Use ``fit_law(points, scale_name)``, then ``law.predict(v)`` (the point prediction) and
``law.bounds(v)`` (the least and the most any law consistent with the points allows). Arithmetic is
exact (rational): the fitted law reproduces every input size byte for byte, and a prediction is
rounded to whole bytes only at the end.

A tensor's size is a product of its dimensions, so an allocation's size is a monomial ``c * v**k``
of the scale value, k in ``MONOMIAL_POWERS`` (0: weights; 1: activations; 2, for ``seq`` only:
attention scores). Rules, in order:

* ``constant`` (k = 0), ``proportional`` (k = 1), ``quadratic-only`` (k = 2) -- one monomial goes
  through every point. Two points at different values already tell k apart (the size ratio is
  ``(v1/v0)**k``), so the law is determined: the range is the point.
* ``unaligned`` -- a single point (an allocation seen in one input only): carried as a constant;
  its range is every monomial through the point.
* no monomial fits (``follows_no_monomial``: reduction workspaces, sizes with an offset): the
  polynomial of degree <= 2 through the points -- two points: ``linear`` ``a + b*v`` with the other
  laws through both (``a + c*v^2``, ``b*v + c*v^2``) in the range; three: ``linear`` or
  ``quadratic``, determined; four or more that no quadratic fits: ``irregular``, the quadratic
  through the three points nearest the target, the range over every three.
* ``whole-batches`` -- sizes within ``ROUNDING_SHARE`` of each other that fall as the value grows:
  a tensor cut to whole batches (``data.narrow(0, 0, len(data) // v * v)``: the word language
  model's ``batchify``, a loader's ``drop_last``) holds ``e * v * floor(N / v)`` bytes, which falls
  by less than ``e * v`` between values. Carried at the size of the largest value; its range spans
  every size seen.
* ``shrinking`` is said of any other law whose size falls as the value grows: no tensor dimension
  does that, so it marks inputs from different configurations (``consistency``), not a law.
"""

from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction
from typing import Sequence

#: Scale names the two-point rule knows: batch never gets a pure quadratic (per-sample memory is
#: linear in the batch); sequence length may (attention scores grow with seq**2).
TWO_POINT_POWERS = {"batch": (1,), "seq": (1, 2)}
DEFAULT_TWO_POINT_POWERS = (1, 2)
#: Powers k of the monomial laws ``c * v**k`` (with 0, a constant).
MONOMIAL_POWERS = (0, 1, 2)

LAW_KINDS = ("constant", "proportional", "quadratic-only", "whole-batches", "linear", "quadratic", "irregular")
#: The most a size cut to whole batches falls between two values, as a share of it: the part of one
#: batch left over is a few bytes a sample out of a dataset of megabytes; a change of dtype or of
#: code path changes a size by far more (a half, a factor of 50 in the 1,024-token GPT's embedding sort).
ROUNDING_SHARE = Fraction(1, 1000)


@dataclasses.dataclass(frozen=True)
class SizeLaw:
    """``size(v) = a + b*v + c*v**2`` with exact rational coefficients and how it was chosen."""

    kind: str
    a: Fraction
    b: Fraction = Fraction(0)
    c: Fraction = Fraction(0)
    #: Terms not determined by the data and set to zero (two-point fits), e.g. ``("c",)``.
    assumed_zero: tuple[str, ...] = ()
    #: Other laws ``(a, b, c)`` through the same points: ``bounds`` spans them and this one.
    alternatives: tuple[tuple[Fraction, Fraction, Fraction], ...] = ()
    #: Some input at a larger value has a smaller size (a configuration change, not a law).
    shrinking: bool = False

    @property
    def follows_no_monomial(self) -> bool:
        """True when no ``c * v**k`` goes through the points (a polynomial was fitted instead)."""
        return self.kind in ("linear", "quadratic", "irregular")

    def bounds(self, v: Fraction) -> tuple[int, int]:
        """(least, most) whole bytes at ``v`` over this law and its alternatives (each at least 1 byte)."""
        sizes = [self.predict(v, floor_bytes=1)[0]]
        for a, b, c in self.alternatives:
            sizes.append(SizeLaw("alt", a, b, c).predict(v, floor_bytes=1)[0])
        return min(sizes), max(sizes)

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


def _monomial(pts: Sequence[tuple[Fraction, int]], powers: Sequence[int]) -> SizeLaw | None:
    """The ``c * v**k`` through every point, k in ``powers``, or None."""
    v0, s0 = pts[0]
    for k in powers:
        c = Fraction(s0) / v0 ** k
        if all(c * v ** k == s for v, s in pts):
            if k == 0:
                return SizeLaw("constant", c)
            if k == 1:
                return SizeLaw("proportional", Fraction(0), c)
            return SizeLaw("quadratic-only", Fraction(0), Fraction(0), c)
    return None


def _shrinks(pts: Sequence[tuple[Fraction, int]]) -> bool:
    """Points sorted by value: does any size fall below an earlier one?"""
    return any(s1 < s0 for (_, s0), (_, s1) in zip(pts, pts[1:]))


def _whole_batches(pts: Sequence[tuple[Fraction, int]]) -> SizeLaw | None:
    """Falling sizes within ``ROUNDING_SHARE`` of the largest (module doc), or None."""
    sizes = [s for _, s in pts]
    if not _shrinks(pts) or max(sizes) - min(sizes) > ROUNDING_SHARE * max(sizes):
        return None
    return SizeLaw("whole-batches", Fraction(pts[-1][1]),
                   alternatives=((Fraction(min(sizes)), Fraction(0), Fraction(0)),
                                 (Fraction(max(sizes)), Fraction(0), Fraction(0))))


def powers_for(scale_name: str) -> tuple[int, ...]:
    """Monomial powers a scale parameter allows: 0 and ``TWO_POINT_POWERS`` (batch: no v**2)."""
    return (0, *TWO_POINT_POWERS.get(scale_name, DEFAULT_TWO_POINT_POWERS))


def fit_law(points: Sequence[tuple[Fraction, int]], scale_name: str = "", target: Fraction | None = None) -> SizeLaw:
    """The law (see module doc) through ``points`` = [(scale value, size_bytes), ...].

    Values must be distinct. ``target`` picks the three points used by an ``irregular`` fit
    (those nearest to it; the largest values when None).
    """
    pts = sorted((Fraction(v), int(s)) for v, s in points)
    if not pts:
        raise ValueError("no points to fit")
    if len({v for v, _ in pts}) != len(pts):
        raise ValueError("two points share one scale value")
    powers = powers_for(scale_name)
    if len(pts) == 1:
        v0, s0 = pts[0]
        # One point: every monomial through it is consistent with the inputs.
        alternatives = tuple((Fraction(0), Fraction(0), Fraction(s0) / v0 ** k) if k == 2 else
                             (Fraction(0), Fraction(s0) / v0, Fraction(0)) for k in powers if k)
        return SizeLaw("constant", Fraction(s0), assumed_zero=("b", "c"), alternatives=alternatives)
    shrinking = _shrinks(pts)
    law = _monomial(pts, powers) or _whole_batches(pts)
    if law is not None:
        return law
    if len(pts) == 2:
        return dataclasses.replace(_two_point_law(pts, scale_name), shrinking=shrinking)
    for degree, kind in ((1, "linear"), (2, "quadratic")):
        law = SizeLaw(kind, *_poly_through(pts, degree), shrinking=shrinking)
        if _fits(law, pts):
            return law
    if target is None:
        nearest = pts[-3:]
    else:
        nearest = sorted(sorted(pts, key=lambda p: (abs(p[0] - target), -p[0]))[:3])
    triples = [list(t) for t in itertools.combinations(pts, 3)][:MAX_TRIPLES]
    return SizeLaw("irregular", *_poly_through(nearest, 2), shrinking=shrinking,
                   alternatives=tuple(_poly_through(t, 2) for t in triples))


#: Irregular laws span at most this many quadratics (through three of their points each).
MAX_TRIPLES = 64


def _two_point_law(pts: Sequence[tuple[Fraction, int]], scale_name: str) -> SizeLaw:
    """Two points that no monomial fits: ``a + b*v``, with ``a + c*v^2`` and ``b*v + c*v^2`` as alternatives."""
    (v0, s0), (v1, s1) = pts
    a, b, _ = _poly_through(pts, 1)
    # a + c*v^2 and b*v + c*v^2 through both points, solved exactly.
    c_sq = Fraction(s1 - s0) / (v1 * v1 - v0 * v0)
    alt_sq = (s0 - c_sq * v0 * v0, Fraction(0), c_sq)
    c_bv = (Fraction(s1) / v1 - Fraction(s0) / v0) / (v1 - v0)
    alt_bv = (Fraction(0), Fraction(s0) / v0 - c_bv * v0, c_bv)
    alternatives = (alt_sq, alt_bv) if 2 in TWO_POINT_POWERS.get(scale_name, DEFAULT_TWO_POINT_POWERS) else ()
    return SizeLaw("linear", a, b, Fraction(0), assumed_zero=("c",), alternatives=alternatives)
