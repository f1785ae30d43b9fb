"""Shape ops: transpose, unsqueeze, squeeze, expand, stack, split and slice.

Each has Paddle's attributes (transpose ``axis``; unsqueeze / squeeze ``axes``; expand
``expand_times``; stack / split ``axis``; split ``sections`` or ``num``; slice ``axes``,
``starts``, ``ends``, ``decrease_axis``). On lod_level=1 values they work row by row
when they leave dim 0 (the rows, one per id) alone, and are refused at build time when
they would move it.
"""
import numpy as np

from fleet.errors import ConfigError
from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op


def _x(op, block, slot="X"):
    return block.var(op.input(slot)[0])


def _set(block, name, shape, dtype):
    var = block.var(name)
    var.shape, var.dtype = tuple(int(d) for d in shape), dtype


def _moves_rows(op, seqs, moved, what):
    if moved:
        raise lod.refuse(op, seqs[0], f"{what} would move dim 0, the rows (one per id)")


@register_op
class Transpose(OpDef):
    """Out = X with its dims permuted by ``axis`` (Paddle's transpose2 attribute)."""

    type = "transpose"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = _x(op, block)
        _set(block, op.output("Out")[0], [x.shape[p] for p in op.attr("axis")], x.dtype)

    def check_rowwise(self, op, block, seqs):
        _moves_rows(op, seqs, op.attr("axis")[0] != 0, f"perm {list(op.attr('axis'))}")

    def forward(self, ctx):
        x = ctx.input("X")
        perm = ctx.attrs["axis"]
        out = ctx.buffer("Out", tuple(x.shape[p] for p in perm), x.dtype)
        np.copyto(out, x.transpose(perm))
        ctx.set_output("Out", out)

    def backward(self, ctx):
        g = ctx.input("Out@GRAD")
        ctx.set_output("X@GRAD", np.ascontiguousarray(g.transpose(np.argsort(ctx.attrs["axis"]))))


def unsqueezed_shape(shape, axes):
    """Paddle's unsqueeze: each axis (negative: from the end of the shape so far) inserts
    a dim of 1, in the order given."""
    out = list(shape)
    for a in axes:
        a = a + len(out) + 1 if a < 0 else a
        out.insert(a, 1)
    return out


def squeezed_axes(shape, axes):
    """The dims squeeze removes: ``axes`` (normalized), or every dim of 1 when empty."""
    if not axes:
        return [i for i, d in enumerate(shape) if d == 1]
    return sorted({a + len(shape) if a < 0 else a for a in axes})


class _Reshaping(OpDef):
    """An op whose output is its input with another shape (a view); the gradient is the
    output gradient reshaped back."""

    grad_slots = ("X",)
    lod = lod.ROWWISE

    def forward(self, ctx):
        x = ctx.input("X")
        ctx.set_output("Out", x.reshape(self.out_shape(ctx.attrs, x.shape)))

    def backward(self, ctx):
        ctx.set_output("X@GRAD", ctx.input("Out@GRAD").reshape(ctx.input("X").shape))


@register_op
class Unsqueeze(_Reshaping):
    type = "unsqueeze"

    def out_shape(self, attrs, shape):
        return unsqueezed_shape(shape, attrs["axes"])

    def infer_shape(self, op, block):
        x = _x(op, block)
        _set(block, op.output("Out")[0], self.out_shape(op.attrs, x.shape), x.dtype)

    def check_rowwise(self, op, block, seqs):
        shape = self.out_shape(op.attrs, [-2] + [0] * (len(seqs[0].shape) - 1))
        _moves_rows(op, seqs, shape[0] != -2, f"axes {list(op.attr('axes'))}")


@register_op
class Squeeze(_Reshaping):
    type = "squeeze"

    def out_shape(self, attrs, shape):
        drop = squeezed_axes(shape, attrs["axes"])
        return [d for i, d in enumerate(shape) if i not in drop]

    def infer_shape(self, op, block):
        x = _x(op, block)
        _set(block, op.output("Out")[0], self.out_shape(op.attrs, x.shape), x.dtype)

    def check_rowwise(self, op, block, seqs):
        _moves_rows(op, seqs, 0 in squeezed_axes(seqs[0].shape, op.attr("axes")), f"axes {list(op.attr('axes'))}")


@register_op
class Expand(OpDef):
    """Out = X tiled ``expand_times[i]`` times along each dim i."""

    type = "expand"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = _x(op, block)
        shape = [d * t if d >= 0 else -1 for d, t in zip(x.shape, op.attr("expand_times"))]
        _set(block, op.output("Out")[0], shape, x.dtype)

    def check_rowwise(self, op, block, seqs):
        _moves_rows(op, seqs, op.attr("expand_times")[0] != 1, f"expand_times {list(op.attr('expand_times'))}")

    def forward(self, ctx):
        x = ctx.input("X")
        times = ctx.attrs["expand_times"]
        out = ctx.buffer("Out", tuple(d * t for d, t in zip(x.shape, times)), x.dtype)
        np.copyto(out, np.tile(x, times))
        ctx.set_output("Out", out)

    def backward(self, ctx):
        x = ctx.input("X")
        times = ctx.attrs["expand_times"]
        g = ctx.input("Out@GRAD")
        split = [v for t, d in zip(times, x.shape) for v in (t, d)]  # (t0, d0, t1, d1, ...)
        dx = g.reshape(split).sum(axis=tuple(range(0, 2 * x.ndim, 2)), dtype=g.dtype)
        ctx.set_output("X@GRAD", np.ascontiguousarray(dx))


@register_op
class Stack(OpDef):
    """Out = the X (all of one shape) stacked along a new dim ``axis``."""

    type = "stack"
    grad_slots = ("X",)
    lod = lod.ROWWISE
    lod_outputs = ("Y",)

    def infer_shape(self, op, block):
        xs = [block.var(n) for n in op.input("X")]
        axis = op.attr("axis")
        axis = axis + len(xs[0].shape) + 1 if axis < 0 else axis
        op.attrs["axis"] = axis
        for x in xs[1:]:
            if x.shape != xs[0].shape:
                raise ConfigError(f"stack inputs must have one shape: {xs[0].name} is "
                                  f"{list(xs[0].shape)}, {x.name} is {list(x.shape)}")
        shape = list(xs[0].shape)
        shape.insert(axis, len(xs))
        _set(block, op.output("Y")[0], shape, xs[0].dtype)

    def check_rowwise(self, op, block, seqs):
        plain = [block.var(n) for n in op.input("X") if not block.var(n).lod_level]
        if plain:
            raise ConfigError(lod.mixed_message("stack", seqs[0], plain[0]))
        _moves_rows(op, seqs, op.attr("axis") == 0, "axis 0")

    def forward(self, ctx):
        xs = ctx.inputs("X")
        axis = ctx.attrs["axis"]
        shape = list(xs[0].shape)
        shape.insert(axis, len(xs))
        out = ctx.buffer("Y", tuple(shape), xs[0].dtype)
        np.stack(xs, axis=axis, out=out)
        ctx.set_output("Y", out)

    def backward(self, ctx):
        g = ctx.input("Y@GRAD")
        axis = ctx.attrs["axis"]
        for i in range(len(ctx.op.input("X"))):
            if ctx.wants("X@GRAD", i):
                ctx.set_output("X@GRAD", np.ascontiguousarray(np.take(g, i, axis=axis)), i)


def split_sizes(dim, sections, num):
    """The sizes of split's parts along a dim of size ``dim`` (-1: unknown)."""
    if sections:
        sizes = list(sections)
        if -1 in sizes and dim >= 0:
            sizes[sizes.index(-1)] = dim - sum(s for s in sizes if s != -1)
        return sizes
    return [dim // num if dim >= 0 else -1] * num


@register_op
class Split(OpDef):
    """Out[i] = consecutive parts of X along ``axis``: ``num`` equal parts, or parts of
    the sizes in ``sections``."""

    type = "split"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = _x(op, block)
        axis = op.attr("axis")
        for name, size in zip(op.output("Out"), split_sizes(x.shape[axis], op.attr("sections"), op.attr("num"))):
            shape = list(x.shape)
            shape[axis] = size
            _set(block, name, shape, x.dtype)

    def check_rowwise(self, op, block, seqs):
        _moves_rows(op, seqs, op.attr("axis") == 0, "splitting along axis 0")

    def forward(self, ctx):
        x = ctx.input("X")
        axis = ctx.attrs["axis"]
        sizes = split_sizes(x.shape[axis], ctx.attrs["sections"], ctx.attrs["num"])
        for i, part in enumerate(np.split(x, np.cumsum(sizes)[:-1], axis=axis)):
            ctx.set_output("Out", np.ascontiguousarray(part), i)

    def backward(self, ctx):
        x = ctx.input("X")
        axis = ctx.attrs["axis"]
        sizes = split_sizes(x.shape[axis], ctx.attrs["sections"], ctx.attrs["num"])
        parts = []
        for i, g in enumerate(ctx.inputs("Out@GRAD")):
            if g is None:  # this part reaches no loss
                shape = list(x.shape)
                shape[axis] = sizes[i]
                g = np.zeros(shape, dtype=x.dtype)
            parts.append(g)
        ctx.set_output("X@GRAD", np.concatenate(parts, axis=axis))


def slice_bounds(dim, start, end):
    """Paddle's slice bounds on a dim of size ``dim``: negatives count from the end, both
    are clipped into [0, dim]."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    return min(max(start, 0), dim), min(max(end, 0), dim)


@register_op
class Slice(OpDef):
    """Out = X[starts[i]:ends[i]] along each of ``axes``; the dims in ``decrease_axis``
    (sliced to size 1) are dropped, as indexing with an int does."""

    type = "slice"
    grad_slots = ("Input",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = _x(op, block, "Input")
        shape = list(x.shape)
        for axis, start, end in zip(op.attr("axes"), op.attr("starts"), op.attr("ends")):
            if shape[axis] >= 0:
                lo, hi = slice_bounds(shape[axis], start, end)
                shape[axis] = max(hi - lo, 0)
        drop = set(op.attr("decrease_axis") or ())
        shape = [d for i, d in enumerate(shape) if i not in drop] or [1]
        _set(block, op.output("Out")[0], shape, x.dtype)

    def check_rowwise(self, op, block, seqs):
        _moves_rows(op, seqs, 0 in op.attr("axes"), "slicing along axis 0")

    @staticmethod
    def _index(attrs, shape):
        index = [slice(None)] * len(shape)
        for axis, start, end in zip(attrs["axes"], attrs["starts"], attrs["ends"]):
            index[axis] = slice(*slice_bounds(shape[axis], start, end))
        return tuple(index)

    def forward(self, ctx):
        x = ctx.input("Input")
        part = x[self._index(ctx.attrs, x.shape)]
        drop = set(ctx.attrs.get("decrease_axis") or ())
        shape = [d for i, d in enumerate(part.shape) if i not in drop] or [1]
        ctx.set_output("Out", np.ascontiguousarray(part).reshape(shape))

    def backward(self, ctx):
        x = ctx.input("Input")
        index = self._index(ctx.attrs, x.shape)
        dx = ctx.buffer("Input@GRAD", x.shape, x.dtype)
        dx.fill(0)
        dx[index] = ctx.input("Out@GRAD").reshape(dx[index].shape)
        ctx.set_output("Input@GRAD", dx)
