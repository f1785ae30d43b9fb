"""Optimizers through the engine: minimize() + Executor.run against Paddle's update
formulas written out in numpy (SGD bit for bit, the others over three steps)."""
import math

import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.param_attr import ParamAttr

W0 = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 1.5]], dtype=np.float32)
B0 = np.array([0.125, -0.5], dtype=np.float32)


class Linear:
    """out = x @ w + b, loss = sum(out * c): the gradient is x.T @ c and sum(c) whatever
    the parameters are, so numpy can replay any optimizer from known gradients."""

    def __init__(self, opt, w_attr="w", b_attr="b"):
        self.main, self.startup, self.scope = fw.Program(), fw.Program(), fw.Scope()
        self.exe = fw.Executor()
        with fw.program_guard(self.main, self.startup):
            x = layers.data("x", shape=[3])
            c = layers.data("c", shape=[2])
            out = layers.fc(x, 2, param_attr=w_attr, bias_attr=b_attr)
            self.loss = layers.reduce_sum(layers.elementwise_mul(out, c))
            self.ops, self.params_grads = opt.minimize(self.loss)
        self.exe.run(self.startup, scope=self.scope)
        self.scope["w"][...] = W0
        self.scope["b"][...] = B0

    def step(self, x, c):
        self.exe.run(self.main, feed={"x": x, "c": c}, scope=self.scope)

    def __getitem__(self, name):
        return self.scope[name]


def _batches(steps=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32))
            for _ in range(steps)]


def _grads(x, c):
    return x.astype(np.float64).T @ c.astype(np.float64), c.astype(np.float64).sum(axis=0)


# ------------------------------------------------------------------------------- SGD
def test_sgd_on_dyadic_values_matches_the_hand_computed_update_exactly():
    model = Linear(optimizer.SGD(0.5))
    x = np.array([[1, 2, -1], [0.5, 0, 1], [-2, 1, 0.25], [1, 1, 1]], dtype=np.float32)
    c = np.array([[1, 0], [0.5, -1], [0, 2], [-0.25, 1]], dtype=np.float32)
    model.step(x, c)
    # dW[i, j] = sum_b x[b, i] c[b, j]; db[j] = sum_b c[b, j]; every value is exact in float32
    dw = np.array([[1 * 1 + 0.5 * 0.5 + 0 - 0.25, 0 - 0.5 - 4 + 1],
                   [2 + 0 + 0 - 0.25, 0 + 0 + 2 + 1],
                   [-1 + 0.5 + 0 - 0.25, 0 - 1 + 0.5 + 1]], dtype=np.float32)
    db = np.array([1 + 0.5 + 0 - 0.25, 0 - 1 + 2 + 1], dtype=np.float32)
    np.testing.assert_array_equal(model["w"], W0 - 0.5 * dw)
    np.testing.assert_array_equal(model["b"], B0 - 0.5 * db)


def test_sgd_on_random_values_matches_float32_arithmetic_within_one_ulp():
    model = Linear(optimizer.SGD(0.01))
    w, b = W0.copy(), B0.copy()
    lr = np.float32(0.01)
    for x, c in _batches():
        model.step(x, c)
        w = w - lr * np.matmul(x.T, c)
        b = b - lr * c.sum(axis=0, dtype=np.float32)
        np.testing.assert_array_max_ulp(model["w"], w, maxulp=1)
        np.testing.assert_array_max_ulp(model["b"], b, maxulp=1)


# ------------------------------------------------------------------------------- dense rules
def _replay(kind, steps, **hp):
    """Paddle's formulas in float64 from the known gradients."""
    params = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
    state = {k: {} for k in params}
    for t, (x, c) in enumerate(steps, start=1):
        gw, gb = _grads(x, c)
        for name, g in (("w", gw), ("b", gb)):
            p, s = params[name], state[name]
            if kind == "momentum":
                v = hp["momentum"] * s.get("v", 0.0) + g
                s["v"] = v
                p -= (g + hp["momentum"] * v) * hp["lr"] if hp.get("use_nesterov") else hp["lr"] * v
            elif kind == "adagrad":
                m = s.get("m", hp.get("initial_accumulator_value", 0.0)) + g * g
                s["m"] = m
                p -= hp["lr"] * g / (np.sqrt(m) + hp["epsilon"])
            elif kind == "adam":
                b1, b2, eps = hp["beta1"], hp["beta2"], hp["epsilon"]
                m1 = b1 * s.get("m1", 0.0) + (1 - b1) * g
                m2 = b2 * s.get("m2", 0.0) + (1 - b2) * g * g
                s["m1"], s["m2"] = m1, m2
                lr_t = hp["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p -= lr_t * m1 / (np.sqrt(m2) + eps * math.sqrt(1 - b2 ** t))
    return params


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_matches_paddles_formula_over_three_steps(nesterov):
    model = Linear(optimizer.Momentum(0.05, momentum=0.9, use_nesterov=nesterov))
    steps = _batches()
    for x, c in steps:
        model.step(x, c)
    want = _replay("momentum", steps, lr=0.05, momentum=0.9, use_nesterov=nesterov)
    np.testing.assert_allclose(model["w"], want["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model["b"], want["b"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model["w_velocity_0"], 0.81 * _grads(*steps[0])[0] + 0.9 * _grads(*steps[1])[0]
                               + _grads(*steps[2])[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("initial", [0.0, 0.1])
def test_adagrad_matches_paddles_formula_over_three_steps(initial):
    model = Linear(optimizer.Adagrad(0.1, epsilon=1e-6, initial_accumulator_value=initial))
    steps = _batches()
    for x, c in steps:
        model.step(x, c)
    want = _replay("adagrad", steps, lr=0.1, epsilon=1e-6, initial_accumulator_value=initial)
    np.testing.assert_allclose(model["w"], want["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model["b"], want["b"], rtol=1e-5, atol=1e-6)


def test_adam_matches_paddles_formula_over_three_steps():
    model = Linear(optimizer.Adam(0.01, beta1=0.8, beta2=0.99, epsilon=1e-6))
    steps = _batches()
    for x, c in steps:
        model.step(x, c)
    want = _replay("adam", steps, lr=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6)
    np.testing.assert_allclose(model["w"], want["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model["b"], want["b"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model["w_beta1_pow_0"], [0.8 ** 4])
    np.testing.assert_allclose(model["w_beta2_pow_0"], [0.99 ** 4])


# ------------------------------------------------------------------------------- sparse rules
class Embedding:
    """pooled = sequence_pool(embedding(ids), sum); loss = sum(pooled * c)."""

    def __init__(self, opt, is_sparse=True, height=6, width=2, seed=0):
        self.main, self.startup, self.scope = fw.Program(), fw.Program(), fw.Scope()
        self.exe = fw.Executor()
        with fw.program_guard(self.main, self.startup):
            ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
            c = layers.data("c", shape=[width])
            emb = layers.embedding(ids, size=[height, width], is_sparse=is_sparse, param_attr="table")
            pooled = layers.sequence_pool(emb, "sum")
            loss = layers.reduce_sum(layers.elementwise_mul(pooled, c))
            opt.minimize(loss)
        self.exe.run(self.startup, scope=self.scope)
        rng = np.random.default_rng(seed)
        self.scope["table"][...] = rng.normal(size=(height, width)).astype(np.float32)
        self.initial = self.scope["table"].copy()

    def step(self, values, lengths, c):
        self.exe.run(self.main, feed={"ids": (np.asarray(values, dtype=np.int64), lengths), "c": c},
                     scope=self.scope)

    @property
    def table(self):
        return self.scope["table"]


SPARSE_STEPS = [([1, 2, 1], [2, 1], np.array([[1.0, -0.5], [0.25, 2.0]], dtype=np.float32)),
                ([3], [1], np.array([[-1.0, 0.5]], dtype=np.float32)),
                ([3, 1], [1, 1], np.array([[0.5, 0.5], [-2.0, 1.0]], dtype=np.float32))]


def _table_grad(values, lengths, c, height=6):
    g = np.zeros((height, c.shape[1]))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for b, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
        for i in values[lo:hi]:
            g[i] += c[b]
    return g


def _adam_rows(table, steps, lazy, lr=0.1, b1=0.9, b2=0.999, eps=1e-8):
    p = table.astype(np.float64)
    m1, m2 = np.zeros_like(p), np.zeros_like(p)
    for t, (values, lengths, c) in enumerate(steps, start=1):
        g = _table_grad(values, lengths, c)
        rows = np.unique(values) if lazy else np.arange(len(p))
        m1[rows] = b1 * m1[rows] + (1 - b1) * g[rows]
        m2[rows] = b2 * m2[rows] + (1 - b2) * g[rows] ** 2
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        p[rows] -= lr_t * m1[rows] / (np.sqrt(m2[rows]) + eps * math.sqrt(1 - b2 ** t))
    return p


@pytest.mark.parametrize("lazy", [False, True])
def test_sparse_adam_matches_paddles_formula_in_lazy_and_non_lazy_mode(lazy):
    model = Embedding(optimizer.Adam(0.1, lazy_mode=lazy))
    for step in SPARSE_STEPS:
        model.step(*step)
    np.testing.assert_allclose(model.table, _adam_rows(model.initial, SPARSE_STEPS, lazy), rtol=1e-5, atol=1e-6)


def test_non_lazy_adam_moves_rows_outside_the_batch_once_their_moments_are_non_zero():
    eager = Embedding(optimizer.Adam(0.1, lazy_mode=False))
    lazy = Embedding(optimizer.Adam(0.1, lazy_mode=True))
    for model in (eager, lazy):
        model.step(*SPARSE_STEPS[0])  # rows 1 and 2
    after_first = {id(m): m.table.copy() for m in (eager, lazy)}
    for model in (eager, lazy):
        model.step(*SPARSE_STEPS[1])  # row 3 only
    # rows 1 and 2 were not in the second batch
    assert not np.array_equal(eager.table[[1, 2]], after_first[id(eager)][[1, 2]])
    np.testing.assert_array_equal(lazy.table[[1, 2]], after_first[id(lazy)][[1, 2]])
    # rows never seen have zero moments: neither mode moves them
    for model in (eager, lazy):
        np.testing.assert_array_equal(model.table[[0, 4, 5]], model.initial[[0, 4, 5]])


@pytest.mark.parametrize("make", [lambda: optimizer.SGD(0.1), lambda: optimizer.Adagrad(0.1),
                                  lambda: optimizer.Adam(0.1, lazy_mode=False)],
                         ids=["sgd", "adagrad", "adam_non_lazy"])
def test_sparse_table_updates_equal_dense_table_updates(make):
    sparse, dense = Embedding(make(), is_sparse=True), Embedding(make(), is_sparse=False)
    for step in SPARSE_STEPS:
        sparse.step(*step)
        dense.step(*step)
    assert not np.array_equal(sparse.table, sparse.initial)
    np.testing.assert_allclose(sparse.table, dense.table, rtol=1e-6, atol=1e-7)


def test_sparse_sgd_sums_duplicate_ids_of_a_batch():
    model = Embedding(optimizer.SGD(0.5))
    values, lengths, c = SPARSE_STEPS[0]
    model.step(values, lengths, c)
    expected = model.initial - 0.5 * _table_grad(values, lengths, c)
    np.testing.assert_allclose(model.table, expected, rtol=1e-6)
    # row 1 appears twice (examples 0 and 1)
    np.testing.assert_allclose(model.initial[1] - model.table[1], 0.5 * (c[0] + c[1]), rtol=1e-6)


# ------------------------------------------------------------------------------- ParamAttr
def test_param_attr_learning_rate_multiplies_the_optimizer_rate():
    model = Linear(optimizer.SGD(0.1), w_attr=ParamAttr(name="w", learning_rate=0.25))
    (x, c), = _batches(1)
    model.step(x, c)
    gw, gb = _grads(x, c)
    np.testing.assert_allclose(model["w"], W0 - 0.025 * gw, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(model["b"], B0 - 0.1 * gb, rtol=1e-6, atol=1e-7)
    (w_op,) = [op for op in model.ops if op.input("Param") == ["w"]]
    assert w_op.attr("learning_rate") == pytest.approx(0.025)


def test_a_parameter_with_trainable_false_is_left_unchanged():
    model = Linear(optimizer.Adam(0.1), w_attr=ParamAttr(name="w", trainable=False))
    for x, c in _batches():
        model.step(x, c)
    np.testing.assert_array_equal(model["w"], W0)
    assert not np.array_equal(model["b"], B0)
    assert [p.name for p, _ in model.params_grads] == ["b"]
    assert not model.main.global_block().has_var("w@GRAD")
    assert "w_moment1_0" not in model.scope


def test_optimizers_reject_bad_hyper_parameters_with_the_value_named():
    with pytest.raises(ValueError, match=r"learning_rate=-1 must be a non-negative number"):
        optimizer.SGD(-1)
    with pytest.raises(ValueError, match=r"Adam beta1=1.0 must be in \[0, 1\)"):
        optimizer.Adam(0.1, beta1=1.0)
    with pytest.raises(TypeError, match="minimize takes one loss Variable, not a list"):
        optimizer.SGD(0.1).minimize([])
