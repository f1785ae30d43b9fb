"""Element-wise unary ops (Paddle's activation ops): relu, sigmoid, tanh, softmax, square,
sqrt, exp, log, abs, pow, clip, leaky_relu, and prelu (which has a learned slope).

Each works on any shape and, on lod_level=1 values, row by row (the LoD passes through).
Outputs and input gradients reuse their buffers from the previous step.
"""
import numpy as np

from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op


class _Activation(OpDef):
    """Out = f(X). Subclasses write f into ``out`` and dX into ``dx``."""

    grad_slots = ("X",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, x.lod_level

    def forward(self, ctx):
        x = ctx.input("X")
        out = ctx.buffer("Out", x.shape, x.dtype)
        self.compute(ctx.attrs, x, out)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        g = ctx.input("Out@GRAD")
        dx = ctx.buffer("X@GRAD", g.shape, g.dtype)
        self.grad(ctx.attrs, ctx.input("X"), ctx.input("Out"), g, dx)
        ctx.set_output("X@GRAD", dx)

    def compute(self, attrs, x, out):
        raise NotImplementedError

    def grad(self, attrs, x, out, g, dx):
        raise NotImplementedError


@register_op
class Relu(_Activation):
    type = "relu"

    def compute(self, attrs, x, out):
        np.maximum(x, 0, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.multiply(g, out > 0, out=dx)


@register_op
class Sigmoid(_Activation):
    type = "sigmoid"

    def compute(self, attrs, x, out):
        sigmoid_into(x, out)

    def grad(self, attrs, x, out, g, dx):
        np.subtract(1, out, out=dx)
        dx *= out
        dx *= g


def sigmoid_into(x, out):
    """out = 1 / (1 + exp(-x)), computed in ``out`` (which may be ``x``)."""
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)


@register_op
class Tanh(_Activation):
    type = "tanh"

    def compute(self, attrs, x, out):
        np.tanh(x, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.multiply(out, out, out=dx)
        np.subtract(1, dx, out=dx)
        dx *= g


@register_op
class Softmax(_Activation):
    """Softmax over the last axis."""

    type = "softmax"

    def compute(self, attrs, x, out):
        softmax_into(x, out)

    def grad(self, attrs, x, out, g, dx):
        np.multiply(out, g - (g * out).sum(axis=-1, keepdims=True), out=dx)


def softmax_into(x, out):
    """Row-wise softmax of x (last axis) into out, shifted by the row max for stability."""
    np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)


@register_op
class Square(_Activation):
    type = "square"

    def compute(self, attrs, x, out):
        np.multiply(x, x, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.multiply(x, g, out=dx)
        dx *= 2


@register_op
class Sqrt(_Activation):
    """sqrt(X); dX = dOut / (2 sqrt(X))."""

    type = "sqrt"

    def compute(self, attrs, x, out):
        np.sqrt(x, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.divide(g, out, out=dx)
        dx *= 0.5


@register_op
class Exp(_Activation):
    type = "exp"

    def compute(self, attrs, x, out):
        np.exp(x, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.multiply(g, out, out=dx)


@register_op
class Log(_Activation):
    """Natural logarithm; dX = dOut / X."""

    type = "log"

    def compute(self, attrs, x, out):
        np.log(x, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.divide(g, x, out=dx)


@register_op
class Abs(_Activation):
    """|X|; dX = dOut * sign(X) (0 at 0, as Paddle)."""

    type = "abs"

    def compute(self, attrs, x, out):
        np.abs(x, out=out)

    def grad(self, attrs, x, out, g, dx):
        np.sign(x, out=dx)
        dx *= g


@register_op
class Pow(_Activation):
    """X ** factor (attr ``factor``)."""

    type = "pow"

    def compute(self, attrs, x, out):
        np.power(x, np.float32(attrs.get("factor", 1.0)), out=out)

    def grad(self, attrs, x, out, g, dx):
        factor = np.float32(attrs.get("factor", 1.0))
        np.power(x, factor - 1, out=dx)
        dx *= factor
        dx *= g


@register_op
class Clip(_Activation):
    """min(max(X, min), max); the gradient flows where min < X < max (Paddle's rule)."""

    type = "clip"

    def compute(self, attrs, x, out):
        np.clip(x, np.float32(attrs["min"]), np.float32(attrs["max"]), out=out)

    def grad(self, attrs, x, out, g, dx):
        inside = (x > np.float32(attrs["min"])) & (x < np.float32(attrs["max"]))
        np.multiply(g, inside, out=dx)


@register_op
class LeakyRelu(_Activation):
    """X where X > 0, else alpha * X (attr ``alpha``, Paddle's default 0.02)."""

    type = "leaky_relu"

    def compute(self, attrs, x, out):
        alpha = np.float32(attrs.get("alpha", 0.02))
        np.multiply(x, np.where(x > 0, np.float32(1), alpha), out=out)

    def grad(self, attrs, x, out, g, dx):
        alpha = np.float32(attrs.get("alpha", 0.02))
        np.multiply(g, np.where(x > 0, np.float32(1), alpha), out=dx)


def prelu_alpha_shape(mode, x_shape):
    """The shape of prelu's Alpha parameter (Paddle's): [1] for "all", [1, C, 1, 1] for
    "channel" (C = dim 1), [1, *x_shape[1:]] for "element"."""
    if mode == "all":
        return [1]
    if mode == "channel":
        return [1, x_shape[1], 1, 1]
    return [1] + list(x_shape[1:])


@register_op
class PRelu(OpDef):
    """X where X > 0, else Alpha * X; Alpha is one slope (mode "all"), one per channel
    (dim 1, "channel") or one per element of an example ("element")."""

    type = "prelu"
    grad_slots = ("X", "Alpha")
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, x.lod_level

    @staticmethod
    def _alpha(ctx, x):
        alpha = ctx.input("Alpha")
        mode = ctx.attrs.get("mode", "all")
        if mode == "all":
            return alpha.reshape(())
        if mode == "channel":
            return alpha.reshape((1, -1) + (1,) * (x.ndim - 2))
        return alpha.reshape((1,) + x.shape[1:])

    def forward(self, ctx):
        x = ctx.input("X")
        out = ctx.buffer("Out", x.shape, x.dtype)
        np.multiply(x, np.where(x > 0, np.float32(1), self._alpha(ctx, x)), out=out)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        x = ctx.input("X")
        g = ctx.input("Out@GRAD")
        alpha = self._alpha(ctx, x)
        if ctx.wants("X@GRAD"):
            dx = ctx.buffer("X@GRAD", g.shape, g.dtype)
            np.multiply(g, np.where(x > 0, np.float32(1), alpha), out=dx)
            ctx.set_output("X@GRAD", dx)
        if ctx.wants("Alpha@GRAD"):
            contrib = np.where(x > 0, np.float32(0), g * x)
            axes = tuple(i for i in range(x.ndim) if i >= alpha.ndim or alpha.shape[i] == 1)
            da = contrib.sum(axis=axes, dtype=np.float32)
            ctx.set_output("Alpha@GRAD", np.ascontiguousarray(da).reshape(ctx.input("Alpha").shape))
