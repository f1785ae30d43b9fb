"""The show and click statistics a training lookup sends with its ids.

A table with statistics (an entry or a CTR accessor) counts, per id of a batch, its
shows and clicks: without a ``ShowClickEntry`` shows are the id's occurrences in the
batch and clicks 0; with one, each occurrence adds its example's value of the show input
and of the click input (a [batch, 1] variable each). ``occurrence_statistics`` gives the
per-occurrence values of a batch's ids, ``unique_statistics`` sums them per unique id: the
arrays the worker sends with its pull (``pull_sparse``'s "shows" and "clicks", float32
one per id) and that a local table's ``pull_train`` takes.

Pure functions of numpy arrays; thread-safe.
"""
import numpy as np

from fleet.errors import DataError
from fleet.framework.tensor import LoDTensor, flat_ids


def _examples_of(ids, batch, what):
    """The example index of every id of one ``Ids`` value (a LoDTensor: its sequence; an
    array [batch, k]: its row)."""
    if isinstance(ids, LoDTensor):
        lengths = np.diff(ids.offsets)
        if len(lengths) != batch:
            raise DataError(f"{what} has {batch} examples but the ids have {len(lengths)} sequences; feed one "
                            f"value per example")
        return np.repeat(np.arange(batch, dtype=np.int64), lengths)
    flat = np.asarray(ids).reshape(-1)
    if batch == 0 or len(flat) % batch:
        raise DataError(f"{what} has {batch} examples but the ids have {len(flat)} values, not a multiple; "
                        f"feed one value per example")
    return np.repeat(np.arange(batch, dtype=np.int64), len(flat) // batch)


def _column(value, what):
    if isinstance(value, LoDTensor):
        value = value.values
    column = np.asarray(value, dtype=np.float32).reshape(-1)
    if len(column) and not (np.isfinite(column).all() and column.min() >= 0):
        raise DataError(f"{what} holds negative or non-finite values; shows and clicks are counts >= 0 "
                        f"per example")
    return column


def occurrence_statistics(id_values, show=None, click=None, names=("show", "click")):
    """The flat ids of a batch and the show and click of each occurrence.

    Args:
        id_values: the ``Ids`` values of a table's lookups (LoDTensors or int arrays; None
            skipped).
        show, click: the batch's show and click inputs ([batch, 1], one value per
            example), or None (shows then count occurrences, clicks are 0).
        names: the inputs' names, for errors.

    Returns:
        (ids int64 [n], shows float32 [n] or None, clicks float32 [n] or None).

    Raises:
        DataError: a show or click input whose number of examples does not fit the ids,
            or with negative or non-finite values.
    """
    ids = flat_ids(id_values)
    per_id = []
    for value, name in ((show, names[0]), (click, names[1])):
        if value is None:
            per_id.append(None)
            continue
        column = _column(value, f"input {name!r}")
        examples = [_examples_of(v, len(column), f"input {name!r}") for v in id_values if v is not None]
        index = np.concatenate(examples) if examples else np.zeros(0, np.int64)
        per_id.append(column[index])
    return ids, per_id[0], per_id[1]


def unique_statistics(ids, shows=None, clicks=None):
    """Sums per-occurrence statistics per unique id.

    Args:
        ids: int64 [n] ids of a batch, with repeats.
        shows, clicks: float32 [n] per occurrence, or None (shows: 1 per occurrence;
            clicks: 0).

    Returns:
        (sorted unique ids int64 [u], shows float32 [u], clicks float32 [u]).
    """
    uniq, inverse, counts = np.unique(np.asarray(ids, dtype=np.int64), return_inverse=True, return_counts=True)
    if shows is None:
        show_sums = counts.astype(np.float32)
    else:
        show_sums = np.bincount(inverse, weights=shows, minlength=len(uniq)).astype(np.float32)
    if clicks is None:
        click_sums = np.zeros(len(uniq), dtype=np.float32)
    else:
        click_sums = np.bincount(inverse, weights=clicks, minlength=len(uniq)).astype(np.float32)
    return uniq, show_sums, click_sums
