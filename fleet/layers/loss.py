"""Loss layers."""
from fleet.errors import ConfigError
from fleet.layers.activation import square
from fleet.layers.helper import append_op, check_var, create_tmp
from fleet.layers.math import elementwise_sub, reduce_mean


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


def softmax_with_cross_entropy(logits, label, soft_label=False, ignore_index=-100,
                               numeric_stable_mode=True, return_softmax=False, axis=-1):
    """Cross entropy of softmax(logits) against class ids [N, 1] (int64) or, with
    ``soft_label``, a distribution [N, classes], computed stably from the logits.

    Returns:
        The loss [N, 1] (0 where label == ignore_index); with ``return_softmax`` the pair
        (loss, softmax).

    Raises:
        ConfigError: an axis other than the last, or hard labels that are not int64.
    """
    check_var(logits, "logits", "softmax_with_cross_entropy")
    check_var(label, "label", "softmax_with_cross_entropy")
    if axis not in (-1, len(logits.shape) - 1):
        raise ConfigError(f"softmax_with_cross_entropy axis={axis}: only the last axis is supported")
    if not soft_label and label.dtype != "int64":
        raise ConfigError(f"softmax_with_cross_entropy label {label.name!r} must be int64 class ids "
                          f"(or use soft_label=True), got {label.dtype}")
    softmax = create_tmp("softmax_with_cross_entropy", logits.shape)
    loss = create_tmp("softmax_with_cross_entropy", tuple(logits.shape[:-1]) + (1,))
    append_op("softmax_with_cross_entropy", {"Logits": logits, "Label": label},
              {"Softmax": softmax, "Loss": loss},
              {"soft_label": bool(soft_label), "ignore_index": int(ignore_index),
               "numeric_stable_mode": bool(numeric_stable_mode), "axis": -1})
    return (loss, softmax) if return_softmax else loss


def square_error_cost(input, label):
    """(input - label) ** 2, element by element."""
    check_var(input, "input", "square_error_cost")
    check_var(label, "label", "square_error_cost")
    return square(elementwise_sub(input, label))


def mse_loss(input, label):
    """The mean of square_error_cost(input, label), shape [1] (Paddle's reduce_mean)."""
    return reduce_mean(square_error_cost(input, label))
