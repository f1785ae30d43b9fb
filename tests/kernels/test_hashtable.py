"""The sparse-table kernels against their plain-Python references, and the index's growth."""
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.errors import ConfigError
from fleet.kernels import hashtable as ht
from fleet.kernels import reserved_array

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
EXTREMES = [0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1]

int64s = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from(EXTREMES), st.integers(-50, 50))
id_batches = st.lists(st.lists(int64s, max_size=300), min_size=1, max_size=6)


@contextlib.contextmanager
def small_growth(migrate_rows_per_key=1, prefault_slots_per_row=1):
    """Slot arrays from 16 slots and reservations from 64 bytes, so small tests grow many times.

    Paces below the defaults' guarantees make calls also complete pending phases at a switch.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ht, "MIN_SLOTS", 16)
        mp.setattr(ht, "MIGRATE_ROWS_PER_KEY", migrate_rows_per_key)
        mp.setattr(ht, "PREFAULT_SLOTS_PER_ROW", prefault_slots_per_row)
        mp.setattr(reserved_array, "RESERVE_AFTER_BYTES", 64)
        yield


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
    index.reserve(100_000)
    slots, row_ids = index.slots, index.row_ids
    index.lookup_or_insert(np.arange(100_000, dtype=np.int64))
    assert index.slots is slots and index.row_ids is row_ids
    assert not index.migrating and index._next is None


def test_reserve_during_a_migration_rebuilds_every_row():
    with small_growth():
        index = ht.HashIndex(capacity=16)
        keys = np.arange(-500, 500, dtype=np.int64) * 7919
        for batch in np.array_split(keys, 40):
            index.lookup_or_insert(batch)
            if index.migrating:
                break
        assert index.migrating
        size = index.size
        index.reserve(5000)
        assert not index.migrating
        np.testing.assert_array_equal(index.lookup(keys[:size]), np.arange(size))
        index.lookup_or_insert(keys)
        np.testing.assert_array_equal(index.lookup(keys), np.arange(len(keys)))


def test_non_integer_ids_are_refused():
    with pytest.raises(ConfigError, match="ids must be integers; got dtype float64"):
        ht.HashIndex().lookup(np.array([1.5]))


operations = st.lists(
    st.tuples(st.sampled_from(["insert", "lookup"]), st.integers(0, 150), st.lists(int64s, max_size=8)),
    min_size=8, max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(operations, st.integers(0, 2**32 - 1), st.sampled_from([(1, 1), (4, 16), (2, 64)]))
def test_index_matches_a_dict_through_many_growths_with_lookups_mid_migration(ops, seed, pace):
    rng = np.random.default_rng(seed)
    with small_growth(*pace):
        index = ht.HashIndex(capacity=16)
        reference = {}
        for op, fresh, extremes in ops:
            known = np.array(list(reference), dtype=np.int64).reshape(-1)
            repeats = known[rng.integers(0, len(known), size=min(len(known), 20))] if len(known) else known
            keys = np.concatenate([rng.integers(INT64_MIN, INT64_MAX, size=fresh, dtype=np.int64),
                                   np.array(extremes, dtype=np.int64), repeats])
            rng.shuffle(keys)
            if op == "insert":
                rows, created = index.lookup_or_insert(keys)
                before = len(reference)
                np.testing.assert_array_equal(rows, ht.lookup_or_insert_reference(reference, keys))
                assert created == len(reference) - before
            else:
                # unknown ids and every third known id, whatever phase the index is in
                queries = np.concatenate([keys, known[::3]])
                np.testing.assert_array_equal(index.lookup(queries), ht.lookup_reference(reference, queries))
            assert index.size == len(reference)
        known = np.array(list(reference), dtype=np.int64).reshape(-1)
        np.testing.assert_array_equal(index.ids, known)
        np.testing.assert_array_equal(index.lookup(known), np.arange(len(known)))


def test_lookups_and_inserts_during_a_migration_see_old_and_new_rows():
    with small_growth(migrate_rows_per_key=1, prefault_slots_per_row=16):
        index = ht.HashIndex(capacity=16)
        keys = np.random.default_rng(4).integers(INT64_MIN, INT64_MAX, size=3000, dtype=np.int64)
        done = 0
        while not index.migrating:
            index.lookup_or_insert(keys[done : done + 7])
            done += 7
        # rows created before the switch are in the old slot array, most not yet migrated
        assert index._migrated < index._old_rows <= index.size == done
        np.testing.assert_array_equal(index.lookup(keys[:done]), np.arange(done))
        rows, created = index.lookup_or_insert(keys[done - 5 : done + 5])  # 5 old, 5 new
        assert created == 5 and rows.tolist() == list(range(done - 5, done + 5))
        assert index.lookup(np.array([12345], dtype=np.int64)).tolist() == [-1]
        # read-only traffic finishes the migration, and the old array is let go
        while index.migrating:
            index.lookup(keys[:3])
        assert len(index._old) == 0
        np.testing.assert_array_equal(index.lookup(keys[: done + 5]), np.arange(done + 5))


def grow_and_record_switches(batch, hits, rows=200_000):
    """Grows a default index with calls of ``batch`` keys; returns the work pending at each switch."""
    pending = []
    original = ht.HashIndex._switch

    def switch(index):
        unprepared = 2 * len(index.slots) if index._next is None else len(index._next) - index._touched
        pending.append((index._old_rows - index._migrated if index.migrating else 0, unprepared))
        original(index)

    rng = np.random.default_rng(7)
    index = ht.HashIndex()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ht.HashIndex, "_switch", switch)
        while index.size < rows:
            keys = rng.integers(INT64_MIN, INT64_MAX, size=batch, dtype=np.int64)
            if index.size and hits:
                old = index.ids[rng.integers(0, index.size, size=int(batch * hits))]
                keys = np.concatenate([keys[: batch - len(old)], old])
            index.lookup_or_insert(keys)
    assert index.size <= ht.MAX_LOAD * len(index.slots)
    return pending


@pytest.mark.parametrize("batch,hits", [(250, 0.0), (250, 0.5), (250, 0.95), (4000, 0.0)],
                         ids=["all_new", "half_hits", "mostly_hits", "large_calls"])
def test_with_the_default_pace_a_switch_leaves_only_the_calling_batch_its_share(batch, hits):
    # no call pays for a whole rehash: at every switch the previous migration is over and
    # the next slot array lacks at most what the rows of one call owe
    pending = grow_and_record_switches(batch, hits)
    assert len(pending) == 4  # 2**15 -> 2**16 -> 2**17 -> 2**18 -> 2**19 slots
    for migrating, unprepared in pending:
        assert migrating == 0
        assert unprepared <= ht.PREFAULT_SLOTS_PER_ROW * batch


def test_memory_bytes_counts_the_old_slots_while_migrating_and_the_prepared_next_slots():
    with small_growth(migrate_rows_per_key=1, prefault_slots_per_row=1):
        index = ht.HashIndex(capacity=16)
        keys = np.arange(10_000, dtype=np.int64)
        done = 0
        while not index.migrating:
            index.lookup_or_insert(keys[done : done + 50])
            done += 50
        ids_bytes = index._ids.memory_bytes(index.size)
        assert index.memory_bytes() == index.slots.nbytes + index._old.nbytes + ids_bytes
        while index.migrating:
            index.lookup(keys[:10])
        while index._next is None:
            index.lookup_or_insert(keys[done : done + 50])
            done += 50
        prepared = 8 * index._touched
        assert 0 < prepared < index._next.nbytes
        assert index.memory_bytes() == index.slots.nbytes + prepared + index._ids.memory_bytes(index.size)


@settings(max_examples=50, deadline=None)
@given(st.lists(int64s, unique=True, max_size=200), st.data())
def test_hash_lookup_finds_rows_still_in_the_old_slots_and_inserts_only_into_the_new(ids, data):
    n = len(ids)
    old_rows = data.draw(st.integers(0, n), label="old_rows")
    migrated = data.draw(st.integers(0, old_rows), label="migrated")
    row_ids = np.empty(n + 50, dtype=np.int64)
    row_ids[:n] = ids
    old = np.zeros(512, dtype=np.uint64)
    ht.hash_insert_rows(old, row_ids, 0, old_rows)
    new = np.zeros(1024, dtype=np.uint64)
    ht.hash_insert_rows(new, row_ids, 0, migrated)
    ht.hash_insert_rows(new, row_ids, old_rows, n)
    reference = {int(k): i for i, k in enumerate(ids)}
    absent = [k for k in data.draw(st.lists(int64s, max_size=50), label="others") if k not in reference]
    queries = np.array(ids + absent, dtype=np.int64)
    out = np.empty(len(queries), dtype=np.int64)
    ht.hash_lookup(new, old, row_ids, queries, out)
    np.testing.assert_array_equal(out, ht.lookup_reference(reference, queries))

    frozen = old.copy()
    out = np.empty(len(queries), dtype=np.int64)
    stop, size = ht.hash_lookup_or_insert(new, old, row_ids, n, queries, out, 0, n + 50)
    assert (stop, size) == (len(queries), n + len(set(absent)))
    np.testing.assert_array_equal(out, ht.lookup_or_insert_reference(reference, queries))
    np.testing.assert_array_equal(old, frozen)


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
