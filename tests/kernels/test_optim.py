"""fleet.kernels.optim against its numpy twins and Paddle's formulas written out by hand."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleet.kernels import optim

SETTINGS = settings(max_examples=50, deadline=None)
FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)
NONNEG = st.floats(0.0, allow_infinity=False, width=32)
LR = st.floats(0.0, 10.0) | st.sampled_from([1e-4, 1e-30])
MU = st.floats(0.0, 0.999)
BETA = st.floats(0.0, 0.9999) | st.sampled_from([0.9, 0.999])
EPS = st.floats(1e-12, 1e-3)


def _arrays(shape, elements=FLOATS):
    return hnp.arrays(np.float32, shape, elements=elements)


def _paddle_adam_scalars(lr, beta1, beta2, epsilon, step):
    """(lr_t, eps_t) as docs/internals.md gives them for 1-based ``step``."""
    root = math.sqrt(1.0 - beta2**step)
    return lr * root / (1.0 - beta1**step), epsilon * root


def _run_both(kernel, reference, *arrays_then_scalars, n_arrays):
    """Runs kernel on the arrays and reference on copies; returns (kernel arrays, ref arrays)."""
    arrays = list(arrays_then_scalars[:n_arrays])
    scalars = arrays_then_scalars[n_arrays:]
    copies = [a.copy() for a in arrays]
    kernel(*arrays, *scalars)
    with np.errstate(all="ignore"):
        reference(*copies, *scalars)
    return arrays, copies


def _assert_all_equal(got, expected):
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


@st.composite
def dense_case(draw, n_state, state_elements=NONNEG):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=9))
    param = draw(_arrays(shape))
    states = [draw(_arrays(shape, state_elements)) for _ in range(n_state)]
    grad = draw(_arrays(shape))
    return param, states, grad


@SETTINGS
@given(dense_case(0), LR)
def test_sgd_dense_matches_reference(case, lr):
    param, _, grad = case
    _assert_all_equal(*_run_both(optim.sgd_dense, optim.sgd_dense_reference,
                                 param, grad, lr, n_arrays=2))


@SETTINGS
@given(dense_case(1, FLOATS), LR, MU, st.sampled_from([0, 1]))
def test_momentum_dense_matches_reference_with_and_without_nesterov(case, lr, mu, nesterov):
    param, (velocity,), grad = case
    _assert_all_equal(*_run_both(optim.momentum_dense, optim.momentum_dense_reference,
                                 param, velocity, grad, lr, mu, nesterov, n_arrays=3))


@SETTINGS
@given(dense_case(1), LR, EPS)
def test_adagrad_dense_matches_reference(case, lr, epsilon):
    param, (moment,), grad = case
    _assert_all_equal(*_run_both(optim.adagrad_dense, optim.adagrad_dense_reference,
                                 param, moment, grad, lr, epsilon, n_arrays=3))


@SETTINGS
@given(dense_case(2), LR, BETA, BETA, EPS)
def test_adam_dense_matches_reference(case, lr_t, beta1, beta2, eps_t):
    param, (m1, m2), grad = case
    _assert_all_equal(*_run_both(optim.adam_dense, optim.adam_dense_reference,
                                 param, m1, m2, grad, lr_t, beta1, beta2, eps_t, n_arrays=4))


def test_adam_dense_matches_reference_for_a_large_array():
    rng = np.random.default_rng(0)
    n = (1 << 18) + 77  # many vector iterations plus a scalar remainder
    param, m1, grad = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    m2 = rng.random(n).astype(np.float32)
    _assert_all_equal(*_run_both(optim.adam_dense, optim.adam_dense_reference,
                                 param, m1, m2, grad, 1e-3, 0.9, 0.999, 1e-8, n_arrays=4))


def test_dense_updates_follow_paddles_formulas_on_hand_computed_numbers():
    def one(value):
        return np.array([value], dtype=np.float32)

    p, g = one(1.0), one(2.0)
    optim.sgd_dense(p, g, 0.1)
    assert p[0] == pytest.approx(0.8)

    # velocity = 0.9 * 0.5 + 2 = 2.45
    p, v = one(1.0), one(0.5)
    optim.momentum_dense(p, v, g, 0.1, 0.9, 0)
    assert (v[0], p[0]) == pytest.approx((2.45, 1.0 - 0.1 * 2.45))
    p, v = one(1.0), one(0.5)
    optim.momentum_dense(p, v, g, 0.1, 0.9, 1)
    assert (v[0], p[0]) == pytest.approx((2.45, 1.0 - (2.0 + 0.9 * 2.45) * 0.1))

    p, m = one(1.0), one(1.0)
    optim.adagrad_dense(p, m, g, 0.1, 1e-6)
    assert (m[0], p[0]) == pytest.approx((5.0, 1.0 - 0.1 * 2.0 / (math.sqrt(5.0) + 1e-6)))

    p, m1, m2 = one(1.0), one(0.0), one(0.0)
    lr_t, eps_t = _paddle_adam_scalars(0.1, 0.9, 0.999, 1e-8, 1)
    optim.adam_dense(p, m1, m2, g, lr_t, 0.9, 0.999, eps_t)
    # first step of bias-corrected Adam moves by lr * sign(g)
    assert (m1[0], m2[0], p[0]) == pytest.approx((0.2, 0.004, 0.9), rel=1e-4)  # 1 - 0.999 in float32


def test_adam_with_paddles_lr_t_and_eps_t_is_textbook_bias_corrected_adam():
    rng = np.random.default_rng(1)
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-6
    param = rng.standard_normal(64).astype(np.float32)
    m1, m2 = np.zeros(64, np.float32), np.zeros(64, np.float32)
    p64, a64, b64 = param.astype(np.float64), np.zeros(64), np.zeros(64)
    for step in range(1, 21):
        grad = rng.standard_normal(64).astype(np.float32)
        lr_t, eps_t = _paddle_adam_scalars(lr, b1, b2, eps, step)
        optim.adam_dense(param, m1, m2, grad, lr_t, b1, b2, eps_t)
        a64 = b1 * a64 + (1 - b1) * grad
        b64 = b2 * b64 + (1 - b2) * grad.astype(np.float64) ** 2
        p64 -= lr * (a64 / (1 - b1**step)) / (np.sqrt(b64 / (1 - b2**step)) + eps)
    np.testing.assert_allclose(param, p64, rtol=1e-5, atol=1e-6)


def test_dense_kernels_read_two_dimensional_arrays_flat():
    rng = np.random.default_rng(2)
    param = rng.standard_normal((7, 3)).astype(np.float32)
    grad = rng.standard_normal((7, 3)).astype(np.float32)
    flat = param.reshape(-1).copy()
    optim.sgd_dense(param, grad, 0.5)
    optim.sgd_dense(flat, grad.reshape(-1), 0.5)
    np.testing.assert_array_equal(param.reshape(-1), flat)


def test_dense_kernels_reject_a_gradient_of_another_size():
    with pytest.raises(AssertionError, match="sizes differ"):
        optim.adam_dense(*(np.zeros(4, np.float32) for _ in range(3)), np.zeros(5, np.float32),
                         0.1, 0.9, 0.999, 1e-8)


@st.composite
def rows_case(draw, n_state, sort, state_elements=NONNEG):
    """A [V, D] table with state, unique rows (edges 0 and V-1 likely) and their gradient."""
    # Small enough that four float arrays fit hypothesis's example budget; big tables
    # are covered by the parametrized tests below.
    height = draw(st.integers(1, 12))
    dim = draw(st.integers(1, 5))
    # A keep-flag per row (no filtering for uniqueness); tables are small, so rows 0 and
    # V-1 are often in, and sometimes every row is.
    keep = draw(st.lists(st.booleans(), min_size=height, max_size=height))
    rows = [r for r in range(height) if keep[r]]
    rows = np.array(rows if sort else draw(st.permutations(rows)), dtype=np.int64)
    param = draw(_arrays((height, dim)))
    states = [draw(_arrays((height, dim), state_elements)) for _ in range(n_state)]
    grad = draw(_arrays((len(rows), dim)))
    return param, states, rows, grad


@SETTINGS
@given(rows_case(0, sort=False), LR)
def test_sgd_rows_matches_reference_on_unsorted_unique_rows(case, lr):
    param, _, rows, grad = case
    _assert_all_equal(*_run_both(optim.sgd_rows, optim.sgd_rows_reference,
                                 param, rows, grad, lr, n_arrays=3))


@SETTINGS
@given(rows_case(1, sort=False, state_elements=FLOATS), LR, MU, st.sampled_from([0, 1]))
def test_momentum_rows_matches_reference_on_unsorted_unique_rows(case, lr, mu, nesterov):
    param, (velocity,), rows, grad = case
    _assert_all_equal(*_run_both(optim.momentum_rows, optim.momentum_rows_reference,
                                 param, velocity, rows, grad, lr, mu, nesterov, n_arrays=4))


@SETTINGS
@given(rows_case(1, sort=False), LR, EPS)
def test_adagrad_rows_matches_reference_on_unsorted_unique_rows(case, lr, epsilon):
    param, (moment,), rows, grad = case
    _assert_all_equal(*_run_both(optim.adagrad_rows, optim.adagrad_rows_reference,
                                 param, moment, rows, grad, lr, epsilon, n_arrays=4))


@SETTINGS
@given(rows_case(2, sort=False), LR, BETA, BETA, EPS)
def test_lazy_adam_rows_matches_reference_and_leaves_other_rows_alone(case, lr_t, beta1, beta2, eps_t):
    param, (m1, m2), rows, grad = case
    before = [param.copy(), m1.copy(), m2.copy()]
    got, expected = _run_both(optim.adam_rows, optim.adam_rows_reference,
                              param, m1, m2, rows, grad, lr_t, beta1, beta2, eps_t, n_arrays=5)
    _assert_all_equal(got, expected)
    untouched = np.setdiff1d(np.arange(param.shape[0]), rows)
    for array, old in zip(got[:3], before):
        np.testing.assert_array_equal(array[untouched], old[untouched])


@SETTINGS
@given(rows_case(2, sort=True), LR, BETA, BETA, EPS)
def test_adam_rows_all_equals_dense_adam_with_a_zero_filled_gradient(case, lr_t, beta1, beta2, eps_t):
    param, (m1, m2), rows, grad = case
    got, expected = _run_both(optim.adam_rows_all, optim.adam_rows_all_reference,
                              param, m1, m2, rows, grad, lr_t, beta1, beta2, eps_t, n_arrays=5)
    _assert_all_equal(got, expected)


@pytest.mark.parametrize("height", [1, 1000, 30011])
@pytest.mark.parametrize("density", [0.0, 0.01, 1.0])
def test_adam_rows_all_matches_the_dense_kernel_bit_for_bit(height, density):
    rng = np.random.default_rng(height)
    dim = 10
    rows = np.flatnonzero(rng.random(height) < density).astype(np.int64)
    if density == 1.0:
        rows = np.arange(height, dtype=np.int64)
    grad = rng.standard_normal((len(rows), dim)).astype(np.float32)
    param = rng.standard_normal((height, dim)).astype(np.float32)
    m1 = rng.standard_normal((height, dim)).astype(np.float32)
    m2 = rng.random((height, dim)).astype(np.float32)
    dense = [param.copy(), m1.copy(), m2.copy()]
    dense_grad = np.zeros((height, dim), np.float32)
    dense_grad[rows] = grad
    lr_t, eps_t = _paddle_adam_scalars(1e-3, 0.9, 0.999, 1e-8, 3)
    optim.adam_rows_all(param, m1, m2, rows, grad, lr_t, 0.9, 0.999, eps_t)
    optim.adam_dense(*dense, dense_grad, lr_t, 0.9, 0.999, eps_t)
    _assert_all_equal([param, m1, m2], dense)


@pytest.mark.parametrize(
    "kernel, n_state, scalars",
    [
        (optim.sgd_rows, 0, (0.1,)),
        (optim.momentum_rows, 1, (0.1, 0.9, 1)),
        (optim.adagrad_rows, 1, (0.1, 1e-6)),
        (optim.adam_rows, 2, (0.1, 0.9, 0.999, 1e-8)),
    ],
)
def test_row_kernels_with_no_rows_change_nothing(kernel, n_state, scalars):
    arrays = [np.full((5, 3), 0.5, np.float32) for _ in range(1 + n_state)]
    kernel(*arrays, np.zeros(0, np.int64), np.zeros((0, 3), np.float32), *scalars)
    for a in arrays:
        assert (a == 0.5).all()


def test_row_kernels_reject_a_gradient_of_the_wrong_width():
    with pytest.raises(AssertionError, match="grad must be"):
        optim.sgd_rows(np.zeros((5, 3), np.float32), np.array([1]), np.zeros((1, 2), np.float32), 0.1)
