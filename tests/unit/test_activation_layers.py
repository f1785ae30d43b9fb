"""Activations and element-wise functions of one input: values as Paddle computes them,
gradients against central finite differences (gradcheck.py), Paddle's defaults."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError
from fleet.framework.tensor import LoDTensor

from gradcheck import check_grads


def _f32(a):
    return np.asarray(a, dtype=np.float32)


def _away_from_zero(seed, shape, low=0.2, high=1.5):
    rng = np.random.default_rng(seed)
    return _f32(rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape))


def _x(name, shape, **kw):
    return layers.data(name, shape=shape, stop_gradient=False, **kw)


_POSITIVE = _f32(np.random.default_rng(1).uniform(0.5, 2.0, (3, 4)))
_SIGNED = _away_from_zero(2, (3, 4))

# layer call, input, numpy reference
_CASES = {
    "square": (lambda x: layers.square(x), _SIGNED, lambda x: x * x),
    "sqrt": (lambda x: layers.sqrt(x), _POSITIVE, np.sqrt),
    "exp": (lambda x: layers.exp(x), _SIGNED, np.exp),
    "log": (lambda x: layers.log(x), _POSITIVE, np.log),
    "abs": (lambda x: layers.abs(x), _SIGNED, np.abs),
    "pow3": (lambda x: layers.pow(x, 3.0), _SIGNED, lambda x: x ** 3),
    "pow_half": (lambda x: layers.pow(x, factor=0.5), _POSITIVE, np.sqrt),
    "clip": (lambda x: layers.clip(x, -0.5, 0.7), _SIGNED, lambda x: np.clip(x, -0.5, 0.7)),
    "leaky_relu": (lambda x: layers.leaky_relu(x), _SIGNED, lambda x: np.where(x > 0, x, 0.02 * x)),
    "leaky_relu_0.3": (lambda x: layers.leaky_relu(x, alpha=0.3), _SIGNED,
                       lambda x: np.where(x > 0, x, 0.3 * x)),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_unary_layers_compute_paddles_values_and_their_gradients_match(case):
    layer, x, reference = _CASES[case]
    if case == "clip":  # no finite-difference step crosses a clipping bound
        assert np.abs(x[:, :, None] - np.array([-0.5, 0.7])).min() > 0.05

    def build():
        xv = _x("x", [4])
        return layer(xv), [xv]

    r = check_grads(build, {"x": x})
    np.testing.assert_allclose(r.out, reference(x), rtol=1e-5, atol=1e-7)


def test_clip_passes_the_gradient_only_strictly_inside_its_bounds():
    x = _f32([[-2.0, -0.3, 0.4, 3.0]])

    def build():
        xv = _x("x", [4])
        return layers.clip(xv, min=-1.0, max=1.0), [xv]

    r = check_grads(build, {"x": x}, indices={"x": [1, 2]})
    assert r.analytic["x"][0, 0] == 0 and r.analytic["x"][0, 3] == 0
    assert r.analytic["x"][0, 1] != 0 and r.analytic["x"][0, 2] != 0


def test_unary_layers_work_row_by_row_on_a_sequence_and_keep_its_lod():
    values, lengths = _away_from_zero(3, (5, 2)), [2, 0, 3]

    def build():
        xv = _x("x", [2], lod_level=1)
        out = layers.leaky_relu(layers.square(xv), alpha=0.1)
        assert out.lod_level == 1
        return out, [xv]

    r = check_grads(build, {"x": (values, lengths)})
    assert isinstance(r.raw["x"], LoDTensor)
    np.testing.assert_allclose(r.out, values * values, rtol=1e-6)


@pytest.mark.parametrize("mode,shape,alpha_shape", [
    ("all", (3, 4), (1,)), ("channel", (3, 4), (1, 4, 1, 1)), ("channel", (2, 3, 2, 2), (1, 3, 1, 1)),
    ("element", (2, 3, 2), (1, 3, 2))])
def test_prelu_learns_one_slope_per_mode_and_its_gradients_match(mode, shape, alpha_shape):
    x = _away_from_zero(4, shape)
    alpha = _f32(np.random.default_rng(5).uniform(0.1, 0.5, alpha_shape))

    def build():
        xv = layers.data("x", shape=list(shape), append_batch_size=False, stop_gradient=False)
        out = layers.prelu(xv, mode, param_attr="alpha")
        return out, [xv, "alpha"]

    r = check_grads(build, {"x": x}, params={"alpha": alpha})
    a = alpha.reshape(()) if mode == "all" else alpha.reshape((1, -1) + (1,) * (x.ndim - 2)) \
        if mode == "channel" else alpha
    np.testing.assert_allclose(r.out, np.where(x > 0, x, a * x), rtol=1e-6)


# ------------------------------------------------------------------ defaults and arguments
@pytest.fixture(autouse=True)
def fresh_programs():
    fw.reset_default_programs()
    yield
    fw.reset_default_programs()


def test_prelu_alpha_is_a_parameter_initialized_to_a_quarter_with_paddles_shape_and_name():
    x = layers.data("x", shape=[3, 2, 2])
    layers.prelu(x, "channel")
    layers.prelu(x, "element", name="pe")
    params = {p.name: p for p in fleet.default_main_program().all_parameters()}
    assert params["prelu_0.w_0"].shape == (1, 3, 1, 1)
    assert params["pe.w_0"].shape == (1, 3, 2, 2)
    scope = fleet.Scope()
    fleet.Executor().run(fleet.default_startup_program(), scope=scope)
    np.testing.assert_array_equal(scope["prelu_0.w_0"], np.full((1, 3, 1, 1), 0.25, np.float32))


def test_unary_layers_refuse_bad_arguments_with_the_value_and_the_fix():
    x = layers.data("x", shape=[3])
    with pytest.raises(ConfigError, match="clip min=2.0 is greater than max=1.0; pass min <= max"):
        layers.clip(x, 2.0, 1.0)
    with pytest.raises(ConfigError, match="pow factor='2' must be a Python number"):
        layers.pow(x, "2")
    with pytest.raises(ConfigError, match=r"prelu mode='row'; use one of \['all', 'channel', 'element'\]"):
        layers.prelu(x, "row")
    with pytest.raises(ConfigError, match=r"fc act='gelu' is not supported; use one of \(None, 'relu', "
                                          r"'sigmoid', 'tanh', 'softmax', 'square'"):
        layers.fc(x, 2, act="gelu")


def test_fc_applies_an_activation_it_does_not_fuse_as_a_separate_op_and_names_params_like_paddle():
    x = layers.data("x", shape=[3])
    out = layers.fc(x, 2, act="leaky_relu", name="tower")
    ops = fleet.default_main_program().global_block().ops
    assert [op.type for op in ops] == ["fc", "leaky_relu"] and ops[0].attr("act") is None
    assert out.name == ops[1].output("Out")[0] and out.shape == (-1, 2)
    assert sorted(p.name for p in fleet.default_main_program().all_parameters()) == ["tower.b_0", "tower.w_0"]
