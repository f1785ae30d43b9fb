"""SparseTable with entries and the CTR accessor: pull_train, statistics, admission, memory, state."""
import numpy as np
import pytest

from fleet.entries import CountFilterEntry, CtrAccessorConfig, ProbabilityEntry, ShowClickEntry
from fleet.errors import ConfigError, DataError
from fleet.rules import AdagradRule, RegularizedRule, SGDRule, unique_rows_update
from fleet.tables import SparseTable

DIM = 4


def make_table(**kw):
    return SparseTable("emb", DIM, kw.pop("rule", SGDRule()), ("uniform", -1.0, 1.0), seed=5, **kw)


def test_a_plain_table_keeps_no_statistics_and_its_memory_is_unchanged():
    table = make_table()
    assert not table.has_statistics and table.accessor is None and table.entry is None
    ids = np.arange(1000, dtype=np.int64)
    table.pull(ids)
    # values + ids + the index's slots: nothing more
    assert table.memory_bytes() == 1000 * DIM * 4 + table._index.memory_bytes()
    with pytest.raises(ConfigError, match="sparse table 'emb' keeps no statistics, so it has no statistics"):
        table.statistics(ids)
    with pytest.raises(ConfigError, match=r"create it with entry=\.\.\. or accessor=CtrAccessorConfig\(\)"):
        table.shrink()
    assert "stats" not in table.state_dict()


def test_pull_train_without_entry_creates_rows_and_counts_show_click_and_delta_score():
    table = make_table(accessor=CtrAccessorConfig(nonclk_coeff=0.5, click_coeff=2.0))
    plain = make_table()
    ids = np.array([7, -3, 11], dtype=np.int64)
    got = table.pull_train(ids, shows=[3, 1, 2], clicks=[1, 0, 2])
    np.testing.assert_array_equal(got, plain.pull(ids))
    table.pull_train(ids[:1], shows=[1], clicks=[0])
    stats = table.statistics(np.array([7, -3, 11, 99], dtype=np.int64))
    # show, click, unseen_days, delta_score = sum of (show - click) * 0.5 + click * 2
    np.testing.assert_allclose(stats, [[4, 1, 0, 1.0 + 2.0 + 0.5], [1, 0, 0, 0.5], [2, 2, 0, 4.0], [0, 0, 0, 0]])
    assert table.size == 3


def test_pull_train_defaults_to_one_show_per_id_and_checks_lengths():
    table = make_table(accessor=CtrAccessorConfig())
    table.pull_train(np.array([1, 2], dtype=np.int64))
    np.testing.assert_allclose(table.statistics([1, 2])[:, :2], [[1, 0], [1, 0]])
    with pytest.raises(DataError, match="sparse table 'emb': shows has 3 entries for 2 ids; give one per id"):
        table.pull_train(np.array([1, 2], dtype=np.int64), shows=[1, 1, 1])


def test_count_filter_table_creates_a_row_on_the_lookup_reaching_the_count():
    table = make_table(entry=CountFilterEntry(3), sketch_width=1 << 12)
    plain = make_table()
    assert table.has_statistics and table.accessor == CtrAccessorConfig()
    ids = np.array([5, 6], dtype=np.int64)
    first = table.pull_train(ids, shows=[2, 1])
    np.testing.assert_array_equal(first, np.zeros((2, DIM), dtype=np.float32))
    assert table.size == 0
    # pushes and adds to ids without a row are dropped, pull never creates
    table.push(ids, np.ones((2, DIM), dtype=np.float32), 0.1)
    table.add(ids, np.ones((2, DIM), dtype=np.float32))
    np.testing.assert_array_equal(table.pull(ids, create=True), np.zeros((2, DIM), dtype=np.float32))
    assert table.size == 0
    second = table.pull_train(ids, shows=[1, 1])  # 5 reaches 3 sightings, 6 has 2
    np.testing.assert_array_equal(second[0], plain.pull(ids[:1])[0])
    np.testing.assert_array_equal(second[1], np.zeros(DIM, dtype=np.float32))
    assert table.contains(ids).tolist() == [True, False]
    np.testing.assert_allclose(table.statistics(ids), [[1, 0, 0, 0.1], [0, 0, 0, 0]])
    # that batch's gradient applies to the new row only
    table.push(ids, np.ones((2, DIM), dtype=np.float32), 0.5)
    np.testing.assert_allclose(table.pull(ids[:1], create=False), plain.pull(ids[:1]) - 0.5)
    assert table.size == 1


def test_probability_and_show_click_tables_admit_deterministically():
    ids = np.arange(2000, dtype=np.int64)
    made = [make_table(entry=ProbabilityEntry(0.25)) for _ in range(2)]
    for table in made:
        table.pull_train(ids)
    assert 350 < made[0].size < 650
    np.testing.assert_array_equal(made[0].contains(ids), made[1].contains(ids))
    table = make_table(entry=ShowClickEntry("show", "click"))
    table.pull_train(ids[:3], shows=[0, 20, 1], clicks=[0, 0, 1])  # scores 0, 2, 1
    assert table.contains(ids[:3]).tolist() == [False, True, True]


def test_memory_counts_statistics_and_the_sketch():
    plain, stats_table = make_table(), make_table(accessor=CtrAccessorConfig())
    entry_table = make_table(entry=CountFilterEntry(1), sketch_width=1 << 12)
    ids = np.arange(5000, dtype=np.int64)
    for table in (plain, stats_table, entry_table):
        table.pull_train(ids)
    # 16 bytes of statistics per row, and one bit of scratch to tell a push's rows unique
    assert stats_table.memory_bytes() - plain.memory_bytes() == 16 * 5000 + 5000 // 8 + 1
    assert entry_table.memory_bytes() - stats_table.memory_bytes() == 4 << 12


def test_state_dict_carries_stats_and_load_restores_them():
    table = make_table(accessor=CtrAccessorConfig(), rule=AdagradRule())
    ids = np.arange(10, dtype=np.int64)
    table.pull_train(ids, shows=np.arange(10), clicks=np.ones(10))
    table.push(ids, np.ones((10, DIM), dtype=np.float32), 0.1)
    state = table.state_dict()
    assert state["stats"].shape == (10, 4) and state["stats"].dtype == np.float32
    other = make_table(accessor=CtrAccessorConfig(), rule=AdagradRule())
    other.load_state_dict(state)
    for key, arr in other.state_dict().items():
        np.testing.assert_array_equal(arr, state[key], err_msg=key)
    del state["stats"]
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.statistics(ids), np.zeros((10, 4), dtype=np.float32))
    with pytest.raises(ConfigError, match="the state to load has 'stats' but the table keeps no statistics"):
        make_table(rule=AdagradRule()).load_state_dict(table.state_dict())
    with pytest.raises(ConfigError, match=r"'stats' to load is float32\[10, 3\], expected float32\[10, 4\]"):
        other.load_state_dict(dict(table.state_dict(), stats=np.zeros((10, 3), dtype=np.float32)))


def test_accessor_from_a_dict_with_paddle_names():
    table = make_table(accessor={"sparse_delete_threshold": 0.5})
    assert table.accessor.delete_threshold == 0.5
    with pytest.raises(ConfigError, match="accessor 3 is not a CtrAccessorConfig or dict"):
        make_table(accessor=3)


@pytest.mark.parametrize("rule", [SGDRule(), AdagradRule(), RegularizedRule(AdagradRule(), "l2", 0.1)],
                         ids=["sgd", "adagrad", "regularized"])
def test_pushes_of_unique_rows_skip_the_merge_with_bit_identical_results(rule):
    stats_table, plain = make_table(rule=rule, accessor=CtrAccessorConfig()), make_table(rule=rule)
    rng = np.random.default_rng(0)
    for ids in (rng.permutation(300), rng.integers(0, 300, 200)):  # unique, then with repeats
        grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        for table in (stats_table, plain):
            table.pull(ids)
            table.push(ids, grads, 0.1)
        got, want = stats_table.state_dict(), plain.state_dict()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert not stats_table._unique_bits.array.any()


def test_only_a_rule_whose_update_comes_with_it_skips_the_merge():
    class LoggedAdagrad(AdagradRule):
        def apply_sparse(self, param, rows, values, state, lr):
            super().apply_sparse(param, rows, values, state, lr)

    assert unique_rows_update(AdagradRule()) is not None
    assert unique_rows_update(LoggedAdagrad()) is None
    regularized = RegularizedRule(SGDRule(), "l1", 0.5)
    assert unique_rows_update(regularized).__func__ is RegularizedRule.apply_sparse_unique


def test_a_probability_table_creates_a_fraction_of_new_ids_within_three_sigma_of_p():
    n, p = 200_000, 0.05
    table = make_table(entry=ProbabilityEntry(p), sketch_width=1 << 20)
    ids = np.arange(n, dtype=np.int64) * 7 - 10**12
    for batch in np.array_split(ids, 20):
        out = table.pull_train(batch)
        created = table.contains(batch)
        assert not out[~created].any()  # an id not admitted reads as a zero row
    assert abs(table.size / n - p) <= 3 * (p * (1 - p) / n) ** 0.5, table.size / n
