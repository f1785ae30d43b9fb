"""SparseTable: lazy rows, order-independent initial values, optimizer rules, GEO, save/load, growth."""
import contextlib
import threading

import numpy as np
import pytest

from fleet.errors import ConfigError, DataError
from fleet.kernels import hashtable as ht
from fleet.kernels import reserved_array
from fleet.rules import AdagradRule, AdamRule, SGDRule
from fleet.tables import SparseTable
from fleet.tables.sparse_table import parse_initializer

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
GIB = 1 << 30


@contextlib.contextmanager
def small_growth(migrate_rows_per_key=1, prefault_slots_per_row=1):
    """Slot arrays from 16 slots, reservations from 64 bytes: small tables grow many times."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ht, "MIN_SLOTS", 16)
        mp.setattr(ht, "MIGRATE_ROWS_PER_KEY", migrate_rows_per_key)
        mp.setattr(ht, "PREFAULT_SLOTS_PER_ROW", prefault_slots_per_row)
        mp.setattr(reserved_array, "RESERVE_AFTER_BYTES", 64)
        yield


class PlainSGD:
    """The rule interface in its simplest form, independent of fleet.optimizer."""

    state_names = ()

    def init_state(self, shape):
        return {}

    def apply_dense(self, param, grad, state, lr):
        param -= np.float32(lr) * grad

    def apply_sparse(self, param, rows, values, state, lr):
        np.subtract.at(param, rows, np.float32(lr) * values)


class CountingRule:
    """A rule with per-row state and a scalar step counter, to test how state is kept."""

    state_names = ("hits", "steps")

    def init_state(self, shape):
        return {"hits": np.zeros(shape, dtype=np.float32), "steps": np.zeros(1, dtype=np.float64)}

    def apply_dense(self, param, grad, state, lr):
        raise AssertionError("not used by sparse tables")

    def apply_sparse(self, param, rows, values, state, lr):
        np.add.at(state["hits"], rows, 1.0)
        np.subtract.at(param, rows, np.float32(lr) * values)
        state["steps"][0] += 1


def make_table(rule=None, initializer=("uniform", -1.0, 1.0), **kw):
    return SparseTable("emb", 4, rule or SGDRule(), initializer, seed=kw.pop("seed", 11), **kw)


@pytest.mark.parametrize("rule", [PlainSGD(), SGDRule()], ids=["plain_sgd", "fleet_sgd"])
def test_pull_after_n_pushes_of_v_from_w_workers_equals_the_sgd_value(rule):
    table = make_table(rule, initializer=("constant", 2.0))
    ids = np.array([3, INT64_MIN, 77, INT64_MAX, 0], dtype=np.int64)
    workers, pushes, lr = 4, 25, 0.25
    grads = np.full((len(ids), 4), 0.5, dtype=np.float32)

    def worker():
        for _ in range(pushes):
            table.push(ids, grads, lr)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    expected = 2.0 - lr * 0.5 * pushes * workers
    np.testing.assert_array_equal(table.pull(ids), np.full((len(ids), 4), expected, dtype=np.float32))


def test_initial_values_do_not_depend_on_arrival_order():
    ids = np.random.default_rng(0).integers(INT64_MIN, INT64_MAX, size=5000, dtype=np.int64)
    forward, backward = make_table(), make_table()
    forward.pull(ids)
    for chunk in np.array_split(ids[::-1], 7):
        backward.pull(chunk)
    np.testing.assert_array_equal(forward.pull(ids), backward.pull(ids))


def test_initial_values_depend_on_the_seed():
    ids = np.arange(10, dtype=np.int64)
    assert not np.array_equal(make_table(seed=1).pull(ids), make_table(seed=2).pull(ids))


def test_pull_creates_rows_once_and_repeats_read_the_same_row():
    table = make_table()
    first = table.pull(np.array([9, 9, -9], dtype=np.int64))
    assert table.size == 2
    np.testing.assert_array_equal(first[0], first[1])
    np.testing.assert_array_equal(table.pull(np.array([-9], dtype=np.int64))[0], first[2])


def test_pull_without_create_reads_zeros_and_creates_nothing():
    table = make_table()
    known = table.pull(np.array([1], dtype=np.int64))
    out = table.pull(np.array([1, 2], dtype=np.int64), create=False)
    np.testing.assert_array_equal(out, np.vstack([known, np.zeros((1, 4), np.float32)]))
    assert table.size == 1
    assert table.contains(np.array([1, 2])).tolist() == [True, False]


def test_push_merges_duplicate_ids():
    table = make_table(PlainSGD(), initializer=("constant", 0.0))
    table.push(np.array([5, 5, 6]), np.ones((3, 4), np.float32), 1.0)
    np.testing.assert_array_equal(table.pull(np.array([5, 6]))[:, 0], [-2.0, -1.0])


@pytest.mark.parametrize("rule_factory", [lambda: AdamRule(lazy_mode=True), lambda: AdamRule(lazy_mode=False),
                                          lambda: AdagradRule(initial_accumulator_value=0.1)],
                         ids=["adam_lazy", "adam", "adagrad"])
def test_push_applies_the_rule_as_on_a_dense_matrix_of_the_same_rows(rule_factory):
    rng = np.random.default_rng(3)
    table = make_table(rule_factory())
    ids = np.array([10, -20, 30, 40], dtype=np.int64)
    param = table.pull(ids)
    reference_rule = rule_factory()
    state = reference_rule.init_state(param.shape)
    for _ in range(4):
        pick = rng.integers(0, len(ids), size=6)
        grads = rng.standard_normal((6, 4)).astype(np.float32)
        table.push(ids[pick], grads, 0.01)
        reference_rule.apply_sparse(param, pick.astype(np.int64), grads, state, 0.01)
    np.testing.assert_array_equal(table.pull(ids), param)
    saved = table.state_dict()
    for name in reference_rule.state_names:
        np.testing.assert_array_equal(saved[f"state.{name}"], state[name])


def test_per_row_state_grows_with_new_rows_and_scalar_state_is_kept():
    table = make_table(CountingRule(), capacity=16)
    for start in range(0, 100, 10):
        table.push(np.arange(start, start + 10), np.ones((10, 4), np.float32), 0.1)
    table.push(np.arange(5), np.ones((5, 4), np.float32), 0.1)
    saved = table.state_dict()
    assert saved["state.steps"].tolist() == [11.0]
    np.testing.assert_array_equal(saved["state.hits"][:, 0], [2.0] * 5 + [1.0] * 95)


def test_add_accumulates_deltas_and_creates_missing_rows():
    table = make_table(initializer=("constant", 1.0))
    table.add(np.array([4, 4, 8]), np.full((3, 4), 0.25, np.float32))
    np.testing.assert_array_equal(table.pull(np.array([4, 8]))[:, 0], [1.5, 1.25])


def test_pull_changed_returns_rows_changed_since_each_workers_last_call():
    table = make_table(track_workers=2)
    table.pull(np.array([1, 2, 3]))
    table.add(np.array([2, 1]), np.ones((2, 4), np.float32))
    ids0, values0 = table.pull_changed(0)
    assert ids0.tolist() == [2, 1]
    np.testing.assert_array_equal(values0, table.pull(np.array([2, 1])))
    table.push(np.array([3, 2]), np.ones((2, 4), np.float32), 0.1)
    assert table.pull_changed(0)[0].tolist() == [3, 2]
    assert table.pull_changed(0)[0].tolist() == []
    assert table.pull_changed(1)[0].tolist() == [2, 1, 3]


def test_pull_changed_without_tracking_or_for_an_unknown_worker_says_how_to_fix_it():
    with pytest.raises(ConfigError, match="does not track changed rows; create it with track_workers=N"):
        make_table().pull_changed(0)
    with pytest.raises(ConfigError, match=r"worker 2 is not tracked; changed rows are kept for workers 0..1"):
        make_table(track_workers=2).pull_changed(2)


def test_state_dict_round_trip_is_bit_exact():
    rng = np.random.default_rng(5)
    table = make_table(AdamRule(lazy_mode=True), initializer=("truncated_normal", 0.0, 0.5))
    ids = rng.integers(INT64_MIN, INT64_MAX, size=3000, dtype=np.int64)
    for _ in range(3):
        table.push(ids[rng.integers(0, len(ids), 500)], rng.standard_normal((500, 4)).astype(np.float32), 0.01)
    saved = table.state_dict()
    loaded = make_table(AdamRule(lazy_mode=True), initializer=("truncated_normal", 0.0, 0.5))
    loaded.load_state_dict(saved)
    again = loaded.state_dict()
    assert sorted(again) == sorted(saved)
    for key in saved:
        assert again[key].dtype == saved[key].dtype
        np.testing.assert_array_equal(again[key], saved[key])
    probe = ids[:100]
    np.testing.assert_array_equal(loaded.pull(probe), table.pull(probe))
    grads = rng.standard_normal((100, 4)).astype(np.float32)
    table.push(probe, grads, 0.01)
    loaded.push(probe, grads, 0.01)
    np.testing.assert_array_equal(loaded.pull(probe), table.pull(probe))


def test_iter_chunks_concatenate_to_the_state_dict():
    table = make_table(AdamRule(lazy_mode=True))
    table.pull(np.arange(1000) * 3)
    chunks = list(table.iter_chunks(chunk_rows=300))
    assert [len(c["ids"]) for c in chunks] == [300, 300, 300, 100]
    saved = table.state_dict()
    for key in ("ids", "values", "state.moment1", "state.moment2"):
        np.testing.assert_array_equal(np.concatenate([c[key] for c in chunks]), saved[key])
    np.testing.assert_array_equal(chunks[-1]["state.beta1_pow"], saved["state.beta1_pow"])


def test_iter_chunks_of_an_empty_table_yields_one_empty_chunk_with_scalar_state():
    chunks = list(make_table(AdamRule()).iter_chunks())
    assert len(chunks) == 1 and len(chunks[0]["ids"]) == 0 and "state.beta2_pow" in chunks[0]


def test_loading_a_subset_of_rows_resplits_a_table():
    table = make_table()
    ids = np.arange(-50, 50, dtype=np.int64)
    values = table.pull(ids)
    saved = table.state_dict()
    keep = saved["ids"] % 2 == 0
    shard = make_table()
    shard.load_state_dict({"ids": saved["ids"][keep], "values": saved["values"][keep]})
    assert shard.size == keep.sum()
    np.testing.assert_array_equal(shard.pull(ids[keep]), values[keep])


def test_load_state_dict_names_a_missing_key_and_a_wrong_shape():
    table = make_table(AdamRule())
    saved = table.state_dict()
    del saved["state.moment2"]
    with pytest.raises(ConfigError, match="the state to load has no 'state.moment2'"):
        table.load_state_dict(saved)
    with pytest.raises(ConfigError, match=r"'values' to load is float32\[2, 3\], expected float32\[2, 4\]"):
        make_table().load_state_dict({"ids": np.array([1, 2]), "values": np.zeros((2, 3), np.float32)})


def test_load_state_dict_refuses_duplicate_ids():
    with pytest.raises(ConfigError, match="id 1 appears more than once"):
        make_table().load_state_dict({"ids": np.array([1, 1]), "values": np.zeros((2, 4), np.float32)})


def test_push_with_grads_of_the_wrong_shape_names_both_shapes():
    with pytest.raises(DataError, match=r"grads has shape \(2, 3\), expected \(2, 4\)"):
        make_table().push(np.array([1, 2]), np.zeros((2, 3), np.float32), 0.1)


@pytest.mark.parametrize(
    "spec,message",
    [(("gaussian", 0, 1), "is not one of"), (("uniform", 1.0), "needs 2 numbers"),
     (("uniform", 2.0, 1.0), "low must not exceed high"), (("normal", 0.0, -1.0), "std must be >= 0"),
     (("constant", "x"), "non-number argument")],
)
def test_bad_initializer_specs_are_refused_with_the_forms_allowed(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_initializer(spec)


def test_memory_per_row_is_small_for_sgd_and_counts_the_slots_a_growth_holds():
    table = SparseTable("emb", 10, SGDRule(), ("uniform", -1.0, 1.0))
    phases = set()
    for start in range(0, 470_000, 10_000):  # 2**19 slots -> 2**20 at 367K rows, migrated by 459K
        table.pull(np.arange(start, start + 10_000, dtype=np.int64))
        index, size = table._index, table.size
        prepared = 0 if index._next is None else 8 * index._touched
        phases.add("migrating" if index.migrating else "preparing" if prepared else "steady")
        rows = table._value_store.memory_bytes(size) + index._ids.memory_bytes(size)
        assert table.memory_bytes() == rows + index.slots.nbytes + index._old.nbytes + prepared
    assert phases == {"migrating", "preparing", "steady"}
    # between growths: 40 bytes of values + 8 of id + 8 per slot at a load of 0.35-0.45,
    # plus at most one (huge) page per array
    assert not table._index.migrating and table._index._next is None
    page = reserved_array._THP_BYTES
    assert 40 + 8 + 17 <= table.bytes_per_row() <= 40 + 8 + 23 + 2 * page / table.size


@pytest.mark.slow
def test_a_table_of_ten_million_rows_of_dim_ten_can_be_created_and_updated():
    table = SparseTable("big", 10, SGDRule(), ("constant", 0.0))
    for start in range(0, 10_000_000, 1_000_000):
        table.pull(np.arange(start, start + 1_000_000, dtype=np.int64))
    assert table.size == 10_000_000
    ids = np.arange(0, 10_000_000, 997, dtype=np.int64)
    table.push(ids, np.ones((len(ids), 10), np.float32), 0.5)
    np.testing.assert_array_equal(table.pull(ids[-3:]), np.full((3, 10), -0.5, np.float32))
    np.testing.assert_array_equal(table.pull(np.array([1], dtype=np.int64)), np.zeros((1, 10), np.float32))
    # 8 GiB for 100M rows, even while the index holds a second slot array
    assert table.memory_bytes() < 10_000_000 * 8 * GIB / 100_000_000


def test_empty_batches_are_no_ops():
    table = make_table(AdamRule(lazy_mode=True), track_workers=1)
    assert table.pull([]).shape == (0, 4)
    table.push([], np.zeros((0, 4), np.float32), 0.1)
    table.add(np.array([], dtype=np.int64), np.zeros((0, 4), np.float32))
    assert table.size == 0 and table.pull_changed(0)[0].tolist() == []
    assert table.state_dict()["state.beta1_pow"].tolist() == [0.9]


def test_non_integer_ids_are_refused():
    with pytest.raises(DataError, match="ids must be integers; got dtype float64"):
        make_table().pull(np.array([1.5]))


class ReferenceTable:
    """The table's semantics in plain numpy: rows in creation order, arrays grown by concatenation."""

    def __init__(self, rule, dim, initializer, seed, workers):
        self.rule, self.dim, self.seed = rule, dim, seed
        self.kind, self.a, self.b = parse_initializer(initializer)
        self.rows = {}
        self.values = np.zeros((0, dim), np.float32)
        self.state = rule.init_state((0, dim))
        self.changed = [dict() for _ in range(workers)]

    def _rows(self, ids):
        new = [int(i) for i in dict.fromkeys(ids.tolist()) if int(i) not in self.rows]
        for i in new:
            self.rows[i] = len(self.rows)
        fresh = np.empty((len(new), self.dim), np.float32)
        ht.init_rows(fresh, np.array(new, dtype=np.int64), 0, len(new), self.kind, self.a, self.b, self.seed)
        self.values = np.concatenate([self.values, fresh])
        grown = self.rule.init_state((len(new), self.dim))
        for key in self.rule.row_state_names:
            self.state[key] = np.concatenate([self.state[key], grown[key]])
        return np.array([self.rows[int(i)] for i in ids], dtype=np.int64)

    def _mark(self, rows):
        for changed in self.changed:
            changed.update(dict.fromkeys(rows.tolist()))

    def pull(self, ids):
        rows = self._rows(ids)
        return self.values[rows]

    def push(self, ids, grads, lr):
        rows = self._rows(ids)
        self.rule.apply_sparse(self.values, rows, grads, self.state, lr)
        self._mark(rows)

    def add(self, ids, deltas):
        rows = self._rows(ids)
        np.add.at(self.values, rows, deltas)
        self._mark(rows)

    def pull_changed(self, worker):
        rows = np.array(list(self.changed[worker]), dtype=np.int64)
        self.changed[worker] = {}
        ids = np.array(list(self.rows), dtype=np.int64)[rows] if len(rows) else np.zeros(0, np.int64)
        return ids, self.values[rows]


def run_workload(table, seed=21, steps=40):
    """Pulls, Adam pushes and GEO adds over ids old and new; returns every result."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(INT64_MIN, INT64_MAX, size=4000, dtype=np.int64)
    pool[:4] = [0, -1, INT64_MIN, INT64_MAX]
    results = []
    for step in range(steps):
        ids = pool[rng.integers(0, min(len(pool), 100 * (step + 1)), size=150)]
        action = step % 4
        if action == 0:
            results.append(table.pull(ids))
        elif action in (1, 2):
            table.push(ids, rng.standard_normal((len(ids), 4)).astype(np.float32), 0.05)
        else:
            table.add(ids, rng.standard_normal((len(ids), 4)).astype(np.float32))
        if step % 5 == 4:
            results.extend(table.pull_changed(step % 2))
    results.append(table.pull(pool[:2000]))
    return results


GROWTH_PATHS = {
    "default": (contextlib.nullcontext, {}),
    "presized": (contextlib.nullcontext, {"capacity": 5000}),
    "tiny_slots_slow_pace": (small_growth, {}),
    "tiny_slots_default_pace": (lambda: small_growth(4, 16), {}),
}


@pytest.mark.parametrize("path", sorted(GROWTH_PATHS))
def test_values_state_and_changed_rows_do_not_depend_on_the_growth_path(path):
    context, kwargs = GROWTH_PATHS[path]
    reference = ReferenceTable(AdamRule(lazy_mode=True), 4, ("normal", 0.0, 0.5), 11, workers=2)
    expected = run_workload(reference)
    with context():
        table = make_table(AdamRule(lazy_mode=True), initializer=("normal", 0.0, 0.5), track_workers=2, **kwargs)
        got = run_workload(table)
        saved = table.state_dict()
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(saved["ids"], np.array(list(reference.rows), dtype=np.int64))
    np.testing.assert_array_equal(saved["values"], reference.values)
    for key in ("moment1", "moment2", "beta1_pow", "beta2_pow"):
        np.testing.assert_array_equal(saved[f"state.{key}"], reference.state[key])


def test_state_dict_round_trip_in_the_middle_of_a_migration():
    rng = np.random.default_rng(8)
    with small_growth():
        table = make_table(AdagradRule(initial_accumulator_value=0.1), track_workers=1)
        ids = rng.integers(INT64_MIN, INT64_MAX, size=5000, dtype=np.int64)
        for batch in np.array_split(ids, 100):
            table.push(batch, np.ones((len(batch), 4), np.float32), 0.1)
            if table._index.migrating and table.size > 1000:
                break
        assert table._index.migrating
        saved = table.state_dict()
        loaded = make_table(AdagradRule(initial_accumulator_value=0.1), track_workers=1)
        loaded.load_state_dict(saved)
        again = loaded.state_dict()
        for key in saved:
            np.testing.assert_array_equal(again[key], saved[key])
        grads = rng.standard_normal((len(ids), 4)).astype(np.float32)
        table.push(ids, grads, 0.1)
        loaded.push(ids, grads, 0.1)
        np.testing.assert_array_equal(loaded.pull(ids), table.pull(ids))
        np.testing.assert_array_equal(loaded.pull_changed(0)[0], ids)


def test_pull_changed_keeps_first_change_order_across_many_growths():
    with small_growth():
        table = make_table(track_workers=2)
        expected = {0: [], 1: []}
        ids = np.arange(6000, dtype=np.int64) * 7 - 20_000
        for i, batch in enumerate(np.array_split(ids, 60)):
            table.add(batch[::-1], np.ones((len(batch), 4), np.float32))
            for w in (0, 1):
                expected[w].extend(batch[::-1].tolist())
            if i % 7 == 0:
                assert table.pull_changed(0)[0].tolist() == expected[0]
                expected[0] = []
        # re-marking an old row during later growth does not repeat it
        table.add(ids[:3], np.ones((3, 4), np.float32))
        changed, values = table.pull_changed(1)
        assert changed.tolist() == expected[1]
        np.testing.assert_array_equal(values, table.pull(changed))
        assert table.pull_changed(0)[0].tolist() == expected[0] + ids[:3].tolist()


def test_loading_forgets_pending_changes_and_reports_later_ones():
    table = make_table(track_workers=1)
    ids = np.array([1, 2, 3], dtype=np.int64)
    table.add(ids, np.ones((3, 4), np.float32))
    table.load_state_dict(table.state_dict())
    assert table.pull_changed(0)[0].tolist() == []
    table.add(ids[::-1], np.ones((3, 4), np.float32))
    assert table.pull_changed(0)[0].tolist() == [3, 2, 1]
