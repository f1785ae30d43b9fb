"""dropout, batch_norm and layer_norm, with Paddle's attributes and train / test behaviour.

``is_test`` (set on every op by ``Program.clone(for_test=True)``) switches dropout to its
inference scaling and batch_norm to its moving statistics. All three work row by row on
lod_level=1 values (batch_norm's statistics then cover every id of the batch).
"""
import numpy as np

from fleet.framework import lod
from fleet.framework.registry import OpDef, register_op

DOWNGRADE, UPSCALE = "downgrade_in_infer", "upscale_in_train"


def _same_as_x(op, block, slots):
    x = block.var(op.input("X")[0])
    for slot in slots:
        for name in op.output(slot):
            var = block.var(name)
            var.shape, var.dtype = x.shape, x.dtype


@register_op
class Dropout(OpDef):
    """Training: Out = X * Mask, Mask[i] = 1 with probability 1 - dropout_prob, and with
    "upscale_in_train" divided by 1 - dropout_prob. Test: "downgrade_in_infer" gives
    X * (1 - dropout_prob), "upscale_in_train" gives X.

    Masks: with ``fix_seed`` every run draws the same mask from ``seed`` (Paddle's rule for
    an explicit seed); otherwise each runner (thread) draws a new mask every run from its
    own generator, seeded from the program's ``random_seed`` and the output's name when the
    program has one (a run is then repeatable), else from fresh entropy.
    """

    type = "dropout"
    grad_slots = ("X",)
    lod = lod.ROWWISE

    def infer_shape(self, op, block):
        _same_as_x(op, block, ("Out", "Mask"))
        for name in op.output("Mask"):
            block.var(name).dtype = "bool"

    @staticmethod
    def _generator(ctx):
        a = ctx.attrs
        if a.get("fix_seed"):
            return np.random.default_rng(int(a.get("seed", 0)))
        key = "@dropout_rng:" + ctx.output_name("Out")
        rng = ctx.local.get(key)
        if rng is None:
            seed = ctx.op.block.program.seed_for(ctx.output_name("Out"))
            rng = ctx.local[key] = np.random.default_rng(seed or None)
        return rng

    def forward(self, ctx):
        x = ctx.input("X")
        a = ctx.attrs
        p = np.float32(a.get("dropout_prob", 0.5))
        upscale = a.get("dropout_implementation", DOWNGRADE) == UPSCALE
        out = ctx.buffer("Out", x.shape, x.dtype)
        if a.get("is_test"):
            if upscale:
                np.copyto(out, x)
            else:
                np.multiply(x, 1 - p, out=out)
            ctx.set_output("Out", out)
            return
        keep = ctx.buffer("Mask", x.shape, np.bool_)
        np.greater_equal(self._generator(ctx).random(x.shape, dtype=np.float32), p, out=keep)
        np.multiply(x, keep, out=out)
        if upscale:
            out *= 0 if p >= 1 else 1 / (1 - p)
        ctx.set_output("Mask", keep)
        ctx.set_output("Out", out)

    def backward(self, ctx):
        g = ctx.input("Out@GRAD")
        a = ctx.attrs
        dx = ctx.buffer("X@GRAD", g.shape, g.dtype)
        np.multiply(g, ctx.input("Mask"), out=dx)
        if a.get("dropout_implementation", DOWNGRADE) == UPSCALE:
            p = np.float32(a.get("dropout_prob", 0.5))
            dx *= 0 if p >= 1 else 1 / (1 - p)
        ctx.set_output("X@GRAD", dx)


def channel_axis(ndim, layout):
    """The channel dim batch_norm normalizes per: 1 for NCHW (and for any 2-D input), the
    last for NHWC."""
    return ndim - 1 if layout == "NHWC" and ndim > 2 else 1


@register_op
class BatchNorm(OpDef):
    """Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias per channel. Training uses the
    batch's mean and (biased) variance and moves Mean / Variance (the same variables as
    MeanOut / VarianceOut) towards them: m = m * momentum + batch * (1 - momentum). With
    ``is_test`` or ``use_global_stats`` it uses Mean / Variance and leaves them alone.
    SavedMean / SavedVariance hold the mean and 1 / sqrt(var + epsilon) used (for the
    gradient)."""

    type = "batch_norm"
    grad_slots = ("X", "Scale", "Bias")
    lod = lod.ROWWISE
    lod_outputs = ("Y",)

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        y = block.var(op.output("Y")[0])
        y.shape, y.dtype = x.shape, x.dtype

    @staticmethod
    def _layout(ctx, x):
        axis = channel_axis(x.ndim, ctx.attrs.get("data_layout", "NCHW"))
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        return tuple(i for i in range(x.ndim) if i != axis), shape

    @staticmethod
    def _global(attrs):
        return bool(attrs.get("is_test") or attrs.get("use_global_stats"))

    def forward(self, ctx):
        x = ctx.input("X")
        a = ctx.attrs
        axes, shape = self._layout(ctx, x)
        eps = np.float32(a.get("epsilon", 1e-5))
        moving_mean, moving_var = ctx.input("Mean"), ctx.input("Variance")
        if self._global(a):
            mean, var = moving_mean.astype(np.float32), moving_var.astype(np.float32)
        else:
            mean = x.mean(axis=axes, dtype=np.float32)
            var = np.square(x - mean.reshape(shape)).mean(axis=axes, dtype=np.float32)
            m = np.float32(a.get("momentum", 0.9))
            moving_mean *= m  # in place: MeanOut / VarianceOut are the same variables
            moving_mean += (1 - m) * mean
            moving_var *= m
            moving_var += (1 - m) * var
            ctx.set_output("MeanOut", moving_mean)
            ctx.set_output("VarianceOut", moving_var)
        inv_std = 1 / np.sqrt(var + eps)
        y = ctx.buffer("Y", x.shape, x.dtype)
        np.subtract(x, mean.reshape(shape), out=y)
        y *= (inv_std * ctx.input("Scale")).reshape(shape)
        y += ctx.input("Bias").reshape(shape)
        ctx.set_output("SavedMean", mean)
        ctx.set_output("SavedVariance", inv_std)
        ctx.set_output("Y", y)

    def backward(self, ctx):
        x = ctx.input("X")
        g = ctx.input("Y@GRAD")
        axes, shape = self._layout(ctx, x)
        mean = ctx.input("SavedMean").reshape(shape)
        inv_std = ctx.input("SavedVariance").reshape(shape)
        xhat = (x - mean) * inv_std
        dbias = g.sum(axis=axes, dtype=np.float32)
        dscale = (g * xhat).sum(axis=axes, dtype=np.float32)
        if ctx.wants("Bias@GRAD"):
            ctx.set_output("Bias@GRAD", dbias)
        if ctx.wants("Scale@GRAD"):
            ctx.set_output("Scale@GRAD", dscale)
        if ctx.wants("X@GRAD"):
            scale = ctx.input("Scale").reshape(shape)
            dx = ctx.buffer("X@GRAD", x.shape, x.dtype)
            if self._global(ctx.attrs):  # the statistics are constants
                np.multiply(g, scale * inv_std, out=dx)
            else:
                count = np.float32(x.size / max(int(np.prod(shape)), 1))  # elements per channel
                np.multiply(xhat, dscale.reshape(shape), out=dx)
                dx += dbias.reshape(shape)
                dx *= np.float32(-1) / count
                dx += g
                dx *= scale * inv_std
            ctx.set_output("X@GRAD", dx)


@register_op
class LayerNorm(OpDef):
    """Y = (X - mean) / sqrt(var + epsilon) * Scale + Bias, mean and (biased) variance over
    the dims from ``begin_norm_axis`` on (each example, or each row, on its own); Scale and
    Bias (optional) have one value per normalized element."""

    type = "layer_norm"
    grad_slots = ("X", "Scale", "Bias")
    lod = lod.ROWWISE
    lod_outputs = ("Y",)

    def infer_shape(self, op, block):
        x = block.var(op.input("X")[0])
        y = block.var(op.output("Y")[0])
        y.shape, y.dtype = x.shape, x.dtype

    @staticmethod
    def _rows(ctx, x):
        axis = ctx.attrs.get("begin_norm_axis", 1)
        return x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))

    def forward(self, ctx):
        x = ctx.input("X")
        x2 = self._rows(ctx, x)
        mean = x2.mean(axis=1, dtype=np.float32)
        var = np.square(x2 - mean[:, None]).mean(axis=1, dtype=np.float32)
        inv_std = 1 / np.sqrt(var + np.float32(ctx.attrs.get("epsilon", 1e-5)))
        y = ctx.buffer("Y", x.shape, x.dtype)
        y2 = y.reshape(x2.shape)
        np.subtract(x2, mean[:, None], out=y2)
        y2 *= inv_std[:, None]
        scale, bias = ctx.input_opt("Scale"), ctx.input_opt("Bias")
        if scale is not None:
            y2 *= scale
        if bias is not None:
            y2 += bias
        ctx.set_output("Mean", mean)
        ctx.set_output("Variance", var)
        ctx.set_output("Y", y)

    def backward(self, ctx):
        x = ctx.input("X")
        x2 = self._rows(ctx, x)
        g = ctx.input("Y@GRAD").reshape(x2.shape)
        mean, var = ctx.input("Mean"), ctx.input("Variance")
        inv_std = (1 / np.sqrt(var + np.float32(ctx.attrs.get("epsilon", 1e-5))))[:, None]
        xhat = (x2 - mean[:, None]) * inv_std
        if ctx.wants("Bias@GRAD"):
            ctx.set_output("Bias@GRAD", g.sum(axis=0, dtype=np.float32))
        if ctx.wants("Scale@GRAD"):
            ctx.set_output("Scale@GRAD", (g * xhat).sum(axis=0, dtype=np.float32))
        if ctx.wants("X@GRAD"):
            scale = ctx.input_opt("Scale")
            dxhat = g * scale if scale is not None else g
            dx = dxhat - dxhat.mean(axis=1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=1, keepdims=True)
            dx *= inv_std
            ctx.set_output("X@GRAD", dx.astype(x.dtype, copy=False).reshape(x.shape))
