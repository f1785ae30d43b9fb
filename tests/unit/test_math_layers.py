"""elementwise_max / min / pow and reduce_mean / max / min: values, Paddle's broadcasting
and tie rules, gradients against central finite differences (gradcheck.py)."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError

from gradcheck import check_grads


def _f32(a):
    return np.asarray(a, dtype=np.float32)


def _distinct(seed, shape, scale=0.1):
    """Values pairwise at least ``scale`` apart (no ties, no finite-difference step flips an
    order), centred on 0."""
    n = int(np.prod(shape))
    return _f32(np.random.default_rng(seed).permutation(n).reshape(shape) * scale - n * scale / 2)


def _data(name, shape):
    return layers.data(name, shape=list(shape), append_batch_size=False, stop_gradient=False)


# (y shape, axis, numpy shape y broadcasts as against x [4, 3, 2])
_BROADCASTS = [((4, 3, 2), -1, (4, 3, 2)), ((3, 2), -1, (3, 2)), ((3,), 1, (3, 1)), ((4, 3), 0, (4, 3, 1))]


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("y_shape,axis,np_shape", _BROADCASTS)
def test_elementwise_max_and_min_match_numpy_and_finite_differences(kind, y_shape, axis, np_shape):
    layer, ref = {"max": (layers.elementwise_max, np.maximum), "min": (layers.elementwise_min, np.minimum)}[kind]
    x = _distinct(1, (4, 3, 2))  # multiples of 0.1
    n = int(np.prod(y_shape))  # y: multiples of 0.1 plus 0.05, never within 0.05 of an x
    y = _f32(np.random.default_rng(2).permutation(n).reshape(y_shape) * 0.1 - (n // 2) * 0.1 + 0.05)

    def build():
        xv, yv = _data("x", x.shape), _data("y", y_shape)
        return layer(xv, yv, axis=axis), [xv, yv]

    r = check_grads(build, {"x": x, "y": y})
    np.testing.assert_array_equal(r.out, ref(x, y.reshape(np_shape)))
    assert r.analytic["y"].shape == y_shape


def test_elementwise_max_sends_the_gradient_of_a_tie_to_y_as_paddle():
    def build():
        xv, yv = _data("x", (1, 3)), _data("y", (1, 3))
        return layers.elementwise_max(xv, yv), [xv, yv]

    x, y = _f32([[1.0, 2.0, 3.0]]), _f32([[1.0, 5.0, 0.0]])
    r = check_grads(build, {"x": x, "y": y}, indices={"x": [1, 2], "y": [1, 2]})
    w = r.analytic["x"] + r.analytic["y"]  # the loss weight of each output
    np.testing.assert_array_equal(r.analytic["x"][0], [0, 0, w[0, 2]])
    np.testing.assert_array_equal(r.analytic["y"][0], [w[0, 0], w[0, 1], 0])


def test_elementwise_pow_gradients_of_base_and_exponent_match_finite_differences():
    rng = np.random.default_rng(3)
    x = _f32(rng.uniform(0.5, 2.0, (3, 4)))
    y = _f32(rng.uniform(-1.5, 2.5, (4,)))

    def build():
        xv, yv = _data("x", x.shape), _data("y", y.shape)
        return layers.elementwise_pow(xv, yv), [xv, yv]

    r = check_grads(build, {"x": x, "y": y})
    np.testing.assert_allclose(r.out, x ** y, rtol=1e-5)


def test_elementwise_act_is_applied_after_the_op():
    x, y = _f32([[-1.0, 2.0]]), _f32([[0.5, -3.0]])

    def build():
        xv, yv = _data("x", x.shape), _data("y", y.shape)
        return layers.elementwise_min(xv, yv, act="relu"), [xv]

    r = check_grads(build, {"x": x, "y": y}, indices={"x": [0]})
    np.testing.assert_array_equal(r.out, [[0.0, 0.0]])


_DIMS = [(None, False), (None, True), (1, False), (-1, True), ([0, 2], False), ([0, 1, 2], True)]


@pytest.mark.parametrize("kind", ["mean", "max", "min"])
@pytest.mark.parametrize("dim,keep_dim", _DIMS)
def test_reduce_mean_max_min_match_numpy_for_every_dim_form_and_their_gradients_match(kind, dim, keep_dim):
    x = _distinct(4, (3, 4, 2))
    layer = getattr(layers, f"reduce_{kind}")

    def build():
        xv = _data("x", x.shape)
        return layer(xv, dim=dim, keep_dim=keep_dim), [xv]

    r = check_grads(build, {"x": x})
    axes = None if dim is None else tuple(dim) if isinstance(dim, list) else dim
    expected = getattr(np, kind)(x, axis=axes, keepdims=keep_dim)
    assert r.out.shape == (np.shape(expected) if np.ndim(expected) else (1,))
    np.testing.assert_allclose(r.out.reshape(-1), np.reshape(expected, -1), rtol=1e-5)


def test_reduce_max_gives_every_tied_maximum_the_gradient_as_paddle():
    x = _f32([[1.0, 3.0, 3.0, 2.0]])

    def build():
        xv = _data("x", x.shape)
        return layers.reduce_max(xv, dim=1), [xv]

    r = check_grads(build, {"x": x}, indices={"x": [0, 3]})
    g = r.analytic["x"][0]
    assert g[0] == 0 and g[3] == 0 and g[1] == g[2] != 0


# ------------------------------------------------------------------ shapes and arguments
@pytest.fixture
def x():
    fw.reset_default_programs()
    yield layers.data("x", shape=[3, 4, 2], append_batch_size=False)
    fw.reset_default_programs()


def test_reductions_infer_paddles_shapes(x):
    for layer in (layers.reduce_mean, layers.reduce_max, layers.reduce_min, layers.reduce_sum):
        assert layer(x).shape == (1,)
        assert layer(x, keep_dim=True).shape == (1, 1, 1)
        assert layer(x, dim=1).shape == (3, 2)
        assert layer(x, dim=[0, -1], keep_dim=True).shape == (1, 4, 1)
        assert layer(x, dim=[0, 1, 2]).shape == (1,)


def test_reductions_and_elementwise_ops_refuse_dims_out_of_range(x):
    with pytest.raises(ConfigError, match=r"reduce_mean dim=3 is out of range for 'x' of rank 3; use dims "
                                          r"in \[-3, 3\)"):
        layers.reduce_mean(x, dim=3)
    y = layers.data("y", shape=[4, 2], append_batch_size=False)
    with pytest.raises(ConfigError, match=r"elementwise_max axis=2 cannot place y \[4, 2\] in x \[3, 4, 2\]; "
                                          r"use -1"):
        layers.elementwise_max(x, y, axis=2)
    assert layers.elementwise_max(x, y, axis=1).shape == (3, 4, 2)
