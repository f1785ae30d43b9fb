"""The sparse-table kernels against their plain-Python references."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.errors import ConfigError
from fleet.kernels import hashtable as ht

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EXTREMES = [0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1]

int64s = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from(EXTREMES), st.integers(-50, 50))
id_batches = st.lists(st.lists(int64s, max_size=300), min_size=1, max_size=6)


def test_splitmix64_matches_the_design_formula():
    for x in [0, 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15, 123456789]:
        assert int(ht.splitmix64(np.uint64(x))) == ht.splitmix64_reference(x)
    # known value of splitmix64(0): the first output of the splitmix64 generator seeded with 0
    assert ht.splitmix64_reference(0) == 0xE220A8397B1DCDAF


@settings(max_examples=50, deadline=None)
@given(id_batches)
def test_lookup_or_insert_matches_a_dict_through_growth(batches):
    index = ht.HashIndex(capacity=16)
    reference = {}
    for batch in batches:
        keys = np.array(batch, dtype=np.int64)
        rows, created = index.lookup_or_insert(keys)
        before = len(reference)
        expected = ht.lookup_or_insert_reference(reference, keys)
        np.testing.assert_array_equal(rows, expected)
        assert created == len(reference) - before
        assert index.size == len(reference)
    np.testing.assert_array_equal(index.ids, np.array(list(reference), dtype=np.int64).reshape(-1))


@settings(max_examples=50, deadline=None)
@given(st.lists(int64s, max_size=400), st.lists(int64s, max_size=200))
def test_lookup_finds_inserted_ids_and_reports_minus_one_for_others(inserted, probes):
    index = ht.HashIndex(capacity=16)
    reference = {}
    keys = np.array(inserted, dtype=np.int64)
    index.lookup_or_insert(keys)
    ht.lookup_or_insert_reference(reference, keys)
    queries = np.array(probes + inserted, dtype=np.int64)
    np.testing.assert_array_equal(index.lookup(queries), ht.lookup_reference(reference, queries))
    assert index.size == len(reference)


def test_every_int64_extreme_is_a_valid_key_and_zero_is_not_a_sentinel():
    index = ht.HashIndex()
    keys = np.array(EXTREMES, dtype=np.int64)
    rows, created = index.lookup_or_insert(keys)
    assert created == len(EXTREMES)
    np.testing.assert_array_equal(rows, np.arange(len(EXTREMES)))
    np.testing.assert_array_equal(index.lookup(keys[::-1]), rows[::-1])
    assert index.lookup(np.array([2, -2], dtype=np.int64)).tolist() == [-1, -1]


def test_growth_keeps_every_row_and_load_stays_under_the_limit():
    index = ht.HashIndex(capacity=16)
    keys = np.random.default_rng(1).integers(INT64_MIN, INT64_MAX, size=200_000, dtype=np.int64)
    keys = np.unique(keys)
    rows, created = index.lookup_or_insert(keys)
    assert created == len(keys)
    np.testing.assert_array_equal(rows, np.arange(len(keys)))
    assert index.size <= ht.MAX_LOAD * len(index.slots)
    np.testing.assert_array_equal(index.lookup(keys), rows)
    np.testing.assert_array_equal(index.ids, keys)


def test_a_batch_of_repeats_creates_one_row_per_distinct_id():
    index = ht.HashIndex()
    rows, created = index.lookup_or_insert(np.array([7, 7, -7, 7, -7], dtype=np.int64))
    assert created == 2 and rows.tolist() == [0, 0, 1, 0, 1]


def test_load_ids_rebuilds_rows_in_the_given_order():
    index = ht.HashIndex()
    ids = np.array([5, INT64_MIN, 0, 99], dtype=np.int64)
    index.load_ids(ids)
    np.testing.assert_array_equal(index.lookup(ids), np.arange(4))
    np.testing.assert_array_equal(index.ids, ids)


def test_load_ids_with_a_duplicate_names_it():
    index = ht.HashIndex()
    with pytest.raises(ConfigError, match=r"id 5 appears more than once in the ids to load \(position 2\)"):
        index.load_ids(np.array([5, 6, 5], dtype=np.int64))


def test_reserve_avoids_later_growth():
    index = ht.HashIndex()
    index.reserve(10_000)
    slots, row_ids = index.slots, index.row_ids
    index.lookup_or_insert(np.arange(10_000, dtype=np.int64))
    assert index.slots is slots and index.row_ids is row_ids


def test_non_integer_ids_are_refused():
    with pytest.raises(ConfigError, match="ids must be integers; got dtype float64"):
        ht.HashIndex().lookup(np.array([1.5]))


@pytest.mark.parametrize(
    "kind,a,b",
    [(ht.INIT_UNIFORM, -1.0, 1.0), (ht.INIT_NORMAL, 0.5, 2.0), (ht.INIT_TRUNCATED_NORMAL, 0.0, 1.0),
     (ht.INIT_CONSTANT, 3.0, 0.0)],
)
def test_init_rows_matches_the_reference_per_seed_id_and_column(kind, a, b):
    ids = np.array([0, -1, INT64_MIN, INT64_MAX, 12345], dtype=np.int64)
    values = np.empty((len(ids), 3), dtype=np.float32)
    ht.init_rows(values, ids, 0, len(ids), kind, a, b, 42)
    expected = [[ht.init_value_reference(42, int(i), c, kind, a, b, 3) for c in range(3)] for i in ids]
    np.testing.assert_allclose(values, np.array(expected, dtype=np.float32), rtol=1e-6, atol=1e-6)


def test_init_rows_draws_have_the_requested_distribution():
    ids = np.arange(20_000, dtype=np.int64)
    values = np.empty((len(ids), 5), dtype=np.float32)
    ht.init_rows(values, ids, 0, len(ids), ht.INIT_UNIFORM, -2.0, 4.0, 7)
    assert values.min() >= -2.0 and values.max() <= 4.0
    assert abs(values.mean() - 1.0) < 0.05
    ht.init_rows(values, ids, 0, len(ids), ht.INIT_NORMAL, 1.0, 3.0, 7)
    assert abs(values.mean() - 1.0) < 0.05 and abs(values.std() - 3.0) < 0.05
    ht.init_rows(values, ids, 0, len(ids), ht.INIT_TRUNCATED_NORMAL, 0.0, 1.0, 7)
    assert values.min() >= -2.0 and values.max() <= 2.0 and abs(values.std() - 0.88) < 0.02


def test_init_rows_differs_by_seed_and_by_column():
    ids = np.array([1, 2], dtype=np.int64)
    one, two = np.empty((2, 4), np.float32), np.empty((2, 4), np.float32)
    ht.init_rows(one, ids, 0, 2, ht.INIT_UNIFORM, 0.0, 1.0, 1)
    ht.init_rows(two, ids, 0, 2, ht.INIT_UNIFORM, 0.0, 1.0, 2)
    assert not np.array_equal(one, two)
    assert len(set(one[0].tolist())) == 4


def test_take_rows_reads_rows_and_zeros_for_missing():
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    rows = np.array([3, -1, 0, 3], dtype=np.int64)
    out = np.empty((4, 3), dtype=np.float32)
    ht.take_rows(values, rows, out)
    expected = values[np.maximum(rows, 0)] * (rows >= 0)[:, None]
    np.testing.assert_array_equal(out, expected)


def test_fill_rows_copies_the_template_into_a_row_range():
    values = np.zeros((5, 2), dtype=np.float32)
    ht.fill_rows(values, 1, 4, np.array([0.5, -1.0], dtype=np.float32))
    np.testing.assert_array_equal(values, [[0, 0], [0.5, -1], [0.5, -1], [0.5, -1], [0, 0]])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 99), max_size=40), min_size=1, max_size=5))
def test_mark_rows_and_clear_marks_keep_each_changed_row_once_in_first_change_order(batches):
    bits = np.zeros(13, dtype=np.uint8)
    pending = np.empty(100, dtype=np.int64)
    count = 0
    expected = []
    for batch in batches:
        rows = np.array(batch, dtype=np.int64)
        count = ht.mark_rows(bits, pending, count, rows)
        for r in batch:
            if r not in expected:
                expected.append(r)
    assert pending[:count].tolist() == expected
    ht.clear_marks(bits, pending[:count])
    assert not bits.any()
