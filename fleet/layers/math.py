"""Activations, element-wise arithmetic and reductions."""
from fleet.errors import ConfigError
from fleet.layers.helper import append_op, check_var, create_tmp


def _unary(op_type, x, name=None):
    check_var(x, "x", op_type)
    out = create_tmp(name or op_type, x.shape, x.dtype, x.lod_level)
    append_op(op_type, {"X": x}, {"Out": out})
    return out


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
    """Softmax over the last axis."""
    if axis not in (-1, len(input.shape) - 1):
        raise ConfigError(f"softmax axis={axis}: only the last axis is supported")
    return _unary("softmax", input, name)


def _binary(op_type, x, y, axis, act, name):
    check_var(x, "x", op_type)
    check_var(y, "y", op_type)
    out = create_tmp(name or op_type, x.shape, x.dtype, x.lod_level)
    append_op(op_type, {"X": x, "Y": y}, {"Out": out}, {"axis": axis})
    return _unary(act, out) if act else out


def elementwise_add(x, y, axis=-1, act=None, name=None):
    """x + y, y broadcast from dim ``axis`` of x (-1: trailing dims)."""
    return _binary("elementwise_add", x, y, axis, act, name)


def elementwise_sub(x, y, axis=-1, act=None, name=None):
    """x - y with the broadcasting of elementwise_add."""
    return _binary("elementwise_sub", x, y, axis, act, name)


def elementwise_mul(x, y, axis=-1, act=None, name=None):
    """x * y with the broadcasting of elementwise_add."""
    return _binary("elementwise_mul", x, y, axis, act, name)


def elementwise_div(x, y, axis=-1, act=None, name=None):
    """x / y with the broadcasting of elementwise_add."""
    return _binary("elementwise_div", x, y, axis, act, name)


def mean(x, name=None):
    """The mean of all elements, shape [1]."""
    check_var(x, "x", "mean")
    out = create_tmp(name or "mean", (1,), x.dtype)
    append_op("mean", {"X": x}, {"Out": out})
    return out


def reduce_sum(input, dim=None, keep_dim=False, name=None):
    """Sum over ``dim`` (an int, a list, or None for all)."""
    check_var(input, "input", "reduce_sum")
    nd = len(input.shape)
    if dim is None:
        shape = (1,) * nd if keep_dim else (1,)
    else:
        dims = [d + nd if d < 0 else d for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        shape = tuple(1 if i in dims else s for i, s in enumerate(input.shape)) if keep_dim else \
            tuple(s for i, s in enumerate(input.shape) if i not in dims) or (1,)
    out = create_tmp(name or "reduce_sum", shape, input.dtype)
    append_op("reduce_sum", {"X": input}, {"Out": out},
              {"dim": dim, "keep_dim": keep_dim, "reduce_all": dim is None})
    return out


def sums(input, out=None):
    """The element-wise sum of a list of variables."""
    for x in input:
        check_var(x, "input", "sums")
    out = out or create_tmp("sums", input[0].shape, input[0].dtype)
    append_op("sum", {"X": list(input)}, {"Out": out})
    return out
