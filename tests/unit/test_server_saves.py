"""Save modes of a parameter-server job without sockets (tests/unit/fake_cluster.py): a base
and its deltas reload bit-exactly as a full save of the same moment onto 1, 2 or 3
servers; a mode-2 base leaves out exactly the rows below base_threshold; shrunk rows stay
deleted; a failed save forgets nothing; snapshots close when their worker is lost."""
import os

import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, ServerError
from fleet.framework import io as fio
from fleet.framework.save_chain import read_chain
from fleet.framework.tensor import SparseRows
from fleet.runtime import WorkerRuntime
from strategies import DistributedStrategyFactory
from fake_cluster import Cluster

IDS = np.arange(-40, 60, dtype=np.int64) * 7919  # spread over servers by id % n


def _program():
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        dids = layers.data("dids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.sequence_pool(layers.embedding(ids, size=[600, 4], is_sparse=True, param_attr="emb"), "sum")
        table = fleet.ParamAttr(name="dtable", initializer=fleet.initializer.Uniform(-1.0, 1.0))
        demb = layers.sequence_pool(layers.embedding(dids, size=[10, 3], is_distributed=True, param_attr=table),
                                    "sum")
        out = layers.fc(layers.concat([emb, demb, x], axis=1), 2, param_attr="w", bias_attr="b")
        optimizer.Adam(0.01, lazy_mode=True).minimize(layers.mean(out))  # a push changes only its rows
    startup.random_seed = 5
    return main, startup


def _strategy(stats=True):
    strategy = DistributedStrategyFactory.create_async_strategy()
    if stats:
        strategy.set_sparse_table_config("dtable")  # Paddle's CtrCommonAccessor defaults
    return strategy


def _cluster(n, dirname=None, stats=True):
    main, startup = _program()
    cluster = Cluster(main, startup, _strategy(stats), n, dirname)
    cluster.main = main
    return cluster


def _runtime(cluster):
    """A WorkerRuntime over the fake cluster (only what saving uses)."""
    runtime = WorkerRuntime.__new__(WorkerRuntime)
    runtime.started, runtime.comm, runtime.plan = True, cluster.comm, cluster.plan
    runtime.strategy, runtime.worker_id, runtime.last_save = _strategy(), 0, None
    return runtime


def _save(runtime, cluster, dirname, mode, commit=True):
    return runtime.save_persistables(str(dirname), cluster.main, {"kind": "persistables"}, None, mode=mode,
                                     commit=commit)


def _tables(cluster):
    return [t for ps in cluster.servers.values() for _, t in ps.shards.values()]


def _train(cluster, ids, seed, shows=1.0, clicks=0.0):
    """Training lookups (statistics) of ``ids`` on their servers, then a push of every
    parameter's gradient (the table's rows of ``ids``)."""
    rng = np.random.default_rng(seed)
    n = len(cluster.servers)
    for index, ps in enumerate(cluster.servers.values()):
        mine = ids[np.mod(ids, n) == index]
        _, table = ps.shards["dtable"]
        if table.has_statistics:
            table.pull_train(mine, np.full(len(mine), shows, np.float32), np.full(len(mine), clicks, np.float32))
        else:
            table.pull(mine)
    grad = {p.name: p.grad for p in cluster.plan.params.values()}
    cluster.push({
        grad["w"]: rng.normal(size=(11, 2)).astype(np.float32),
        grad["b"]: rng.normal(size=2).astype(np.float32),
        grad["emb"]: SparseRows(rng.integers(0, 600, 9), rng.normal(size=(9, 4)).astype(np.float32), 600),
        grad["dtable"]: SparseRows(ids, rng.normal(size=(len(ids), 3)).astype(np.float32), 2**63 - 1),
    })


def _assert_same(a, b, what):
    dense_a, tables_a = a
    dense_b, tables_b = b
    assert sorted(dense_a) == sorted(dense_b), what
    for name in dense_a:
        if isinstance(dense_a[name], dict):
            assert sorted(dense_a[name]) == sorted(dense_b[name]), f"{what}: {name}"
            for k in dense_a[name]:
                np.testing.assert_array_equal(dense_a[name][k], dense_b[name][k], err_msg=f"{what}: {name} {k}")
        else:
            np.testing.assert_array_equal(dense_a[name], dense_b[name], err_msg=f"{what}: {name}")
    rows_a, rows_b = tables_a["dtable"], tables_b["dtable"]
    assert sorted(rows_a) == sorted(rows_b), f"{what}: the id sets differ by {set(rows_a) ^ set(rows_b)}"
    for i in rows_a:
        assert sorted(rows_a[i]) == sorted(rows_b[i])
        for key in rows_a[i]:
            np.testing.assert_array_equal(rows_a[i][key], rows_b[i][key], err_msg=f"{what}: row {i} {key}")


# ------------------------------------------------------------------ chains reload as full saves
@pytest.mark.parametrize("servers", [1, 2, 3])
def test_a_base_and_its_deltas_load_bit_exactly_as_a_full_save_of_the_same_moment(tmp_path, servers):
    cluster = _cluster(2)
    runtime = _runtime(cluster)
    _train(cluster, IDS[:60], seed=1)
    _save(runtime, cluster, tmp_path / "base", 0)
    _train(cluster, IDS[50:80], seed=2, clicks=1.0)
    _save(runtime, cluster, tmp_path / "d1", 1)
    _train(cluster, IDS[70:], seed=3, shows=3.0)
    for table in _tables(cluster):
        table.shrink()  # deletes the rows below delete_threshold (tombstones), decays and ages the others
    _train(cluster, IDS[::9], seed=4)
    _save(runtime, cluster, tmp_path / "d2", 1)
    _save(runtime, cluster, tmp_path / "full", 0, commit=False)

    d1 = fio.read_vars(str(tmp_path / "d1"))
    assert sorted(d1["dtable@ids"].tolist()) == sorted(IDS[50:80].tolist())  # only the rows changed since base
    assert d1["dtable@stats"].shape == (30, 4) and d1["dtable@deleted"].shape == (0,)
    chain = [read_chain(tmp_path / n) for n in ("base", "d1", "d2", "full")]
    assert [(c["mode"], c["sequence"]) for c in chain] == [(0, 0), (1, 1), (1, 2), (0, 0)]
    assert chain[2]["parent"] == {"save_id": chain[1]["save_id"], "dirname": "d1"}

    _assert_same(_cluster(servers, str(tmp_path / "d2")).whole(), _cluster(servers, str(tmp_path / "full")).whole(),
                 f"base + d1 + d2 vs full on {servers} servers")


def test_a_mode_2_base_and_deltas_equal_the_full_save_minus_the_rows_left_out_that_never_changed(tmp_path):
    cluster = _cluster(2)
    runtime = _runtime(cluster)
    hot, cold = IDS[:40], IDS[40:]
    _train(cluster, hot, seed=1, shows=4.0, clicks=1.0)  # score (4-1)*0.1 + 1 = 1.3 per lookup
    _train(cluster, hot, seed=2, shows=4.0, clicks=1.0)  # 2.6 >= base_threshold 1.5
    _train(cluster, cold, seed=3)  # 0.1: left out of the base
    _save(runtime, cluster, tmp_path / "base", 2)
    assert sorted(fio.read_vars(str(tmp_path / "base"))["dtable@ids"].tolist()) == sorted(hot.tolist())
    touched = cold[::5]
    _train(cluster, touched, seed=4)
    _save(runtime, cluster, tmp_path / "d1", 1)
    _save(runtime, cluster, tmp_path / "full", 0, commit=False)

    dense, tables = _cluster(3, str(tmp_path / "full")).whole()
    left_out = set(cold.tolist()) - set(touched.tolist())
    assert len(left_out) == 48
    tables["dtable"] = {i: row for i, row in tables["dtable"].items() if i not in left_out}
    _assert_same(_cluster(3, str(tmp_path / "d1")).whole(), (dense, tables), "base(2) + d1 vs full minus left out")


def test_rows_deleted_by_shrink_stay_deleted_when_the_chain_loads(tmp_path):
    cluster = _cluster(2)
    runtime = _runtime(cluster)
    hot, cold = IDS[:40], IDS[40:]
    _train(cluster, hot, seed=1, shows=4.0, clicks=1.0)
    _train(cluster, cold, seed=2)
    _save(runtime, cluster, tmp_path / "base", 0)
    deleted = sum(t.shrink() for t in _tables(cluster))  # cold rows score 0.1 * 0.98 < delete_threshold 0.8
    assert deleted == len(cold)
    again = cold[:5]
    _train(cluster, again, seed=3)  # rows made again after the shrink
    _save(runtime, cluster, tmp_path / "d1", 1)
    _save(runtime, cluster, tmp_path / "full", 0, commit=False)
    d1 = fio.read_vars(str(tmp_path / "d1"))
    assert set(d1["dtable@deleted"].tolist()) >= set(cold[5:].tolist())
    loaded = _cluster(3, str(tmp_path / "d1")).whole()
    assert sorted(loaded[1]["dtable"]) == sorted(hot.tolist() + again.tolist())
    _assert_same(loaded, _cluster(3, str(tmp_path / "full")).whole(), "base + d1 after a shrink vs full")


# ------------------------------------------------------------------ failures
def test_a_failed_save_forgets_no_change_for_the_next_delta(tmp_path):
    cluster = _cluster(2)
    runtime = _runtime(cluster)
    _train(cluster, IDS[:50], seed=1)
    _save(runtime, cluster, tmp_path / "base", 0)
    _train(cluster, IDS[40:70], seed=2)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OSError):
        _save(runtime, cluster, tmp_path / "file" / "d1", 1)
    assert all(not ps._saves for ps in cluster.servers.values())  # the snapshots were released
    _train(cluster, IDS[90:], seed=3)
    _save(runtime, cluster, tmp_path / "d1", 1)
    d1 = fio.read_vars(str(tmp_path / "d1"))
    assert sorted(d1["dtable@ids"].tolist()) == sorted(IDS[40:70].tolist() + IDS[90:].tolist())
    _save(runtime, cluster, tmp_path / "full", 0, commit=False)
    _assert_same(_cluster(2, str(tmp_path / "d1")).whole(), _cluster(2, str(tmp_path / "full")).whole(),
                 "base + d1 after a failed save vs full")


def test_a_delta_follows_the_save_the_servers_loaded_when_this_worker_saved_none(tmp_path):
    first = _cluster(2)
    _train(first, IDS, seed=1)
    _save(_runtime(first), first, tmp_path / "base", 0)
    cluster = _cluster(2, str(tmp_path / "base"))
    runtime = _runtime(cluster)
    _train(cluster, IDS[:5], seed=2)
    _save(runtime, cluster, tmp_path / "d1", 1)
    assert sorted(fio.read_vars(str(tmp_path / "d1"))["dtable@ids"].tolist()) == sorted(IDS[:5].tolist())
    assert read_chain(tmp_path / "d1")["parent"]["save_id"] == read_chain(tmp_path / "base")["save_id"]


def test_a_delta_with_no_save_before_it_and_a_base_without_statistics_are_refused(tmp_path):
    cluster = _cluster(2, stats=False)
    runtime = _runtime(cluster)
    _train(cluster, IDS, seed=1)
    with pytest.raises(ConfigError, match=r"save_persistables\(mode=1\) to .* but this job has none"):
        _save(runtime, cluster, tmp_path / "d1", 1)
    with pytest.raises(ConfigError, match=r"save_persistables\(mode=2\) saves the rows passing base_threshold, "
                                          r"which needs statistics, but distributed tables \['dtable'\] keep none: "
                                          r"give each table an entry"):
        _save(runtime, cluster, tmp_path / "b", 2)
    assert not os.path.exists(tmp_path / "d1") and not os.path.exists(tmp_path / "b")
    assert all(not ps._saves for ps in cluster.servers.values())


def test_snapshots_of_a_lost_worker_are_closed_and_cannot_be_committed():
    cluster = _cluster(2)
    _train(cluster, IDS, seed=1)
    comm = cluster.comm
    opened = comm.open_snapshots("s1", 1, {"dtable": 8})
    assert sum(info["totals"]["dtable"] for info in opened.values()) == len(IDS)
    with pytest.raises(ServerError, match=r"save s1: the snapshots of \['dtable'\] were not read to their end"):
        comm.close_snapshots("s1", commit=True)
    comm.open_snapshots("s2", 1, {"dtable": 8})
    for ps in cluster.servers.values():
        ps.fail_worker(0, "it stopped sending heartbeats")
        assert not ps._saves
    for table in _tables(cluster):
        table.shrink()  # no snapshot holds it up


def test_load_model_makes_running_servers_load_a_chain_or_the_next_delta(tmp_path):
    cluster = _cluster(2)
    runtime = _runtime(cluster)
    _train(cluster, IDS[:60], seed=1)
    _save(runtime, cluster, tmp_path / "base", 0)
    for i in (1, 2):
        _train(cluster, IDS[20 * i:20 * i + 40], seed=1 + i)
        _save(runtime, cluster, tmp_path / f"d{i}", 1)
    _save(runtime, cluster, tmp_path / "full", 0, commit=False)
    expected = _cluster(3, str(tmp_path / "full")).whole()

    serving = _cluster(3, str(tmp_path / "base"))
    worker = _runtime(serving)
    with pytest.raises(ConfigError, match=r"mode=1\): that delta \(sequence 2 of chain \w+\) follows save \w+, but "
                                          r"the save the servers hold is \w+ \(.*base\)"):
        worker.load_model(str(tmp_path / "d2"), 1)
    worker.load_model(str(tmp_path / "d1"), 1)
    worker.load_model(str(tmp_path / "d2"), 1)
    _assert_same(serving.whole(), expected, "base, then d1 and d2 applied by load_model(mode=1)")
    _train(serving, IDS[:3], seed=9)
    _save(worker, serving, tmp_path / "d3", 1)  # follows the save loaded last
    assert read_chain(tmp_path / "d3")["parent"]["dirname"] == "d2"

    fresh = _cluster(1)
    _runtime(fresh).load_model(str(tmp_path / "d2"), 0)
    _assert_same(fresh.whole(), _cluster(1, str(tmp_path / "full")).whole(), "load_model(d2, mode=0)")


def test_a_second_save_or_a_shrink_while_a_save_holds_snapshots_is_refused_without_waiting():
    from fake_cluster import FakeClient

    main, startup = _program()
    cluster = Cluster(main, startup, _strategy(), 1, workers=2)
    _train(cluster, IDS, seed=1)
    cluster.comm.open_snapshots("s1", 0, {"dtable": 8})
    ps = next(iter(cluster.servers.values()))
    other = FakeClient(ps, worker_id=1)
    with pytest.raises(ServerError, match=r"sparse table 'dtable': snapshot\(mode=0\) waited 0 s for TableSnapshot "
                                          r"#\d+ of table 'dtable' \(mode 0, opened .*, 0 of 100 rows read, open\)"):
        other.request("open_snapshot", meta={"save": "s2", "mode": 0, "tables": {"dtable": 8}})
    with pytest.raises(ServerError, match=r"shrink refused: save s1 of worker 0 holds snapshots of this server's "
                                          r"tables; shrink after that save has ended"):
        other.request("shrink")
    cluster.comm.close_snapshots("s1", commit=False)
    assert other.request("shrink").meta["deleted"] == {"dtable": 100}  # score 0.1 < delete_threshold
