"""The built-in ops. Importing this package registers them."""
from fleet.framework.ops import (activation_ops, basic, linalg_ops, math_ops, metrics, nn,  # noqa: F401
                                 norm_ops, optimize, reduce_ops, saved_table, shape_ops)
