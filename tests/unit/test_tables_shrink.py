"""SparseTable.shrink: decay, age, delete exactly the rows the accessor's rule names, compact."""
import numpy as np
import pytest

from fleet.entries import CountFilterEntry, CtrAccessorConfig
from fleet.rules import AdagradRule
from fleet.tables import SparseTable

DIM = 2


def make_table(**kw):
    kw.setdefault("accessor", CtrAccessorConfig())
    return SparseTable("emb", DIM, AdagradRule(), ("uniform", -1, 1), seed=9, **kw)


def shrink_reference(state, config):
    """Numpy reference of one shrink on a state_dict: returns (state after, deleted ids)."""
    stats = state["stats"].copy()
    stats[:, 0] *= np.float32(config.show_click_decay_rate)
    stats[:, 1] *= np.float32(config.show_click_decay_rate)
    stats[:, 2] += np.float32(1)
    score = ((stats[:, 0] - stats[:, 1]).astype(np.float64) * config.nonclk_coeff
             + stats[:, 1].astype(np.float64) * config.click_coeff)
    delete = (score < config.delete_threshold) | (stats[:, 2] > config.delete_after_unseen_days)
    after = {key: arr[~delete] for key, arr in state.items() if key != "stats"}
    after["stats"] = stats[~delete]
    return after, state["ids"][delete]


@pytest.mark.parametrize("config", [CtrAccessorConfig(),
                                    CtrAccessorConfig(delete_threshold=0.3, delete_after_unseen_days=2,
                                                      show_click_decay_rate=0.5, nonclk_coeff=0.2)])
def test_shrink_deletes_exactly_the_rows_the_rule_names_and_keeps_the_order_of_survivors(config):
    table = make_table(accessor=config)
    rng = np.random.default_rng(0)
    for day in range(6):
        for _ in range(5):
            ids = np.unique(rng.zipf(1.5, 400) % 3000 + day * 300)
            shows = rng.integers(1, 4, len(ids)).astype(np.float32)
            clicks = (rng.random(len(ids)) < 0.1).astype(np.float32)
            table.pull_train(ids, shows, clicks)
            table.push(ids, rng.standard_normal((len(ids), DIM)).astype(np.float32), 0.1)
        expected, deleted_ids = shrink_reference(table.state_dict(), config)
        deleted = table.shrink()
        got = table.state_dict()
        assert deleted == len(deleted_ids) and table.size == len(expected["ids"])
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"day {day}: {key}")
        assert not table.contains(deleted_ids).any()
        assert table.contains(expected["ids"]).all()
    assert deleted > 0


def test_shrink_keeps_geo_change_tracking_on_renumbered_rows():
    table = make_table(track_workers=2)
    ids = np.arange(10, dtype=np.int64)
    table.pull_train(ids, shows=np.where(ids % 2 == 0, 20.0, 1.0))  # odd ids score 0.1: deleted
    table.pull_changed(0)
    table.push(ids[5:], np.ones((5, DIM), dtype=np.float32), 0.1)  # changed for both workers
    table.pull_changed(1)
    assert table.shrink() == 5
    changed, values = table.pull_changed(0)
    assert changed.tolist() == [6, 8]
    np.testing.assert_array_equal(values, table.pull(changed, create=False))
    assert table.pull_changed(1)[0].tolist() == []
    table.push([2], np.ones((1, DIM), dtype=np.float32), 0.1)
    assert table.pull_changed(1)[0].tolist() == [2]


def test_shrink_deletes_rows_unseen_too_long_and_a_lookup_resets_unseen_days():
    table = make_table(accessor=CtrAccessorConfig(delete_after_unseen_days=2, delete_threshold=0.0))
    table.pull_train([1, 2], shows=[5, 5])
    table.shrink()
    table.shrink()
    table.pull_train([1])
    np.testing.assert_allclose(table.statistics([1, 2])[:, 2], [0, 2])
    assert table.shrink() == 1 and table.contains([1, 2]).tolist() == [True, False]


def test_shrink_decays_the_admission_sketch_so_old_candidates_fade():
    table = make_table(entry=CountFilterEntry(3), sketch_width=1 << 12)
    ids = np.arange(100, dtype=np.int64) + 1000
    table.pull_train(ids, shows=np.full(100, 2.0))
    assert table.size == 0 and (table.admission.estimate(ids) == 2).all()
    table.shrink()  # 2 * 0.98 rounds down to 1
    assert (table.admission.estimate(ids) == 1).all()
    table.pull_train(ids)
    assert table.size == 0  # 1 + 1 < 3


def test_shrink_returns_zero_on_an_empty_table_and_memory_follows_the_rows():
    table = make_table()
    assert table.shrink() == 0
    table.pull_train(np.arange(10_000), shows=np.ones(10_000))
    before = table.memory_bytes()
    assert table.shrink() == 10_000 and table.size == 0
    assert table.memory_bytes() < before
    table.pull_train(np.arange(5), shows=np.full(5, 30.0))
    assert table.size == 5 and table.shrink() == 0
