"""The built-in ops. Importing this package registers them."""
from fleet.framework.ops import basic, math_ops, nn, metrics, optimize, saved_table  # noqa: F401
