"""Row statistics kernels (CTR accessor) against their numpy twins."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.kernels import row_stats as rs

small = st.floats(0, 50, width=32)


def random_stats(rng, n):
    stats = np.zeros((n, 4), dtype=np.float32)
    stats[:, rs.SHOW] = rng.integers(0, 40, n)
    stats[:, rs.CLICK] = np.minimum(rng.integers(0, 6, n), stats[:, rs.SHOW])
    stats[:, rs.UNSEEN_DAYS] = rng.integers(0, 40, n)
    stats[:, rs.DELTA_SCORE] = rng.random(n, dtype=np.float32) * 5
    return stats


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 60), st.integers(0, 2**32 - 1), st.floats(0, 1), st.floats(0, 2))
def test_take_rows_update_stats_matches_its_reference(n, seed, nonclk, click_coeff):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((80, 3)).astype(np.float32)
    stats = random_stats(rng, 80)
    rows = rng.permutation(80)[:n].astype(np.int64)
    rows[rng.random(n) < 0.3] = -1
    shows = rng.integers(0, 5, n).astype(np.float32)
    clicks = np.minimum(rng.integers(0, 3, n), shows).astype(np.float32)
    expected_stats = stats.copy()
    expected = rs.take_rows_update_stats_reference(values, expected_stats, rows, shows, clicks, nonclk, click_coeff)
    out = np.empty((n, 3), dtype=np.float32)
    rs.take_rows_update_stats(values, stats, rows, shows, clicks, nonclk, click_coeff, out)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(stats, expected_stats)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 200), st.integers(0, 2**32 - 1), st.floats(0.5, 1.0), st.floats(0, 3), st.integers(0, 40))
def test_shrink_stats_matches_its_reference(n, seed, decay, threshold, max_unseen):
    stats = random_stats(np.random.default_rng(seed), n + 5)
    expected_stats = stats.copy()
    keep_ref, deleted_ref = rs.shrink_stats_reference(expected_stats, n, decay, 0.1, 1.0, threshold, max_unseen)
    keep = np.empty(n, dtype=np.bool_)
    deleted = rs.shrink_stats(stats, n, decay, 0.1, 1.0, threshold, max_unseen, keep)
    np.testing.assert_array_equal(keep, keep_ref)
    assert deleted == deleted_ref
    np.testing.assert_array_equal(stats, expected_stats)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), max_size=100), st.sampled_from([np.float32, np.int64, np.uint8]))
def test_compact_rows_keeps_the_order_of_the_kept_rows(keep, dtype):
    keep = np.array(keep, dtype=np.bool_)
    arr = np.arange(len(keep) * 2 + 6).reshape(-1, 2).astype(dtype)
    expected = arr.copy()
    assert rs.compact_rows(arr, keep, len(keep)) == rs.compact_rows_reference(expected, keep, len(keep))
    np.testing.assert_array_equal(arr, expected)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 100), st.integers(0, 2**32 - 1), st.floats(0, 3), st.floats(0, 30))
def test_base_rows_matches_its_reference(n, seed, threshold, keep_days):
    stats = random_stats(np.random.default_rng(seed), n)
    start = n // 3
    out = np.empty(n, dtype=np.int64)
    count = rs.base_rows(stats, start, n, 0.1, 1.0, threshold, keep_days, out)
    np.testing.assert_array_equal(out[:count], rs.base_rows_reference(stats, start, n, 0.1, 1.0, threshold, keep_days))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=80))
def test_rows_unique_matches_its_reference_and_leaves_its_scratch_zero(rows):
    rows = np.array(rows, dtype=np.int64)
    bits = np.zeros(26, dtype=np.uint8)
    assert rs.rows_unique(bits, rows) == rs.rows_unique_reference(rows)
    assert not bits.any()
