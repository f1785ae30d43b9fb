"""The built-in ops. Importing this package registers them."""
from fleet.framework.ops import (activation_ops, basic, math_ops, metrics, nn, optimize,  # noqa: F401
                                 reduce_ops, saved_table)
