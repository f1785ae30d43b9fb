"""Base (mode 0) plus deltas (mode 1) applied in order rebuild the table exactly, at table level."""
import numpy as np
import pytest

from fleet.entries import CountFilterEntry, CtrAccessorConfig
from fleet.errors import ConfigError
from fleet.rules import AdagradRule, AdamRule
from fleet.tables import SparseTable
from fleet.tables import snapshot as snapshot_module

DIM = 3


def make_table(rule, **kw):
    kw.setdefault("accessor", CtrAccessorConfig())
    return SparseTable("emb", DIM, rule, ("uniform", -1, 1), seed=4, **kw)


def save(table, mode):
    """A committed snapshot as (state with scalars, deleted ids)."""
    snap = table.snapshot(mode)
    parts = list(snap.chunks(rows=50))
    state = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    state.update({f"state.{key}": arr for key, arr in snap.scalars.items()})
    deleted = snap.deleted
    snap.commit()
    return state, deleted


def by_id(state):
    order = np.argsort(state["ids"], kind="stable")
    # per-row arrays: ids [n] and [n, k] values, states, stats; scalar states are [1]
    return {key: (arr[order] if key == "ids" or arr.ndim == 2 else arr) for key, arr in state.items()}


def assert_same_table(got, want):
    got, want = by_id(got.state_dict()), by_id(want.state_dict())
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def train(table, rng, id_range, steps):
    for _ in range(steps):
        ids = np.unique(rng.integers(*id_range, 200))
        shows = rng.integers(1, 5, len(ids)).astype(np.float32)
        clicks = (rng.random(len(ids)) < 0.2).astype(np.float32)
        table.pull_train(ids, shows, clicks)
        table.push(ids, rng.standard_normal((len(ids), DIM)).astype(np.float32), 0.05)


@pytest.mark.parametrize("rule,entry", [(AdagradRule(), None), (AdamRule(lazy_mode=True), CountFilterEntry(2)),
                                        (AdamRule(lazy_mode=False), None)],
                         ids=["adagrad", "adam_count_filter", "adam_not_lazy_decays_every_row"])
def test_a_base_and_its_deltas_applied_in_order_equal_the_table(rule, entry):
    rng = np.random.default_rng(1)
    table = make_table(rule, entry=entry, **({"sketch_width": 1 << 14} if entry else {}))
    train(table, rng, (0, 2000), 10)
    base, _ = save(table, 0)
    deltas = []
    for day in range(4):
        train(table, rng, (day * 500, 2000 + day * 500), 6)
        table.add(rng.integers(0, 3000, 30), np.ones((30, DIM), dtype=np.float32))
        if day % 2 == 1:
            deleted = table.shrink()
            assert deleted > 0
        deltas.append(save(table, 1))
    assert sum(len(d) for _, d in deltas) > 0
    rebuilt = make_table(rule, entry=entry, **({"sketch_width": 1 << 14} if entry else {}))
    rebuilt.load_state_dict(base)
    for state, deleted in deltas:
        rebuilt.apply_delta(state, deleted)
    assert_same_table(rebuilt, table)
    # deleted rows stay deleted
    all_deleted = np.concatenate([d for _, d in deltas])
    gone = all_deleted[~table.contains(all_deleted)]
    assert len(gone) and not rebuilt.contains(gone).any()


def test_deltas_split_over_servers_rebuild_each_share():
    rng = np.random.default_rng(2)
    table = make_table(AdagradRule())
    train(table, rng, (0, 1000), 5)
    base, _ = save(table, 0)
    train(table, rng, (500, 1500), 5)
    table.shrink()
    train(table, rng, (0, 1500), 2)
    delta, deleted = save(table, 1)
    shares = []
    for server in range(3):
        part = make_table(AdagradRule())
        mine = base["ids"] % 3 == server
        part.load_state_dict({k: (v[mine] if v.shape[:1] == mine.shape else v) for k, v in base.items()})
        mine = delta["ids"] % 3 == server
        part.apply_delta({k: (v[mine] if v.shape[:1] == mine.shape else v) for k, v in delta.items()}, deleted)
        shares.append(part.state_dict())
    whole = {k: np.concatenate([s[k] for s in shares]) if k in ("ids", "values", "state.moment", "stats")
             else shares[0][k] for k in shares[0]}
    merged = make_table(AdagradRule())
    merged.load_state_dict(whole)
    assert_same_table(merged, table)


def test_changes_made_while_a_delta_is_written_go_to_the_next_delta():
    table = make_table(AdagradRule())
    table.pull_train(np.arange(100), np.full(100, 3.0))
    save(table, 0)
    table.push(np.arange(10), np.ones((10, DIM), dtype=np.float32), 0.1)
    snap = table.snapshot(1)
    chunks = snap.chunks(rows=4)
    next(chunks)
    table.push([1, 9, 50], np.ones((3, DIM), dtype=np.float32), 0.1)  # 1 read already, 9 not yet, 50 not in it
    rest = list(chunks)
    assert sum(len(c["ids"]) for c in rest) == 6
    snap.commit()
    nxt, _ = save(table, 1)
    assert sorted(nxt["ids"]) == [1, 9, 50]


def test_apply_delta_checks_its_arrays():
    table = make_table(AdagradRule())
    with pytest.raises(ConfigError, match=r"the state to load has no 'state.moment'"):
        table.apply_delta({"ids": np.array([1]), "values": np.zeros((1, DIM), dtype=np.float32)})
    with pytest.raises(ConfigError, match=r"'values' to load is float32\[1, 2\], expected float32\[1, 3\]"):
        table.apply_delta({"ids": np.array([1]), "values": np.zeros((1, 2), dtype=np.float32)})


def test_past_a_quarter_of_a_large_table_changed_the_next_delta_holds_every_row(monkeypatch):
    monkeypatch.setattr(snapshot_module, "DELTA_LIST_ROWS", 10)
    table = make_table(AdagradRule())
    table.pull_train(np.arange(100))
    save(table, 0)
    table.push(np.arange(20), np.ones((20, DIM), dtype=np.float32), 0.1)
    assert len(table._delta.pending(0)) == 20
    table.push(np.arange(20, 30), np.ones((10, DIM), dtype=np.float32), 0.1)
    assert len(table._delta.pending(0)) == 0  # the list was dropped ...
    delta, _ = save(table, 1)
    assert len(delta["ids"]) == 100  # ... for a delta of every row
