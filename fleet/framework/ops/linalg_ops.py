"""Matrix products: matmul (batched, Paddle's transpose_X / transpose_Y / alpha), mul
(flatten both to matrices, multiply) and conv2d with a 1x1 filter (xDeepFM's
compression: a product over the channels)."""
import numpy as np

from fleet.errors import ConfigError
from fleet.framework import lod
from fleet.framework.ops.math_ops import _reduce_to
from fleet.framework.registry import OpDef, register_op


def _batch_dims(a, b):
    """numpy's broadcast of two batch shapes with -1 for unknown dims."""
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for da, db in zip(a, b):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif da < 0 or db < 0:
            out.append(max(da, db))
        else:
            raise ConfigError(f"matmul batch dims {a} and {b} do not broadcast; give both the same "
                              f"batch dims (or make one a matrix)")
    return out


def matmul_shape(x_shape, y_shape, tx, ty, names=("x", "y")):
    """The output shape of Paddle's matmul (1-D operands: a row / a column, dropped again).

    Raises:
        ConfigError: the inner dims differ (names both shapes).
    """
    x, y = list(x_shape), list(y_shape)
    x1, y1 = len(x) == 1, len(y) == 1
    x = [1] + x if x1 else x
    y = y + [1] if y1 else y
    if tx and not x1:
        x[-2], x[-1] = x[-1], x[-2]
    if ty and not y1:
        y[-2], y[-1] = y[-1], y[-2]
    if x[-1] >= 0 and y[-2] >= 0 and x[-1] != y[-2]:
        raise ConfigError(f"matmul of {names[0]} {list(x_shape)} (transpose_x={tx}) and {names[1]} "
                          f"{list(y_shape)} (transpose_y={ty}): the inner dims {x[-1]} and {y[-2]} differ")
    out = _batch_dims(x[:-2], y[:-2]) + [x[-2], y[-1]]
    if y1:
        out.pop(-1)
    if x1:
        out.pop(-1 if y1 else -2)
    return out or [1]


class _Operands:
    """x and y of a matmul as >= 2-D arrays, transposes applied (views)."""

    def __init__(self, x, y, tx, ty):
        self.x1, self.y1 = x.ndim == 1, y.ndim == 1
        self.tx, self.ty = tx and not self.x1, ty and not self.y1
        self.x = x[None, :] if self.x1 else (np.swapaxes(x, -1, -2) if self.tx else x)
        self.y = y[:, None] if self.y1 else (np.swapaxes(y, -1, -2) if self.ty else y)


@register_op
class MatMul(OpDef):
    """Out = alpha * op(X) @ op(Y), op a transpose of the last two dims when asked; batch
    dims broadcast. A lod_level=1 X keeps its LoD (its rows are a batch dim)."""

    type = "matmul"
    grad_slots = ("X", "Y")
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x, y = block.var(op.input("X")[0]), block.var(op.input("Y")[0])
        out = block.var(op.output("Out")[0])
        out.shape = tuple(matmul_shape(x.shape, y.shape, op.attr("transpose_X", False),
                                       op.attr("transpose_Y", False), (x.name, y.name)))
        out.dtype = x.dtype

    def check_rowwise(self, op, block, seqs):
        x, y = block.var(op.input("X")[0]), block.var(op.input("Y")[0])
        if not x.lod_level or len(x.shape) < 2 or (len(x.shape) == 2 and op.attr("transpose_X", False)):
            raise lod.refuse(op, seqs[0], "matmul keeps one row per id only for an x of rank >= 2 whose "
                                          "first dim is not transposed")
        if y.lod_level and len(y.shape) < 3:
            raise lod.refuse(op, y, "as a matrix y its rows would be summed over")

    def forward(self, ctx):
        a = ctx.attrs
        ops = _Operands(ctx.input("X"), ctx.input("Y"), a.get("transpose_X", False), a.get("transpose_Y", False))
        out = np.matmul(ops.x, ops.y)
        alpha = np.float32(a.get("alpha", 1.0))
        if alpha != 1:
            out *= alpha
        if ops.y1:
            out = out[..., 0]
        if ops.x1:
            out = out[..., 0] if ops.y1 else out[..., 0, :]
        ctx.set_output("Out", np.ascontiguousarray(out.reshape(out.shape or (1,))))

    def backward(self, ctx):
        a = ctx.attrs
        x, y = ctx.input("X"), ctx.input("Y")
        ops = _Operands(x, y, a.get("transpose_X", False), a.get("transpose_Y", False))
        shape = np.broadcast_shapes(ops.x.shape[:-2], ops.y.shape[:-2]) + (ops.x.shape[-2], ops.y.shape[-1])
        g = ctx.input("Out@GRAD").reshape(shape) * np.float32(a.get("alpha", 1.0))
        if ctx.wants("X@GRAD"):
            dx = _reduce_to(np.matmul(g, np.swapaxes(ops.y, -1, -2)), ops.x.shape)
            dx = np.swapaxes(dx, -1, -2) if ops.tx else dx
            ctx.set_output("X@GRAD", np.ascontiguousarray(dx, dtype=x.dtype).reshape(x.shape))
        if ctx.wants("Y@GRAD"):
            dy = _reduce_to(np.matmul(np.swapaxes(ops.x, -1, -2), g), ops.y.shape)
            dy = np.swapaxes(dy, -1, -2) if ops.ty else dy
            ctx.set_output("Y@GRAD", np.ascontiguousarray(dy, dtype=y.dtype).reshape(y.shape))


@register_op
class Mul(OpDef):
    """Out = flatten(X, x_num_col_dims) @ flatten(Y, y_num_col_dims), shaped
    X.shape[:x_num_col_dims] + Y.shape[y_num_col_dims:]. A lod_level=1 X keeps its LoD."""

    type = "mul"
    grad_slots = ("X", "Y")
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x, y = block.var(op.input("X")[0]), block.var(op.input("Y")[0])
        xn, yn = op.attr("x_num_col_dims", 1), op.attr("y_num_col_dims", 1)
        inner_x, inner_y = x.shape[xn:], y.shape[:yn]
        if all(d >= 0 for d in inner_x + inner_y) and np.prod(inner_x) != np.prod(inner_y):
            raise ConfigError(f"mul of {x.name!r} {list(x.shape)} (x_num_col_dims={xn}) and {y.name!r} "
                              f"{list(y.shape)} (y_num_col_dims={yn}): {list(inner_x)} and {list(inner_y)} "
                              f"hold different numbers of values")
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype = tuple(x.shape[:xn]) + tuple(y.shape[yn:]), x.dtype

    def check_rowwise(self, op, block, seqs):
        y = block.var(op.input("Y")[0])
        if y.lod_level:
            raise lod.refuse(op, y, "as y its rows would be summed over")

    @staticmethod
    def _matrices(ctx, x, y):
        xn, yn = ctx.attrs.get("x_num_col_dims", 1), ctx.attrs.get("y_num_col_dims", 1)
        x2 = x.reshape(int(np.prod(x.shape[:xn])), int(np.prod(x.shape[xn:])))
        y2 = y.reshape(int(np.prod(y.shape[:yn])), int(np.prod(y.shape[yn:])))
        return x2, y2, tuple(x.shape[:xn]) + tuple(y.shape[yn:])

    def forward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        x2, y2, shape = self._matrices(ctx, x, y)
        out = ctx.buffer("Out", (x2.shape[0], y2.shape[1]), x.dtype)
        np.matmul(x2, y2, out=out)
        ctx.set_output("Out", out.reshape(shape))

    def backward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        x2, y2, _ = self._matrices(ctx, x, y)
        g = ctx.input("Out@GRAD").reshape(x2.shape[0], y2.shape[1])
        if ctx.wants("X@GRAD"):
            ctx.set_output("X@GRAD", np.matmul(g, y2.T).reshape(x.shape))
        if ctx.wants("Y@GRAD"):
            ctx.set_output("Y@GRAD", np.matmul(x2.T, g).reshape(y.shape))


@register_op
class Conv2D1x1(OpDef):
    """conv2d with a 1x1 filter, stride 1, no padding, one group, NCHW: Output[n, f, h, w]
    = sum_c Filter[f, c, 0, 0] * Input[n, c, h, w]. (Larger filters are refused by the
    layer: no model fleet targets uses them.)"""

    type = "conv2d"
    grad_slots = ("Input", "Filter")

    def infer_shape(self, op, block):
        x, w = block.var(op.input("Input")[0]), block.var(op.input("Filter")[0])
        out = block.var(op.output("Output")[0])
        out.shape, out.dtype = (x.shape[0], w.shape[0]) + tuple(x.shape[2:]), x.dtype

    def forward(self, ctx):
        x, w = ctx.input("Input"), ctx.input("Filter")
        n, c = x.shape[:2]
        out = ctx.buffer("Output", (n, w.shape[0]) + x.shape[2:], x.dtype)
        np.matmul(w.reshape(w.shape[0], c), x.reshape(n, c, -1), out=out.reshape(n, w.shape[0], -1))
        ctx.set_output("Output", out)

    def backward(self, ctx):
        x, w = ctx.input("Input"), ctx.input("Filter")
        n, c = x.shape[:2]
        g = ctx.input("Output@GRAD").reshape(n, w.shape[0], -1)
        if ctx.wants("Filter@GRAD"):
            dw = np.tensordot(g, x.reshape(n, c, -1), axes=([0, 2], [0, 2]))
            ctx.set_output("Filter@GRAD", dw.astype(w.dtype, copy=False).reshape(w.shape))
        if ctx.wants("Input@GRAD"):
            dx = np.matmul(w.reshape(w.shape[0], c).T, g)
            ctx.set_output("Input@GRAD", dx.reshape(x.shape))
