"""Metric ops: accuracy and AUC (global and sliding-window), which have no gradient."""
import threading

import numpy as np

from fleet.framework.registry import OpDef, register_op

_AUC_LOCKS = {}
_AUC_LOCKS_GUARD = threading.Lock()
_LAST_GROUP = {}  # window state name -> the step group that last wrote it


def _lock_for(name):
    with _AUC_LOCKS_GUARD:
        return _AUC_LOCKS.setdefault(name, threading.Lock())


@register_op
class Accuracy(OpDef):
    """Fraction of examples whose label is among the top-k predictions."""

    type = "accuracy"

    def forward(self, ctx):
        x = ctx.input("Out")
        label = np.asarray(ctx.input("Label")).reshape(-1)
        k = int(ctx.attrs.get("k", 1))
        if k == 1:
            hit = x.argmax(axis=1) == label
        else:
            top = np.argpartition(-x, k - 1, axis=1)[:, :k]
            hit = (top == label[:, None]).any(axis=1)
        correct, total = int(hit.sum()), len(label)
        ctx.set_output("Accuracy", np.array([correct / total if total else 0.0], dtype=np.float32))
        ctx.set_output("Correct", np.array([correct], dtype=np.int64))
        ctx.set_output("Total", np.array([total], dtype=np.int64))


def auc_from_stats(pos, neg):
    """Area under the ROC curve from per-bucket positive and negative counts (Paddle's
    trapezoid sum from the highest bucket down); 0.0 when either class is absent."""
    pos = np.asarray(pos, dtype=np.float64)[::-1]
    neg = np.asarray(neg, dtype=np.float64)[::-1]
    tp = np.cumsum(pos)
    fp = np.cumsum(neg)
    tot_pos, tot_neg = tp[-1] if len(tp) else 0.0, fp[-1] if len(fp) else 0.0
    if tot_pos <= 0 or tot_neg <= 0:
        return 0.0
    prev_tp = np.concatenate(([0.0], tp[:-1]))
    area = np.sum(neg * (tp + prev_tp) / 2.0)
    return float(area / (tot_pos * tot_neg))


@register_op
class Auc(OpDef):
    """AUC of the positive-class probability, bucketed into num_thresholds+1 bins.

    State (persistable, zero to reset): StatPos / StatNeg accumulate every batch since the
    start; BatchStatPos / BatchStatNeg hold the last ``slide_steps`` batches (one row per
    step, used as a ring) for the sliding-window batch AUC, or with ``slide_steps`` 0 one
    row that accumulates every batch (the batch AUC then covers them all).
    """

    type = "auc"

    def forward(self, ctx):
        predict = ctx.input("Predict")
        label = np.asarray(ctx.input("Label")).reshape(-1)
        t = int(ctx.attrs.get("num_thresholds", 4095))
        p1 = predict[:, 1] if predict.ndim == 2 and predict.shape[1] > 1 else predict.reshape(-1)
        bucket = np.clip((p1.astype(np.float64) * t).astype(np.int64), 0, t)
        positive = label > 0
        batch_pos = np.bincount(bucket[positive], minlength=t + 1).astype(np.int64)
        batch_neg = np.bincount(bucket[~positive], minlength=t + 1).astype(np.int64)
        stat_pos, stat_neg = ctx.input("StatPos"), ctx.input("StatNeg")
        win_pos, win_neg = ctx.input("BatchStatPos"), ctx.input("BatchStatNeg")
        with _lock_for(ctx.input_name("StatPos")):
            stat_pos += batch_pos
            stat_neg += batch_neg
            # Row 0 of the window holds the step counter's slot index; rows 1.. the steps.
            # The parts of one batch split across Reduce threads share a step group and
            # add into one slot, so the window counts batches whatever the thread count.
            slide = win_pos.shape[0] - 1
            group = getattr(ctx.runner, "step_group", None)
            key = ctx.input_name("BatchStatPos")
            if int(ctx.attrs.get("slide_steps", 1)) == 0:
                # No window: one row accumulates every batch (the parts of a Reduce step too).
                if group is None or _LAST_GROUP.get(key) != group:
                    win_pos[0, 0] += 1
                win_pos[1] += batch_pos
                win_neg[1] += batch_neg
            elif group is not None and _LAST_GROUP.get(key) == group:
                slot = 1 + (int(win_pos[0, 0]) - 1) % slide
                win_pos[slot] += batch_pos
                win_neg[slot] += batch_neg
            else:
                slot = 1 + int(win_pos[0, 0]) % slide
                win_pos[0, 0] += 1
                win_pos[slot] = batch_pos
                win_neg[slot] = batch_neg
            _LAST_GROUP[key] = group
            auc = auc_from_stats(stat_pos, stat_neg)
            batch_auc = auc_from_stats(win_pos[1:].sum(axis=0), win_neg[1:].sum(axis=0))
        ctx.set_output("AUC", np.array([auc], dtype=np.float64))
        ctx.set_output("BatchAUC", np.array([batch_auc], dtype=np.float64))
