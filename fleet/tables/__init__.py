"""Layer 4: server-side storage of parameters.

``SparseTable`` (int64 id -> row, created on first use, optimizer state per row),
``DenseTable`` (a block of a dense parameter with its optimizer state) and
``ChangeTracker`` (rows changed since a worker's last pull, for GEO). Sparse tables
with an entry or a CTR accessor config keep per-row statistics, admit new ids and
shrink (``statistics``); ``TableSnapshot`` is a point-in-time copy for saves
(``snapshot``). Tables take an optimizer rule from ``fleet.rules`` and never touch
the network.
"""
from fleet.tables.changes import ChangeTracker
from fleet.tables.dense_table import DenseTable
from fleet.tables.snapshot import TableSnapshot
from fleet.tables.sparse_table import SparseTable, parse_initializer

__all__ = ["ChangeTracker", "DenseTable", "SparseTable", "TableSnapshot", "parse_initializer"]
