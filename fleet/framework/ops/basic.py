"""Constant, random-initializer, sum, scale, cast, reshape and concat ops."""
import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import SparseRows

NP = {"float32": np.float32, "int64": np.int64, "float64": np.float64, "int32": np.int32,
      "bool": np.bool_}


def _out_var(op, block, slot="Out"):
    return block.var(op.output(slot)[0])


@register_op
class FillConstant(OpDef):
    type = "fill_constant"

    def forward(self, ctx):
        a = ctx.attrs
        ctx.set_output("Out", np.full(a["shape"], a["value"], dtype=NP[a.get("dtype", "float32")]))


def _rng(ctx):
    name = ctx.output_name("Out")
    seed = ctx.op.block.program.seed_for(name, ctx.attrs.get("seed", 0))
    return np.random.default_rng(seed if seed else None)


@register_op
class UniformRandom(OpDef):
    type = "uniform_random"

    def forward(self, ctx):
        a = ctx.attrs
        low, high = float(a["min"]), float(a["max"])
        out = _rng(ctx).random(tuple(a["shape"]), dtype=np.float32)
        out *= np.float32(high - low)
        out += np.float32(low)
        ctx.set_output("Out", out)


@register_op
class GaussianRandom(OpDef):
    type = "gaussian_random"

    def forward(self, ctx):
        a = ctx.attrs
        out = _rng(ctx).standard_normal(tuple(a["shape"]), dtype=np.float32)
        out *= np.float32(a["std"])
        out += np.float32(a["mean"])
        ctx.set_output("Out", out)


@register_op
class TruncatedGaussianRandom(OpDef):
    type = "truncated_gaussian_random"

    def forward(self, ctx):
        a = ctx.attrs
        rng = _rng(ctx)
        out = rng.standard_normal(tuple(a["shape"]), dtype=np.float32)
        bad = np.abs(out) > 2.0
        while bad.any():  # resample outside two standard deviations, as Paddle
            out[bad] = rng.standard_normal(int(bad.sum()), dtype=np.float32)
            bad = np.abs(out) > 2.0
        out *= np.float32(a["std"])
        out += np.float32(a["mean"])
        ctx.set_output("Out", out)


@register_op
class AssignValue(OpDef):
    type = "assign_value"

    def forward(self, ctx):
        a = ctx.attrs
        ctx.set_output("Out", np.array(a["values"], dtype=NP[a.get("dtype", "float32")]).reshape(a["shape"]))


@register_op
class Sum(OpDef):
    """Out = sum of X; SparseRows inputs are concatenated (merged later by the optimizer)."""

    type = "sum"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def forward(self, ctx):
        xs = [x for x in ctx.inputs("X") if x is not None]
        if not xs:
            raise ConfigError(f"sum op {ctx.op!r} got no inputs")
        if isinstance(xs[0], SparseRows):
            dense = [x for x in xs if not isinstance(x, SparseRows)]
            rows = np.concatenate([x.rows for x in xs if isinstance(x, SparseRows)])
            values = np.concatenate([x.values for x in xs if isinstance(x, SparseRows)])
            out = SparseRows(rows, values, xs[0].height)
            if dense:
                total = out.to_dense()
                for d in dense:
                    total += d
                out = total
            ctx.set_output("Out", out)
            return
        out = ctx.buffer("Out", xs[0].shape, xs[0].dtype)
        np.copyto(out, xs[0])
        for x in xs[1:]:
            if isinstance(x, SparseRows):
                np.add.at(out, x.rows, x.values)
            else:
                out += x
        ctx.set_output("Out", out)

    def backward(self, ctx):
        g = ctx.input("Out@GRAD")
        for i in range(len(ctx.op.input("X"))):
            if ctx.wants("X@GRAD", i):
                ctx.set_output("X@GRAD", g, i)


@register_op
class Scale(OpDef):
    """Out = X * scale + bias (bias_after_scale) or (X + bias) * scale."""

    type = "scale"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = _out_var(op, block)
        out.shape, out.dtype, out.lod_level = x.shape, x.dtype, x.lod_level

    def forward(self, ctx):
        x = ctx.input("X")
        a = ctx.attrs
        s, b = np.float32(a.get("scale", 1.0)), np.float32(a.get("bias", 0.0))
        out = ctx.buffer("Out", x.shape, x.dtype)
        if a.get("bias_after_scale", True):
            np.multiply(x, s, out=out, casting="unsafe")
            out += b.astype(x.dtype)
        else:
            np.add(x, b, out=out, casting="unsafe")
            out *= s.astype(x.dtype)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        g = ctx.input("Out@GRAD")
        dx = ctx.buffer("X@GRAD", g.shape, g.dtype)
        np.multiply(g, np.float32(ctx.attrs.get("scale", 1.0)), out=dx, casting="unsafe")
        ctx.set_output("X@GRAD", dx)


@register_op
class Cast(OpDef):
    type = "cast"
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        out = _out_var(op, block)
        out.shape = x.shape

    def forward(self, ctx):
        ctx.set_output("Out", np.asarray(ctx.input("X")).astype(NP[ctx.attrs["out_dtype"]]))


@register_op
class Reshape(OpDef):
    """Out = X with another shape (0 keeps the input's dim, one -1 is inferred). A
    lod_level=1 input keeps its LoD when its rows stay rows (Paddle shares the LoD when the
    first dimension is unchanged)."""

    type = "reshape"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def check_rowwise(self, op, block, seqs):
        x = block.var(op.input("X")[0])
        shape = list(op.attr("shape"))
        row = int(np.prod(x.shape[1:])) if len(x.shape) > 1 else 1
        rest = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)][1:]
        keeps_rows = (bool(shape) and shape[0] in (0, -1) and all(d > 0 for d in rest)
                      and int(np.prod(rest)) == row and min(x.shape[1:], default=1) >= 0)
        if not keeps_rows:
            raise lod.refuse(op, x, f"reshape to {shape} does not keep one row per id (the first "
                                    f"dimension must stay 0 or -1, the others hold {row} values)")

    def forward(self, ctx):
        x = ctx.input("X")
        shape = list(ctx.attrs["shape"])
        for i, d in enumerate(shape):
            if d == 0:
                shape[i] = x.shape[i]
        ctx.set_output("Out", x.reshape(shape))

    def backward(self, ctx):
        x = ctx.input("X")
        ctx.set_output("X@GRAD", np.asarray(ctx.input("Out@GRAD")).reshape(x.shape))


def _check_one_id_each(ctx, xs):
    """A concat joining sequences with per-example inputs: every input must have one row
    per example (each sequence exactly one id)."""
    names = ctx.op.input("X")
    block = ctx.op.block
    examples = next(x.shape[0] for n, x in zip(names, xs) if not block.var(n).lod_level)
    for name, x in zip(names, xs):
        if x.shape[0] != examples:
            raise DataError(
                f"concat of {name!r} (lod_level=1) with inputs of one row per example: its sequences "
                f"hold {x.shape[0]} ids for {examples} examples, and joining them needs exactly one id per "
                f"example; " + lod.POOL_HINT.format(name=name))


@register_op
class Concat(OpDef):
    """Out = X joined along ``axis``; lod_level=1 inputs (with the same sequence lengths)
    join row by row along an axis >= 1."""

    type = "concat"
    grad_slots = ("X",)
    lod = lod.ROWWISE
    joins_single_ids = True

    def infer_shape(self, op, block):
        xs = [block.var(n) for n in op.input("X")]
        axis = op.attr("axis", 0)
        ndim = len(xs[0].shape)
        axis = axis + ndim if axis < 0 else axis
        shape = list(xs[0].shape)
        dims = [x.shape[axis] for x in xs]
        shape[axis] = -1 if any(d < 0 for d in dims) else sum(dims)
        for x in xs[1:]:
            if len(x.shape) != ndim or any(
                    a != b and a >= 0 and b >= 0 for i, (a, b) in enumerate(zip(x.shape, xs[0].shape)) if i != axis):
                raise ConfigError(
                    f"concat inputs must match except on axis {axis}: {xs[0].name} is "
                    f"{list(xs[0].shape)}, {x.name} is {list(x.shape)}")
        out = _out_var(op, block)
        out.shape, out.dtype = tuple(shape), xs[0].dtype
        op.attrs["axis"] = axis

    def check_rowwise(self, op, block, seqs):
        plain = [block.var(n) for n in op.input("X") if not block.var(n).lod_level]
        if plain and not op.attr(lod.ONE_ID_PER_SEQUENCE):
            raise ConfigError(lod.mixed_message("concat", seqs[0], plain[0]))
        if op.attr("axis") == 0:
            raise lod.refuse(op, seqs[0], "concat along axis 0 would stack the ids of different "
                                          "batches; join sequences along axis 1",
                             "use axis=1, or " + lod.POOL_HINT.format(name=seqs[0].name))

    def forward(self, ctx):
        xs = ctx.inputs("X")
        axis = ctx.attrs["axis"]
        if ctx.attrs.get(lod.ONE_ID_PER_SEQUENCE):
            _check_one_id_each(ctx, xs)
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = ctx.buffer("Out", tuple(shape), xs[0].dtype)
        np.concatenate(xs, axis=axis, out=out)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        g = ctx.input("Out@GRAD")
        axis = ctx.attrs["axis"]
        start = 0
        for i, x in enumerate(ctx.inputs("X")):
            width = x.shape[axis]
            if ctx.wants("X@GRAD", i):
                idx = [slice(None)] * g.ndim
                idx[axis] = slice(start, start + width)
                ctx.set_output("X@GRAD", np.ascontiguousarray(g[tuple(idx)]), i)
            start += width
