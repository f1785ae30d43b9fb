"""Reductions: mean (of everything) and reduce_sum / reduce_mean / reduce_max / reduce_min
over some dims.

On lod_level=1 values dim 0 is the rows (one per id): reducing other dims keeps one row
per id and the LoD; reducing dim 0 (or all dims) sums over every id of the batch and
gives a plain tensor, as Paddle (which passes the LoD on only when dim 0 is kept).
"""
import numpy as np

from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op


@register_op
class Mean(OpDef):
    """Out [1] = the mean of every element of X."""

    type = "mean"
    grad_slots = ("X",)
    lod = lod.ROWWISE
    lod_outputs = ()

    def forward(self, ctx):
        x = ctx.input("X")
        ctx.set_output("Out", np.array([x.mean(dtype=np.float32)], dtype=np.float32))

    def backward(self, ctx):
        x = ctx.input("X")
        g = ctx.input("Out@GRAD")
        dx = ctx.buffer("X@GRAD", x.shape, np.float32)
        dx.fill(g.reshape(-1)[0] / max(x.size, 1))
        ctx.set_output("X@GRAD", dx)


def reduce_axes(attrs, ndim):
    """The axes an op's ``dim`` / ``reduce_all`` attributes reduce, normalized and sorted."""
    dim = attrs.get("dim")
    if dim is None or attrs.get("reduce_all", False):
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted(d + ndim if d < 0 else d for d in dims))


class _Reduce(OpDef):
    """Out = reduction of X over ``dim`` (an int, a list, or None for every dim), keeping
    the reduced dims as 1 with ``keep_dim``; a full reduction without keep_dim is [1]."""

    grad_slots = ("X",)
    lod = lod.ROWWISE

    def lod_outputs_of(self, op):
        x = op.block.var(op.input("X")[0])
        return () if 0 in reduce_axes(op.attrs, len(x.shape)) else ("Out",)

    def forward(self, ctx):
        x = ctx.input("X")
        out = self.reduce(x, reduce_axes(ctx.attrs, x.ndim), ctx.attrs.get("keep_dim", False))
        if out.ndim == 0:
            out = out.reshape(1)
        ctx.set_output("Out", np.ascontiguousarray(out, dtype=x.dtype))

    def backward(self, ctx):
        x = ctx.input("X")
        axes = reduce_axes(ctx.attrs, x.ndim)
        kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
        g = ctx.input("Out@GRAD").reshape(kept)
        dx = ctx.buffer("X@GRAD", x.shape, x.dtype)
        self.grad(x, ctx.input("Out").reshape(kept), g, axes, dx)
        ctx.set_output("X@GRAD", dx)


@register_op
class ReduceSum(_Reduce):
    type = "reduce_sum"

    def reduce(self, x, axes, keep_dim):
        return x.sum(axis=axes, keepdims=keep_dim, dtype=x.dtype)

    def grad(self, x, out, g, axes, dx):
        np.copyto(dx, g)


@register_op
class ReduceMean(_Reduce):
    type = "reduce_mean"

    def reduce(self, x, axes, keep_dim):
        return x.mean(axis=axes, keepdims=keep_dim, dtype=np.float32)

    def grad(self, x, out, g, axes, dx):
        count = int(np.prod([x.shape[a] for a in axes]))
        np.copyto(dx, g)
        dx *= np.float32(1.0 / max(count, 1))


@register_op
class ReduceMax(_Reduce):
    """Max over ``dim``; every element equal to the max gets the gradient (Paddle's rule)."""

    type = "reduce_max"

    def reduce(self, x, axes, keep_dim):
        return x.max(axis=axes, keepdims=keep_dim)

    def grad(self, x, out, g, axes, dx):
        np.equal(x, out, out=dx, casting="unsafe")
        dx *= g


@register_op
class ReduceMin(ReduceMax):
    """Min over ``dim``; every element equal to the min gets the gradient."""

    type = "reduce_min"

    def reduce(self, x, axes, keep_dim):
        return x.min(axis=axes, keepdims=keep_dim)
