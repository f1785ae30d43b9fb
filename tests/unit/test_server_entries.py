"""Servers' tables with entries and statistics, in process (fake clients): a worker's
training pulls carry shows and clicks, test pulls create nothing, the shrink op, the
checks at the server boundary, and the same admissions and statistics as local training
on one or two servers."""
import numpy as np
import pytest
from fake_cluster import FakeClient, endpoints, startup_values

import fleet
import fleet.framework as fw
from fleet import local_tables
from fleet.communicator import make_communicator
from fleet.errors import ServerError
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan
from fleet.transpiler.worker_program import transpile_worker
from strategies import DistributedStrategyFactory
from test_local_tables import _batches, _feed, _model
from test_server_liveness import handle

pytestmark = pytest.mark.usefixtures("fresh_fleet")


@pytest.fixture(autouse=True)
def fresh_local_tables():
    local_tables.LOCAL.reset()
    yield
    local_tables.LOCAL.reset()


class Job:
    """``n`` servers and one worker (mode) running the transpiled program in process."""

    def __init__(self, main, startup, n, mode="sync", strategy=None):
        strategy = strategy or getattr(DistributedStrategyFactory, f"create_{mode}_strategy")()
        self.plan = build_plan(main, strategy, endpoints(n), 1)
        initial = startup_values(startup)
        self.servers = {ep: ParameterServer(ep, self.plan, initial) for ep in self.plan.server_endpoints}
        self.program, worker_startup = transpile_worker(main, startup, self.plan)
        self.scope = fw.Scope()
        self.comm = make_communicator(mode, self.plan, 0, self.scope, {},
                                      connect=lambda ep: FakeClient(self.servers[ep], 0))
        self.program.training_hooks = self.comm
        self.comm.start()
        self.comm.pull_dense()
        self.exe = fw.Executor()
        self.exe.run(worker_startup, scope=self.scope)

    def run(self, feed, program=None, fetch_list=None):
        return self.exe.run(program or self.program, feed=feed, scope=self.scope, fetch_list=fetch_list)

    def shards(self, name="emb"):
        return [ps.shards[name][1] for ps in self.servers.values()]

    def rows(self, name="emb"):
        """{id: (value, statistics)} over every server's shard."""
        out = {}
        for table in self.shards(name):
            state = table.state_dict()
            stats = table.statistics(state["ids"])
            for i, row_id in enumerate(state["ids"]):
                out[int(row_id)] = (state["values"][i], stats[i])
        return out


def _local_rows(main, startup, batches):
    exe = fleet.Executor()
    scope = fw.Scope()
    exe.run(startup, scope=scope)
    for feed in batches:
        exe.run(main, feed=feed, scope=scope)
    table = local_tables.local_tables()["emb"]
    state = table.state_dict()
    stats = table.statistics(state["ids"])
    return {int(r): (state["values"][i], stats[i]) for i, r in enumerate(state["ids"])}, exe, scope


@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("entry", [fleet.CountFilterEntry(2), fleet.ShowClickEntry("show", "click"),
                                   fleet.ProbabilityEntry(0.5)])
def test_local_and_distributed_training_admit_the_same_ids_with_the_same_statistics(servers, entry):
    batches = _batches(10)
    main, startup, _, _, _ = _model(entry)
    local, _, local_scope = _local_rows(main, startup, batches)
    job = Job(main, startup, servers)
    for feed in batches:
        job.run(feed)
    remote = job.rows()
    assert sorted(remote) == sorted(local) and len(local) > 5
    for row_id, (value, stats) in local.items():
        np.testing.assert_array_equal(remote[row_id][1], stats, err_msg=f"statistics of id {row_id}")
        np.testing.assert_allclose(remote[row_id][0], value, rtol=1e-5, atol=1e-6, err_msg=f"row of id {row_id}")
    if servers == 2:  # every id on the server of id % 2
        for index, table in enumerate(job.shards()):
            assert (table.state_dict()["ids"] % 2 == index).all()
    np.testing.assert_allclose(job.scope["fc.w"], local_scope["fc.w"], rtol=1e-5, atol=1e-6)


def test_a_count_filter_entry_on_the_servers_reads_zeros_until_the_second_sight():
    main, startup, _, pooled, _ = _model(fleet.CountFilterEntry(2), init=fleet.initializer.Constant(0.5))
    job = Job(main, startup, 2, mode="async")
    out, = job.run(_feed([[7], [8]]), fetch_list=[pooled])
    job.comm.flush()
    np.testing.assert_array_equal(out, np.zeros((2, 4), np.float32))
    assert sum(len(t) for t in job.shards()) == 0
    out, = job.run(_feed([[7], [3]]), fetch_list=[pooled])
    job.comm.flush()
    np.testing.assert_array_equal(out, [[0.5] * 4, [0] * 4])
    assert sorted(job.rows()) == [7]


def test_a_test_clone_of_the_worker_program_creates_and_counts_nothing():
    main, startup, _, pooled, _ = _model(fleet.CountFilterEntry(1))
    job = Job(main, startup, 1)
    job.run(_feed([[1]]))
    before = job.rows()
    test = job.program.clone(for_test=True)
    out, = job.run(_feed([[2, 1]]), program=test, fetch_list=[pooled.name])
    np.testing.assert_allclose(out[0], before[1][0], rtol=1e-6)
    after = job.rows()
    assert sorted(after) == [1]
    np.testing.assert_array_equal(after[1][1], before[1][1])  # no show counted


def test_shrink_on_every_server_returns_the_rows_it_deleted():
    main, startup, _, _, _ = _model(fleet.CountFilterEntry(1))
    job = Job(main, startup, 2)
    job.run(_feed([[1] * 10, [2] * 10, [3], [4]]))
    # score = (show - click) * 0.1 + click after the 0.98 decay: 0.98 for 10 shows, 0.098 for 1
    assert job.comm.shrink(first=True) == {"emb": 2}
    assert sorted(job.rows()) == [1, 2]
    assert [ps.last_shrink for ps in job.servers.values()] == [{"emb": 1}, {"emb": 1}]
    assert job.comm.shrink(first=False) == {"emb": 2}  # what the other workers read
    assert sorted(job.rows()) == [1, 2]


def test_a_plain_table_keeps_no_statistics_and_shrinks_nothing():
    main, startup, _, _, _ = _model(None)
    job = Job(main, startup, 1)
    job.run(_feed([[1, 2]]))
    assert not job.shards()[0].has_statistics
    assert job.comm.shrink(first=True) == {}


def test_the_strategy_accessor_reaches_the_servers_tables():
    main, startup, _, _, _ = _model(None)
    strategy = DistributedStrategyFactory.create_async_strategy()
    strategy.set_sparse_table_config("emb", sparse_show_click_decay_rate=0.5, delete_threshold=0.1)
    job = Job(main, startup, 2, mode="async", strategy=strategy)
    for table in job.shards():
        assert table.has_statistics and table.entry is None
        assert table.accessor == fleet.entries.CtrAccessorConfig(show_click_decay_rate=0.5, delete_threshold=0.1)


@pytest.mark.parametrize("names, arrays, message", [
    (["ids", "shows"], [np.array([1, 2]), np.ones(2, np.float32)],
     r"a training pull of table 'emb' carries \['shows'\] but not 'clicks'"),
    (["ids", "shows", "clicks"], [np.array([1, 2]), np.ones(2, np.float64), np.zeros(2, np.float32)],
     r"a training pull of table 'emb' has shows of dtype float64 and shape \[2\]; expected float32 \[2\]"),
    (["ids", "shows", "clicks"], [np.array([1, 2]), np.ones(3, np.float32), np.zeros(2, np.float32)],
     r"has shows of dtype float32 and shape \[3\]; expected float32 \[2\]"),
    (["ids", "shows", "clicks"], [np.array([1, 2]), np.ones(2, np.float32), np.full(2, -1, np.float32)],
     r"has clicks that are negative or not finite"),
])
def test_the_server_refuses_bad_statistics_naming_the_table(names, arrays, message):
    main, startup, _, _, _ = _model(fleet.CountFilterEntry(1))
    job = Job(main, startup, 1)
    client = job.comm.clients[job.plan.server_endpoints[0]]
    with pytest.raises(ServerError, match=message):
        client.request("pull_sparse", names, arrays, {"table": "emb", "is_test": False})
    assert len(job.shards()[0]) == 0


@pytest.mark.parametrize("threads, lock_step", [(1, False), (2, False), (2, True)])
def test_async_pulls_ahead_carry_each_batchs_statistics_exactly_once(tmp_path, monkeypatch, threads, lock_step):
    """Hogwild threads pull each batch ahead (prepare_batch); threads in lock step (a Reduce
    build strategy) pull each step's batches at once (prepare_step)."""
    from test_local_tables import _write_dataset

    monkeypatch.setenv("CPU_NUM", str(threads))
    batches = _batches(12)
    _write_dataset(tmp_path / "data.txt", batches)
    main, startup, _, _, _ = _model(fleet.ShowClickEntry("show", "click"))
    strategy = DistributedStrategyFactory.create_async_strategy()
    strategy.set_sparse_table_config("emb", nonclk_coeff=1.0)  # every show admits: score >= 1
    job = Job(main, startup, 2, mode="async", strategy=strategy)
    if lock_step:
        job.program._build_strategy = strategy.get_build_strategy()  # Reduce with CPU_NUM=2
    runtime_inputs = {"emb": ["ids"]}
    job.comm.set_prefetch_inputs(runtime_inputs, {"emb": ("show", "click")})
    block = main.global_block()
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var([block.var("ids"), block.var("show"), block.var("click")])
    ds.set_batch_size(8)
    ds.set_thread(threads)
    ds.set_filelist([str(tmp_path / "data.txt")])
    job.exe.train_from_dataset(job.program, ds, scope=job.scope)
    job.comm.flush()
    assert job.comm.stats["prefetches_ahead_used"] > 0
    expected = {}
    for feed in batches:
        ids = feed["ids"]
        example = np.repeat(np.arange(len(feed["show"])), np.diff(ids.offsets))
        for i, e in zip(ids.values, example):
            s, c = expected.get(int(i), (0.0, 0.0))
            expected[int(i)] = (s + feed["show"][e, 0], c + feed["click"][e, 0])
    rows = job.rows()
    assert sorted(rows) == sorted(expected)
    for row_id, (show, click) in expected.items():
        assert tuple(rows[row_id][1][:2]) == (show, click), row_id
    job.comm.stop()


@pytest.mark.parametrize("entry", [fleet.CountFilterEntry(2), fleet.ShowClickEntry("show", "click")])
def test_a_servers_warm_up_runs_its_kernels_and_changes_nothing_it_holds(entry):
    main, startup, _, _, _ = _model(entry, optimizer=fleet.optimizer.Adam(0.1))
    job = Job(main, startup, 2, mode="async")
    for feed in _batches(3):
        job.run(feed)
    job.comm.flush()
    before = {ep: ({n: t.state_dict() for n, (_, _, t) in ps.blocks.items()},
                   {n: t.state_dict() for n, (_, t) in ps.shards.items()}, ps.updates, ps.lr_step)
              for ep, ps in job.servers.items()}
    assert any(len(shards["emb"]["ids"]) for _, shards, _, _ in before.values())
    for ps in job.servers.values():
        ps.warm_up()
    for ep, ps in job.servers.items():
        blocks, shards, updates, lr_step = before[ep]
        assert (ps.updates, ps.lr_step) == (updates, lr_step)
        for name, (_, _, table) in ps.blocks.items():
            _assert_same_state(table.state_dict(), blocks[name])
        for name, (_, table) in ps.shards.items():
            _assert_same_state(table.state_dict(), shards[name])


def _assert_same_state(got, expected):
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_same_state(got[key], value)
        else:
            np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_geo_servers_warm_up_changes_no_block_and_marks_no_row_changed():
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = fleet.layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        e = fleet.layers.sequence_pool(fleet.layers.embedding(ids, size=[100, 2], is_sparse=True, param_attr="t"),
                                       "sum")
        fleet.optimizer.SGD(0.1).minimize(fleet.layers.mean(fleet.layers.fc(e, 2, param_attr="w")))
    plan = build_plan(main, DistributedStrategyFactory.create_geo_strategy(4), endpoints(1), 2)
    ps = ParameterServer(plan.server_endpoints[0], plan, startup_values(startup))
    handle(ps, "geo_push", 0, ["t@ROWS", "t@VALUES"], [np.array([4, 9], np.int64), np.ones((2, 2), np.float32)])
    before = {name: table.state_dict() for name, (_, _, table) in ps.blocks.items()}
    ps.warm_up()
    for name, (_, _, table) in ps.blocks.items():
        _assert_same_state(table.state_dict(), before[name])
    assert ps.blocks["t"][2].pull_changed(1)[0].tolist() == [4, 9]  # worker 1 sees worker 0's rows only
