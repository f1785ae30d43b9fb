"""Sparse-row kernels: merging duplicate rows, scatter-add, and flat reduce helpers.

``merge_rows`` is Paddle's MergeAdd: it sorts the row ids with a stable LSD radix sort
(only as many 11-bit passes as the id range needs, so ids of a 1M-row table take two
passes) and sums the values of equal ids in the order they appeared. Every kernel is a
numba function compiled on first call and cached on disk; all release the GIL, none is
thread-safe against a concurrent writer of the same output array.

Each kernel has a plain-numpy ``*_reference`` twin used only by the tests.
"""
import numba
import numpy as np

_RADIX_BITS = 11
_RADIX_SIZE = 1 << _RADIX_BITS
# Below this many rows an insertion sort beats clearing a 2048-bucket histogram.
_SMALL_SORT = 32


@numba.njit(cache=True, nogil=True)
def _stable_order(rows):
    """Returns perm (int64 [n]) with rows[perm] sorted ascending, equal ids kept in order."""
    n = rows.shape[0]
    perm = np.arange(n)
    if n < 2:
        return perm
    if n <= _SMALL_SORT:
        for i in range(1, n):
            p = perm[i]
            key = rows[p]
            j = i - 1
            while j >= 0 and rows[perm[j]] > key:
                perm[j + 1] = perm[j]
                j -= 1
            perm[j + 1] = p
        return perm
    lo = rows[0]
    hi = rows[0]
    for i in range(1, n):
        v = rows[i]
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
    # Unsigned offsets from the minimum keep the order for any int64 ids, even a
    # span wider than 2**63.
    ulo = np.uint64(lo)
    span = np.uint64(hi) - ulo
    if span == np.uint64(0):
        return perm
    keys = np.empty(n, dtype=np.uint64)
    for i in range(n):
        keys[i] = np.uint64(rows[i]) - ulo
    keys_tmp = np.empty(n, dtype=np.uint64)
    perm_tmp = np.empty(n, dtype=np.int64)
    counts = np.empty(_RADIX_SIZE, dtype=np.int64)
    mask = np.uint64(_RADIX_SIZE - 1)
    shift = np.uint64(0)
    while shift < np.uint64(64) and (span >> shift) != np.uint64(0):
        counts[:] = 0
        for i in range(n):
            counts[(keys[i] >> shift) & mask] += 1
        if counts[(keys[0] >> shift) & mask] != n:
            total = 0
            for d in range(_RADIX_SIZE):
                c = counts[d]
                counts[d] = total
                total += c
            for i in range(n):
                k = keys[i]
                d = (k >> shift) & mask
                pos = counts[d]
                counts[d] = pos + 1
                keys_tmp[pos] = k
                perm_tmp[pos] = perm[i]
            keys, keys_tmp = keys_tmp, keys
            perm, perm_tmp = perm_tmp, perm
        shift += np.uint64(_RADIX_BITS)
    return perm


@numba.njit(cache=True, nogil=True)
def merge_rows(rows, values):
    """Sums the values of duplicate rows (Paddle's MergeAdd).

    Args:
        rows: int64 [n] row ids, any order, duplicates allowed.
        values: float32 [n, D], C-contiguous; ``values[i]`` belongs to ``rows[i]``.

    Returns:
        (uniq int64 [m], summed float32 [m, D]): the distinct ids ascending and, for each,
        the float32 sum of its values in the order they appear in ``rows``. Empty input
        gives empty output. Blocks the calling thread only; releases the GIL.
    """
    n = rows.shape[0]
    dim = values.shape[1]
    assert values.shape[0] == n, "merge_rows: values must have one row per id"
    perm = _stable_order(rows)
    m = 0
    for i in range(n):
        if i == 0 or rows[perm[i]] != rows[perm[i - 1]]:
            m += 1
    uniq = np.empty(m, dtype=np.int64)
    summed = np.empty((m, dim), dtype=np.float32)
    j = -1
    for i in range(n):
        p = perm[i]
        r = rows[p]
        if j < 0 or r != uniq[j]:
            j += 1
            uniq[j] = r
            for d in range(dim):
                summed[j, d] = values[p, d]
        else:
            for d in range(dim):
                summed[j, d] += values[p, d]
    return uniq, summed


@numba.njit(cache=True, nogil=True)
def scatter_add(table, rows, values):
    """Adds ``values[i]`` into ``table[rows[i]]`` for every i; duplicates accumulate.

    Args:
        table: float32 [V, D], updated in place.
        rows: int64 [n], each in [0, V) (the caller checks).
        values: float32 [n, D].

    Returns:
        None. Releases the GIL; not safe against another writer of the same table rows.
    """
    n = rows.shape[0]
    dim = table.shape[1]
    assert values.shape[0] == n and values.shape[1] == dim, (
        "scatter_add: values must be [len(rows), table width]"
    )
    for i in range(n):
        r = rows[i]
        for d in range(dim):
            table[r, d] += values[i, d]


@numba.njit(cache=True, nogil=True)
def add_into(out, x):
    """Adds ``x`` into ``out`` element-wise (the Reduce strategy's building block).

    Runs on the calling thread (see fleet.kernels.optim on why nothing here is parallel).

    Args:
        out: float32 array, C-contiguous, updated in place.
        x: float32 array, C-contiguous, same number of elements (shape is not checked,
           only size: both are read flat).

    Returns:
        None. Releases the GIL.
    """
    assert x.size == out.size, "add_into: out and x must have the same number of elements"
    flat_out = out.reshape(out.size)
    flat_x = x.reshape(x.size)
    for i in range(flat_out.shape[0]):
        flat_out[i] += flat_x[i]


@numba.njit(cache=True, nogil=True)
def scale_into(out, factor):
    """Multiplies ``out`` in place by ``factor`` (rounded to float32 first, as Paddle's scale op).

    Args:
        out: float32 array, C-contiguous.
        factor: Python float.

    Returns:
        None. Releases the GIL.
    """
    flat = out.reshape(out.size)
    f = np.float32(factor)
    for i in range(flat.shape[0]):
        flat[i] *= f


def merge_rows_reference(rows, values):
    """Numpy twin of :func:`merge_rows` (sums duplicates in order of appearance)."""
    uniq, inverse = np.unique(rows, return_inverse=True)
    summed = np.zeros((len(uniq), values.shape[1]), dtype=np.float32)
    seen = np.zeros(len(uniq), dtype=bool)
    for i, j in enumerate(inverse.reshape(-1)):
        summed[j] = values[i] if not seen[j] else summed[j] + values[i]
        seen[j] = True
    return uniq.astype(np.int64), summed


def scatter_add_reference(table, rows, values):
    """Numpy twin of :func:`scatter_add`."""
    for i, r in enumerate(rows):
        table[r] += values[i]


def add_into_reference(out, x):
    """Numpy twin of :func:`add_into`."""
    out.reshape(-1)[...] += x.reshape(-1)


def scale_into_reference(out, factor):
    """Numpy twin of :func:`scale_into`."""
    out *= np.float32(factor)
