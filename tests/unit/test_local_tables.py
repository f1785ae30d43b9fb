"""Local training of tables with an entry or accessor (fleet.local_tables): admission,
statistics and shrink as on the servers, through exe.run and train_from_dataset, and
the same results as a worker talking to in-process servers."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
import fleet.layers as layers
import fleet.runtime as fleet_runtime
from fleet import local_tables
from fleet.errors import ConfigError
from fleet.framework.tensor import LoDTensor
from fleet.initializer import Constant, Uniform
from fleet.optimizer import SGD, Adam
from role_makers import LocalRoleMaker
from strategies import DistributedStrategyFactory

pytestmark = pytest.mark.usefixtures("fresh_fleet")


@pytest.fixture(autouse=True)
def fresh_local_tables():
    local_tables.LOCAL.reset()
    yield
    local_tables.LOCAL.reset()


def _model(entry, init=None, optimizer=None, seed=7, strategy=None):
    main, startup = fw.Program(), fw.Program()
    main.random_seed = seed
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        show = layers.data("show", shape=[1], dtype="float32")
        click = layers.data("click", shape=[1], dtype="float32")
        emb = layers.sparse_embedding(ids, [1000, 4], entry=entry, param_attr=fleet.ParamAttr(
            name="emb", initializer=init or Uniform(-0.5, 0.5)))
        pooled = layers.sequence_pool(emb, "sum")
        logit = layers.fc(layers.concat([pooled, show], axis=1), 1, param_attr="fc.w", bias_attr="fc.b")
        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, click))
        test = main.clone(for_test=True)
        if strategy is not None:  # local fleet.distributed_optimizer: the strategy's accessor applies
            fleet.distributed_optimizer(optimizer or SGD(0.5), strategy).minimize(loss)
        else:
            (optimizer or SGD(0.5)).minimize(loss)
    return main, startup, test, pooled, loss


def _feed(seqs, shows=None, clicks=None):
    lengths = np.array([len(s) for s in seqs], np.int64)
    values = np.array([i for s in seqs for i in s], np.int64)
    n = len(seqs)
    return {"ids": LoDTensor.from_lengths(values, lengths),
            "show": np.asarray(shows if shows is not None else [1] * n, np.float32).reshape(n, 1),
            "click": np.asarray(clicks if clicks is not None else [0] * n, np.float32).reshape(n, 1)}


def _batches(n, seed=3, vocab=60, batch=8):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        seqs = [list(rng.zipf(1.6, size=rng.randint(1, 4)) % vocab) for _ in range(batch)]
        shows = rng.randint(1, 4, size=batch)
        clicks = (rng.rand(batch) < 0.3).astype(np.float32) * np.minimum(shows, 1)
        out.append(_feed(seqs, shows, clicks))
    return out


def test_an_id_seen_once_reads_zeros_and_gets_no_row_and_the_second_sight_creates_it():
    main, startup, _, pooled, _ = _model(fleet.CountFilterEntry(2), init=Constant(0.5))
    exe = fleet.Executor()
    exe.run(startup)
    assert "emb" not in fw.global_scope()  # no dense [1000, 4] array: the local table holds the rows
    out, = exe.run(main, feed=_feed([[7]]), fetch_list=[pooled])
    np.testing.assert_array_equal(out, np.zeros((1, 4), np.float32))
    table = local_tables.local_tables()["emb"]
    assert not table.contains(np.array([7]))[0] and len(table) == 0
    out, = exe.run(main, feed=_feed([[7], [9, 9]]), fetch_list=[pooled])
    np.testing.assert_array_equal(out, [[0.5] * 4, [1.0] * 4])  # created: the initial value
    assert table.contains(np.array([7, 9])).all()
    assert not np.allclose(table.pull(np.array([7, 9]), create=False), 0.5)  # the gradient applied
    assert fleet_runtime.local_tables()["emb"] is table


def test_a_test_clone_creates_and_counts_nothing():
    main, startup, test, pooled, _ = _model(fleet.CountFilterEntry(2), init=Constant(0.5))
    exe = fleet.Executor()
    exe.run(startup)
    exe.run(main, feed=_feed([[1, 1]]))
    row = local_tables.local_tables()["emb"].pull(np.array([1]), create=False)
    out, = exe.run(test, feed=_feed([[1, 2], [2]]), fetch_list=[pooled.name])
    np.testing.assert_array_equal(out, [row[0], np.zeros(4, np.float32)])
    exe.run(main, feed=_feed([[2]]))
    assert not local_tables.local_tables()["emb"].contains(np.array([2]))[0]  # test lookups did not count


def test_show_click_statistics_are_the_sums_of_the_fed_columns_from_the_batch_that_admitted_the_id():
    main, startup, _, _, _ = _model(fleet.ShowClickEntry("show", "click"))
    exe = fleet.Executor()
    exe.run(startup)
    expected = {}
    for feed in _batches(12):
        exe.run(main, feed=feed)
        table = local_tables.local_tables()["emb"]
        ids = feed["ids"]
        example = np.repeat(np.arange(len(feed["show"])), np.diff(ids.offsets))
        for i, e in zip(ids.values, example):
            if table.contains(np.array([i]))[0]:
                s, c = expected.get(int(i), (0.0, 0.0))
                expected[int(i)] = (s + feed["show"][e, 0], c + feed["click"][e, 0])
    table = local_tables.local_tables()["emb"]
    ids = np.array(sorted(expected), np.int64)
    assert len(ids) == len(table) > 5
    stats = table.statistics(ids)
    np.testing.assert_array_equal(stats[:, 0], [expected[i][0] for i in ids])
    np.testing.assert_array_equal(stats[:, 1], [expected[i][1] for i in ids])


def test_fleet_shrink_locally_evicts_rows_and_returns_the_count():
    fleet.init(LocalRoleMaker())
    strategy = DistributedStrategyFactory.create_sync_strategy()
    strategy.set_sparse_table_config("emb", delete_threshold=0.25)
    main, startup, _, _, _ = _model(None, strategy=strategy)
    exe = fleet.Executor()
    exe.run(startup)
    for feed in _batches(6):
        exe.run(main, feed=feed)
    table = local_tables.local_tables()["emb"]
    assert table.accessor.delete_threshold == 0.25
    ids = np.array(sorted(set(np.concatenate([f["ids"].values for f in _batches(6)]))), np.int64)
    before = table.statistics(ids)
    show, click = before[:, 0] * np.float32(0.98), before[:, 1] * np.float32(0.98)
    score = (show - click) * 0.1 + click  # Paddle's score after the decay
    doomed = int((score < 0.25).sum())
    assert 0 < doomed < len(ids)
    assert fleet.shrink() == {"emb": doomed}
    assert len(table) == len(ids) - doomed


def test_fleet_shrink_without_a_table_keeping_statistics_names_the_fix():
    with pytest.raises(ConfigError, match=r"fleet.shrink\(\) evicts rows of tables that keep statistics, and this "
                                          r"process has none: give a sparse_embedding an entry"):
        fleet.shrink()
    with pytest.raises(ConfigError, match=r"set them with strategy.set_sparse_table_config\(delete_threshold"):
        fleet.shrink(threshold=0.5)


def test_running_startup_again_starts_the_table_afresh():
    main, startup, _, _, _ = _model(fleet.CountFilterEntry(1))
    exe = fleet.Executor()
    exe.run(startup)
    exe.run(main, feed=_feed([[1, 2, 3]]))
    assert len(local_tables.local_tables()["emb"]) == 3
    exe.run(startup)
    exe.run(main, feed=_feed([[4]]))
    assert len(local_tables.local_tables()["emb"]) == 1


def _write_dataset(path, batches):
    lines = []
    for feed in batches:
        ids = feed["ids"]
        for e in range(len(feed["show"])):
            seq = ids.values[ids.offsets[e]:ids.offsets[e + 1]]
            lines.append(f"{len(seq)} {' '.join(map(str, seq))} 1 {feed['show'][e, 0]:g} 1 {feed['click'][e, 0]:g}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("reduce", [False, True])
def test_train_from_dataset_with_threads_admits_and_counts_every_occurrence_once(tmp_path, monkeypatch, reduce):
    monkeypatch.setenv("CPU_NUM", "2")
    batches = _batches(10)
    _write_dataset(tmp_path / "data.txt", batches)
    main, startup, _, _, _ = _model(fleet.CountFilterEntry(2), optimizer=Adam(0.01, lazy_mode=True))
    if reduce:
        main._build_strategy = DistributedStrategyFactory.create_sync_strategy().get_build_strategy()
    exe = fleet.Executor()
    exe.run(startup)
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    block = main.global_block()
    ds.set_use_var([block.var("ids"), block.var("show"), block.var("click")])
    ds.set_batch_size(8)
    ds.set_thread(2)
    ds.set_filelist([str(tmp_path / "data.txt")])
    exe.train_from_dataset(main, ds)
    table = local_tables.local_tables()["emb"]
    all_ids = np.concatenate([f["ids"].values for f in batches])
    uniq, counts = np.unique(all_ids, return_counts=True)
    assert set(table.state_dict()["ids"].tolist()) == set(uniq[counts >= 2].tolist())
    admitted = uniq[counts >= 2]
    shows = table.statistics(admitted)[:, 0]
    assert (shows >= 1).all() and (shows <= counts[counts >= 2]).all()


def test_a_table_with_an_entry_never_trains_as_a_plain_array(monkeypatch):
    """Without fleet's local tables (a process that never resolved a fleet name) the lookup
    refuses instead of training without admission."""
    from fleet.framework import hooks

    main, startup, _, _, _ = _model(fleet.CountFilterEntry(2))
    monkeypatch.setattr(hooks, "_local_rewriter", None)
    exe = fw.Executor()
    exe.run(startup)
    with pytest.raises(ConfigError, match=r"table 'emb' has entry 'count_filter_entry:2', so its training lookups "
                                          r"must go through a sparse table that admits ids"):
        exe.run(main, feed=_feed([[1]]))


def test_collective_training_refuses_a_table_with_an_entry():
    fleet.init(LocalRoleMaker())
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.sparse_embedding(ids, [10, 4], entry=fleet.CountFilterEntry(2), param_attr="emb")
        loss = layers.mean(layers.sequence_pool(emb, "sum"))
        with pytest.raises(ConfigError, match=r"CollectiveStrategy keeps a copy on each worker: use "
                                              r"DistributedStrategyFactory.create_hybrid_strategy\(\)"):
            fleet.distributed_optimizer(SGD(0.1), fleet.CollectiveStrategy()).minimize(loss)


@pytest.mark.parametrize("first", ["fleet.transport", "fleet.tables", "fleet.errors", "fleet.server.parameter_server"])
def test_lower_layers_import_first_without_pulling_in_the_local_tables(first):
    """``from fleet import endpoints`` (and the like) in a lower layer must not import
    fleet.local_tables, which imports the layers above them (an import cycle)."""
    import subprocess
    import sys

    code = f"import sys, {first}, fleet; fleet.Executor; assert 'fleet.local_tables' in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_sparse_embedding_built_with_is_test_only_reads():
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.sparse_embedding(ids, [10, 4], is_test=True, entry=fleet.CountFilterEntry(1),
                                      param_attr=fleet.ParamAttr(name="emb", initializer=Constant(0.5)))
        pooled = layers.sequence_pool(emb, "sum")
    exe = fleet.Executor()
    exe.run(startup)
    for _ in range(2):
        out, = exe.run(main, feed={"ids": _feed([[1, 2]])["ids"]}, fetch_list=[pooled])
        np.testing.assert_array_equal(out, np.zeros((1, 4), np.float32))
    assert len(local_tables.local_tables()["emb"]) == 0


def test_the_startup_program_allocates_neither_the_table_nor_its_optimizer_state():
    main, startup, _, _, _ = _model(fleet.CountFilterEntry(1), optimizer=Adam(0.01))
    exe = fleet.Executor()
    exe.run(startup)
    names = fw.global_scope().keys()
    assert not [n for n in names if n.startswith("emb")], sorted(names)
    assert any(n.startswith("fc.w_moment1") for n in names)
    exe.run(main, feed=_feed([[1, 2]]))
    assert len(local_tables.local_tables()["emb"]) == 2


def test_local_tables_of_a_program_builds_its_tables_before_it_runs():
    main, startup, test, pooled, _ = _model(fleet.CountFilterEntry(3), init=Constant(0.5))
    exe = fleet.Executor()
    exe.run(startup)  # runs before the load: a startup run resets the tables
    assert local_tables.local_tables() == {}
    tables = local_tables.local_tables(main)
    assert list(tables) == ["emb"] and len(tables["emb"]) == 0
    assert tables["emb"].entry == fleet.CountFilterEntry(3) and type(tables["emb"].rule).__name__ == "SGDRule"
    tables["emb"].load_state_dict({"ids": np.array([4], np.int64), "values": np.ones((1, 4), np.float32)})
    out, = exe.run(test, feed=_feed([[4], [5]]), fetch_list=[pooled.name])  # the loaded row serves the test clone
    np.testing.assert_array_equal(out, [[1] * 4, [0] * 4])
    assert local_tables.local_tables(test)["emb"] is tables["emb"]
    assert local_tables.local_tables()["emb"].contains(np.array([4]))[0]
