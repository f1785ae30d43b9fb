"""Sync steps in one round trip (tests/unit/fake_cluster.py, no sockets): the rows of the
next step's batches come with the step's answer, read after the update, so training is
bit-identical to pulling them at the start of the next step."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.communicator.api import make_communicator
from fleet.errors import DataError, ServerError
from fleet.framework.tensor import SparseRows
from strategies import DistributedStrategyFactory
from fake_cluster import Cluster

STEPS = 4


def _cluster(mode="sync"):
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
        optimizer.Adam(0.01).minimize(layers.mean(out))
    startup.random_seed = 5
    strategy = getattr(DistributedStrategyFactory, f"create_{mode}_strategy")()
    strategy.set_sparse_table_config("dtable")  # statistics: a training pull counts shows
    cluster = Cluster(main, startup, strategy, 2)
    if mode != "sync":
        cluster.comm = make_communicator(mode, cluster.plan, 0, fw.Scope(), {}, lambda ep: cluster.clients[ep])
        cluster.comm.start()
    cluster.comm.set_prefetch_inputs({"emb": ["ids"], "dtable": ["dids"]})
    return cluster


def _feeds():
    rng = np.random.default_rng(3)
    return [{"ids": rng.integers(0, 600, 12, dtype=np.int64), "dids": rng.integers(-50, 50, 9, dtype=np.int64) * 7919}
            for _ in range(STEPS)]


def _grads(plan, step, rows):
    rng = np.random.default_rng(100 + step)
    out = {}
    for name, p in sorted(plan.params.items()):
        if name in rows:
            out[p.grad] = SparseRows(rows[name].ids, rng.standard_normal((len(rows[name].ids), p.width), np.float32),
                                     p.shape[0])
        else:
            out[p.grad] = rng.standard_normal(p.shape).astype(np.float32)
    return out


def _train(cluster, ahead):
    """STEPS sync steps as the dataset trainer runs them: with ``ahead`` each step first
    hands over the next batch (``prepare_batch``), else every prefetch pulls."""
    comm, feeds, seen = cluster.comm, _feeds(), []
    comm.begin_pass(1)
    for step, feed in enumerate(feeds):
        if ahead and step + 1 < len(feeds):
            comm.prepare_batch(feeds[step + 1])
        rows = {"emb": comm.prefetch("emb", feed["ids"]), "dtable": comm.prefetch("dtable", feed["dids"])}
        seen.append({t: (r.ids.copy(), r.values.copy()) for t, r in rows.items()})
        comm.send(_grads(cluster.plan, step, rows))
    comm.end_pass()
    return seen


@pytest.mark.parametrize("mode", ["sync", "half_async"])
def test_rows_that_come_with_the_step_answer_train_bit_identically_to_pulls_at_the_next_step(mode):
    old, new = _cluster(mode), _cluster(mode)
    old_rows, new_rows = _train(old, ahead=False), _train(new, ahead=True)
    for a, b in zip(old_rows, new_rows):
        for table in a:
            np.testing.assert_array_equal(a[table][0], b[table][0])
            np.testing.assert_array_equal(a[table][1], b[table][1])
    (old_vals, old_tables), (new_vals, new_tables) = old.whole(), new.whole()
    assert sorted(old_vals) == sorted(new_vals)
    for name in old_vals:
        if not name.endswith("@per_block"):
            np.testing.assert_array_equal(old_vals[name], new_vals[name], err_msg=name)
    assert sorted(old_tables["dtable"]) == sorted(new_tables["dtable"])
    for row_id, row in old_tables["dtable"].items():  # values, optimizer state and show statistics
        for key, value in row.items():
            np.testing.assert_array_equal(value, new_tables["dtable"][row_id][key], err_msg=f"{row_id} {key}")
    for name in old.comm.stats:
        if name not in ("requests", "prefetches", "prefetches_ahead_used"):
            assert old.comm.stats[name] == new.comm.stats[name]
    # only the first step pulls (one request per server and table); then one request per server a step
    assert new.comm.stats["prefetches_ahead_used"] == 2 * (STEPS - 1)
    assert new.comm.stats["prefetches"] == 2
    for ep, client in new.clients.items():
        assert client.requests.count("sync_push" if mode == "sync" else "push") == STEPS
        first_step = old.clients[ep].requests[:old.clients[ep].requests.index(client.requests[-1])]
        assert client.requests.count("pull_sparse") == first_step.count("pull_sparse")
        assert old.clients[ep].requests.count("pull_sparse") > client.requests.count("pull_sparse")


def test_lock_step_threads_get_the_rows_of_each_of_their_batches_as_each_pulled_them_after_the_step():
    """Two threads' batches per step (``prepare_step``): one row pull per batch and table,
    each with its own statistics, in thread order (as the threads' prefetch ops pull)."""
    def train(cluster, ahead):
        comm, feeds, seen = cluster.comm, _feeds(), []
        steps = [feeds[i:i + 2] for i in range(0, len(feeds), 2)]
        comm.begin_pass(2)
        for step, batches in enumerate(steps):
            if ahead and step + 1 < len(steps):
                comm.prepare_step(steps[step + 1])
            rows = [{"emb": comm.prefetch("emb", f["ids"]), "dtable": comm.prefetch("dtable", f["dids"])}
                    for f in batches]
            seen += [{t: (r.ids.copy(), r.values.copy()) for t, r in b.items()} for b in rows]
            merged = {t: type("Rows", (), {"ids": np.union1d(rows[0][t].ids, rows[1][t].ids)}) for t in rows[0]}
            comm.send(_grads(cluster.plan, step, merged))
        comm.end_pass()
        return seen

    old, new = _cluster(), _cluster()
    old_rows, new_rows = train(old, ahead=False), train(new, ahead=True)
    for a, b in zip(old_rows, new_rows):
        for table in a:
            np.testing.assert_array_equal(a[table][1], b[table][1])
    (_, old_tables), (_, new_tables) = old.whole(), new.whole()
    for row_id, row in old_tables["dtable"].items():
        for key, value in row.items():
            np.testing.assert_array_equal(value, new_tables["dtable"][row_id][key], err_msg=f"{row_id} {key}")
    assert new.comm.stats["prefetches_ahead_used"] == 2 * (STEPS - 2)


def test_a_step_answer_without_the_rows_asked_for_is_an_error_naming_the_server():
    cluster = _cluster()
    ep = cluster.plan.server_endpoints[1]
    server = cluster.servers[ep]
    row_pulls = server._row_pulls
    server._row_pulls = lambda req: (row_pulls(req)[0], [])  # applies the step, reads no rows
    comm, feeds = cluster.comm, _feeds()
    comm.begin_pass(1)
    comm.prepare_batch(feeds[1])
    rows = {"emb": comm.prefetch("emb", feeds[0]["ids"]), "dtable": comm.prefetch("dtable", feeds[0]["dids"])}
    with pytest.raises(DataError, match=f"server {ep} answered a sync step with"):
        comm.send(_grads(cluster.plan, 0, rows))


def test_a_row_pull_that_does_not_match_its_arrays_is_refused_before_the_step_is_parked():
    cluster = _cluster()
    ep = cluster.plan.server_endpoints[0]
    client = cluster.clients[ep]
    with pytest.raises(ServerError, match="does not match its 1 arrays"):
        client.request("sync_push", ["0/ids"], [np.arange(3, dtype=np.int64)], {"pull": [], "rows": [["dtable", 3]]})
    with pytest.raises(ServerError, match="a training pull of table .dtable. has shows of dtype float64"):
        client.request("sync_push", ["0/ids", "0/shows", "0/clicks"],
                       [np.arange(3, dtype=np.int64), np.ones(3), np.zeros(3, np.float32)],
                       {"pull": [], "rows": [["dtable", 3]]})
    assert not cluster.servers[ep]._sync


def test_a_half_async_batch_needing_a_server_that_gets_no_push_is_pulled_by_its_prefetch():
    cluster = _cluster("half_async")
    comm, feeds = cluster.comm, _feeds()
    comm.begin_pass(1)
    comm.prepare_batch(feeds[1])
    comm.send({})  # no gradient: every server gets a pull_dense, which carries no rows
    rows = comm.prefetch("dtable", feeds[1]["dids"])
    assert comm.stats["prefetches_ahead_used"] == 0 and comm.stats["prefetches"] == 1
    again = comm.prefetch("dtable", feeds[1]["dids"], is_test=True)
    np.testing.assert_array_equal(rows.values, again.values)
