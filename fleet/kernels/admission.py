"""Admission kernels of the sparse tables: a count-min sketch of candidate ids and a hash coin.

A table with an entry (``fleet.entries``) counts how often ids without a row were looked
up, in fixed memory: a count-min sketch of ``depth`` rows of ``width`` uint8 counters
(``width`` a power of two). An id maps to one counter per sketch row (splitmix64 of the
id, the table's seed key and the row number); its estimate is the smallest of those
counters. Updates are conservative: a counter is raised only as far as the id's new
estimate (never past it), which keeps the overestimate of every other id as small as a
count-min sketch allows. Counters saturate at ``MAX_COUNT`` instead of wrapping.

Error (what tests/kernels/test_admission.py checks): an estimate is never below the true
count (until saturation or a decay); it exceeds it only when every one of the id's
``depth`` counters is shared with another id, so for an id among ``m`` distinct ids
counted, ``P(estimate > true count) <= (1 - exp(-(m - 1) / width)) ** depth``; and the
classic bound holds: ``estimate <= true + e * total / width`` with probability at least
``1 - exp(-depth)`` (``total`` the sum of all increments).

The hash coin: ``coin(seed key, id, k)`` is a float in [0, 1) that depends only on those
three numbers, so probability trials repeat from run to run. ``k`` is the number of
sightings of the id so far (the sketch estimate), so successive trials of one id differ.

All kernels are ``njit(cache=True, nogil=True)``; ``*_reference`` twins are plain Python.
"""
import math

import numba
import numpy as np

from fleet.kernels.hashtable import splitmix64, splitmix64_reference

MAX_COUNT = 255
"""The largest count a sketch counter holds (uint8); counts beyond it stay there."""

ENTRY_COUNT_FILTER = 0
ENTRY_PROBABILITY = 1
ENTRY_SHOW_CLICK = 2

_MASK64 = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_S11 = np.uint64(11)
_TWO_POW_M53 = 1.0 / 9007199254740992.0
_SKETCH_DOMAIN = 0x5EED5CE7C0FFEE01
_COIN_DOMAIN = 0xC01DC0FFEE15BAD5


def seed_key(seed, domain):
    """Returns the uint64 key the kernels mix into hashes: splitmix64(seed ^ domain)."""
    return np.uint64(splitmix64_reference((int(seed) & _MASK64) ^ domain))


def sketch_key(seed):
    """The seed key of a table's sketch (``seed``: the table's seed, any int)."""
    return seed_key(seed, _SKETCH_DOMAIN)


def coin_key(seed):
    """The seed key of a table's hash coin."""
    return seed_key(seed, _COIN_DOMAIN)


@numba.njit(cache=True, nogil=True)
def _cell(h, j, width):
    return np.int64(splitmix64(h + np.uint64(j + 1) * _GAMMA) & np.uint64(width - 1))


@numba.njit(cache=True, nogil=True)
def _estimate(counters, h, width):
    est = MAX_COUNT
    for j in range(counters.shape[0]):
        c = np.int64(counters[j, _cell(h, j, width)])
        if c < est:
            est = c
    return est


@numba.njit(cache=True, nogil=True)
def _raise_to(counters, h, width, target):
    t = min(target, MAX_COUNT)
    for j in range(counters.shape[0]):
        cell = _cell(h, j, width)
        if counters[j, cell] < t:
            counters[j, cell] = t


@numba.njit(cache=True, nogil=True)
def coin(key, x, k):
    """Returns the deterministic uniform draw in [0, 1) of (seed key, id ``x``, trial ``k``)."""
    base = splitmix64(key ^ np.uint64(x))
    return np.float64(splitmix64(base + np.uint64(k + 1) * _GAMMA) >> _S11) * _TWO_POW_M53


@numba.njit(cache=True, nogil=True)
def sketch_estimate(counters, key, ids, out):
    """Writes each id's count estimate (int64) into ``out``; changes nothing.

    Args:
        counters: uint8 [depth, width] (width a power of two).
        key: uint64 sketch key (``sketch_key``).
        ids: int64 [n]; out: int64 [n].
    """
    width = counters.shape[1]
    for i in range(len(ids)):
        out[i] = _estimate(counters, splitmix64(key ^ np.uint64(ids[i])), width)


@numba.njit(cache=True, nogil=True)
def sketch_add(counters, key, ids, incs):
    """Adds ``incs[i]`` (>= 0) sightings of ``ids[i]`` with conservative update, saturating."""
    width = counters.shape[1]
    for i in range(len(ids)):
        h = splitmix64(key ^ np.uint64(ids[i]))
        est = _estimate(counters, h, width)
        _raise_to(counters, h, width, est + incs[i])


@numba.njit(cache=True, nogil=True)
def admit_ids(counters, skey, ckey, kind, ids, shows, clicks, count_filter, probability,
              nonclk_coeff, click_coeff, out):
    """Decides, per id without a row, whether this training lookup creates its row.

    Every id is one trial (its sightings so far are its sketch estimate ``k``):
    ENTRY_COUNT_FILTER: admitted when ``k + round(shows[i]) >= count_filter``;
    ENTRY_PROBABILITY: when ``coin(ckey, id, k) < probability``;
    ENTRY_SHOW_CLICK: score = (shows - clicks) * nonclk_coeff + clicks * click_coeff;
    admitted when score >= 1, never when score <= 0, else when ``coin(ckey, id, k) < score``.
    An id not admitted is counted: ``round(shows[i])`` sightings for the count filter, one
    for the others. An admitted id is not counted (it has a row from now on).

    Args:
        counters: uint8 [depth, width] sketch (updated in place).
        skey, ckey: uint64 sketch and coin keys.
        kind: one of the ENTRY_* constants.
        ids: int64 [n] (unique); shows, clicks: float32 [n].
        count_filter: int; probability, nonclk_coeff, click_coeff: float.
        out: bool [n] output (True: create the row).
    """
    width = counters.shape[1]
    for i in range(len(ids)):
        h = splitmix64(skey ^ np.uint64(ids[i]))
        k = _estimate(counters, h, width)
        inc = 1
        if kind == ENTRY_COUNT_FILTER:
            inc = max(np.int64(round(shows[i])), 0)
            admit = k + inc >= count_filter
        elif kind == ENTRY_PROBABILITY:
            admit = coin(ckey, ids[i], k) < probability
        else:
            score = (shows[i] - clicks[i]) * nonclk_coeff + clicks[i] * click_coeff
            if score >= 1.0:
                admit = True
            elif score <= 0.0:
                admit = False
            else:
                admit = coin(ckey, ids[i], k) < score
        out[i] = admit
        if not admit:
            _raise_to(counters, h, width, k + inc)


@numba.njit(cache=True, nogil=True)
def sketch_decay(counters, rate):
    """Scales every counter by ``rate`` (0 <= rate <= 1), rounding down."""
    flat = counters.reshape(-1)
    for i in range(len(flat)):
        flat[i] = np.uint8(math.floor(flat[i] * rate))


# ------------------------------------------------------------------------- plain-Python twins


def _cells_reference(key, x, depth, width):
    h = splitmix64_reference((int(key) ^ (int(x) & _MASK64)) & _MASK64)
    return [splitmix64_reference((h + (j + 1) * 0x9E3779B97F4A7C15) & _MASK64) & (width - 1)
            for j in range(depth)]


def coin_reference(key, x, k):
    """Plain-Python twin of ``coin``."""
    base = splitmix64_reference((int(key) ^ (int(x) & _MASK64)) & _MASK64)
    return (splitmix64_reference((base + (k + 1) * 0x9E3779B97F4A7C15) & _MASK64) >> 11) * _TWO_POW_M53


def sketch_estimate_reference(counters, key, ids):
    """Plain-Python twin of ``sketch_estimate``: returns int64 [n]."""
    depth, width = counters.shape
    return np.array([min([MAX_COUNT] + [int(counters[j, c]) for j, c in
                                        enumerate(_cells_reference(key, x, depth, width))])
                     for x in ids], dtype=np.int64)


def _raise_reference(counters, key, x, target):
    depth, width = counters.shape
    for j, c in enumerate(_cells_reference(key, x, depth, width)):
        counters[j, c] = max(int(counters[j, c]), min(target, MAX_COUNT))


def sketch_add_reference(counters, key, ids, incs):
    """Plain-Python twin of ``sketch_add`` (updates ``counters`` in place)."""
    for x, inc in zip(ids, incs):
        est = int(sketch_estimate_reference(counters, key, [x])[0])
        _raise_reference(counters, key, x, est + int(inc))


def admit_ids_reference(counters, skey, ckey, kind, ids, shows, clicks, count_filter, probability,
                        nonclk_coeff, click_coeff):
    """Plain-Python twin of ``admit_ids``: returns the bool [n] mask (updates ``counters``)."""
    out = np.zeros(len(ids), dtype=bool)
    for i, x in enumerate(ids):
        k = int(sketch_estimate_reference(counters, skey, [x])[0])
        inc = 1
        if kind == ENTRY_COUNT_FILTER:
            inc = max(int(round(float(shows[i]))), 0)
            admit = k + inc >= count_filter
        elif kind == ENTRY_PROBABILITY:
            admit = coin_reference(ckey, x, k) < probability
        else:
            s, c = float(shows[i]), float(clicks[i])
            score = (s - c) * nonclk_coeff + c * click_coeff
            admit = score >= 1.0 or (score > 0.0 and coin_reference(ckey, x, k) < score)
        out[i] = admit
        if not admit:
            _raise_reference(counters, skey, x, k + inc)
    return out


def sketch_decay_reference(counters, rate):
    """Plain-Python twin of ``sketch_decay`` (in place)."""
    for j in range(counters.shape[0]):
        for c in range(counters.shape[1]):
            counters[j, c] = math.floor(int(counters[j, c]) * rate)
