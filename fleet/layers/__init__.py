"""Model-building layers (Paddle's ``fluid.layers``): each appends ops to the current main
program (and parameter initializers to the startup program) and returns its output.

Importing it also gives Variables Paddle's Python operators (``x + y``, ``1 - p``, ``x[:, i]``;
see ``fleet.layers.math_op_patch``)."""
from fleet.layers import math_op_patch  # noqa: F401  (Variable operators)
from fleet.layers.io import data
from fleet.layers.nn import (concat, embedding, sparse_embedding, fc, sequence_pool, reshape, scale, cast,
                             fill_constant, create_parameter)
from fleet.layers.activation import (relu, sigmoid, tanh, softmax, square, sqrt, exp, log, abs,
                                     pow, clip, leaky_relu, prelu)
from fleet.layers.math import (mean, reduce_sum, reduce_mean, reduce_max, reduce_min,
                               elementwise_add, elementwise_sub, elementwise_mul, elementwise_div,
                               elementwise_max, elementwise_min, elementwise_pow, sums)
from fleet.layers.shapes import (transpose, unsqueeze, squeeze, expand, stack, split, slice, flatten,
                                create_tensor)
from fleet.layers.linalg import matmul, mul, conv2d
from fleet.layers.norm import dropout, batch_norm, layer_norm
from fleet.layers.sequence import sequence_expand, sequence_expand_as, sequence_softmax
from fleet.layers.loss import (cross_entropy, log_loss, sigmoid_cross_entropy_with_logits,
                               softmax_with_cross_entropy, square_error_cost, mse_loss)
from fleet.layers.metric import accuracy, auc
from fleet.layers.tensor import (shape, argmax, argmin, zeros, ones, zeros_like, ones_like, one_hot, cos_sim,
                                 l2_normalize)
from fleet.layers.learning_rate_scheduler import (exponential_decay, natural_exp_decay, inverse_time_decay,
                                                  polynomial_decay, piecewise_decay, noam_decay, cosine_decay,
                                                  linear_lr_warmup)

__all__ = ["data", "embedding", "sparse_embedding", "fc", "concat", "sequence_pool", "reshape", "scale", "cast",
           "fill_constant", "create_parameter", "relu", "sigmoid", "tanh", "softmax", "square",
           "sqrt", "exp", "log", "abs", "pow", "clip", "leaky_relu", "prelu", "mean", "reduce_sum",
           "reduce_mean", "reduce_max", "reduce_min", "elementwise_add", "elementwise_sub",
           "elementwise_mul", "elementwise_div", "elementwise_max", "elementwise_min",
           "elementwise_pow", "sums", "transpose", "unsqueeze", "squeeze", "expand", "stack", "split",
           "slice", "flatten", "create_tensor", "matmul", "mul", "conv2d",
           "dropout", "batch_norm", "layer_norm", "sequence_expand", "sequence_expand_as",
           "sequence_softmax", "cross_entropy", "log_loss", "softmax_with_cross_entropy",
           "square_error_cost", "mse_loss",
           "sigmoid_cross_entropy_with_logits", "accuracy", "auc", "exponential_decay", "natural_exp_decay",
           "inverse_time_decay", "polynomial_decay", "piecewise_decay", "noam_decay", "cosine_decay",
           "linear_lr_warmup", "shape", "argmax", "argmin", "zeros", "ones", "zeros_like", "ones_like", "one_hot",
           "cos_sim", "l2_normalize"]


def __getattr__(name):
    raise AttributeError(f"fleet.layers has no attribute {name!r}: fleet does not provide Paddle's "
                         f"fluid.layers.{name} (docs/porting.md lists every supported layer and what to use "
                         f"instead)")
