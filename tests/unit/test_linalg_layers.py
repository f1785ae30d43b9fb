"""matmul, mul and conv2d (1x1): values against numpy, Paddle's shape rules and
defaults, gradients against central finite differences (gradcheck.py)."""
import math

import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError

from gradcheck import check_grads


def _r(seed, shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _data(name, shape, **kw):
    return layers.data(name, shape=list(shape), append_batch_size=False, stop_gradient=False, **kw)


def _t(a, flag):
    return np.swapaxes(a, -1, -2) if flag and a.ndim > 1 else a


# x shape, y shape, transpose_x, transpose_y, alpha
_MATMULS = [
    ((3, 4), (4, 2), False, False, 1.0),
    ((4, 3), (4, 2), True, False, 1.0),
    ((3, 4), (2, 4), False, True, 2.5),
    ((4, 3), (2, 4), True, True, 1.0),
    ((2, 1, 5), (2, 5, 3), False, False, 1.0),      # DIN: attention weights @ history
    ((2, 5, 1), (2, 5, 3), True, False, 1.0),       # AFM: transpose_x
    ((2, 3, 4, 1), (2, 3, 1, 2), False, False, 1.0),  # xDeepFM: outer products per dim
    ((2, 3, 4), (4, 2), False, False, 1.0),          # a batch of matrices times one matrix
    ((4,), (4, 2), False, False, 1.0),
    ((3, 4), (4,), False, False, 1.0),
    ((4,), (4,), False, False, 0.5),
]


@pytest.mark.parametrize("xs,ys,tx,ty,alpha", _MATMULS)
def test_matmul_matches_numpy_for_every_shape_form_and_its_gradients_match(xs, ys, tx, ty, alpha):
    x, y = _r(1, xs), _r(2, ys)
    expected = alpha * np.matmul(_t(x, tx), _t(y, ty))
    expected = expected.reshape(expected.shape or (1,))

    def build():
        xv, yv = _data("x", xs), _data("y", ys)
        out = layers.matmul(xv, yv, transpose_x=tx, transpose_y=ty, alpha=alpha)
        assert out.shape == expected.shape
        return out, [xv, yv]

    r = check_grads(build, {"x": x, "y": y})
    np.testing.assert_allclose(r.out, expected, rtol=1e-5, atol=1e-6)


def test_matmul_of_a_sequence_by_a_parameter_keeps_the_lod():
    values = _r(3, (5, 4))

    def build():
        xv = layers.data("x", shape=[4], lod_level=1, stop_gradient=False)
        w = layers.create_parameter([4, 2], name="w")
        out = layers.matmul(xv, w)
        assert out.lod_level == 1 and out.shape == (-1, 2)
        return layers.sequence_pool(out, "sum"), [xv, "w"]

    r = check_grads(build, {"x": (values, [3, 2])})
    prod = values @ r.scope["w"]
    np.testing.assert_allclose(r.out, [prod[:3].sum(0), prod[3:].sum(0)], rtol=1e-5)


@pytest.mark.parametrize("xs,ys,xn,yn,out_shape", [
    ((3, 4), (4, 2), 1, 1, (3, 2)), ((2, 3, 4), (12, 5), 1, 1, (2, 5)), ((2, 3, 4), (4, 5), 2, 1, (2, 3, 5)),
    ((3, 6), (2, 3, 4), 1, 2, (3, 4))])
def test_mul_flattens_both_operands_by_their_num_col_dims(xs, ys, xn, yn, out_shape):
    x, y = _r(4, xs), _r(5, ys)

    def build():
        xv, yv = _data("x", xs), _data("y", ys)
        out = layers.mul(xv, yv, x_num_col_dims=xn, y_num_col_dims=yn)
        assert out.shape == out_shape
        return out, [xv, yv]

    r = check_grads(build, {"x": x, "y": y})
    rows = int(np.prod(xs[:xn]))
    expected = (x.reshape(rows, -1) @ y.reshape(int(np.prod(ys[:yn])), -1)).reshape(out_shape)
    np.testing.assert_allclose(r.out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_1x1_weights_the_channels_at_every_position_and_its_gradients_match(bias):
    x = _r(6, (2, 3, 1, 4))

    def build():
        xv = _data("x", x.shape)
        out = layers.conv2d(xv, num_filters=2, filter_size=(1, 1), param_attr="f",
                            bias_attr="b" if bias else False, act="tanh" if bias else None)
        assert out.shape == (2, 2, 1, 4)
        return out, [xv, "f"] + (["b"] if bias else [])

    r = check_grads(build, {"x": x}, params={"b": _r(7, (2,))} if bias else None)
    pre = np.einsum("fc,nchw->nfhw", r.scope["f"].reshape(2, 3), x)
    if bias:
        pre = np.tanh(pre + r.scope["b"].reshape(1, 2, 1, 1))
    np.testing.assert_allclose(r.out, pre, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ defaults and refusals
@pytest.fixture(autouse=True)
def fresh_programs():
    fw.reset_default_programs()
    yield
    fw.reset_default_programs()


def test_conv2d_parameters_have_paddles_names_shapes_and_initializers():
    x = layers.data("x", shape=[8, 1, 4])
    out = layers.conv2d(x, num_filters=5, filter_size=1)
    assert out.shape == (-1, 5, 1, 4)
    params = {p.name: p for p in fleet.default_main_program().all_parameters()}
    assert params["conv2d_0.w_0"].shape == (5, 8, 1, 1) and params["conv2d_0.b_0"].shape == (5,)
    ops = {op.output("Out")[0]: op for op in fleet.default_startup_program().global_block().ops}
    assert ops["conv2d_0.w_0"].type == "gaussian_random"
    assert ops["conv2d_0.w_0"].attr("std") == pytest.approx(math.sqrt(2.0 / 8))
    assert ops["conv2d_0.b_0"].type == "fill_constant" and ops["conv2d_0.b_0"].attr("value") == 0.0


def test_matmul_mul_and_conv2d_refuse_shapes_they_cannot_multiply():
    x = layers.data("x", shape=[3, 4])
    with pytest.raises(ConfigError, match=r"matmul of 'x' \[-1, 3, 4\] \(transpose_x=False\) and 'y' \[3, 2\] "
                                          r"\(transpose_y=False\): the inner dims 4 and 3 differ"):
        layers.matmul(x, layers.data("y", shape=[3, 2], append_batch_size=False))
    with pytest.raises(ConfigError, match=r"mul of 'x' \[-1, 3, 4\] \(x_num_col_dims=1\) and 'w' \[5, 2\] "
                                          r"\(y_num_col_dims=1\): \[3, 4\] and \[5\] hold different numbers"):
        layers.mul(x, layers.create_parameter([5, 2], name="w"))
    image = layers.data("image", shape=[3, 5, 5])
    with pytest.raises(ConfigError, match=r"conv2d filter_size=\(3, 3\) is not supported: fleet has the 1x1 "
                                          r"convolution of CTR models only"):
        layers.conv2d(image, num_filters=2, filter_size=3)
    with pytest.raises(ConfigError, match=r"conv2d stride=\(2, 2\) is not supported"):
        layers.conv2d(image, num_filters=2, filter_size=1, stride=2)


def test_matmul_refuses_a_transposed_sequence():
    seq = layers.data("seq", shape=[4], lod_level=1)
    with pytest.raises(ConfigError, match=r"^matmul of 'seq' \(lod_level=1, one row per id\): matmul keeps one "
                                          r"row per id only for an x of rank >= 2 whose first dim is not "
                                          r"transposed; pool"):
        layers.matmul(seq, layers.create_parameter([5, 2], name="w"), transpose_x=True)
