"""Small tensor ops without a gradient: shape, arg_max / arg_min, fill_any_like, Paddle
1.x's one_hot (ids [..., 1] -> [..., depth]) and one_hot_v2 (depth appended)."""
import numpy as np

from fleet.errors import DataError
from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import LoDTensor
from fleet.framework.ops.basic import NP


def _values(value):
    return value.values if isinstance(value, LoDTensor) else np.asarray(value)


@register_op
class Shape(OpDef):
    """Out = the shape of X at run time, int32 [rank] (of a lod_level=1 value: of its rows)."""

    type = "shape"
    lod = lod.SEQUENCE

    def forward(self, ctx):
        shape = _values(ctx.input("Input")).shape
        declared = ctx.op.block.var(ctx.input_name("Input")).shape
        if len(shape) < len(declared):  # a sequence of ids comes as flat rows: [total] of [-1, 1]
            shape = tuple(shape) + tuple(declared[len(shape):])
        ctx.set_output("Out", np.array(shape, dtype=np.int32))


class _ArgExtreme(OpDef):
    lod = lod.ROWWISE
    pick = None

    def forward(self, ctx):
        x = np.asarray(ctx.input("X"))
        axis = int(ctx.attrs.get("axis", 0))
        out = self.pick(x, axis=axis).astype(NP[ctx.attrs.get("dtype", "int64")])
        if ctx.attrs.get("keepdims"):
            out = np.expand_dims(out, axis)
        ctx.set_output("Out", out)


@register_op
class ArgMax(_ArgExtreme):
    """Out = the index of the largest value along ``axis`` (the first of equal ones)."""

    type = "arg_max"
    pick = staticmethod(np.argmax)


@register_op
class ArgMin(_ArgExtreme):
    """Out = the index of the smallest value along ``axis`` (the first of equal ones)."""

    type = "arg_min"
    pick = staticmethod(np.argmin)


@register_op
class FillAnyLike(OpDef):
    """Out = an array of X's shape (at run time) filled with ``value``, of ``dtype``."""

    type = "fill_any_like"
    lod = lod.ROWWISE

    def forward(self, ctx):
        x = np.asarray(ctx.input("X"))
        ctx.set_output("Out", np.full(x.shape, ctx.attrs["value"], dtype=NP[ctx.attrs["dtype"]]))


def _one_hot(ctx, ids):
    """float32 one-hot rows of ``ids`` with ``depth`` appended (the attrs of ``ctx``)."""
    depth = int(ctx.attrs["depth"])
    bad = (ids < 0) | (ids >= depth)
    if bad.any() and not ctx.attrs.get("allow_out_of_range"):
        raise DataError(f"one_hot {ctx.input_name('X')!r}: id {int(ids[bad][0])} is outside [0, {depth}); "
                        f"pass allow_out_of_range=True for zero rows, or a larger depth")
    out = np.zeros(ids.shape + (depth,), dtype=np.float32)
    hits = np.nonzero(~bad)
    out[hits + (ids[~bad],)] = 1.0
    ctx.set_output("Out", out)


@register_op
class OneHot(OpDef):
    """Paddle 1.x's one_hot: ids [..., 1] int64 -> float32 [..., depth], 1.0 at the id.
    An id outside [0, depth) is a DataError, or a zero row with ``allow_out_of_range``."""

    type = "one_hot"
    lod = lod.ROWWISE

    def forward(self, ctx):
        ids = np.asarray(ctx.input("X"), dtype=np.int64)
        if ids.ndim > 1:  # [..., 1]; the rows of a lod_level=1 input come flat
            ids = ids.reshape(ids.shape[:-1])
        _one_hot(ctx, ids)


@register_op
class OneHotV2(OpDef):
    """Out[..., k] = 1.0 where the id is k (Paddle 1.8's ``one_hot_v2``: ``depth`` appended
    to the ids' shape); no gradient."""

    type = "one_hot_v2"
    lod = lod.ROWWISE

    def forward(self, ctx):
        _one_hot(ctx, np.asarray(ctx.input("X"), dtype=np.int64))
