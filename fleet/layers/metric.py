"""Metric layers: accuracy and AUC."""
from fleet.errors import ConfigError
from fleet.layers.helper import append_op, check_var, create_tmp
from fleet.initializer import Constant


def accuracy(input, label, k=1, correct=None, total=None):
    """Top-k accuracy of a batch, shape [1]."""
    check_var(input, "input", "accuracy")
    check_var(label, "label", "accuracy")
    acc = create_tmp("accuracy", (1,), stop_gradient=True)
    correct = correct or create_tmp("accuracy", (1,), "int64", stop_gradient=True)
    total = total or create_tmp("accuracy", (1,), "int64", stop_gradient=True)
    append_op("accuracy", {"Out": input, "Label": label},
              {"Accuracy": acc, "Correct": correct, "Total": total}, {"k": k})
    return acc


def _state(name, shape):
    """A persistable int64 counter array, zeroed by the startup program (not a parameter:
    optimizers and servers leave it alone; each worker keeps its own)."""
    from fleet.framework.program import default_startup_program, unique_name
    from fleet.layers.helper import main_block

    var = main_block().create_var(unique_name.generate(f"auc.{name}"), shape=shape, dtype="int64",
                                  persistable=True, stop_gradient=True)
    Constant(0.0)(var, default_startup_program().global_block())
    return var


def auc(input, label, curve="ROC", num_thresholds=2 ** 12 - 1, topk=1, slide_steps=1):
    """Area under the ROC curve of the positive-class probability.

    Args:
        input: probabilities [batch, 2] (column 1 is the positive class) or [batch, 1].
        label: int64 [batch, 1], 1 for positive.
        num_thresholds: buckets - 1 (default 4095, i.e. 4096 buckets).
        slide_steps: batches in the sliding window of the batch AUC; 0: no window, the
            batch AUC covers every batch since the start (as Paddle's ``slide_steps=0``).

    Returns:
        (auc, batch_auc, [batch_stat_pos, batch_stat_neg, stat_pos, stat_neg]); the four
        state variables are persistable: zero them in the scope to reset the metric.
    """
    check_var(input, "input", "auc")
    check_var(label, "label", "auc")
    if curve != "ROC":
        raise ConfigError(f"auc curve={curve!r}: only 'ROC' is supported")
    if not isinstance(num_thresholds, int) or num_thresholds < 1:
        raise ConfigError(f"auc num_thresholds={num_thresholds!r} must be a positive int")
    if isinstance(slide_steps, bool) or not isinstance(slide_steps, int) or slide_steps < 0:
        raise ConfigError(f"auc slide_steps={slide_steps!r} must be an int >= 0 (the batches the batch AUC "
                          "covers; 0: every batch since the start)")
    buckets = num_thresholds + 1
    stat_pos = _state("stat_pos", [buckets])
    stat_neg = _state("stat_neg", [buckets])
    # Row 0 counts steps; then one row per batch of the window (0: one row that accumulates).
    rows = max(slide_steps, 1) + 1
    batch_pos = _state("batch_stat_pos", [rows, buckets])
    batch_neg = _state("batch_stat_neg", [rows, buckets])
    auc_out = create_tmp("auc", (1,), "float64", stop_gradient=True)
    batch_auc = create_tmp("auc", (1,), "float64", stop_gradient=True)
    append_op("auc", {"Predict": input, "Label": label, "StatPos": stat_pos, "StatNeg": stat_neg,
                      "BatchStatPos": batch_pos, "BatchStatNeg": batch_neg},
              {"AUC": auc_out, "BatchAUC": batch_auc},
              {"num_thresholds": num_thresholds, "slide_steps": slide_steps, "curve": curve})
    return auc_out, batch_auc, [batch_pos, batch_neg, stat_pos, stat_neg]
