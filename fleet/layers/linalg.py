"""Matrix-product layers (Paddle 1.x signatures): matmul, mul, and conv2d with a 1x1 filter."""
import math

from fleet.errors import ConfigError
from fleet.framework.ops.linalg_ops import matmul_shape
from fleet.initializer import Normal
from fleet.layers.activation import apply_act, check_act
from fleet.layers.helper import append_op, check_var, create_parameter, create_tmp, layer_name


def matmul(x, y, transpose_x=False, transpose_y=False, alpha=1.0, name=None):
    """alpha * x @ y, each transposed (its last two dims) when asked.

    Rank >= 3 operands are stacks of matrices whose batch dims broadcast; a 1-D x is a row
    and a 1-D y a column, and that dim is dropped from the result (two 1-D operands give
    [1]). On a lod_level=1 x of rank >= 2 (not transposed) the rows keep the LoD.

    Raises:
        ConfigError: the inner dims differ, or batch dims that do not broadcast.
    """
    check_var(x, "x", "matmul")
    check_var(y, "y", "matmul")
    shape = matmul_shape(x.shape, y.shape, bool(transpose_x), bool(transpose_y), (repr(x.name), repr(y.name)))
    out = create_tmp(name or "matmul", shape, x.dtype)
    append_op("matmul", {"X": x, "Y": y}, {"Out": out},
              {"transpose_X": bool(transpose_x), "transpose_Y": bool(transpose_y), "alpha": float(alpha)})
    return out


def mul(x, y, x_num_col_dims=1, y_num_col_dims=1, name=None):
    """flatten(x) @ flatten(y): x's first ``x_num_col_dims`` dims become the rows, y's first
    ``y_num_col_dims`` dims its rows; the result is x.shape[:x_num_col_dims] +
    y.shape[y_num_col_dims:].

    Raises:
        ConfigError: a num_col_dims out of range, or inner sizes that differ.
    """
    check_var(x, "x", "mul")
    check_var(y, "y", "mul")
    for arg, value, var in (("x_num_col_dims", x_num_col_dims, x), ("y_num_col_dims", y_num_col_dims, y)):
        if not isinstance(value, int) or not 1 <= value < len(var.shape):
            raise ConfigError(f"mul {arg}={value!r} must be in [1, {len(var.shape)}) for {var.name!r} "
                              f"{list(var.shape)}")
    out = create_tmp(name or "mul", x.shape, x.dtype)
    append_op("mul", {"X": x, "Y": y}, {"Out": out},
              {"x_num_col_dims": x_num_col_dims, "y_num_col_dims": y_num_col_dims})
    return out


def _pair(value):
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def conv2d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=None,
           param_attr=None, bias_attr=None, use_cudnn=True, act=None, name=None, data_format="NCHW"):
    """A 2-D convolution, NCHW, supported for a 1x1 filter (stride 1, no padding, one group):
    each output channel is a learned weighting of the input channels at every position
    (xDeepFM's CIN compression).

    The filter [num_filters, C, 1, 1] defaults to Normal(0, sqrt(2 / C)) (Paddle's), the
    bias [num_filters] to zeros (``bias_attr=False``: none), added per channel.

    Raises:
        ConfigError: another filter size, stride, padding, dilation, groups or layout (the
            message names it), an input not of rank 4, or an unknown channel count.
    """
    check_var(input, "input", "conv2d")
    check_act(act, "conv2d")
    settings = {"filter_size": _pair(filter_size), "stride": _pair(stride), "padding": _pair(padding),
                "dilation": _pair(dilation), "groups": groups or 1, "data_format": data_format}
    wanted = {"filter_size": (1, 1), "stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1,
              "data_format": "NCHW"}
    for key, value in settings.items():
        if value != wanted[key]:
            raise ConfigError(f"conv2d {key}={value!r} is not supported: fleet has the 1x1 convolution of "
                              f"CTR models only (filter_size=1, stride=1, padding=0, dilation=1, groups=1, "
                              f"NCHW)")
    if len(input.shape) != 4 or input.shape[1] < 0:
        raise ConfigError(f"conv2d input {input.name!r} {list(input.shape)} must be NCHW with a known "
                          f"channel count")
    if not isinstance(num_filters, int) or num_filters < 1:
        raise ConfigError(f"conv2d num_filters={num_filters!r} must be a positive int")
    layer = layer_name("conv2d", name)
    channels = input.shape[1]
    filt = create_parameter(layer, param_attr, [num_filters, channels, 1, 1],
                            default_initializer=Normal(0.0, math.sqrt(2.0 / channels)))
    out = create_tmp(layer, input.shape, input.dtype)
    append_op("conv2d", {"Input": input, "Filter": filt}, {"Output": out},
              {"strides": [1, 1], "paddings": [0, 0], "dilations": [1, 1], "groups": 1,
               "data_format": "NCHW"})
    if bias_attr is not False:
        bias = create_parameter(layer, bias_attr, [num_filters], suffix="b", is_bias=True)
        biased = create_tmp(layer, out.shape, out.dtype)
        append_op("elementwise_add", {"X": out, "Y": bias}, {"Out": biased}, {"axis": 1})
        out = biased
    return apply_act(out, act, "conv2d")
