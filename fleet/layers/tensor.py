"""Tensor layers of Paddle's ``fluid.layers``: shape, argmax / argmin, zeros / ones (and
their ``_like`` forms), Paddle 1.x's one_hot, and cos_sim / l2_normalize, which are built
from the math layers (so their gradients are those layers')."""
from fleet.errors import ConfigError
from fleet.framework.program import normalize_dtype
from fleet.layers.activation import sqrt, square
from fleet.layers.helper import append_op, check_var, create_tmp
from fleet.layers.math import elementwise_div, elementwise_max, elementwise_mul, reduce_sum
from fleet.layers.nn import fill_constant


def shape(input):
    """The shape of ``input`` at run time: int32 [rank] (no gradient)."""
    check_var(input, "input", "shape")
    out = create_tmp("shape", (len(input.shape),), "int32", stop_gradient=True)
    append_op("shape", {"Input": input}, {"Out": out})
    return out


def _arg(layer, op, x, axis):
    check_var(x, "x", layer)
    rank = len(x.shape)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise ConfigError(f"{layer}: axis={axis!r} must be an int in [{-rank}, {rank}) for {x.name!r} of shape "
                          f"{tuple(x.shape)}")
    axis %= rank
    out = create_tmp(layer, tuple(d for i, d in enumerate(x.shape) if i != axis), "int64",
                     lod_level=x.lod_level if axis else 0, stop_gradient=True)
    if not out.shape:
        out.shape = (1,)
    append_op(op, {"X": x}, {"Out": out}, {"axis": axis, "keepdims": False, "dtype": "int64"})
    return out


def argmax(x, axis=0):
    """The index (int64) of the largest value along ``axis``, that dimension removed;
    the first of equal values wins. No gradient."""
    return _arg("argmax", "arg_max", x, axis)


def argmin(x, axis=0):
    """The index (int64) of the smallest value along ``axis`` (see argmax)."""
    return _arg("argmin", "arg_min", x, axis)


def zeros(shape, dtype, force_cpu=False):
    """A constant tensor of zeros (``fill_constant(shape, dtype, 0.0)``)."""
    return fill_constant(shape, dtype, 0.0)


def ones(shape, dtype, force_cpu=False):
    """A constant tensor of ones (``fill_constant(shape, dtype, 1.0)``)."""
    return fill_constant(shape, dtype, 1.0)


def _full_like(layer, x, value, dtype):
    check_var(x, "x", layer)
    dtype = normalize_dtype(dtype or x.dtype)
    out = create_tmp(layer, tuple(x.shape), dtype, lod_level=x.lod_level, stop_gradient=True)
    append_op("fill_any_like", {"X": x}, {"Out": out}, {"value": float(value), "dtype": dtype})
    return out


def zeros_like(x, out=None):
    """Zeros of ``x``'s shape and dtype at run time (no gradient)."""
    if out is not None:
        raise ConfigError("zeros_like(out=...): fleet layers return new variables; drop out=")
    return _full_like("zeros_like", x, 0.0, None)


def ones_like(x, out=None):
    """Ones of ``x``'s shape and dtype at run time (no gradient)."""
    if out is not None:
        raise ConfigError("ones_like(out=...): fleet layers return new variables; drop out=")
    return _full_like("ones_like", x, 1.0, None)


def one_hot(input, depth, allow_out_of_range=False):
    """Paddle 1.x's ``fluid.layers.one_hot``: int64 ids whose last dimension is 1 ->
    float32 one-hot rows, that dimension replaced by ``depth`` ([N, 1] -> [N, depth]). An
    id outside [0, depth) is a DataError at run time, or a zero row with
    ``allow_out_of_range``. A lod_level=1 input keeps its sequences. No gradient.
    (``fluid.one_hot``, Paddle 1.8's, appends ``depth`` instead.)

    Raises:
        ConfigError: ids that are not int64, a last dimension that is not 1, or a depth
            that is not a positive int.
    """
    check_var(input, "input", "one_hot")
    if input.dtype != "int64":
        raise ConfigError(f"one_hot input {input.name!r} must be int64 ids, got {input.dtype}")
    if not input.shape or input.shape[-1] != 1:
        raise ConfigError(f"one_hot input {input.name!r} must have a last dimension of 1 (ids [N, 1]), got shape "
                          f"{tuple(input.shape)}; fluid.one_hot appends depth to any shape")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"one_hot depth={depth!r} must be a positive int")
    out = create_tmp("one_hot", tuple(input.shape[:-1]) + (depth,), lod_level=input.lod_level, stop_gradient=True)
    append_op("one_hot", {"X": input}, {"Out": out}, {"depth": depth, "allow_out_of_range": bool(allow_out_of_range)})
    return out


def _norm(x, epsilon=None):
    """sqrt(sum(x^2, last axis)) per row [N, 1], at least sqrt(epsilon) when given."""
    total = reduce_sum(square(x), dim=len(x.shape) - 1, keep_dim=True)
    if epsilon is not None:
        total = elementwise_max(total, fill_constant([1], "float32", float(epsilon)))
    return sqrt(total)


def cos_sim(X, Y):
    """Cosine similarity of the rows of X and Y, [N, 1]: sum(x * y) / (|x| |y|). Y may
    have one row, compared with every row of X (Paddle's broadcast). As Paddle's, a
    zero row gives a non-finite value."""
    check_var(X, "X", "cos_sim")
    check_var(Y, "Y", "cos_sim")
    if len(X.shape) != 2 or len(Y.shape) != 2 or X.shape[1] != Y.shape[1]:
        raise ConfigError(f"cos_sim: X {X.name!r} {tuple(X.shape)} and Y {Y.name!r} {tuple(Y.shape)} must be "
                          f"[N, D] and [N or 1, D] with the same D")
    dot = reduce_sum(elementwise_mul(X, Y), dim=1, keep_dim=True)
    return elementwise_div(dot, elementwise_mul(_norm(X), _norm(Y)))


def l2_normalize(x, axis, epsilon=1e-12, name=None):
    """x / sqrt(max(sum(x^2, axis), epsilon)) (Paddle's; ``axis`` -1 or the last
    dimension: rows of a [N, D] input)."""
    check_var(x, "x", "l2_normalize")
    rank = len(x.shape)
    if not rank or isinstance(axis, bool) or not isinstance(axis, int) or axis % rank != rank - 1:
        raise ConfigError(f"l2_normalize: axis={axis!r}: fleet normalizes along the last dimension of "
                          f"{x.name!r} {tuple(x.shape)} (axis -1 or {rank - 1})")
    return elementwise_div(x, _norm(x, epsilon), axis=0)
