"""Admission kernels against their plain-Python twins, and the sketch's stated error."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.entries import DEFAULT_SKETCH_DEPTH, DEFAULT_SKETCH_WIDTH
from fleet.kernels import admission as adm

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
int64s = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.integers(-40, 40),
                   st.sampled_from([0, -1, INT64_MIN, INT64_MAX]))


def unique(xs):
    return np.array(list(dict.fromkeys(xs)), dtype=np.int64)


@settings(max_examples=40, deadline=None)
@given(int64s, st.integers(0, 2**64 - 1), st.integers(0, 300))
def test_coin_matches_its_reference(x, key, k):
    assert adm.coin(np.uint64(key), x, k) == adm.coin_reference(key, x, k)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(int64s, max_size=60), max_size=5), st.integers(0, 2**63), st.sampled_from([16, 64]),
       st.integers(1, 4), st.integers(0, 300))
def test_sketch_add_and_estimate_match_their_references(batches, seed, width, depth, inc):
    key = adm.sketch_key(seed)
    fast = np.zeros((depth, width), dtype=np.uint8)
    slow = fast.copy()
    for batch in batches:
        ids = np.array(batch, dtype=np.int64)
        incs = np.full(len(ids), inc, dtype=np.int64)
        adm.sketch_add(fast, key, ids, incs)
        adm.sketch_add_reference(slow, key, ids, incs)
        np.testing.assert_array_equal(fast, slow)
        out = np.empty(len(ids), dtype=np.int64)
        adm.sketch_estimate(fast, key, ids, out)
        np.testing.assert_array_equal(out, adm.sketch_estimate_reference(slow, key, ids))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(int64s, max_size=50), max_size=5),
       st.sampled_from([adm.ENTRY_COUNT_FILTER, adm.ENTRY_PROBABILITY, adm.ENTRY_SHOW_CLICK]),
       st.integers(1, 5), st.floats(0.01, 1.0), st.integers(0, 7), st.integers(0, 3), st.integers(0, 2**63))
def test_admit_ids_matches_its_reference(batches, kind, count, p, show, click, seed):
    skey, ckey = adm.sketch_key(seed), adm.coin_key(seed)
    fast = np.zeros((3, 32), dtype=np.uint8)
    slow = fast.copy()
    for batch in batches:
        ids = unique(batch)
        shows = np.full(len(ids), show, dtype=np.float32)
        clicks = np.full(len(ids), min(click, show), dtype=np.float32)
        out = np.empty(len(ids), dtype=np.bool_)
        adm.admit_ids(fast, skey, ckey, kind, ids, shows, clicks, count, p, 0.1, 1.0, out)
        expected = adm.admit_ids_reference(slow, skey, ckey, kind, ids, shows, clicks, count, p, 0.1, 1.0)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(fast, slow)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=64), st.floats(0.0, 1.0))
def test_sketch_decay_matches_its_reference_and_rounds_down(cells, rate):
    fast = np.array(cells, dtype=np.uint8).reshape(1, -1)
    slow = fast.copy()
    adm.sketch_decay(fast, rate)
    adm.sketch_decay_reference(slow, rate)
    np.testing.assert_array_equal(fast, slow)
    assert all(int(f) == math.floor(c * rate) for f, c in zip(fast[0], cells))


def test_counters_saturate_at_max_count_instead_of_wrapping():
    counters = np.zeros((2, 16), dtype=np.uint8)
    key = adm.sketch_key(3)
    ids = np.array([42], dtype=np.int64)
    for _ in range(3):
        adm.sketch_add(counters, key, ids, np.array([200], dtype=np.int64))
    out = np.empty(1, dtype=np.int64)
    adm.sketch_estimate(counters, key, ids, out)
    assert out[0] == adm.MAX_COUNT == 255


def overestimated_fraction(width, depth, candidates, probes, seed=5):
    """Counts `candidates` distinct ids once each; returns the fraction of fresh ids reading >= 1."""
    counters = np.zeros((depth, width), dtype=np.uint8)
    key = adm.sketch_key(seed)
    ids = np.arange(candidates, dtype=np.int64) * 7919 + 1
    adm.sketch_add(counters, key, ids, np.ones(candidates, dtype=np.int64))
    fresh = -np.arange(1, probes + 1, dtype=np.int64)
    out = np.empty(probes, dtype=np.int64)
    adm.sketch_estimate(counters, key, fresh, out)
    counted = np.empty(candidates, dtype=np.int64)
    adm.sketch_estimate(counters, key, ids, counted)
    assert (counted >= 1).all()  # never below the true count
    return float((out >= 1).mean())


@pytest.mark.parametrize("width,depth,candidates", [(1 << 12, 4, 1000), (1 << 12, 2, 3000), (1 << 10, 3, 400)])
def test_the_chance_of_an_overestimate_is_the_stated_bound(width, depth, candidates):
    probes = 200_000
    bound = (1 - math.exp(-candidates / width)) ** depth
    measured = overestimated_fraction(width, depth, candidates, probes)
    sigma = math.sqrt(bound * (1 - bound) / probes)
    assert abs(measured - bound) <= 4 * sigma + 1e-4, (measured, bound)


def test_the_default_sketch_overestimates_a_fresh_id_after_1m_candidates_at_most_a_quarter_percent():
    # docs/tables.md: 16 MiB per table; after 1M distinct candidates (1 sighting each) a new id
    # reads as seen with probability (1 - exp(-1M / 4Mi)) ** 4 = 0.24%
    bound = (1 - math.exp(-1_000_000 / DEFAULT_SKETCH_WIDTH)) ** DEFAULT_SKETCH_DEPTH
    assert bound < 0.0025
    measured = overestimated_fraction(DEFAULT_SKETCH_WIDTH, DEFAULT_SKETCH_DEPTH, 1_000_000, 200_000)
    assert measured <= bound + 4 * math.sqrt(bound / 200_000), (measured, bound)


def test_the_classic_count_min_bound_holds_on_a_zipf_stream():
    width, depth = 1 << 10, 4
    rng = np.random.default_rng(0)
    stream = rng.zipf(1.3, 100_000).astype(np.int64) % 5000
    ids, counts = np.unique(stream, return_counts=True)
    counts = np.minimum(counts, 40)  # stay below saturation: the bound is about true counts
    counters = np.zeros((depth, width), dtype=np.uint8)
    key = adm.sketch_key(1)
    adm.sketch_add(counters, key, ids, counts.astype(np.int64))
    est = np.empty(len(ids), dtype=np.int64)
    adm.sketch_estimate(counters, key, ids, est)
    assert (est >= counts).all()
    over = est - counts > math.e * counts.sum() / width
    assert over.mean() <= math.exp(-depth)
