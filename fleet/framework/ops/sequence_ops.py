"""Sequence ops that read the LoD themselves: sequence_expand / sequence_expand_as (repeat
each example's row once per id of a sequence input) and sequence_softmax (a softmax
within each sequence). sequence_pool is in nn.py with the embedding it is fused with."""
import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import LoDTensor
from fleet.kernels import embedding as emb

_SUM = 0
_NO_ARGMAX = np.zeros((1, 1), dtype=np.int64)


def segment_sum(values, offsets, ctx):
    """Sums the rows of each sequence: [batch, width] from values [total, width] (one
    numba pass; empty sequences give zero rows)."""
    rows = values.reshape(len(values), -1)
    out = np.empty((len(offsets) - 1, rows.shape[1]), dtype=np.float32)
    ids = ctx.local.get("@arange")
    if ids is None or len(ids) < len(rows):
        ids = ctx.local["@arange"] = np.arange(max(len(rows), 1024), dtype=np.int64)
    emb.gather_pool(np.ascontiguousarray(rows, dtype=np.float32), ids[:len(rows)], offsets, _SUM, -1, out,
                    _NO_ARGMAX)
    return out


def _example_of_each_row(offsets):
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


@register_op
class SequenceExpandAs(OpDef):
    """Out = row b of X repeated once per row of sequence b of Y, with Y's LoD (X: one row
    per example; its own LoD, if any, is not used, as Paddle). dX[b] = the sum of dOut over
    sequence b. ``sequence_expand`` of an X without LoD is the same op."""

    type = "sequence_expand_as"
    grad_slots = ("X",)
    lod = lod.SEQUENCE

    def infer_shape(self, op, block):
        x, y = block.var(op.input("X")[0]), block.var(op.input("Y")[0])
        if y.lod_level != 1:
            raise ConfigError(f"{op.type} y {y.name!r} must be lod_level=1 (it gives the lengths to repeat "
                              f"by); pass the sequence input as y")
        if x.lod_level:
            raise ConfigError(f"{op.type} x {x.name!r} is lod_level=1: x must have one row per example; "
                              + lod.POOL_HINT.format(name=x.name))
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, 1

    def forward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        if not isinstance(y, LoDTensor):
            raise DataError(f"{ctx.op.type} y {ctx.input_name('Y')!r} must hold sequences (lod_level=1)")
        if len(x) != y.batch_size:
            raise DataError(f"{ctx.op.type}: x {ctx.input_name('X')!r} has {len(x)} rows but y "
                            f"{ctx.input_name('Y')!r} has {y.batch_size} sequences; give x one row per "
                            f"example")
        ctx.set_output("Out", LoDTensor(np.ascontiguousarray(x[_example_of_each_row(y.offsets)]), y.offsets))

    def backward(self, ctx):
        x, y = ctx.input("X"), ctx.input("Y")
        g = ctx.input("Out@GRAD")
        g = g.values if isinstance(g, LoDTensor) else g
        ctx.set_output("X@GRAD", segment_sum(g, y.offsets, ctx).astype(x.dtype, copy=False).reshape(x.shape))


@register_op
class SequenceExpand(SequenceExpandAs):
    """Paddle's sequence_expand for an X without LoD and ``ref_level`` -1 or 0 (the only
    level fleet has): the same as sequence_expand_as."""

    type = "sequence_expand"


@register_op
class SequenceSoftmax(OpDef):
    """Out = softmax over the rows of each sequence of X ([total, 1] or [total]): the
    weights within one example sum to 1."""

    type = "sequence_softmax"
    grad_slots = ("X",)
    lod = lod.SEQUENCE

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        if x.lod_level != 1:
            raise ConfigError(f"sequence_softmax input {x.name!r} must be lod_level=1 (a softmax within "
                              f"each sequence); use layers.softmax for one row per example")
        if len(x.shape) > 2 or (len(x.shape) == 2 and x.shape[1] != 1):
            raise ConfigError(f"sequence_softmax input {x.name!r} {list(x.shape)} must have one value per "
                              f"row ([-1, 1])")
        out = block.var(op.output("Out")[0])
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, 1

    @staticmethod
    def _segments(offsets):
        lengths = np.diff(offsets)
        nonempty = lengths > 0
        starts = offsets[:-1][nonempty]
        return starts, np.repeat(np.arange(len(starts)), lengths[nonempty])

    def forward(self, ctx):
        x = ctx.input("X")
        if not isinstance(x, LoDTensor):
            raise DataError(f"sequence_softmax input {ctx.input_name('X')!r} must hold sequences (lod_level=1)")
        values = x.values.reshape(-1)
        out = np.empty_like(values)
        if len(values):
            starts, seg = self._segments(x.offsets)
            np.subtract(values, np.maximum.reduceat(values, starts)[seg], out=out)
            np.exp(out, out=out)
            out /= np.add.reduceat(out, starts)[seg]
        ctx.set_output("Out", LoDTensor(out.reshape(x.values.shape), x.offsets))

    def backward(self, ctx):
        x = ctx.input("X")
        out = ctx.input("Out").values.reshape(-1)
        g = ctx.input("Out@GRAD")
        g = (g.values if isinstance(g, LoDTensor) else g).reshape(-1)
        dx = np.empty_like(out)
        if len(out):
            starts, seg = self._segments(x.offsets)
            np.multiply(g, out, out=dx)
            dx = out * (g - np.add.reduceat(dx, starts)[seg])
        ctx.set_output("X@GRAD", LoDTensor(dx.astype(np.float32, copy=False).reshape(x.values.shape), x.offsets))
