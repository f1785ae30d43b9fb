"""The built-in ops. Importing this package registers them."""
from fleet.framework.ops import (activation_ops, basic, linalg_ops, loss_ops, math_ops,  # noqa: F401
                                 metrics, nn, norm_ops, optimize, reduce_ops, saved_table,
                                 sequence_ops, shape_ops, tensor_ops)
