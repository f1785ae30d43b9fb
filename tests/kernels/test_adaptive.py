"""fleet.kernels.adaptive (Ftrl, RMSProp, DecayedAdagrad, Lamb, Adamax, Adadelta) against its numpy twins and
against Paddle's formulas written out by hand in float64 for one element."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleet.kernels import adaptive as ad

SETTINGS = settings(max_examples=40, deadline=None)
# Bounded values keep squares and quotients finite, so equality is exact (NaN == NaN too).
VALUES = st.floats(-100.0, 100.0, width=32)
NONNEG = st.floats(0.0, 100.0, width=32)
LR = st.floats(0.0001220703125, 10.0, width=32)
RATE = st.floats(0.0, 0.9990000128746033, width=32)
EPS = st.floats(1e-8, 1e-3)


def _arrays(shape, elements=VALUES):
    return hnp.arrays(np.float32, shape, elements=elements)


def _both(kernel, reference, arrays, scalars, rows=None):
    mine, theirs = [a.copy() for a in arrays], [a.copy() for a in arrays]
    head = (rows,) if rows is not None else ()
    kernel(*mine[:-1], *head, mine[-1], *scalars)
    with np.errstate(all="ignore"):
        reference(*theirs[:-1], *head, theirs[-1], *scalars)
    return mine[:-1], theirs[:-1]


def _equal(got, expected, exact=True):
    for g, e in zip(got, expected):
        if exact:
            np.testing.assert_array_equal(g, e)
        else:  # a few float32 ulps of the inputs' magnitude (a step may cancel the value)
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * (1.0 + float(np.max(np.abs(e), initial=0.0))))


@st.composite
def dense_case(draw, n_state, nonneg=()):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=7))
    arrays = [draw(_arrays(shape, NONNEG if i in nonneg else VALUES)) for i in range(1 + n_state)]
    return arrays + [draw(_arrays(shape))]


@st.composite
def rows_case(draw, n_state, nonneg=()):
    height, dim = draw(st.integers(1, 9)), draw(st.integers(1, 4))
    keep = draw(st.lists(st.booleans(), min_size=height, max_size=height))
    rows = np.array(draw(st.permutations([r for r in range(height) if keep[r]])), dtype=np.int64)
    arrays = [draw(_arrays((height, dim), NONNEG if i in nonneg else VALUES)) for i in range(1 + n_state)]
    return arrays + [draw(_arrays((len(rows), dim)))], rows


FTRL_SCALARS = st.tuples(LR, st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.sampled_from([-0.5, -0.25, -1.0]))
FTRL_SQRT_SCALARS = st.tuples(LR, st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.just(-0.5))
RMS_SCALARS = st.tuples(LR, RATE, EPS, RATE, st.sampled_from([0, 1]))
DECAYED_SCALARS = st.tuples(LR, RATE, EPS)
LAMB_SCALARS = st.tuples(LR, RATE, RATE, EPS, st.floats(0.0, 0.1))
ADAMAX_SCALARS = st.tuples(LR, RATE, RATE, EPS)
ADADELTA_SCALARS = st.tuples(RATE, EPS)

CASES = {
    # name: (kernel stem, state arrays, which are non-negative, scalars, bit-exact)
    # numba's float32 pow is not libm's: lr_power other than -0.5 agrees to rounding
    "ftrl": ("ftrl", 2, (1,), FTRL_SCALARS, False),
    "ftrl_sqrt": ("ftrl", 2, (1,), FTRL_SQRT_SCALARS, True),
    "rmsprop": ("rmsprop", 3, (1,), RMS_SCALARS, True),
    "decayed_adagrad": ("decayed_adagrad", 1, (1,), DECAYED_SCALARS, True),
    "lamb": ("lamb", 2, (2,), LAMB_SCALARS, True),
    "adamax": ("adamax", 2, (2,), ADAMAX_SCALARS, True),
    "adadelta": ("adadelta", 2, (1, 2), ADADELTA_SCALARS, True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dense_kernels_match_their_numpy_twins(name):
    stem, n_state, nonneg, scalars, exact = CASES[name]

    @SETTINGS
    @given(dense_case(n_state, nonneg), scalars)
    def check(arrays, scal):
        _equal(*_both(getattr(ad, stem + "_dense"), getattr(ad, stem + "_dense_reference"), arrays, scal), exact)

    check()


@pytest.mark.parametrize("name", sorted(CASES))
def test_row_kernels_match_their_twins_and_leave_other_rows_alone(name):
    stem, n_state, nonneg, scalars, exact = CASES[name]

    @SETTINGS
    @given(rows_case(n_state, nonneg), scalars)
    def check(case, scal):
        arrays, rows = case
        got, expected = _both(getattr(ad, stem + "_rows"), getattr(ad, stem + "_rows_reference"), arrays, scal,
                              rows=rows)
        _equal(got, expected, exact)
        untouched = np.setdiff1d(np.arange(arrays[0].shape[0]), rows)
        for after, before in zip(got, arrays):
            np.testing.assert_array_equal(after[untouched], before[untouched])

    check()


def test_ftrl_follows_paddles_formula_on_one_element():
    p, sq, lin, g, lr, l1, l2 = 0.5, 0.25, 0.1, 0.3, 0.1, 0.01, 0.02
    new = sq + g * g
    lin_out = lin + g - (math.sqrt(new) - math.sqrt(sq)) / lr * p
    l1e, l2e = l1 + 1e-10, l2 + 1e-10
    expect = (l1e * math.copysign(1, lin_out) - lin_out) / (math.sqrt(new) / lr + 2 * l2e)
    arrays = [np.array([v], np.float32) for v in (p, sq, lin)]
    ad.ftrl_dense(*arrays, np.array([g], np.float32), lr, l1, l2, -0.5)
    np.testing.assert_allclose([a[0] for a in arrays], [expect, new, lin_out], rtol=1e-6)
    # a linear accumulator inside [-l1, l1] zeroes the weight
    small = [np.array([v], np.float32) for v in (0.5, 0.0, 0.0)]
    ad.ftrl_dense(*small, np.array([0.001], np.float32), 1e6, 0.5, 0.0, -0.5)
    assert small[0][0] == 0.0


def test_ftrl_with_another_lr_power_uses_powers():
    p, sq, lin, g, lr, power = 0.5, 0.25, 0.1, 0.3, 0.1, -0.25
    new = sq + g * g
    lin_out = lin + g - (new ** -power - sq ** -power) / lr * p
    expect = ((1e-10) * math.copysign(1, lin_out) - lin_out) / (new ** -power / lr + 2e-10)
    arrays = [np.array([v], np.float32) for v in (p, sq, lin)]
    ad.ftrl_dense(*arrays, np.array([g], np.float32), lr, 0.0, 0.0, power)
    np.testing.assert_allclose(arrays[0][0], expect, rtol=1e-5)


@pytest.mark.parametrize("centered", [0, 1])
def test_rmsprop_follows_paddles_formula_on_one_element(centered):
    p, ms, mom, mg, g, lr, rho, eps, mu = 1.0, 0.5, 0.2, 0.1, 0.4, 0.01, 0.95, 1e-6, 0.9
    ms_out = rho * ms + (1 - rho) * g * g
    mg_out = rho * mg + (1 - rho) * g if centered else mg
    denom = ms_out - mg_out * mg_out + eps if centered else ms_out + eps
    mom_out = mu * mom + lr * g / math.sqrt(denom)
    arrays = [np.array([v], np.float32) for v in (p, ms, mom, mg)]
    ad.rmsprop_dense(*arrays, np.array([g], np.float32), lr, rho, eps, mu, centered)
    np.testing.assert_allclose([a[0] for a in arrays], [p - mom_out, ms_out, mom_out, mg_out], rtol=1e-6)


def test_decayed_adagrad_follows_paddles_formula_on_one_element():
    p, m, g, lr, decay, eps = 1.0, 0.5, 0.4, 0.01, 0.95, 1e-6
    m_out = decay * m + (1 - decay) * g * g
    arrays = [np.array([v], np.float32) for v in (p, m)]
    ad.decayed_adagrad_dense(*arrays, np.array([g], np.float32), lr, decay, eps)
    np.testing.assert_allclose([a[0] for a in arrays], [p - lr * g / (math.sqrt(m_out) + eps), m_out], rtol=1e-6)


def test_adamax_and_adadelta_follow_paddles_formulas_on_one_element():
    p, m, u, g, lr_t, b1, b2, eps = 1.0, 0.5, 0.2, -0.4, 0.01, 0.9, 0.999, 1e-8
    m_out, u_out = b1 * m + (1 - b1) * g, max(abs(g), b2 * u + eps)
    arrays = [np.array([v], np.float32) for v in (p, m, u)]
    ad.adamax_dense(*arrays, np.array([g], np.float32), lr_t, b1, b2, eps)
    np.testing.assert_allclose([a[0] for a in arrays], [p - lr_t * m_out / u_out, m_out, u_out], rtol=1e-6)
    p, g2, u2, g, rho, eps = 1.0, 0.5, 0.2, 0.4, 0.95, 1e-6
    g2_out = rho * g2 + (1 - rho) * g * g
    update = -math.sqrt((u2 + eps) / (g2_out + eps)) * g
    arrays = [np.array([v], np.float32) for v in (p, g2, u2)]
    ad.adadelta_dense(*arrays, np.array([g], np.float32), rho, eps)
    np.testing.assert_allclose([a[0] for a in arrays], [p + update, g2_out, rho * u2 + (1 - rho) * update ** 2],
                               rtol=1e-6)


def test_lamb_scales_the_step_by_the_trust_ratio_over_the_whole_array():
    p = np.array([3.0, 4.0], np.float32)
    g = np.array([0.5, -1.0], np.float32)
    # the kernel rounds the hyper-parameters to float32 first, so the formula does too
    lr, b1, b2, eps, wd = (float(np.float32(v)) for v in (0.1, 0.9, 0.999, 1e-6, 0.01))
    m1, m2 = (1 - b1) * g.astype(np.float64), (1 - b2) * g.astype(np.float64) ** 2
    r = m1 / (np.sqrt(m2) + eps) + wd * p
    expect = p - lr * (5.0 / np.linalg.norm(r)) * r
    arrays = [p.copy(), np.zeros(2, np.float32), np.zeros(2, np.float32)]
    ad.lamb_dense(*arrays, g, lr, b1, b2, eps, wd)
    np.testing.assert_allclose(arrays[0], expect, rtol=1e-6)
    # a zero parameter has no trust ratio: the step is lr * r
    zero = [np.zeros(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32)]
    ad.lamb_dense(*zero, g, lr, b1, b2, eps, 0.0)
    np.testing.assert_allclose(zero[0], -lr * (m1 / (np.sqrt(m2) + eps)), rtol=1e-6)


@pytest.mark.parametrize("stem, n_state, scalars", [
    ("ftrl", 2, (0.1, 0.0, 0.0, -0.5)), ("rmsprop", 3, (0.1, 0.95, 1e-6, 0.0, 0)),
    ("decayed_adagrad", 1, (0.1, 0.95, 1e-6)), ("lamb", 2, (0.1, 0.9, 0.999, 1e-6, 0.01)),
    ("adamax", 2, (0.1, 0.9, 0.999, 1e-8)), ("adadelta", 2, (0.95, 1e-6))])
def test_row_kernels_with_no_rows_change_nothing_and_check_the_width(stem, n_state, scalars):
    arrays = [np.full((4, 3), 0.5, np.float32) for _ in range(1 + n_state)]
    kernel = getattr(ad, stem + "_rows")
    kernel(*arrays, np.zeros(0, np.int64), np.zeros((0, 3), np.float32), *scalars)
    assert all((a == 0.5).all() for a in arrays)
    with pytest.raises(AssertionError, match="grad must be"):
        kernel(*arrays, np.array([1]), np.zeros((1, 2), np.float32), *scalars)
