"""Regularizing and normalizing layers (Paddle 1.x signatures and defaults): dropout,
batch_norm and layer_norm.

``Program.clone(for_test=True)`` sets ``is_test`` on their ops: dropout then scales as at
inference and batch_norm uses its moving mean and variance.
"""
import math

from fleet.errors import ConfigError
from fleet.framework.ops.norm_ops import DOWNGRADE, UPSCALE, channel_axis
from fleet.initializer import Constant
from fleet.layers.activation import apply_act, check_act
from fleet.layers.helper import append_op, check_var, create_parameter, create_tmp, layer_name
from fleet.param_attr import ParamAttr


def dropout(x, dropout_prob, is_test=False, seed=None, name=None,
            dropout_implementation=DOWNGRADE):
    """Zeroes each element with probability ``dropout_prob`` while training.

    Args:
        dropout_implementation: "downgrade_in_infer" (Paddle's default: training keeps
            x * mask, inference gives x * (1 - dropout_prob)) or "upscale_in_train"
            (training gives x * mask / (1 - dropout_prob), inference x).
        is_test: inference behaviour (``clone(for_test=True)`` sets it).
        seed: an int makes every run drop the same elements (Paddle's rule: do not fix the
            seed for training). Without it each run draws a new mask; the program's
            ``random_seed`` makes the sequence of masks repeatable (Paddle would fix the
            mask then too).

    Returns:
        A Variable of x's shape (and LoD).

    Raises:
        ConfigError: a probability outside [0, 1] or an unknown implementation.
    """
    check_var(x, "x", "dropout")
    if isinstance(dropout_prob, bool) or not isinstance(dropout_prob, (int, float)) or not 0 <= dropout_prob <= 1:
        raise ConfigError(f"dropout dropout_prob={dropout_prob!r} must be a number in [0, 1]")
    if dropout_implementation not in (DOWNGRADE, UPSCALE):
        raise ConfigError(f"dropout dropout_implementation={dropout_implementation!r}; use "
                          f"{DOWNGRADE!r} or {UPSCALE!r}")
    out = create_tmp(name or "dropout", x.shape, x.dtype, x.lod_level)
    mask = create_tmp(name or "dropout", x.shape, "bool", stop_gradient=True)
    append_op("dropout", {"X": x}, {"Out": out, "Mask": mask},
              {"dropout_prob": float(dropout_prob), "is_test": bool(is_test), "fix_seed": seed is not None,
               "seed": int(seed or 0), "dropout_implementation": dropout_implementation})
    return out


def batch_norm(input, act=None, is_test=False, momentum=0.9, epsilon=1e-05, param_attr=None,
               bias_attr=None, data_layout="NCHW", in_place=False, name=None, moving_mean_name=None,
               moving_variance_name=None, do_model_average_for_mean_and_var=True,
               use_global_stats=False):
    """Normalizes each channel (dim 1 for NCHW and for a 2-D input [batch, features]; the
    last dim for NHWC) by the batch's mean and variance while training, then scales and
    shifts it (learned, initialized to 1 and 0).

    The moving mean and variance (initialized to 0 and 1, names ``moving_mean_name`` /
    ``moving_variance_name`` or "<name>.w_1" / "<name>.w_2") are persistable, not trained,
    moved by ``momentum`` at every training step, and used instead of the batch's statistics
    with ``is_test`` (``clone(for_test=True)``) or ``use_global_stats``.

    Returns:
        act(Y), a Variable of the input's shape.

    Raises:
        ConfigError: an unknown layout or act, or an unknown channel count.
    """
    check_var(input, "input", "batch_norm")
    check_act(act, "batch_norm")
    if data_layout not in ("NCHW", "NHWC"):
        raise ConfigError(f"batch_norm data_layout={data_layout!r}; use 'NCHW' or 'NHWC'")
    if len(input.shape) < 2:
        raise ConfigError(f"batch_norm input {input.name!r} {list(input.shape)} needs a batch and a channel dim")
    channels = input.shape[channel_axis(len(input.shape), data_layout)]
    if channels < 0:
        raise ConfigError(f"batch_norm input {input.name!r} {list(input.shape)}: the channel count must be known")
    layer = layer_name("batch_norm", name)
    scale = create_parameter(layer, param_attr, [channels], default_initializer=Constant(1.0))
    bias = create_parameter(layer, bias_attr, [channels], suffix="b", is_bias=True)
    mean = create_parameter(layer, ParamAttr(name=moving_mean_name, initializer=Constant(0.0), trainable=False),
                            [channels])
    variance = create_parameter(layer, ParamAttr(name=moving_variance_name, initializer=Constant(1.0),
                                                 trainable=False), [channels])
    y = create_tmp(layer, input.shape, input.dtype, input.lod_level)
    saved_mean = create_tmp(layer, [channels], stop_gradient=True)
    saved_variance = create_tmp(layer, [channels], stop_gradient=True)
    append_op("batch_norm", {"X": input, "Scale": scale, "Bias": bias, "Mean": mean, "Variance": variance},
              {"Y": y, "MeanOut": mean, "VarianceOut": variance, "SavedMean": saved_mean,
               "SavedVariance": saved_variance},
              {"momentum": float(momentum), "epsilon": float(epsilon), "is_test": bool(is_test),
               "data_layout": data_layout, "use_global_stats": bool(use_global_stats)})
    return apply_act(y, act, "batch_norm")


def layer_norm(input, scale=True, shift=True, begin_norm_axis=1, epsilon=1e-05, param_attr=None,
               bias_attr=None, act=None, name=None):
    """Normalizes over the dims from ``begin_norm_axis`` on (each example on its own), then
    scales (``scale``; learned, initialized to 1) and shifts (``shift``; initialized to 0),
    one value per normalized element.

    Raises:
        ConfigError: ``begin_norm_axis`` outside [1, rank), normalized dims not known, or
            an unknown act.
    """
    check_var(input, "input", "layer_norm")
    check_act(act, "layer_norm")
    nd = len(input.shape)
    if not isinstance(begin_norm_axis, int) or not 1 <= begin_norm_axis < nd:
        raise ConfigError(f"layer_norm begin_norm_axis={begin_norm_axis!r} must be in [1, {nd}) for "
                          f"{input.name!r} {list(input.shape)}")
    tail = input.shape[begin_norm_axis:]
    if any(d < 0 for d in tail):
        raise ConfigError(f"layer_norm of {input.name!r} {list(input.shape)}: the dims from "
                          f"begin_norm_axis={begin_norm_axis} on must be known")
    layer = layer_name("layer_norm", name)
    inputs = {"X": input}
    if scale:
        inputs["Scale"] = create_parameter(layer, param_attr, [math.prod(tail)], default_initializer=Constant(1.0))
    if shift:
        inputs["Bias"] = create_parameter(layer, bias_attr, [math.prod(tail)], suffix="b", is_bias=True)
    y = create_tmp(layer, input.shape, input.dtype, input.lod_level)
    stats = [create_tmp(layer, [-1], stop_gradient=True) for _ in range(2)]
    append_op("layer_norm", inputs, {"Y": y, "Mean": stats[0], "Variance": stats[1]},
              {"epsilon": float(epsilon), "begin_norm_axis": begin_norm_axis})
    return apply_act(y, act, "layer_norm")
