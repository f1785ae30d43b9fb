"""Per-row CTR statistics kernels of the sparse tables (Paddle's CtrCommonAccessor).

A table with statistics keeps float32 [rows, 4] beside its values: show, click,
unseen_days and delta_score (columns ``SHOW``, ``CLICK``, ``UNSEEN_DAYS``,
``DELTA_SCORE``). score(show, click) = (show - click) * nonclk_coeff + click * click_coeff.

- ``take_rows_update_stats``: a training lookup's gather fused with its statistics update
  (one pass, prefetched like ``hashtable.take_rows``);
- ``shrink_stats``: decay show and click, age unseen_days, and mark the rows to delete;
- ``compact_rows``: move the kept rows of a per-row array down, keeping their order;
- ``base_rows``: the rows a base save keeps (score >= threshold, unseen_days <= keep days);
- ``rows_unique``: whether a push's rows repeat (a bitmap over the table's rows as
  scratch), so a rule can skip merging duplicates.

All kernels are ``njit(cache=True, nogil=True)``; ``*_reference`` twins use numpy.
"""
import numba
import numpy as np

from fleet.kernels.hashtable import prefetch

SHOW, CLICK, UNSEEN_DAYS, DELTA_SCORE = 0, 1, 2, 3
STAT_COLUMNS = 4
_AHEAD = 16


@numba.njit(cache=True, nogil=True)
def take_rows_update_stats(values, stats, rows, shows, clicks, nonclk_coeff, click_coeff, out):
    """out[i] = values[rows[i]] (zeros where rows[i] < 0) and the statistics of each row found:
    show += shows[i], click += clicks[i], unseen_days = 0, delta_score += score(shows[i], clicks[i]).

    Args:
        values: float32 [capacity, dim]; stats: float32 [capacity, 4] (updated in place).
        rows: int64 [n], unique where >= 0; shows, clicks: float32 [n].
        nonclk_coeff, click_coeff: float.
        out: float32 [n, dim] output.
    """
    dim = values.shape[1]
    n = len(rows)
    for i in range(n):
        if i + _AHEAD < n and rows[i + _AHEAD] >= 0:
            prefetch(values, rows[i + _AHEAD])
            prefetch(stats, rows[i + _AHEAD])
        r = rows[i]
        if r < 0:
            for c in range(dim):
                out[i, c] = 0.0
            continue
        for c in range(dim):
            out[i, c] = values[r, c]
        s = shows[i]
        k = clicks[i]
        stats[r, SHOW] += s
        stats[r, CLICK] += k
        stats[r, UNSEEN_DAYS] = 0.0
        stats[r, DELTA_SCORE] += np.float32((s - k) * nonclk_coeff + k * click_coeff)


def take_rows_update_stats_reference(values, stats, rows, shows, clicks, nonclk_coeff, click_coeff):
    """Numpy twin of ``take_rows_update_stats``: returns out (updates ``stats`` in place)."""
    out = np.zeros((len(rows), values.shape[1]), dtype=np.float32)
    found = rows >= 0
    r = rows[found]
    out[found] = values[r]
    s, k = shows[found], clicks[found]
    stats[r, SHOW] += s
    stats[r, CLICK] += k
    stats[r, UNSEEN_DAYS] = 0.0
    stats[r, DELTA_SCORE] += ((s - k).astype(np.float64) * nonclk_coeff
                              + k.astype(np.float64) * click_coeff).astype(np.float32)
    return out


@numba.njit(cache=True, nogil=True)
def shrink_stats(stats, size, decay, nonclk_coeff, click_coeff, delete_threshold, max_unseen_days, keep):
    """Shrinks rows 0 .. size-1: show *= decay, click *= decay, unseen_days += 1, then
    keep[r] = not (score < delete_threshold or unseen_days > max_unseen_days).

    Returns:
        The number of rows to delete.
    """
    deleted = 0
    d = np.float32(decay)
    for r in range(size):
        show = stats[r, SHOW] * d
        click = stats[r, CLICK] * d
        unseen = stats[r, UNSEEN_DAYS] + np.float32(1.0)
        stats[r, SHOW] = show
        stats[r, CLICK] = click
        stats[r, UNSEEN_DAYS] = unseen
        score = (show - click) * nonclk_coeff + click * click_coeff
        k = not (score < delete_threshold or unseen > max_unseen_days)
        keep[r] = k
        if not k:
            deleted += 1
    return deleted


def shrink_stats_reference(stats, size, decay, nonclk_coeff, click_coeff, delete_threshold, max_unseen_days):
    """Numpy twin of ``shrink_stats``: returns (keep bool [size], deleted) (updates ``stats``)."""
    s = stats[:size]
    s[:, SHOW] *= np.float32(decay)
    s[:, CLICK] *= np.float32(decay)
    s[:, UNSEEN_DAYS] += np.float32(1.0)
    score = (s[:, SHOW] - s[:, CLICK]).astype(np.float64) * nonclk_coeff + s[:, CLICK].astype(np.float64) * click_coeff
    keep = ~((score < delete_threshold) | (s[:, UNSEEN_DAYS] > max_unseen_days))
    return keep, int((~keep).sum())


@numba.njit(cache=True, nogil=True)
def compact_rows(arr, keep, size):
    """Moves the rows r < size with keep[r] to the front of ``arr``, in order; returns how many."""
    j = 0
    for r in range(size):
        if keep[r]:
            if j != r:
                arr[j] = arr[r]
            j += 1
    return j


def compact_rows_reference(arr, keep, size):
    """Numpy twin of ``compact_rows``."""
    kept = arr[:size][keep[:size]].copy()
    arr[: len(kept)] = kept
    return len(kept)


@numba.njit(cache=True, nogil=True)
def base_rows(stats, start, stop, nonclk_coeff, click_coeff, base_threshold, keep_days, out):
    """Writes into ``out`` the rows start .. stop-1 a base save keeps; returns how many.

    Paddle's rule: score >= base_threshold and unseen_days <= keep_days.
    """
    count = 0
    for r in range(start, stop):
        show = stats[r, SHOW]
        click = stats[r, CLICK]
        score = (show - click) * nonclk_coeff + click * click_coeff
        if score >= base_threshold and stats[r, UNSEEN_DAYS] <= keep_days:
            out[count] = r
            count += 1
    return count


def base_rows_reference(stats, start, stop, nonclk_coeff, click_coeff, base_threshold, keep_days):
    """Numpy twin of ``base_rows``: returns the int64 rows."""
    s = stats[start:stop]
    score = (s[:, SHOW] - s[:, CLICK]).astype(np.float64) * nonclk_coeff + s[:, CLICK].astype(np.float64) * click_coeff
    return np.flatnonzero((score >= base_threshold) & (s[:, UNSEEN_DAYS] <= keep_days)).astype(np.int64) + start


@numba.njit(cache=True, nogil=True)
def rows_unique(bits, rows):
    """Returns True when no row of ``rows`` (each >= 0) repeats.

    ``bits`` (uint8, one bit per table row, all zero) is scratch: bits are set while
    scanning and cleared again before returning, so it is all zero afterwards.
    """
    n = len(rows)
    stop = n
    for i in range(n):
        r = rows[i]
        bit = np.uint8(1 << (r & 7))
        if bits[r >> 3] & bit:
            stop = i
            break
        bits[r >> 3] |= bit
    for i in range(stop):
        r = rows[i]
        bits[r >> 3] &= np.uint8(~(1 << (r & 7)) & 0xFF)
    return stop == n


def rows_unique_reference(rows):
    """Numpy twin of ``rows_unique``."""
    return len(np.unique(rows)) == len(rows)
