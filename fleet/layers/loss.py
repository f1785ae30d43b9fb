"""Loss layers."""
from fleet.errors import ConfigError
from fleet.layers.helper import append_op, check_var, create_tmp


def cross_entropy(input, label, soft_label=False, ignore_index=-100):
    """-log(input[label]) per example, for probabilities ``input`` [batch, classes] and
    int64 ``label`` [batch, 1]. Returns [batch, 1]."""
    check_var(input, "input", "cross_entropy")
    check_var(label, "label", "cross_entropy")
    if not soft_label and label.dtype != "int64":
        raise ConfigError(f"cross_entropy label {label.name!r} must be int64 class ids (or use soft_label=True)")
    out = create_tmp("cross_entropy", (input.shape[0], 1))
    append_op("cross_entropy", {"X": input, "Label": label}, {"Y": out},
              {"soft_label": soft_label, "ignore_index": ignore_index})
    return out


def log_loss(input, label, epsilon=1e-4, name=None):
    """Binary log loss of probabilities ``input`` [batch, 1] against float labels."""
    check_var(input, "input", "log_loss")
    check_var(label, "label", "log_loss")
    out = create_tmp(name or "log_loss", input.shape)
    append_op("log_loss", {"Predicted": input, "Labels": label}, {"Loss": out}, {"epsilon": epsilon})
    return out


def sigmoid_cross_entropy_with_logits(x, label, ignore_index=-100, name=None, normalize=False):
    """Binary cross entropy of logits ``x`` against float labels, numerically stable."""
    check_var(x, "x", "sigmoid_cross_entropy_with_logits")
    check_var(label, "label", "sigmoid_cross_entropy_with_logits")
    out = create_tmp(name or "sigmoid_ce", x.shape)
    append_op("sigmoid_cross_entropy_with_logits", {"X": x, "Label": label}, {"Out": out},
              {"ignore_index": ignore_index, "normalize": normalize})
    return out
