"""Layer 1: numba kernels, pure functions on numpy arrays (see docs/internals.md).

``embedding`` (gather + sequence pooling), ``sparse`` (row merge, scatter-add, reduce)
and ``optim`` (optimizer updates). Import the submodule you need
(``from fleet.kernels import optim``); nothing here is imported or compiled eagerly.
"""
