"""Element-wise arithmetic, activations and reductions."""
import numpy as np

from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import LoDTensor


def _vals(x):
    return x.values if isinstance(x, LoDTensor) else x


def _like(x, values):
    return LoDTensor(values, x.offsets) if isinstance(x, LoDTensor) else values


def _broadcast_y(x, y, axis):
    """Reshapes y for numpy broadcasting against x with Paddle's ``axis`` rule: y's dims
    match x's dims starting at ``axis`` (-1: aligned to x's trailing dims)."""
    if y.shape == x.shape or y.ndim == 0:
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
    grad_slots = ("X", "Y")

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, x.lod_level

    def forward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        xv = _vals(x)
        yv = _broadcast_y(xv, _vals(y), ctx.attrs.get("axis", -1))
        ctx.set_output("Out", _like(x, self.compute(xv, yv)))

    def backward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        g = _vals(ctx.input("Out@GRAD"))
        xv, yv0 = _vals(x), _vals(y)
        yv = _broadcast_y(xv, yv0, ctx.attrs.get("axis", -1))
        gx, gy = self.grads(xv, yv, g)
        # A gradient already of its input's shape is used as is: np.broadcast_to would make
        # it a read-only view (and numba compiles a second, read-only kernel signature).
        if ctx.wants("X@GRAD"):
            if gx.shape != xv.shape:
                gx = _reduce_to(np.broadcast_to(gx, xv.shape), xv.shape)
            ctx.set_output("X@GRAD", _like(x, gx))
        if ctx.wants("Y@GRAD"):
            if gy.shape != yv.shape:
                gy = _reduce_to(np.broadcast_to(gy, np.broadcast_shapes(xv.shape, yv.shape)), yv.shape)
            ctx.set_output("Y@GRAD", _like(y, np.ascontiguousarray(gy.reshape(yv0.shape))))


@register_op
class ElementwiseAdd(_Elementwise):
    type = "elementwise_add"

    def compute(self, x, y):
        return x + y

    def grads(self, x, y, g):
        return g, g


@register_op
class ElementwiseSub(_Elementwise):
    type = "elementwise_sub"

    def compute(self, x, y):
        return x - y

    def grads(self, x, y, g):
        return g, -g


@register_op
class ElementwiseMul(_Elementwise):
    type = "elementwise_mul"

    def compute(self, x, y):
        return x * y

    def grads(self, x, y, g):
        return g * y, g * x


@register_op
class ElementwiseDiv(_Elementwise):
    type = "elementwise_div"

    def compute(self, x, y):
        return x / y

    def grads(self, x, y, g):
        return g / y, -g * x / (y * y)


class _Activation(OpDef):
    grad_slots = ("X",)

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, x.lod_level

    def forward(self, ctx):
        x = ctx.input("X")
        xv = _vals(x)
        out = ctx.buffer("Out", xv.shape, xv.dtype) if not isinstance(x, LoDTensor) else np.empty_like(xv)
        self.compute(xv, out)
        ctx.set_output("Out", _like(x, out))

    def backward(self, ctx):
        x = ctx.input("X")
        out = _vals(ctx.input("Out"))
        g = _vals(ctx.input("Out@GRAD"))
        ctx.set_output("X@GRAD", _like(x, self.grad(out, g)))


@register_op
class Relu(_Activation):
    type = "relu"

    def compute(self, x, out):
        np.maximum(x, 0, out=out)

    def grad(self, out, g):
        return g * (out > 0)


@register_op
class Sigmoid(_Activation):
    type = "sigmoid"

    def compute(self, x, out):
        np.negative(x, out=out)
        np.exp(out, out=out)
        out += 1
        np.reciprocal(out, out=out)

    def grad(self, out, g):
        return g * out * (1 - out)


@register_op
class Tanh(_Activation):
    type = "tanh"

    def compute(self, x, out):
        np.tanh(x, out=out)

    def grad(self, out, g):
        return g * (1 - out * out)


@register_op
class Softmax(_Activation):
    type = "softmax"

    def compute(self, x, out):
        softmax_into(x, out)

    def grad(self, out, g):
        return out * (g - (g * out).sum(axis=-1, keepdims=True))


def softmax_into(x, out):
    """Row-wise softmax of x (last axis) into out, shifted by the row max for stability."""
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)


@register_op
class Mean(OpDef):
    type = "mean"
    grad_slots = ("X",)

    def forward(self, ctx):
        x = _vals(ctx.input("X"))
        ctx.set_output("Out", np.array([x.mean(dtype=np.float32)], dtype=np.float32))

    def backward(self, ctx):
        x = ctx.input("X")
        xv = _vals(x)
        g = _vals(ctx.input("Out@GRAD"))
        ctx.set_output("X@GRAD", _like(x, np.full(xv.shape, g.reshape(-1)[0] / max(xv.size, 1), dtype=np.float32)))


@register_op
class ReduceSum(OpDef):
    type = "reduce_sum"
    grad_slots = ("X",)

    def _axes(self, ctx, ndim):
        dim = ctx.attrs.get("dim")
        if dim is None or ctx.attrs.get("reduce_all", False):
            return tuple(range(ndim))
        dims = dim if isinstance(dim, (list, tuple)) else [dim]
        return tuple(d + ndim if d < 0 else d for d in dims)

    def forward(self, ctx):
        x = _vals(ctx.input("X"))
        axes = self._axes(ctx, x.ndim)
        out = x.sum(axis=axes, keepdims=ctx.attrs.get("keep_dim", False), dtype=x.dtype)
        if out.ndim == 0:
            out = out.reshape(1)
        ctx.set_output("Out", np.ascontiguousarray(out))

    def backward(self, ctx):
        x = ctx.input("X")
        xv = _vals(x)
        axes = self._axes(ctx, xv.ndim)
        g = _vals(ctx.input("Out@GRAD"))
        shape = [1 if i in axes else d for i, d in enumerate(xv.shape)]
        ctx.set_output("X@GRAD", _like(x, np.ascontiguousarray(np.broadcast_to(g.reshape(shape), xv.shape))))
