"""Element-wise binary ops with Paddle's ``axis`` broadcasting: add, sub, mul, div, max,
min and pow."""
import numpy as np

from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op


def _broadcast_y(x, y, axis):
    """Reshapes y for numpy broadcasting against x with Paddle's ``axis`` rule: y's dims
    match x's dims starting at ``axis`` (-1: aligned to x's trailing dims)."""
    if y.ndim == x.ndim or y.ndim == 0:  # same rank: numpy broadcasting, axis unused (Paddle)
        return y
    if axis == -1 or axis is None:
        axis = x.ndim - y.ndim
    shape = [1] * x.ndim
    shape[axis:axis + y.ndim] = y.shape
    return y.reshape(shape)


def _reduce_to(g, shape):
    """Sums the broadcast dims of gradient ``g`` back to ``shape``."""
    if g.shape == tuple(shape):
        return g
    ndim_extra = g.ndim - len(shape)
    if ndim_extra:
        g = g.sum(axis=tuple(range(ndim_extra)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


class _Elementwise(OpDef):
    """Out = f(X, Y) with Y broadcast onto X from dim ``axis`` of X (-1: Y aligned to X's
    trailing dims). On lod_level=1 values it works row by row: Y is then lod_level=1 with
    the same lengths, or has no batch dimension (a parameter or a constant)."""

    grad_slots = ("X", "Y")
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, x.lod_level

    def check_rowwise(self, op, block, seqs):
        x = block.var(op.input("X")[0])
        if not x.lod_level:
            raise lod.refuse(op, seqs[0], f"as y it would be broadcast onto x {x.name!r}, which "
                                          f"has no row per id",
                             "make the lod_level=1 value x (the first operand)")

    def forward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        yb = _broadcast_y(x, y, ctx.attrs.get("axis", -1))
        out = ctx.buffer("Out", np.broadcast_shapes(x.shape, yb.shape), x.dtype)
        self.compute(x, yb, out)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        x, y0 = ctx.input("X"), ctx.input("Y")
        g = ctx.input("Out@GRAD")
        y = _broadcast_y(x, y0, ctx.attrs.get("axis", -1))
        gx, gy = self.grads(ctx, x, y, g)
        # A gradient already of its input's shape is used as is: np.broadcast_to would make
        # it a read-only view (and numba compiles a second, read-only kernel signature).
        if ctx.wants("X@GRAD"):
            if gx.shape != x.shape:
                gx = _reduce_to(np.broadcast_to(gx, x.shape), x.shape)
            ctx.set_output("X@GRAD", np.ascontiguousarray(gx, dtype=x.dtype))
        if ctx.wants("Y@GRAD"):
            if gy.shape != y.shape:
                gy = _reduce_to(np.broadcast_to(gy, np.broadcast_shapes(x.shape, y.shape)), y.shape)
            ctx.set_output("Y@GRAD", np.ascontiguousarray(gy.reshape(y0.shape), dtype=y0.dtype))

    def compute(self, x, y, out):
        raise NotImplementedError

    def grads(self, ctx, x, y, g):
        """Returns (dX, dY) before the broadcast dims are summed away."""
        raise NotImplementedError


@register_op
class ElementwiseAdd(_Elementwise):
    type = "elementwise_add"

    def compute(self, x, y, out):
        np.add(x, y, out=out)

    def grads(self, ctx, x, y, g):
        return g, g


@register_op
class ElementwiseSub(_Elementwise):
    type = "elementwise_sub"

    def compute(self, x, y, out):
        np.subtract(x, y, out=out)

    def grads(self, ctx, x, y, g):
        return g, -g


@register_op
class ElementwiseMul(_Elementwise):
    type = "elementwise_mul"

    def compute(self, x, y, out):
        np.multiply(x, y, out=out)

    def grads(self, ctx, x, y, g):
        return g * y, g * x


@register_op
class ElementwiseDiv(_Elementwise):
    type = "elementwise_div"

    def compute(self, x, y, out):
        np.divide(x, y, out=out)

    def grads(self, ctx, x, y, g):
        return g / y, -g * x / (y * y)


@register_op
class ElementwiseMax(_Elementwise):
    """max(X, Y); where they tie the gradient goes to Y (Paddle: dX = dOut * (X > Y))."""

    type = "elementwise_max"

    def compute(self, x, y, out):
        np.maximum(x, y, out=out)

    def grads(self, ctx, x, y, g):
        wins = x > y
        return g * wins, g * ~wins


@register_op
class ElementwiseMin(_Elementwise):
    """min(X, Y); where they tie the gradient goes to Y (Paddle: dX = dOut * (X < Y))."""

    type = "elementwise_min"

    def compute(self, x, y, out):
        np.minimum(x, y, out=out)

    def grads(self, ctx, x, y, g):
        wins = x < y
        return g * wins, g * ~wins


@register_op
class ElementwisePow(_Elementwise):
    """X ** Y; dX = dOut * Y * X**(Y-1), dY = dOut * log(X) * X**Y (X > 0 for dY)."""

    type = "elementwise_pow"

    def compute(self, x, y, out):
        np.power(x, y, out=out)

    def grads(self, ctx, x, y, g):
        out = ctx.input("Out")
        gx = g * y * np.power(x, y - 1)
        gy = g * np.log(x) * out if ctx.wants("Y@GRAD") else g
        return gx, gy
