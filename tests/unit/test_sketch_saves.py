"""Saves carry the admission sketch of tables with an entry (``t@sketch`` from one server
or local training, ``t@sketch@shards`` from several), so a job restarted from a save or
a chain still counts its candidates: an id seen once before the save is admitted by
CountFilterEntry(2) at its next sighting after the load, onto 1 or 2 servers and
locally. Onto another number of servers the saved sketches merge by elementwise maximum,
which never under-counts."""
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fleet
import fleet.framework as fw
from fleet import layers, local_tables, optimizer
from fleet.entries import AdmissionFilter, CountFilterEntry, DEFAULT_SKETCH_DEPTH, DEFAULT_SKETCH_WIDTH
from fleet.errors import ConfigError
from fleet.framework import io as fio
from fleet.framework.tensor import LoDTensor
from fleet.initializer import Uniform
from fleet.rules import SGDRule
from fleet.runtime import WorkerRuntime
from fleet.server import checkpoint
from fleet.tables import SparseTable
from role_makers import LocalRoleMaker
from strategies import DistributedStrategyFactory
from fake_cluster import Cluster

pytestmark = pytest.mark.usefixtures("fresh_fleet")

VOCAB = 100000
SEEN_ONCE = np.arange(1, 41, dtype=np.int64) * 2477        # candidates: seen once before the save
SEEN_TWICE = np.arange(41, 61, dtype=np.int64) * 2477      # admitted before the save
SKETCH = (DEFAULT_SKETCH_DEPTH, DEFAULT_SKETCH_WIDTH)


@pytest.fixture(autouse=True)
def fresh_local_tables():
    local_tables.LOCAL.reset()
    yield
    local_tables.LOCAL.reset()


def _program():
    main, startup = fw.Program(), fw.Program()
    main.random_seed = startup.random_seed = 5
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.sparse_embedding(ids, [VOCAB, 3], entry=fleet.CountFilterEntry(2),
                                      param_attr=fleet.ParamAttr(name="dtable", initializer=Uniform(-1.0, 1.0)))
        out = layers.fc(layers.sequence_pool(emb, "sum"), 1, param_attr="w", bias_attr="b")
        optimizer.SGD(0.1).minimize(layers.mean(out))
    return main, startup


def _cluster(n, dirname=None):
    main, startup = _program()
    cluster = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), n, dirname)
    cluster.main = main
    return cluster


def _runtime(cluster):
    """A WorkerRuntime over the fake cluster (only what saving uses)."""
    runtime = WorkerRuntime.__new__(WorkerRuntime)
    runtime.started, runtime.comm, runtime.plan = True, cluster.comm, cluster.plan
    runtime.strategy = DistributedStrategyFactory.create_async_strategy()
    runtime.worker_id, runtime.last_save = 0, None
    return runtime


def _save(runtime, cluster, dirname, mode):
    return runtime.save_persistables(str(dirname), cluster.main, {"kind": "persistables"}, None, mode=mode)


def _tables(cluster):
    return [ps.shards["dtable"][1] for ps in cluster.servers.values()]


def _sight(cluster, ids):
    """One training lookup of each of ``ids`` on its server."""
    n = len(cluster.servers)
    for index, table in enumerate(_tables(cluster)):
        table.pull_train(ids[np.mod(ids, n) == index])


def _admitted(cluster, ids):
    n = len(cluster.servers)
    got = np.zeros(len(ids), bool)
    for index, table in enumerate(_tables(cluster)):
        mine = np.mod(ids, n) == index
        got[mine] = table.contains(ids[mine])
    return got


def _estimates(cluster, ids):
    n = len(cluster.servers)
    out = np.zeros(len(ids), np.int64)
    for index, table in enumerate(_tables(cluster)):
        mine = np.mod(ids, n) == index
        out[mine] = table._admission.estimate(ids[mine])
    return out


def _distributed_save(tmp_path, servers, how):
    """A save (``how``: "mode0", or "chain" = a base saved before the sightings and a delta
    after) of a job of ``servers`` servers whose table saw SEEN_ONCE once and SEEN_TWICE
    twice. Returns (the directory to load, the servers' sketches at the save)."""
    cluster = _cluster(servers)
    runtime = _runtime(cluster)
    _sight(cluster, SEEN_TWICE)
    if how == "chain":
        _save(runtime, cluster, tmp_path / "base", 0)
    _sight(cluster, SEEN_ONCE)
    _sight(cluster, SEEN_TWICE)
    dirname = _save(runtime, cluster, tmp_path / "save", 0 if how == "mode0" else 1)
    assert not _admitted(cluster, SEEN_ONCE).any() and _admitted(cluster, SEEN_TWICE).all()
    return dirname, [t.sketch() for t in _tables(cluster)]


@pytest.mark.parametrize("how", ["mode0", "chain"])
@pytest.mark.parametrize("saved_on, loaded_on", [(2, 2), (2, 1), (1, 2), (1, 1)])
def test_a_candidate_seen_once_before_a_save_is_admitted_by_its_next_sighting_after_the_load(
        tmp_path, how, saved_on, loaded_on, monkeypatch):
    dirname, sketches = _distributed_save(tmp_path, saved_on, how)
    saved = fio.read_vars(dirname)
    if saved_on == 1:
        assert "dtable@sketch@shards" not in saved
        np.testing.assert_array_equal(saved["dtable@sketch"], sketches[0])
    else:
        assert "dtable@sketch" not in saved
        assert saved["dtable@sketch@shards"].shape == (2,) + SKETCH
        for i in range(2):
            np.testing.assert_array_equal(saved["dtable@sketch@shards"][i], sketches[i])

    cluster = _cluster(loaded_on, dirname)
    if saved_on == loaded_on:  # each server takes its own shard's sketch, exactly
        for table, sketch in zip(_tables(cluster), sketches):
            np.testing.assert_array_equal(table.sketch(), sketch)
    else:  # the elementwise maximum of the saved sketches
        for table in _tables(cluster):
            np.testing.assert_array_equal(table.sketch(), np.maximum.reduce(sketches))
    np.testing.assert_array_equal(_estimates(cluster, SEEN_ONCE), np.ones(len(SEEN_ONCE)))
    assert not _admitted(cluster, SEEN_ONCE).any() and _admitted(cluster, SEEN_TWICE).all()
    _sight(cluster, SEEN_ONCE)
    assert _admitted(cluster, SEEN_ONCE).all()

    # without the sketch (as before saves held one) the next sighting admits none of them
    monkeypatch.setattr(checkpoint, "saved_sketch", lambda *args: None)
    forgetful = _cluster(loaded_on, dirname)
    assert not _sketch_bytes(forgetful)
    _sight(forgetful, SEEN_ONCE)
    assert not _admitted(forgetful, SEEN_ONCE).any()
    np.testing.assert_array_equal(_estimates(forgetful, SEEN_ONCE), np.ones(len(SEEN_ONCE)))


def _sketch_bytes(cluster):
    return sum(int(np.count_nonzero(t.sketch())) for t in _tables(cluster))


def test_a_chain_takes_the_sketch_of_its_last_delta_and_every_mode_saves_it(tmp_path):
    cluster = _cluster(1)
    runtime = _runtime(cluster)
    _save(runtime, cluster, tmp_path / "base", 0)
    _sight(cluster, SEEN_ONCE)
    _save(runtime, cluster, tmp_path / "d1", 1)
    _sight(cluster, SEEN_ONCE)  # admitted now: the sketch no longer rises for them
    _sight(cluster, SEEN_TWICE)
    last = _tables(cluster)[0].sketch()
    _save(runtime, cluster, tmp_path / "d2", 1)
    assert np.count_nonzero(fio.read_vars(str(tmp_path / "base"))["dtable@sketch"]) == 0
    loaded = _cluster(1, str(tmp_path / "d2"))
    np.testing.assert_array_equal(_tables(loaded)[0].sketch(), last)
    np.testing.assert_array_equal(_estimates(loaded, SEEN_TWICE), np.ones(len(SEEN_TWICE)))
    assert _admitted(loaded, SEEN_ONCE).all()
    # a delta holds the sketch even when no row changed
    _save(_runtime(loaded), loaded, tmp_path / "d3", 1)
    np.testing.assert_array_equal(fio.read_vars(str(tmp_path / "d3"))["dtable@sketch"], last)
    # and a base (mode 2) holds it too, though it leaves out every row below base_threshold
    _save(_runtime(loaded), loaded, tmp_path / "b2", 2)
    b2 = fio.read_vars(str(tmp_path / "b2"))
    assert len(b2["dtable@ids"]) == 0
    np.testing.assert_array_equal(b2["dtable@sketch"], last)
    np.testing.assert_array_equal(_tables(_cluster(1, str(tmp_path / "b2")))[0].sketch(), last)


def test_a_sketch_larger_than_a_message_is_read_in_slices(tmp_path):
    main, startup = _program()
    cluster = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), 2,
                      max_message_bytes=1 << 20)  # 256 KiB per answer: 64 slices of each 16 MiB sketch
    cluster.main = main
    _sight(cluster, SEEN_ONCE)
    dirname = _save(_runtime(cluster), cluster, tmp_path / "save", 0)
    saved = fio.read_vars(dirname)["dtable@sketch@shards"]
    for i, table in enumerate(_tables(cluster)):
        np.testing.assert_array_equal(saved[i], table.sketch())
    pulls = [c.requests.count("pull_shard") for c in cluster.clients.values()]
    assert min(pulls) >= 64, pulls


# ------------------------------------------------------------------------- local training
def _local_job():
    fleet.init(LocalRoleMaker())
    main, startup = _program()
    exe = fleet.Executor()
    exe.run(startup)
    return exe, main


def _local_sight(exe, main, ids):
    feed = {"ids": LoDTensor.from_lengths(ids, np.ones(len(ids), np.int64))}
    exe.run(main, feed=feed)


def _local_table():
    return local_tables.local_tables()["dtable"]


@pytest.mark.parametrize("saved_on", [1, 2])
def test_local_training_loads_a_distributed_save_with_the_maximum_of_its_sketches(tmp_path, saved_on):
    dirname, sketches = _distributed_save(tmp_path, saved_on, "chain")
    exe, main = _local_job()
    fleet.load_persistables(exe, dirname, main)
    table = _local_table()
    np.testing.assert_array_equal(table.sketch(), np.maximum.reduce(sketches))
    assert not table.contains(SEEN_ONCE).any() and table.contains(SEEN_TWICE).all()
    _local_sight(exe, main, SEEN_ONCE)
    assert table.contains(SEEN_ONCE).all()


def test_a_local_chain_saves_its_sketch_and_loads_locally_and_onto_two_servers(tmp_path):
    exe, main = _local_job()
    _local_sight(exe, main, SEEN_TWICE)
    fleet.save_persistables(exe, str(tmp_path / "base"), main, mode=0)
    _local_sight(exe, main, SEEN_ONCE)
    fleet.save_persistables(exe, str(tmp_path / "d1"), main, mode=1)
    sketch = _local_table().sketch()
    np.testing.assert_array_equal(fio.read_vars(str(tmp_path / "d1"))["dtable@sketch"], sketch)
    assert int(np.count_nonzero(sketch)) > 0

    local_tables.LOCAL.reset()
    exe, main = _local_job()
    fleet.load_persistables(exe, str(tmp_path / "d1"), main)
    np.testing.assert_array_equal(_local_table().sketch(), sketch)
    _local_sight(exe, main, SEEN_ONCE)
    assert _local_table().contains(SEEN_ONCE).all()

    cluster = _cluster(2, str(tmp_path / "d1"))  # distributed from local: every server takes it
    for table in _tables(cluster):
        np.testing.assert_array_equal(table.sketch(), sketch)
    _sight(cluster, SEEN_ONCE)
    assert _admitted(cluster, SEEN_ONCE).all()


# ------------------------------------------------------------------------ merge and errors
def _filter(width):
    return AdmissionFilter(CountFilterEntry(255), seed=11, width=width)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(st.integers(-300, 300), min_size=1, max_size=400),
       old=st.integers(1, 4), new=st.integers(1, 4), width=st.sampled_from([16, 64, 1024]))
def test_merging_the_saved_sketches_never_under_counts_an_id(stream, old, new, width):
    ids = np.array(stream, np.int64)
    filters = [_filter(width) for _ in range(old)]
    for i in ids:  # one sighting per lookup, on the id's server (CountFilterEntry(255) never admits here)
        assert not filters[int(i) % old].admit(np.array([i]))[0]
    uniq, counts = np.unique(ids, return_counts=True)
    with tempfile.TemporaryDirectory() as tmp:
        with fio.VarsWriter(os.path.join(tmp, "s"), {}) as writer:
            sketches = np.stack([f.state_dict()["sketch"] for f in filters])
            if old == 1:
                writer.add("t@sketch", sketches[0])
            else:
                writer.add("t@sketch@shards", sketches)
        reader = fio.VarsReader(os.path.join(tmp, "s"))
        for server in range(new):
            merged = _filter(width)
            merged.load_state_dict({"sketch": checkpoint.saved_sketch(reader, "t", server, new)})
            mine = np.mod(uniq, new) == server
            assert (merged.estimate(uniq[mine]) >= counts[mine]).all()
            if old == new:  # its own shard, exactly
                np.testing.assert_array_equal(merged.state_dict()["sketch"], sketches[server])
            else:
                np.testing.assert_array_equal(merged.state_dict()["sketch"], sketches.max(axis=0))


def test_a_sketch_of_another_width_is_refused_naming_both_and_the_fix(tmp_path):
    with fio.VarsWriter(str(tmp_path / "s"), {}) as writer:
        writer.add("t@sketch", np.ones((4, 2048), np.uint8))
    table = SparseTable("t", 3, SGDRule(), ("constant", 0.0), entry=CountFilterEntry(2), sketch_width=1024)
    with pytest.raises(ConfigError, match=r"sparse table 't': the admission sketch of checkpoint '.*' is "
                                          r"uint8\[4, 2048\] \(depth, width\), but this table's is uint8\[4, 1024\]; "
                                          r"build the table with the width it was saved with \(sketch_width=2048\)"):
        checkpoint.load_table_sketch(table, fio.VarsReader(str(tmp_path / "s")), "t", 0, 1, base=True)
    assert np.count_nonzero(table.sketch()) == 0


def test_a_save_without_a_sketch_loads_an_empty_one_and_a_delta_without_one_keeps_it(tmp_path):
    with fio.VarsWriter(str(tmp_path / "old"), {}) as writer:
        writer.add("x", np.zeros(1, np.float32))
    reader = fio.VarsReader(str(tmp_path / "old"))
    table = SparseTable("t", 3, SGDRule(), ("constant", 0.0), entry=CountFilterEntry(3), sketch_width=1024)
    table.pull_train(np.array([5, 6], np.int64))
    checkpoint.load_table_sketch(table, reader, "t", 0, 1, base=False)  # a delta: kept
    np.testing.assert_array_equal(table._admission.estimate(np.array([5, 6])), [1, 1])
    checkpoint.load_table_sketch(table, reader, "t", 0, 1, base=True)   # a base: empty, as a fresh table
    np.testing.assert_array_equal(table._admission.estimate(np.array([5, 6])), [0, 0])
    plain = SparseTable("p", 3, SGDRule(), ("constant", 0.0))
    assert plain.sketch() is None and plain.sketch_shape is None
    with plain.snapshot(0) as snap:
        assert snap.sketch is None
