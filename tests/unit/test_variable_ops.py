"""Python operators on Variables (Paddle's math_op_patch): the ops they append, their
values and gradients, and the program they go to."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError

from gradcheck import check_grads


def _f32(a):
    return np.asarray(a, dtype=np.float32)


X = _f32(np.random.default_rng(0).uniform(0.5, 2.0, (3, 4)))
Y = _f32(np.random.default_rng(1).uniform(0.5, 2.0, (3, 4)))

_CASES = {
    "x+y": (lambda x, y: x + y, lambda x, y: x + y),
    "x-y": (lambda x, y: x - y, lambda x, y: x - y),
    "x*y": (lambda x, y: x * y, lambda x, y: x * y),
    "x/y": (lambda x, y: x / y, lambda x, y: x / y),
    "x**y": (lambda x, y: x ** y, lambda x, y: x ** y),
    "x+1.5": (lambda x, y: x + 1.5, lambda x, y: x + 1.5),
    "2+x": (lambda x, y: 2 + x, lambda x, y: 2 + x),
    "1-x": (lambda x, y: 1 - x, lambda x, y: 1 - x),
    "x-3": (lambda x, y: x - 3, lambda x, y: x - 3),
    "0.5*x": (lambda x, y: 0.5 * x, lambda x, y: 0.5 * x),
    "x/4": (lambda x, y: x / 4, lambda x, y: x / 4),
    "3/x": (lambda x, y: 3 / x, lambda x, y: 3 / x),
    "x**2": (lambda x, y: x ** 2, lambda x, y: x ** 2),
    "2**x": (lambda x, y: 2 ** x, lambda x, y: 2 ** x),
    "-x": (lambda x, y: -x, lambda x, y: -x),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_operators_compute_what_python_computes_and_their_gradients_match(case):
    op, reference = _CASES[case]

    def build():
        x = layers.data("x", shape=[4], stop_gradient=False)
        y = layers.data("y", shape=[4], stop_gradient=False)
        out = op(x, y)
        assert out.shape == (-1, 4)
        return out, [x, y] if "y" in case else [x]

    r = check_grads(build, {"x": X, "y": Y})
    np.testing.assert_allclose(r.out, reference(X, Y), rtol=1e-5)


def test_operators_append_paddles_ops():
    fw.reset_default_programs()
    x = layers.data("x", shape=[4])
    y = layers.data("y", shape=[4])
    for expr, types in [(lambda: 1 - x, ["scale"]), (lambda: x * y, ["elementwise_mul"]),
                        (lambda: x ** 2, ["pow"]), (lambda: x[:, 1], ["slice"]),
                        (lambda: x.astype("int64"), ["cast"]), (lambda: -x, ["scale"])]:
        before = len(fw.default_main_program().global_block().ops)
        expr()
        assert [op.type for op in fw.default_main_program().global_block().ops[before:]] == types
    op = fw.default_main_program().global_block().ops[0]
    assert (op.attr("scale"), op.attr("bias")) == (-1.0, 1.0)
    fw.reset_default_programs()


def test_a_variable_of_another_dtype_is_cast_to_the_left_operands_dtype():
    def build():
        x = layers.data("x", shape=[4], stop_gradient=False)
        n = layers.data("n", shape=[4], dtype="int64")
        out = x * n
        assert out.dtype == "float32"
        return out, [x]

    n = np.arange(12).reshape(3, 4)
    r = check_grads(build, {"x": X, "n": n})
    np.testing.assert_allclose(r.out, X * n, rtol=1e-6)


def test_operators_append_to_the_variables_own_program():
    fw.reset_default_programs()
    other = fw.Program()
    with fw.program_guard(other, fw.Program()):
        x = layers.data("x", shape=[4])
    y = x * 2.0 + x
    assert y.block.program is other
    assert [op.type for op in other.global_block().ops] == ["scale", "elementwise_add"]
    assert not fw.default_main_program().global_block().ops
    fw.reset_default_programs()


def test_the_din_attention_pattern_works_on_padded_histories():
    hist = _f32(np.random.default_rng(2).normal(size=(2, 3, 4)))
    target = _f32(np.random.default_rng(3).normal(size=(2, 3, 4)))
    mask = _f32([[[0], [0], [-1e9]], [[0], [0], [0]]])

    def build():
        h = layers.data("hist", shape=[3, 4], stop_gradient=False)
        t = layers.data("target", shape=[3, 4], stop_gradient=False)
        m = layers.data("mask", shape=[3, 1])
        feats = layers.concat([h, t, h - t, h * t], axis=2)
        score = layers.fc(feats, 1, num_flatten_dims=2, param_attr="att_w", bias_attr=False)
        score += m
        weight = layers.softmax(layers.transpose(score, perm=[0, 2, 1]))
        return layers.reshape(layers.matmul(weight, h), [0, 4]), [h, t, "att_w"]

    r = check_grads(build, {"hist": hist, "target": target, "mask": mask})
    w = r.scope["att_w"]
    feats = np.concatenate([hist, target, hist - target, hist * target], axis=2)
    score = (feats @ w)[:, :, 0] + mask[:, :, 0]
    weight = np.exp(score - score.max(1, keepdims=True))
    weight /= weight.sum(1, keepdims=True)
    np.testing.assert_allclose(r.out, np.einsum("bl,bld->bd", weight, hist), rtol=1e-5, atol=1e-6)
    assert weight[0, 2] == 0


def test_operators_refuse_what_paddle_cannot_compute():
    fw.reset_default_programs()
    x = layers.data("x", shape=[4])
    with pytest.raises(ConfigError, match=r"-2.0 \*\* 'x': the base of a Variable exponent must be > 0"):
        (-2.0) ** x
    with pytest.raises(ConfigError, match="'x' / 0: division by a zero constant"):
        x / 0
    with pytest.raises(TypeError):
        x + "a"
    with pytest.raises(TypeError, match="a Variable \\('x'\\) is not iterable; index it"):
        list(x)
    fw.reset_default_programs()
