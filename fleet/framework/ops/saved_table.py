"""Lookups into a saved ``is_distributed`` table, for inference models with no servers.

On a distributed worker an ``is_distributed`` table lives only on the servers and is
read through a ``prefetch`` op. An inference model saved from such a worker holds the
table as two arrays, ``<table>@ids`` (int64 [n], sorted) and ``<table>@values`` (float32
[n, dim]); its program reads them through ``saved_table_prefetch``, which gives the
lookup ops the same ``PrefetchedRows`` a server prefetch gives. An id the table does not
hold reads as a zero row, as a server answers an unseen id under ``is_test``.
"""
import numpy as np

from fleet.errors import DataError
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import PrefetchedRows, flat_ids

SAVED_TABLE_PREFETCH = "saved_table_prefetch"


def saved_rows(table_ids, table_values, ids, name="table"):
    """Returns PrefetchedRows with the sorted unique ``ids`` and their rows (zero rows for
    ids not in ``table_ids``).

    Args:
        table_ids: int64 [n], sorted ascending, unique.
        table_values: float32 [n, dim].
        ids: int64 ids of a batch (any order, repeats allowed).

    Raises:
        DataError: the saved arrays do not match (names the table).
    """
    if table_ids.ndim != 1 or table_values.ndim != 2 or len(table_ids) != len(table_values):
        raise DataError(f"saved table {name!r}: ids {list(table_ids.shape)} and values "
                        f"{list(table_values.shape)} do not match; save the model again")
    uniq = np.unique(np.asarray(ids, dtype=np.int64))
    values = np.zeros((len(uniq), table_values.shape[1]), dtype=np.float32)
    if len(table_ids) and len(uniq):
        pos = np.minimum(np.searchsorted(table_ids, uniq), len(table_ids) - 1)
        found = table_ids[pos] == uniq
        values[found] = table_values[pos[found]]
    return PrefetchedRows(name, uniq, values, 2 ** 63 - 1)


@register_op
class SavedTablePrefetch(OpDef):
    """The rows of a saved distributed table that this batch's ids need (no servers)."""

    type = SAVED_TABLE_PREFETCH

    def forward(self, ctx):
        all_ids = flat_ids(ctx.inputs("Ids"))
        rows = saved_rows(ctx.input("TableIds"), ctx.input("TableValues"), all_ids, ctx.attrs["table"])
        ctx.local[ctx.output_name("Out")] = rows
