"""Every op's backward agrees with central finite differences (see gradcheck.py for the
method and the float32 tolerances: eps=1e-2, rtol=1e-2, atol=1e-3 unless a test says).

Each test builds a tiny program with fleet.layers, puts the op's output in the loss
``reduce_sum(out * W)`` with a fixed random W, and compares the engine's gradients of
the op's inputs and parameters with finite differences of re-run forwards.
"""
import numpy as np
import pytest

from fleet import layers
from fleet.framework.program import BACKWARD
from fleet.framework.tensor import LoDTensor, SparseRows
from fleet.param_attr import ParamAttr

from gradcheck import check_grads


def _rng(seed=0):
    return np.random.default_rng(seed)


def _f32(a):
    return np.asarray(a, dtype=np.float32)


def _away_from_zero(rng, shape, low=0.2, high=1.5):
    """Values with |v| in [low, high): no finite-difference step crosses a kink at 0."""
    return _f32(rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape))


def _x(name, shape, **kw):
    return layers.data(name, shape=shape, stop_gradient=False, **kw)


# ------------------------------------------------------------------------------- fc
def _fc_params_with_margin(x, width, margin=0.1):
    """W and b of an fc whose pre-activations on x are all at least ``margin`` from 0."""
    for seed in range(200):
        rng = _rng(100 + seed)
        w = _f32(rng.normal(0, 0.7, (x.shape[1], width)))
        b = _f32(rng.normal(0, 0.3, width))
        if np.abs(x @ w + b).min() > margin:
            return w, b
    raise AssertionError("no seed gives pre-activations away from 0")


@pytest.mark.parametrize("act", [None, "relu", "sigmoid", "tanh", "softmax"])
def test_fc_gradients_of_input_weight_and_bias_match_finite_differences(act):
    x = _f32(_rng(1).normal(size=(4, 3)))
    w, b = _fc_params_with_margin(x, 5)

    def build():
        xv = _x("x", [3])
        out = layers.fc(xv, 5, act=act, param_attr="fc_w", bias_attr="fc_b")
        return out, [xv, "fc_w", "fc_b"]

    r = check_grads(build, {"x": x}, params={"fc_w": w, "fc_b": b})
    pre = x @ w + b
    expected = {None: pre, "relu": np.maximum(pre, 0), "sigmoid": 1 / (1 + np.exp(-pre)),
                "tanh": np.tanh(pre),
                "softmax": np.exp(pre) / np.exp(pre).sum(axis=1, keepdims=True)}[act]
    np.testing.assert_allclose(r.out, expected, rtol=1e-5, atol=1e-6)


def test_fc_with_num_flatten_dims_2_keeps_two_dims_and_its_gradients_match():
    x = _f32(_rng(2).normal(size=(3, 2, 4)))

    def build():
        xv = _x("x", [2, 4])
        out = layers.fc(xv, 5, num_flatten_dims=2, act="tanh", param_attr="w", bias_attr="b")
        assert out.shape == (-1, 2, 5)
        return out, [xv, "w", "b"]

    r = check_grads(build, {"x": x})
    assert r.out.shape == (3, 2, 5)
    w, b = r.scope["w"], r.scope["b"]
    assert w.shape == (4, 5)
    np.testing.assert_allclose(r.out, np.tanh(x @ w + b), rtol=1e-5, atol=1e-6)


def test_fc_with_a_list_of_inputs_sums_one_product_per_input_and_its_gradients_match():
    rng = _rng(3)
    x1, x2 = _f32(rng.normal(size=(4, 3))), _f32(rng.normal(size=(4, 2)))

    def build():
        a, b = _x("a", [3]), _x("b", [2])
        out = layers.fc([a, b], 4, act="sigmoid", param_attr=["wa", "wb"], bias_attr="bias")
        return out, [a, b, "wa", "wb", "bias"]

    r = check_grads(build, {"a": x1, "b": x2})
    s = r.scope
    pre = x1 @ s["wa"] + x2 @ s["wb"] + s["bias"]
    np.testing.assert_allclose(r.out, 1 / (1 + np.exp(-pre)), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------- embedding
def test_embedding_dense_gradient_scatters_output_gradients_into_the_rows_looked_up():
    ids = np.array([[1], [4], [1], [0], [7]], dtype=np.int64)

    def build():
        i = layers.data("ids", shape=[1], dtype="int64")
        return layers.embedding(i, size=[8, 3], param_attr="table"), ["table"]

    r = check_grads(build, {"ids": ids})
    assert isinstance(r.raw["table"], np.ndarray)
    grad = r.analytic["table"]
    untouched = [k for k in range(8) if k not in ids]
    assert not grad[untouched].any()
    assert grad[1].any() and grad[4].any()


def test_sparse_embedding_gradient_is_sparse_rows_equal_to_finite_differences():
    values = np.array([3, 0, 3, 5, 9, 3], dtype=np.int64)
    lengths = np.array([2, 1, 3], dtype=np.int64)

    def build():
        i = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(i, size=[10, 4], is_sparse=True, param_attr="table")
        assert emb.lod_level == 1
        return emb, ["table"]

    r = check_grads(build, {"ids": (values, lengths)})
    grad = r.raw["table"]
    assert isinstance(grad, SparseRows)
    assert grad.height == 10 and grad.width == 4
    assert sorted(set(grad.rows.tolist())) == [0, 3, 5, 9]
    np.testing.assert_array_equal(r.out, r.scope["table"][values])


def test_embedding_padding_idx_rows_are_zero_and_get_no_gradient():
    values = np.array([2, 0, 2, 5, 0], dtype=np.int64)

    def build():
        i = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(i, size=[6, 3], is_sparse=True, padding_idx=0, param_attr="table")
        return layers.sequence_pool(emb, "sum"), ["table"]

    r = check_grads(build, {"ids": (values, [2, 3])})
    assert not r.analytic["table"][0].any()
    assert r.analytic["table"][2].any()
    t = r.scope["table"]
    np.testing.assert_allclose(r.out, [t[2], t[2] + t[5]], rtol=1e-6)


def test_negative_padding_idx_counts_from_the_end_of_the_table():
    def build():
        i = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(i, size=[6, 2], padding_idx=-1, param_attr="table")
        return emb, ["table"]

    r = check_grads(build, {"ids": ([5, 1, 5], [3])})
    assert not r.out[0].any() and not r.out[2].any()
    assert not r.analytic["table"][5].any()


def test_a_table_shared_by_three_slots_gets_the_sum_of_their_gradients():
    feeds = {"s0": ([1, 2], [1, 1]), "s1": ([2, 3, 2], [2, 1]), "s2": ([0, 1], [1, 1])}
    attr = ParamAttr(name="shared")

    def build():
        slots = [layers.data(f"s{k}", shape=[1], dtype="int64", lod_level=1) for k in range(3)]
        pooled = [layers.sequence_pool(layers.embedding(s, size=[5, 2], is_sparse=True, param_attr=attr),
                                       "sum") for s in slots]
        return layers.concat(pooled, axis=1), ["shared"]

    r = check_grads(build, feeds)
    names = [n for op in r.main.global_block().ops for n in op.output_arg_names]
    assert sum("shared@GRAD@RENAME@" in n for n in set(names)) == 3
    sums = [op for op in r.main.global_block().ops if op.type == "sum" and op.output("Out") == ["shared@GRAD"]]
    assert len(sums) == 1 and sums[0].attr("op_role") == BACKWARD
    assert isinstance(r.raw["shared"], SparseRows)
    assert len(r.main.all_parameters()) == 1
    assert not r.analytic["shared"][4].any()


# ------------------------------------------------------------------------------- sequence_pool
def _distinct_values(rng, n, width):
    """Values pairwise at least 0.1 apart: max pooling has no ties and no step flips it."""
    return _f32(rng.permutation(n * width).reshape(n, width) * 0.1 - n * width * 0.05)


@pytest.mark.parametrize("pool", ["sum", "average", "max", "sqrt", "first", "last"])
def test_sequence_pool_gradients_match_finite_differences_with_an_empty_sequence(pool):
    lengths = np.array([3, 0, 1, 4], dtype=np.int64)
    values = _distinct_values(_rng(4), int(lengths.sum()), 3)

    def build():
        x = _x("x", [3], lod_level=1)
        return layers.sequence_pool(x, pool), [x]

    r = check_grads(build, {"x": (values, lengths)})
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    reduce = {"sum": lambda s: s.sum(0), "average": lambda s: s.mean(0), "max": lambda s: s.max(0),
              "sqrt": lambda s: s.sum(0) / np.sqrt(len(s)), "first": lambda s: s[0],
              "last": lambda s: s[-1]}[pool]
    expected = [reduce(values[a:b]) if b > a else np.zeros(3) for a, b in zip(offsets, offsets[1:])]
    np.testing.assert_allclose(r.out, expected, rtol=1e-5, atol=1e-6)
    assert not r.out[1].any()
    assert isinstance(r.raw["x"], LoDTensor)


@pytest.mark.parametrize("pool", ["sum", "average", "max", "sqrt", "first", "last"])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_embedding_then_sequence_pool_table_gradients_match_for_every_pool_type(pool, padding_idx):
    # the execution pass may fuse lookup_table + sequence_pool; the gradients must not change
    values = np.array([1, 4, 6, 4, 2, 6, 0, 5], dtype=np.int64)
    lengths = np.array([3, 0, 2, 3], dtype=np.int64)
    table = _distinct_values(_rng(21), 7, 3)

    def build():
        i = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(i, size=[7, 3], is_sparse=True, padding_idx=padding_idx, param_attr="t")
        return layers.sequence_pool(emb, pool), ["t"]

    r = check_grads(build, {"ids": (values, lengths)}, params={"t": table})
    rows = table.copy()
    if padding_idx is not None:
        rows[padding_idx] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    reduce = {"sum": lambda s: s.sum(0), "average": lambda s: s.mean(0), "max": lambda s: s.max(0),
              "sqrt": lambda s: s.sum(0) / np.sqrt(len(s)), "first": lambda s: s[0],
              "last": lambda s: s[-1]}[pool]
    expected = [reduce(rows[values[a:b]]) if b > a else np.zeros(3) for a, b in zip(offsets, offsets[1:])]
    np.testing.assert_allclose(r.out, expected, rtol=1e-5, atol=1e-6)
    assert isinstance(r.raw["t"], SparseRows)
    if padding_idx is not None:
        assert not r.analytic["t"][padding_idx].any()


# ------------------------------------------------------------------------------- shape ops
@pytest.mark.parametrize("axis", [0, 1])
def test_concat_gradients_split_back_to_each_input(axis):
    rng = _rng(5)
    a = _f32(rng.normal(size=(2, 3)))
    b = _f32(rng.normal(size=(2, 3) if axis == 1 else (3, 3)))

    def build():
        xa, xb = _x("a", [3]), _x("b", [3])
        return layers.concat([xa, xb], axis=axis), [xa, xb]

    r = check_grads(build, {"a": a, "b": b})
    np.testing.assert_array_equal(r.out, np.concatenate([a, b], axis=axis))


def test_reshape_gradient_has_the_input_shape():
    x = _f32(_rng(6).normal(size=(4, 6)))

    def build():
        xv = _x("x", [6])
        return layers.reshape(xv, [0, 3, 2]), [xv]

    r = check_grads(build, {"x": x})
    assert r.out.shape == (4, 3, 2)
    assert r.analytic["x"].shape == (4, 6)


@pytest.mark.parametrize("bias_after_scale", [True, False])
def test_scale_gradient_is_the_scale(bias_after_scale):
    x = _f32(_rng(7).normal(size=(3, 4)))

    def build():
        xv = _x("x", [4])
        return layers.scale(xv, 2.5, 0.5, bias_after_scale=bias_after_scale), [xv]

    r = check_grads(build, {"x": x})
    expected = x * 2.5 + 0.5 if bias_after_scale else (x + 0.5) * 2.5
    np.testing.assert_allclose(r.out, expected, rtol=1e-6)


# ------------------------------------------------------------------------------- elementwise
_ELEMENTWISE = {
    "add": (layers.elementwise_add, np.add),
    "sub": (layers.elementwise_sub, np.subtract),
    "mul": (layers.elementwise_mul, np.multiply),
    "div": (layers.elementwise_div, np.divide),
}
# (y shape, axis, numpy shape y broadcasts as against x [4, 3, 2])
_BROADCASTS = [((4, 3, 2), -1, (4, 3, 2)), ((3, 2), -1, (3, 2)), ((2,), -1, (2,)),
               ((3,), 1, (3, 1)), ((3, 2), 1, (3, 2)), ((4, 3), 0, (4, 3, 1))]


@pytest.mark.parametrize("kind", sorted(_ELEMENTWISE))
@pytest.mark.parametrize("y_shape,axis,np_shape", _BROADCASTS)
def test_elementwise_gradients_match_finite_differences_same_shape_and_broadcast(kind, y_shape, axis, np_shape):
    layer, ref = _ELEMENTWISE[kind]
    rng = _rng(8)
    x = _f32(rng.normal(size=(4, 3, 2)))
    y = _away_from_zero(rng, y_shape, 0.5, 1.5)

    def build():
        xv = layers.data("x", shape=[4, 3, 2], append_batch_size=False, stop_gradient=False)
        yv = layers.data("y", shape=list(y_shape), append_batch_size=False, stop_gradient=False)
        return layer(xv, yv, axis=axis), [xv, yv]

    r = check_grads(build, {"x": x, "y": y})
    np.testing.assert_allclose(r.out, ref(x, y.reshape(np_shape)), rtol=1e-6)
    assert r.analytic["y"].shape == y_shape
    # gradients are plain writable arrays (a read-only broadcast view would make numba
    # compile a second signature of every optimizer kernel)
    assert all(np.asarray(g).flags.writeable for g in r.raw.values())


# ------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("act", ["relu", "sigmoid", "tanh", "softmax"])
def test_activation_gradients_match_finite_differences(act):
    x = _away_from_zero(_rng(9), (4, 5))

    def build():
        xv = _x("x", [5])
        return getattr(layers, act)(xv), [xv]

    check_grads(build, {"x": x})


def test_relu_passes_gradient_only_where_the_input_is_positive():
    x = _away_from_zero(_rng(10), (3, 4))

    def build():
        xv = _x("x", [4])
        return layers.relu(xv), [xv]

    r = check_grads(build, {"x": x})
    assert not r.analytic["x"][x < 0].any()
    assert r.analytic["x"][x > 0].all()


# ------------------------------------------------------------------------------- reductions
def test_mean_gradient_is_uniform():
    x = _f32(_rng(11).normal(size=(4, 3)))

    def build():
        xv = _x("x", [3])
        return layers.mean(xv), [xv]

    r = check_grads(build, {"x": x})
    np.testing.assert_allclose(r.out, [x.mean()], rtol=1e-6)


@pytest.mark.parametrize("dim,keep_dim", [(None, False), (None, True), (1, False), (-1, False),
                                          ([0, 2], False), ([0, 2], True), (1, True)])
def test_reduce_sum_gradients_match_for_every_dim_form(dim, keep_dim):
    x = _f32(_rng(12).normal(size=(3, 4, 2)))

    def build():
        xv = layers.data("x", shape=[3, 4, 2], append_batch_size=False, stop_gradient=False)
        return layers.reduce_sum(xv, dim=dim, keep_dim=keep_dim), [xv]

    r = check_grads(build, {"x": x})
    axes = None if dim is None else tuple(dim) if isinstance(dim, list) else dim
    expected = x.sum(axis=axes, keepdims=keep_dim)
    np.testing.assert_allclose(r.out.reshape(-1), np.reshape(expected, -1), rtol=1e-5)
    if dim is not None or keep_dim:
        assert r.out.shape == np.shape(expected)


# ------------------------------------------------------------------------------- accumulation
def test_a_variable_used_twice_gets_renamed_gradients_summed_by_a_sum_op():
    x = _f32(_rng(13).normal(size=(3, 4)))

    def build():
        xv = _x("x", [4])
        return layers.sums([layers.tanh(xv), layers.sigmoid(xv)]), [xv]

    r = check_grads(build, {"x": x})
    ops = r.main.global_block().ops
    grad_sum = [op for op in ops if op.type == "sum" and op.output("Out") == ["x@GRAD"]]
    assert len(grad_sum) == 1
    assert sorted(grad_sum[0].input("X")) == ["x@GRAD@RENAME@0", "x@GRAD@RENAME@1"]
    np.testing.assert_allclose(r.out, np.tanh(x) + 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_a_variable_used_twice_by_one_op_gets_both_gradients():
    x = _f32(_rng(14).normal(size=(3, 4)))

    def build():
        xv = _x("x", [4])
        return layers.elementwise_mul(xv, xv), [xv]

    r = check_grads(build, {"x": x})
    w = r.analytic["x"] / (2 * x)  # d(x*x)/dx = 2x times the loss weight
    assert np.all(np.abs(w) >= 0.5 - 1e-6)


# ------------------------------------------------------------------------------- losses
def test_cross_entropy_with_hard_labels_matches_finite_differences():
    rng = _rng(15)
    p = _f32(rng.uniform(0.2, 0.9, (5, 3)))
    label = np.array([[0], [2], [1], [2], [0]], dtype=np.int64)

    def build():
        x = _x("p", [3])
        y = layers.data("label", shape=[1], dtype="int64")
        return layers.cross_entropy(x, y), [x]

    r = check_grads(build, {"p": p, "label": label})
    np.testing.assert_allclose(r.out[:, 0], -np.log(p[np.arange(5), label[:, 0]]), rtol=1e-6)
    mask = np.ones_like(p, dtype=bool)
    mask[np.arange(5), label[:, 0]] = False
    assert not r.analytic["p"][mask].any()


def test_cross_entropy_with_soft_labels_matches_finite_differences():
    rng = _rng(16)
    p = _f32(rng.uniform(0.2, 0.9, (4, 3)))
    soft = _f32(rng.dirichlet(np.ones(3), 4))

    def build():
        x = _x("p", [3])
        y = layers.data("soft", shape=[3], dtype="float32")
        return layers.cross_entropy(x, y, soft_label=True), [x]

    r = check_grads(build, {"p": p, "soft": soft})
    np.testing.assert_allclose(r.out[:, 0], -(soft * np.log(p)).sum(axis=1), rtol=1e-5)


def test_softmax_then_cross_entropy_then_mean_gives_the_textbook_logit_gradient():
    rng = _rng(17)
    x = _f32(rng.normal(size=(5, 3)))
    label = rng.integers(0, 3, (5, 1))

    def build():
        xv = _x("x", [3])
        y = layers.data("label", shape=[1], dtype="int64")
        return layers.mean(layers.cross_entropy(layers.softmax(xv), y)), [xv]

    r = check_grads(build, {"x": x, "label": label})
    e = np.exp(x - x.max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    onehot = np.eye(3)[label[:, 0]]
    weight = r.analytic["x"] / ((sm - onehot) / 5)  # the loss weight of the single output
    np.testing.assert_allclose(weight, np.full_like(weight, weight.flat[0]), rtol=1e-4)


def test_log_loss_matches_finite_differences():
    rng = _rng(18)
    p = _f32(rng.uniform(0.1, 0.9, (6, 1)))
    y = _f32(rng.integers(0, 2, (6, 1)))

    def build():
        pv = _x("p", [1])
        yv = layers.data("y", shape=[1])
        return layers.log_loss(pv, yv), [pv]

    r = check_grads(build, {"p": p, "y": y})
    eps = np.float32(1e-4)
    np.testing.assert_allclose(r.out, -y * np.log(p + eps) - (1 - y) * np.log(1 - p + eps), rtol=1e-5)


@pytest.mark.parametrize("normalize", [False, True])
def test_sigmoid_cross_entropy_with_logits_matches_finite_differences(normalize):
    rng = _rng(19)
    x = _f32(rng.normal(0, 3, (4, 3)))
    y = _f32(rng.uniform(0, 1, (4, 3)))
    y[1, 2] = -100  # ignored

    def build():
        xv = _x("x", [3])
        yv = layers.data("y", shape=[3])
        return layers.sigmoid_cross_entropy_with_logits(xv, yv, normalize=normalize), [xv]

    r = check_grads(build, {"x": x, "y": y})
    keep = y != -100
    expected = np.where(keep, np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))), 0)
    if normalize:
        expected /= keep.sum()
    np.testing.assert_allclose(r.out, expected, rtol=1e-5, atol=1e-7)
    assert r.analytic["x"][1, 2] == 0


# ------------------------------------------------------------------------------- a model
def test_small_ctr_model_parameter_gradients_match_finite_differences():
    rng = _rng(20)
    batch = 6
    feed = {"dense": _f32(rng.normal(size=(batch, 3))), "label": rng.integers(0, 2, (batch, 1))}
    for k in range(3):
        lengths = rng.integers(0, 3, batch)
        feed[f"C{k}"] = (rng.integers(0, 7, int(lengths.sum())), lengths)
    table = ParamAttr(name="table")

    def build():
        dense = layers.data("dense", shape=[3])
        label = layers.data("label", shape=[1], dtype="int64")
        slots = [layers.data(f"C{k}", shape=[1], dtype="int64", lod_level=1) for k in range(3)]
        embs = [layers.sequence_pool(layers.embedding(s, size=[7, 2], is_sparse=True, param_attr=table), "sum")
                for s in slots]
        x = layers.concat(embs + [dense], axis=1)
        x = layers.fc(x, 4, act="tanh", param_attr="w1", bias_attr="b1")
        pred = layers.fc(x, 2, act="softmax", param_attr="w2", bias_attr="b2")
        return layers.mean(layers.cross_entropy(pred, label)), ["table", "w1", "b1", "w2", "b2"]

    check_grads(build, feed, max_checks=14)
