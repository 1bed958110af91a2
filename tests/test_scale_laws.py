"""Size laws of ``allocsim scale``: exact on the inputs, the simplest law first, assumptions stated."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.scale.laws import fit_law


def pts(law, values):
    return [(Fraction(v), law(v)) for v in values]


def test_constant_linear_quadratic_are_recognised_and_exact():
    assert fit_law(pts(lambda v: 4096, [1, 2, 3]), "batch").kind == "constant"
    lin = fit_law(pts(lambda v: 96 + 3072 * v, [1, 2, 3, 4]), "batch")
    assert (lin.kind, lin.a, lin.b, lin.c) == ("linear", 96, 3072, 0)
    quad = fit_law(pts(lambda v: 7 + 5 * v + 48 * v * v, [64, 128, 192, 256]), "seq")
    assert (quad.kind, quad.a, quad.b, quad.c) == ("quadratic", 7, 5, 48)
    assert quad.predict(Fraction(512)) == (7 + 5 * 512 + 48 * 512 * 512, False, False)
    assert not lin.assumed_zero and not quad.assumed_zero


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 10**9), b=st.integers(0, 10**7), c=st.integers(0, 10**5),
       values=st.lists(st.integers(1, 4096), min_size=3, max_size=5, unique=True),
       target=st.integers(1, 10**5))
def test_any_integer_quadratic_is_reproduced_byte_for_byte(a, b, c, values, target):
    law = fit_law(pts(lambda v: a + b * v + c * v * v, values), "seq")
    for v in values:
        assert law.value(Fraction(v)) == a + b * v + c * v * v
    assert law.predict(Fraction(target))[0] == a + b * target + c * target * target


def test_two_points_state_the_assumed_term():
    # A pure seq^2 tensor (attention scores) with two points: the monomial is determined, exact at 512.
    q = fit_law(pts(lambda v: 48 * v * v, [128, 256]), "seq")
    assert (q.kind, q.assumed_zero) == ("quadratic-only", ())
    assert q.bounds(Fraction(512)) == (48 * 512 * 512,) * 2
    assert q.predict(Fraction(512))[0] == 48 * 512 * 512
    # The same sizes under "batch": per-sample memory is linear, so c is assumed zero instead.
    lin = fit_law(pts(lambda v: 48 * v * v, [128, 256]), "batch")
    assert (lin.kind, lin.assumed_zero) == ("linear", ("c",))
    assert lin.predict(Fraction(512))[0] != 48 * 512 * 512
    prop = fit_law(pts(lambda v: 3072 * v, [3, 4]), "batch")
    assert (prop.kind, prop.assumed_zero, prop.predict(Fraction(8))[0]) == ("proportional", (), 3072 * 8)
    affine = fit_law(pts(lambda v: 96 + 3072 * v, [3, 4]), "seq")
    assert (affine.kind, affine.assumed_zero) == ("linear", ("c",))
    assert fit_law([(Fraction(4), 10)], "batch").assumed_zero == ("b", "c")


def test_irregular_uses_the_points_nearest_the_target():
    # A size that jumps (an algorithm switch) fits no quadratic through four points.
    points = [(Fraction(1), 100), (Fraction(2), 100), (Fraction(3), 100), (Fraction(4), 900)]
    law = fit_law(points, "batch", target=Fraction(8))
    assert law.kind == "irregular"
    for v, s in points[1:]:
        assert law.value(v) == s     # exact on the three nearest points


def test_rounding_and_clamping_are_reported():
    law = fit_law([(Fraction(2), 3), (Fraction(4), 4)], "batch")   # 2 + v/2
    assert law.predict(Fraction(3)) == (4, True, False)              # 3.5 rounds half up
    falling = fit_law([(Fraction(1), 30), (Fraction(2), 20)], "batch")
    assert falling.predict(Fraction(8)) == (0, False, True)          # would be -40: clamped at 0


def test_bad_points_are_refused():
    with pytest.raises(ValueError):
        fit_law([], "batch")
    with pytest.raises(ValueError):
        fit_law([(Fraction(2), 1), (Fraction(2), 2)], "batch")


def test_a_tensor_cut_to_whole_batches_is_no_configuration_change():
    """``data.narrow(0, 0, len(data) // v * v)`` (the word language model's ``batchify``) holds a few bytes
    less at some larger batches: carried at the largest batch's size with every size seen as its range,
    not refused as shrinking; a fall of more than 1/1000 (a dtype, a code path) still is."""
    from fractions import Fraction as F

    from allocsim.scale.laws import fit_law

    n_tokens, element = 217_646, 8
    points = [(F(v), element * v * (n_tokens // v)) for v in (4, 8, 16, 32)]
    assert [s for _, s in points] == [1_741_152, 1_741_120, 1_741_056, 1_741_056]   # as captured
    for pts in (points[:2], points):
        law = fit_law(pts, "batch", F(2307))
        assert law.kind == "whole-batches" and not law.shrinking
        assert law.predict(F(2307))[0] == pts[-1][1]
        assert law.bounds(F(2307)) == (min(s for _, s in pts), max(s for _, s in pts))
    halved = fit_law([(F(4), 1000), (F(8), 500)], "batch")
    assert halved.shrinking and halved.kind != "whole-batches"
