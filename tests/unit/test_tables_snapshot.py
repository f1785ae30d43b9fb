"""Point-in-time snapshots: copy-on-write under concurrent pushes, modes, commit and close."""
import threading

import numpy as np
import pytest

from fleet.entries import CtrAccessorConfig
from fleet.errors import ConfigError, FleetTimeoutError
from fleet.rules import AdagradRule, AdamRule
from fleet.tables import SparseTable

DIM = 3


class CountedAdagrad(AdagradRule):
    """Adagrad plus a scalar "pushes" counter and a log of each push's rows, in the order applied.

    apply_sparse runs under the table's lock, so the log is the order of the table's writes and
    a snapshot's scalars["pushes"] is the number of pushes applied before its instant.
    """

    state_names = ("moment", "pushes")
    row_state_names = ("moment",)

    def __init__(self):
        super().__init__(epsilon=1e-6)
        self.log = []

    def init_state(self, shape):
        return {"moment": np.zeros(shape, dtype=np.float32), "pushes": np.zeros(1, dtype=np.float64)}

    def apply_sparse(self, param, rows, values, state, lr):
        super().apply_sparse(param, rows, values, state, lr)
        state["pushes"][0] += 1
        self.log.append(np.unique(rows))


def after_pushes(k):
    """(value, moment) of a row (initial value 0) after k pushes of gradient -1 with lr 0.1."""
    table = SparseTable("ref", 1, AdagradRule(epsilon=1e-6), ("constant", 0.0))
    table.pull([0])
    for _ in range(k):
        table.push([0], -np.ones((1, 1), dtype=np.float32), 0.1)
    state = table.state_dict()
    return state["values"][0, 0], state["state.moment"][0, 0]


def read_all(snap, rows=1 << 16, between=None):
    parts = []
    for chunk in snap.chunks(rows):
        parts.append(chunk)
        if between is not None:
            between()
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def make_table(rule=None, **kw):
    kw.setdefault("accessor", CtrAccessorConfig())
    return SparseTable("emb", DIM, rule or AdagradRule(), ("uniform", -1, 1), seed=3, **kw)


def test_a_snapshot_read_while_two_workers_push_is_the_table_of_one_instant():
    rule = CountedAdagrad()
    table = SparseTable("emb", DIM, rule, ("constant", 0.0), accessor=CtrAccessorConfig())
    minus_one = -np.ones((64, DIM), dtype=np.float32)
    stop = threading.Event()
    batches = {0: [], 1: []}

    def worker(w):
        rng = np.random.default_rng(w)
        while not stop.is_set():
            ids = np.unique(rng.integers(0, 3000 + 20 * len(batches[w]), 64))
            batches[w].append(ids)
            table.pull_train(ids)  # show += 1 ...
            table.push(ids, minus_one[: len(ids)], 0.1)  # ... then value and moment for one more push

    for _ in range(20):  # warm up: rows and pushes exist before the snapshot
        table.pull_train(np.arange(500), np.ones(500))
        table.push(np.arange(500), -np.ones((500, DIM), dtype=np.float32), 0.1)
    threads = [threading.Thread(target=worker, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    try:
        while (len(batches[0]) < 50 or len(batches[1]) < 50) and all(t.is_alive() for t in threads):
            threading.Event().wait(0.001)
        assert all(t.is_alive() for t in threads), "a worker failed"
        snap = table.snapshot(mode=0)
        # a write to rows not yet read must preserve them (deterministic, besides the workers')
        table.push(np.arange(490, 500), -np.ones((10, DIM), dtype=np.float32), 0.1)
        assert snap._preserved._index.size >= 10
        got = read_all(snap, rows=97, between=lambda: threading.Event().wait(0.0005))
        snap.close()
    finally:
        stop.set()
        for t in threads:
            t.join()
    pushes = int(snap.scalars["pushes"][0])
    assert 0 < pushes < len(rule.log)  # pushes went on after the instant
    # identical id sets: one row per id in values, every state and stats
    n = len(got["ids"])
    assert n == snap.total and len(np.unique(got["ids"])) == n
    assert got["values"].shape == got["state.moment"].shape == (n, DIM) and got["stats"].shape == (n, 4)
    # rows are creation order, so row r of the snapshot is row r of the table; count each row's pushes
    counts = np.zeros(table.size, dtype=np.int64)
    for rows in rule.log[:pushes]:
        counts[rows] += 1
    assert counts[n:].sum() == 0  # rows created after the instant are not in the snapshot
    np.testing.assert_array_equal(got["ids"], table.state_dict()["ids"][:n])
    expected = {k: after_pushes(k) for k in np.unique(counts[:n])}
    for r in range(n):
        value, moment = expected[counts[r]]
        assert (got["values"][r] == value).all() and (got["state.moment"][r] == moment).all(), (r, counts[r])
    # show counts pull_train lookups: each worker has at most one lookup not yet followed by its push
    show = got["stats"][:, 0].astype(np.int64)
    extra = show - counts[:n]
    assert extra.min() >= 0 and extra.max() <= 2
    assert (got["stats"][:, 2] == 0).all()


def test_a_snapshot_keeps_the_instant_while_rows_change_and_new_rows_appear():
    table = make_table(rule=AdamRule())
    ids = np.arange(100, dtype=np.int64)
    table.pull_train(ids, np.full(100, 2.0), np.ones(100))
    table.push(ids, np.ones((100, DIM), dtype=np.float32), 0.1)
    before = table.state_dict()
    snap = table.snapshot()
    table.push(ids[::3], np.ones((34, DIM), dtype=np.float32), 0.5)
    table.pull_train(np.arange(90, 200), np.ones(110))
    table.add(ids[50:], np.ones((50, DIM), dtype=np.float32))
    got = read_all(snap, rows=7)
    for key in ("ids", "values", "state.moment1", "state.moment2", "stats"):
        np.testing.assert_array_equal(got[key], before[key], err_msg=key)
    for key in ("beta1_pow", "beta2_pow"):
        np.testing.assert_array_equal(snap.scalars[key], before[f"state.{key}"])
    assert table.state_dict()["state.beta1_pow"][0] != before["state.beta1_pow"][0]
    assert snap.deleted.dtype == np.int64 and len(snap.deleted) == 0
    snap.commit()
    assert table.size == 200


def test_a_delta_holds_the_rows_changed_since_the_previous_commit():
    table = make_table()
    table.pull_train(np.arange(50))
    read_all(snapshot := table.snapshot(mode=0))
    snapshot.commit()
    table.push([3, 4], np.ones((2, DIM), dtype=np.float32), 0.1)  # pushed
    table.pull_train(np.array([10, 60]))  # statistics updated, and a row created
    table.add([20], np.ones((1, DIM), dtype=np.float32))
    snap = table.snapshot(mode=1)
    table.push([30], np.ones((1, DIM), dtype=np.float32), 0.1)  # after the instant: next delta
    got = read_all(snap)
    assert sorted(got["ids"]) == [3, 4, 10, 20, 60] and snap.total == 5
    assert (got["stats"][:, 3] == 0).all()  # delta_score as commit leaves it
    assert table.statistics([10])[0, 3] > 0
    snap.commit()
    assert table.statistics([10])[0, 3] == 0 and table.statistics([11])[0, 3] > 0
    nxt = table.snapshot(mode=1)
    assert sorted(read_all(nxt)["ids"]) == [30]
    nxt.close()  # without commit nothing is forgotten
    again = table.snapshot(mode=1)
    assert sorted(read_all(again)["ids"]) == [30]
    again.close()


def test_the_first_delta_and_a_delta_after_shrink_hold_every_row():
    table = make_table()
    table.pull_train(np.arange(20), np.full(20, 20.0))  # score 2: survives a shrink
    snap = table.snapshot(mode=1)
    assert snap.total == 20
    read_all(snap)
    snap.commit()
    table.shrink()
    snap = table.snapshot(mode=1)
    assert snap.total == table.size == 20
    snap.close()


def test_a_base_snapshot_keeps_rows_by_paddles_rule():
    table = make_table(accessor=CtrAccessorConfig(base_threshold=1.5, delta_keep_days=1))
    ids = np.arange(6, dtype=np.int64)
    # scores: show 20 -> 2.0, show 10 -> 1.0, show 2 click 2 -> 2.0
    table.pull_train(ids, shows=[20, 10, 2, 20, 20, 1], clicks=[0, 0, 2, 0, 0, 0])
    table.shrink()
    table.shrink()  # unseen_days 2 > delta_keep_days for every row ...
    table.pull_train(ids[:3], shows=[0, 0, 0])  # ... but these were seen again
    snap = table.snapshot(mode=2)
    assert sorted(read_all(snap)["ids"]) == [0, 2]
    snap.commit()
    with pytest.raises(ConfigError, match="keeps no statistics, so it has no base snapshot"):
        SparseTable("plain", DIM, AdagradRule(), ("constant", 0.0)).snapshot(mode=2)


def test_shrink_load_and_another_snapshot_wait_for_an_open_snapshot_and_name_it():
    table = make_table()
    table.pull_train(np.arange(10), np.full(10, 20.0))
    snap = table.snapshot()
    with pytest.raises(FleetTimeoutError, match=r"sparse table 'emb': shrink waited 0.05 s for TableSnapshot #\d+ "
                                                r"of table 'emb' \(mode 0, opened .*, 0 of 10 rows read, open\) "
                                                r"to close; whoever took it must call commit\(\) or close\(\)"):
        table.shrink(timeout=0.05)
    with pytest.raises(FleetTimeoutError, match=r"snapshot\(mode=1\) waited 0.01 s"):
        table.snapshot(mode=1, timeout=0.01)
    done = []
    waiter = threading.Thread(target=lambda: done.append(table.shrink(timeout=30)))
    waiter.start()
    snap.close()
    waiter.join()
    assert done == [0]
    with pytest.raises(ConfigError, match="commit\\(\\) on a snapshot that is closed"):
        snap.commit()


def test_commit_needs_every_chunk_read_and_chunks_are_read_once():
    table = make_table()
    table.pull_train(np.arange(10))
    with table.snapshot() as snap:
        chunks = snap.chunks(4)
        next(chunks)
        with pytest.raises(ConfigError, match="commit\\(\\) before every chunk was read"):
            snap.commit()
        with pytest.raises(ConfigError, match="chunks\\(\\) was already called"):
            next(snap.chunks())
        assert len(list(chunks)) == 2
        snap.commit()
    empty = SparseTable("e", DIM, AdagradRule(), ("constant", 0.0)).snapshot()
    assert [len(c["ids"]) for c in empty.chunks()] == [0]
    empty.close()
