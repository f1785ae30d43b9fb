"""Element-wise arithmetic of two inputs and reductions (Paddle's math layers)."""
from fleet.errors import ConfigError
from fleet.layers.activation import apply_act, check_act
from fleet.layers.helper import append_op, check_var, create_tmp


def _binary(op_type, x, y, axis, act, name):
    check_var(x, "x", op_type)
    check_var(y, "y", op_type)
    check_act(act, op_type)
    # same rank: numpy broadcasting, axis does not matter (Paddle)
    same_rank = len(y.shape) == len(x.shape)
    if not isinstance(axis, int) or axis < -1 or (
            not same_rank and axis >= 0 and axis + len(y.shape) > len(x.shape)):
        raise ConfigError(f"{op_type} axis={axis!r} cannot place y {list(y.shape)} in x {list(x.shape)}; "
                          f"use -1 (y matches x's trailing dims) or the dim of x where y's dims start")
    out = create_tmp(name or op_type, x.shape, x.dtype, x.lod_level)
    append_op(op_type, {"X": x, "Y": y}, {"Out": out}, {"axis": axis})
    return apply_act(out, act, op_type)


def elementwise_add(x, y, axis=-1, act=None, name=None):
    """x + y, y broadcast from dim ``axis`` of x (-1: y matches x's trailing dims).

    Raises:
        ConfigError: y cannot be placed in x at ``axis``, or an unknown ``act``.
    """
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


def elementwise_max(x, y, axis=-1, act=None, name=None):
    """max(x, y) with the broadcasting of elementwise_add; ties send the gradient to y."""
    return _binary("elementwise_max", x, y, axis, act, name)


def elementwise_min(x, y, axis=-1, act=None, name=None):
    """min(x, y) with the broadcasting of elementwise_add; ties send the gradient to y."""
    return _binary("elementwise_min", x, y, axis, act, name)


def elementwise_pow(x, y, axis=-1, act=None, name=None):
    """x ** y with the broadcasting of elementwise_add (x > 0 where y gets a gradient)."""
    return _binary("elementwise_pow", x, y, axis, act, name)


def mean(x, name=None):
    """The mean of all elements, shape [1]."""
    check_var(x, "x", "mean")
    out = create_tmp(name or "mean", (1,), x.dtype)
    append_op("mean", {"X": x}, {"Out": out})
    return out


def _reduce(op_type, input, dim, keep_dim, name):
    check_var(input, "input", op_type)
    nd = len(input.shape)
    dims = None if dim is None else [d for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    if dims is not None and any(not isinstance(d, int) or not -nd <= d < nd for d in dims):
        raise ConfigError(f"{op_type} dim={dim!r} is out of range for {input.name!r} of rank {nd}; "
                          f"use dims in [{-nd}, {nd})")
    reduce_all = not dims or len({d % nd for d in dims}) == nd
    if reduce_all:
        shape = (1,) * nd if keep_dim else (1,)
    else:
        axes = {d % nd for d in dims}
        shape = tuple(1 if i in axes else s for i, s in enumerate(input.shape)) if keep_dim else \
            tuple(s for i, s in enumerate(input.shape) if i not in axes) or (1,)
    out = create_tmp(name or op_type, shape, input.dtype)
    append_op(op_type, {"X": input}, {"Out": out},
              {"dim": dim if dims is None else list(dims), "keep_dim": bool(keep_dim), "reduce_all": reduce_all})
    return out


def reduce_sum(input, dim=None, keep_dim=False, name=None):
    """Sum over ``dim`` (an int, a list, or None for every dim; the result of a full
    reduction without keep_dim is [1]). On a lod_level=1 input, dims other than 0 keep one
    row per id and the LoD; dim 0 sums over the ids of the whole batch.

    Raises:
        ConfigError: a dim out of range.
    """
    return _reduce("reduce_sum", input, dim, keep_dim, name)


def reduce_mean(input, dim=None, keep_dim=False, name=None):
    """Mean over ``dim``, as reduce_sum."""
    return _reduce("reduce_mean", input, dim, keep_dim, name)


def reduce_max(input, dim=None, keep_dim=False, name=None):
    """Max over ``dim``, as reduce_sum; every element equal to the max gets the gradient."""
    return _reduce("reduce_max", input, dim, keep_dim, name)


def reduce_min(input, dim=None, keep_dim=False, name=None):
    """Min over ``dim``, as reduce_sum; every element equal to the min gets the gradient."""
    return _reduce("reduce_min", input, dim, keep_dim, name)


def sums(input, out=None):
    """The element-wise sum of a list of variables."""
    for x in input:
        check_var(x, "input", "sums")
    out = out or create_tmp("sums", input[0].shape, input[0].dtype)
    append_op("sum", {"X": list(input)}, {"Out": out})
    return out
