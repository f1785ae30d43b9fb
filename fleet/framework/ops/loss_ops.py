"""softmax_with_cross_entropy: softmax and cross entropy in one numerically stable op."""
import numpy as np

from fleet.errors import DataError
from fleet.framework.registry import OpDef, register_op


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@register_op
class SoftmaxWithCrossEntropy(OpDef):
    """Softmax = softmax(Logits) over the last axis; Loss [N, 1] = -log Softmax[Label] for
    class ids (0 where Label == ignore_index), or -sum(Label * log Softmax) for soft labels.
    dLogits = (Softmax - onehot(Label)) * dLoss (Label itself for soft labels)."""

    type = "softmax_with_cross_entropy"
    grad_slots = ("Logits",)

    def infer_shape(self, op, block):
        logits = block.var(op.input("Logits")[0])
        block.var(op.output("Softmax")[0]).shape = logits.shape
        block.var(op.output("Loss")[0]).shape = tuple(logits.shape[:-1]) + (1,)

    def _labels(self, ctx, logits):
        label = ctx.input("Label")
        if ctx.attrs.get("soft_label"):
            return np.asarray(label, dtype=np.float32).reshape(logits.shape), None
        lab = np.asarray(label).reshape(-1).astype(np.int64, copy=False)
        rows = int(np.prod(logits.shape[:-1]))
        if len(lab) != rows:
            raise DataError(f"softmax_with_cross_entropy label {ctx.input_name('Label')!r} has {len(lab)} "
                            f"entries for {rows} rows of logits; feed one class id per row")
        ignore = lab == ctx.attrs.get("ignore_index", -100)
        bad = ((lab < 0) | (lab >= logits.shape[-1])) & ~ignore
        if bad.any():
            raise DataError(f"softmax_with_cross_entropy label {ctx.input_name('Label')!r} values must be class "
                            f"ids in [0, {logits.shape[-1]}), got {int(lab[bad][0])}; feed ids below the "
                            f"number of classes (or ignore_index)")
        return lab, ignore

    def forward(self, ctx):
        logits = ctx.input("Logits")
        log_p = _log_softmax(logits)
        labels, ignore = self._labels(ctx, logits)
        if ignore is None:
            loss = -(labels * log_p).sum(axis=-1, keepdims=True)
        else:
            flat = log_p.reshape(-1, logits.shape[-1])
            loss = -flat[np.arange(len(labels)), np.where(ignore, 0, labels)]
            loss[ignore] = 0
            loss = loss.reshape(logits.shape[:-1] + (1,))
        ctx.set_output("Softmax", np.exp(log_p, dtype=np.float32))
        ctx.set_output("Loss", loss.astype(np.float32, copy=False))

    def backward(self, ctx):
        logits = ctx.input("Logits")
        softmax = ctx.input("Softmax")
        g = ctx.input("Loss@GRAD").reshape(logits.shape[:-1] + (1,))
        labels, ignore = self._labels(ctx, logits)
        if ignore is None:
            dx = softmax - labels
        else:
            dx = softmax.reshape(-1, logits.shape[-1]).copy()
            dx[np.arange(len(labels)), np.where(ignore, 0, labels)] -= np.where(ignore, 0, 1).astype(np.float32)
            dx[ignore] = 0
            dx = dx.reshape(logits.shape)
        dx *= g
        ctx.set_output("Logits@GRAD", dx.astype(np.float32, copy=False))
