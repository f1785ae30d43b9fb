"""Activations and other element-wise functions of one input (Paddle's activation layers).

Each keeps its input's shape and, on a lod_level=1 input, its LoD.
"""
from fleet.errors import ConfigError
from fleet.initializer import Constant
from fleet.layers.helper import append_op, check_var, create_parameter, create_tmp, layer_name

# activations a layer's ``act`` argument may name (each an op of one input, default attributes)
ACTS = ("relu", "sigmoid", "tanh", "softmax", "square", "sqrt", "exp", "log", "abs", "leaky_relu")


def _unary(op_type, x, name=None, attrs=None):
    check_var(x, "x", op_type)
    out = create_tmp(name or op_type, x.shape, x.dtype, x.lod_level)
    append_op(op_type, {"X": x}, {"Out": out}, attrs)
    return out


def check_act(act, layer):
    """Returns ``act`` if a layer may apply it.

    Raises:
        ConfigError: not None and not one of ``ACTS`` (names both).
    """
    if act is not None and act not in ACTS:
        raise ConfigError(f"{layer} act={act!r} is not supported; use one of {(None,) + ACTS}")
    return act


def apply_act(x, act, layer):
    """Returns ``act(x)`` (a new variable), or x itself when ``act`` is None."""
    check_act(act, layer)
    return _unary(act, x) if act else x


def relu(x, name=None):
    """max(x, 0)."""
    return _unary("relu", x, name)


def sigmoid(x, name=None):
    """1 / (1 + exp(-x))."""
    return _unary("sigmoid", x, name)


def tanh(x, name=None):
    """tanh(x)."""
    return _unary("tanh", x, name)


def softmax(input, use_cudnn=False, name=None, axis=-1):
    """Softmax over the last axis.

    Raises:
        ConfigError: another axis.
    """
    check_var(input, "input", "softmax")
    if axis not in (-1, len(input.shape) - 1):
        raise ConfigError(f"softmax axis={axis}: only the last axis is supported")
    return _unary("softmax", input, name)


def square(x, name=None):
    """x * x."""
    return _unary("square", x, name)


def sqrt(x, name=None):
    """The square root of x (x >= 0)."""
    return _unary("sqrt", x, name)


def exp(x, name=None):
    """e ** x."""
    return _unary("exp", x, name)


def log(x, name=None):
    """The natural logarithm of x (x > 0)."""
    return _unary("log", x, name)


def abs(x, name=None):
    """|x|; its gradient is sign(x) (0 at 0)."""
    return _unary("abs", x, name)


def pow(x, factor=1.0, name=None):
    """x ** factor.

    Args:
        factor: a Python number (Paddle 1.x also takes a Variable; fleet does not).

    Raises:
        ConfigError: ``factor`` is not a number.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ConfigError(f"pow factor={factor!r} must be a Python number")
    return _unary("pow", x, name, {"factor": float(factor)})


def clip(x, min, max, name=None):
    """Clips x into [min, max]; the gradient flows only where min < x < max.

    Raises:
        ConfigError: min > max.
    """
    if float(min) > float(max):
        raise ConfigError(f"clip min={min} is greater than max={max}; pass min <= max")
    return _unary("clip", x, name, {"min": float(min), "max": float(max)})


def leaky_relu(x, alpha=0.02, name=None):
    """x where x > 0, else alpha * x (Paddle's default alpha 0.02)."""
    return _unary("leaky_relu", x, name, {"alpha": float(alpha)})


_PRELU_MODES = ("all", "channel", "element")


def prelu(x, mode, param_attr=None, name=None):
    """x where x > 0, else alpha * x with a learned alpha (initialized to 0.25).

    Args:
        mode: "all" (one alpha, shape [1]), "channel" (one per channel, dim 1, shape
            [1, C, 1, 1]) or "element" (one per element of an example, shape [1, *x.shape[1:]]).
        param_attr: the alpha's ParamAttr or name.

    Returns:
        A Variable of x's shape.

    Raises:
        ConfigError: an unknown mode, or an input too small for it.
    """
    from fleet.framework.ops.activation_ops import prelu_alpha_shape

    check_var(x, "x", "prelu")
    if mode not in _PRELU_MODES:
        raise ConfigError(f"prelu mode={mode!r}; use one of {list(_PRELU_MODES)}")
    if mode != "all" and (len(x.shape) < 2 or any(d < 0 for d in x.shape[1:])):
        raise ConfigError(f"prelu mode={mode!r} needs an input whose dims after the first are known; "
                          f"{x.name!r} is {list(x.shape)}")
    layer = layer_name("prelu", name)
    alpha = create_parameter(layer, param_attr, prelu_alpha_shape(mode, x.shape),
                             default_initializer=Constant(0.25))
    out = create_tmp(layer, x.shape, x.dtype, x.lod_level)
    append_op("prelu", {"X": x, "Alpha": alpha}, {"Out": out}, {"mode": mode})
    return out
