"""Servers apply the new optimizers, regularizers and learning-rate schedules exactly as
local training does: a sync job of one worker (servers in this process, see
tests/unit/fake_cluster.py) fed the gradients of a local run ends every step with the
local run's parameters and optimizer state; async servers step the schedule per push
(each schedule at its closed-form value) or per merged update; checkpoints keep each
server's counter."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer, regularizer
from fleet.errors import ConfigError
from fleet.framework import io as fio
from fleet.framework.tensor import SparseRows
from fleet.param_attr import ParamAttr
from fleet.server_saves import write_server_lr_steps, write_server_params
from fleet.transpiler.plan import build_plan
from strategies import DistributedStrategyFactory
from fake_cluster import Cluster, endpoints
from test_optimizers_adaptive import SCHEDULES, _closed_form

VOCAB, TABLE = 30, 12


def _program(make_opt, schedule=True):
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        dids = layers.data("dids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(ids, size=[VOCAB, 3], is_sparse=True,
                               param_attr=ParamAttr(name="emb", regularizer=regularizer.L1Decay(0.01)))
        table = ParamAttr(name="dtable", initializer=fleet.initializer.Uniform(-0.5, 0.5))
        demb = layers.embedding(dids, size=[TABLE, 2], is_distributed=True, param_attr=table)
        pooled = [layers.sequence_pool(emb, "sum"), layers.sequence_pool(demb, "sum"), x]
        h = layers.fc(layers.concat(pooled, axis=1), 6, act="tanh", param_attr="w", bias_attr="b")
        loss = layers.mean(layers.square(layers.fc(h, 1, param_attr="w2", bias_attr="b2")))
        lr = layers.exponential_decay(0.05, decay_steps=2, decay_rate=0.5) if schedule else 0.05
        make_opt(lr).minimize(loss)
    startup.random_seed = 3
    return main, startup


def _feeds(steps, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        out.append({"x": rng.normal(size=(5, 4)).astype(np.float32),
                    "ids": [list(rng.integers(0, VOCAB, rng.integers(1, 4))) for _ in range(5)],
                    "dids": [list(rng.integers(0, TABLE, rng.integers(1, 3))) for _ in range(5)]})
    return out


OPTIMIZERS = {
    "rmsprop_l2": lambda lr: optimizer.RMSProp(lr, momentum=0.5, centered=True,
                                               regularization=regularizer.L2Decay(0.1)),
    "ftrl": lambda lr: optimizer.Ftrl(lr, l1=0.001, l2=0.01),
    "decayed_adagrad": lambda lr: optimizer.DecayedAdagrad(lr, regularization=regularizer.L1Decay(0.05)),
    "lamb": lambda lr: optimizer.Lamb(lr, exclude_from_weight_decay_fn=lambda p: p.name.startswith("b")),
    "adam_l2": lambda lr: optimizer.Adam(lr, regularization=regularizer.L2Decay(0.2)),
    "adamax": lambda lr: optimizer.Adamax(lr, regularization=regularizer.L2Decay(0.05)),
    "adadelta": lambda lr: optimizer.Adadelta(lr, rho=0.9),
}


def _sync_step(cluster, grads):
    for ep, (names, arrays) in cluster.comm.split_grads(grads).items():
        if names:
            cluster.clients[ep].request("sync_push", names, arrays, meta={"pull": []})


def cluster_rule(cluster, name):
    for ps in cluster.servers.values():
        for pplan, _, table in ps.blocks.values():
            if pplan.name == name:
                return table.rule
        if name in ps.shards:
            return ps.shards[name][1].rule
    raise KeyError(name)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_sync_job_of_one_worker_equals_local_training_step_by_step(name):
    # Lamb's trust ratio is per block on servers (as on Paddle's pservers): one server
    # holds each parameter whole, so it equals local training.
    servers = 1 if name == "lamb" else 2
    main, startup = _program(OPTIMIZERS[name])
    cluster = Cluster(main, startup, DistributedStrategyFactory.create_sync_strategy(), servers)
    scope, exe = fw.Scope(), fw.Executor()
    exe.run(startup, scope=scope)
    for p in cluster.plan.params.values():  # local training starts from the servers' values
        if p.name == "dtable":
            ids = np.arange(TABLE, dtype=np.int64)
            for i, ep in enumerate(cluster.plan.server_endpoints):
                mine = ids[ids % servers == i]
                scope["dtable"][mine] = cluster.servers[ep].shards["dtable"][1].pull(mine)
        else:
            scope[p.name][...] = cluster.whole()[0][p.name]
    grads = [p.grad for p in cluster.plan.params.values()]
    for step, feed in enumerate(_feeds(5)):
        values = exe.run(main, feed=feed, fetch_list=grads, scope=scope, return_numpy=False)
        pushed = {}
        for gname, value in zip(grads, values):
            if gname.startswith("dtable"):  # the distributed table's gradient rows are ids
                value = SparseRows(value.rows, value.values, 2**63 - 1)
            pushed[gname] = value
        _sync_step(cluster, pushed)
        dense, tables = cluster.whole()
        for p in cluster.plan.params.values():
            keys = ["value"] + [k for k in cluster_rule(cluster, p.name).row_state_names]
            for key in keys:
                local = scope[p.name if key == "value" else f"{p.name}_{key}_0"]
                if p.name == "dtable":
                    got = np.array([tables["dtable"][i]["values" if key == "value" else f"state.{key}"]
                                    for i in range(TABLE) if i in tables["dtable"]])
                    want = np.array([local[i] for i in range(TABLE) if i in tables["dtable"]])
                else:
                    got, want = dense[p.name if key == "value" else f"{p.name}_{key}_0"], local
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name}: {p.name} {key} after step {step}")
            rule = cluster_rule(cluster, p.name)
            for key in (k for k in rule.state_names if k not in rule.row_state_names):  # Adamax's beta1_pow
                local = scope[f"{p.name}_{key}_0"]
                if p.name == "dtable":
                    per = [ps.shards["dtable"][1].state_dict()[f"state.{key}"] for ps in cluster.servers.values()]
                else:
                    per = list(dense[f"{p.name}_{key}_0@per_block"].values())
                for value in per:
                    np.testing.assert_allclose(value, local, rtol=1e-12, err_msg=f"{p.name} {key}")
        for ps in cluster.servers.values():
            assert ps.lr_step == step == int(scope["@LR_DECAY_COUNTER@"][0])


def _async_cluster(n=2, merge=1):
    main, startup = _program(lambda lr: optimizer.SGD(lr))
    return Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), n)


def test_async_servers_step_the_schedule_once_per_push_and_use_the_decayed_rate():
    cluster = _async_cluster()
    b2 = cluster.plan.params["b2"]
    assert b2.lr_schedule["kind"] == "exponential_decay" and b2.learning_rate == 1.0
    before = cluster.whole()[0]["b2"].copy()
    for push in range(4):
        cluster.push({b2.grad: np.ones(1, np.float32)})
    # pushes see steps 0, 1, 2, 3: rates 0.05 * 0.5 ** (t / 2)
    moved = sum(0.05 * 0.5 ** (t / 2) for t in range(4))
    np.testing.assert_allclose(cluster.whole()[0]["b2"], before - moved, rtol=1e-6)
    # each server counts the updates it applied: the one holding b2 four, the other none
    holder = b2.blocks[0].endpoint
    assert cluster.comm.lr_steps() == {ep: (3 if ep == holder else -1) for ep in cluster.plan.server_endpoints}


def test_a_checkpoint_keeps_each_servers_counter_and_falls_back_to_the_workers(tmp_path):
    cluster = _async_cluster(n=2)
    grads = {p.grad: np.ones(p.shape, np.float32) for p in cluster.plan.params.values() if p.kind == "dense"}
    for _ in range(3):
        cluster.push(grads)
    dirname = str(tmp_path / "ck")
    with fio.VarsWriter(dirname, {}) as writer:
        write_server_params(writer, cluster.comm, cluster.plan.params.values())
        write_server_lr_steps(writer, cluster.comm, cluster.plan)
        writer.add("@LR_DECAY_COUNTER@", np.array([7], np.int64))  # the worker's own counter
    saved = fio.read_vars(dirname, ["@LR_DECAY_COUNTER@@servers"])["@LR_DECAY_COUNTER@@servers"]
    assert saved.tolist() == [[2], [2]]
    main, startup = _program(lambda lr: optimizer.SGD(lr))
    same = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), 2, dirname=dirname)
    assert [ps.lr_step for ps in same.servers.values()] == [2, 2]
    other = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), 3, dirname=dirname)
    assert [ps.lr_step for ps in other.servers.values() if ps.has_lr_schedule] == [7] * sum(
        ps.has_lr_schedule for ps in other.servers.values())


def test_servers_refuse_a_rate_computed_by_other_ops_with_the_fix():
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        loss = layers.mean(layers.fc(x, 1))
        lr = layers.scale(layers.exponential_decay(0.1, 10, 0.5), scale=0.5)
        optimizer.SGD(lr).minimize(loss)
    with pytest.raises(ConfigError, match="computed by op 'scale'.*pass the schedule's Variable"):
        build_plan(main, DistributedStrategyFactory.create_async_strategy(), endpoints(1), 1)


def test_merged_async_pushes_step_the_schedule_once_per_merged_update():
    from fake_cluster import FakeClient, startup_values
    from fleet.server.parameter_server import ParameterServer

    main, startup = _program(lambda lr: optimizer.SGD(lr))
    plan = build_plan(main, DistributedStrategyFactory.create_async_strategy(), endpoints(1), 2)
    ps = ParameterServer(plan.server_endpoints[0], plan, startup_values(startup), merge_pushes=2)
    clients = [FakeClient(ps, worker) for worker in (0, 1)]
    b2 = plan.params["b2"]
    before = ps.blocks["b2"][2].pull().copy()
    for round_ in range(2):
        for client in clients:  # two pushes make one update with their mean gradient
            client.request("push", ["b2"], [np.full(1, 2.0, np.float32)])
        assert ps.lr_step == round_
    np.testing.assert_allclose(ps.blocks["b2"][2].pull(), before - 2.0 * (0.05 + 0.05 * 0.5 ** 0.5), rtol=1e-6)


def _schedule_program(kind, args):
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        loss = layers.mean(layers.fc(x, 1, param_attr="w", bias_attr="b"))
        optimizer.SGD(getattr(layers, kind)(**args)).minimize(loss)
    return main, startup


@pytest.mark.parametrize("kind, args", SCHEDULES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SCHEDULES)])
def test_a_server_applies_each_schedule_at_its_closed_form_value_step_by_step(kind, args):
    main, startup = _schedule_program(kind, args)
    cluster = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), 1)
    begin = 1 if kind == "noam_decay" else 0
    assert cluster.plan.lr_begin == begin
    table = cluster.servers[cluster.plan.server_endpoints[0]].blocks["b"][2]
    for t in range(begin, begin + 8):
        before = table.pull().astype(np.float64)
        cluster.push({cluster.plan.params["b"].grad: np.ones(1, np.float32)})  # SGD: b -= lr
        np.testing.assert_allclose(before - table.pull(), [_closed_form(kind, t, **args)], rtol=2e-5, atol=1e-9,
                                   err_msg=f"step {t}")


def test_a_server_evaluates_warmup_over_another_schedule():
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        loss = layers.mean(layers.fc(x, 1, param_attr="w", bias_attr="b"))
        inner = layers.exponential_decay(0.1, 2, 0.5, staircase=True)
        optimizer.SGD(layers.linear_lr_warmup(inner, 3, 0.0, 0.3)).minimize(loss)
    cluster = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), 1)
    spec = cluster.plan.params["b"].lr_schedule
    assert spec["kind"] == "linear_lr_warmup" and spec["learning_rate"]["kind"] == "exponential_decay"
    table = cluster.servers[cluster.plan.server_endpoints[0]].blocks["b"][2]
    seen = []
    for _ in range(6):
        before = float(table.pull()[0])
        cluster.push({cluster.plan.params["b"].grad: np.ones(1, np.float32)})
        seen.append(before - float(table.pull()[0]))
    np.testing.assert_allclose(seen, [0.0, 0.1, 0.2, 0.1 * 0.5, 0.1 * 0.25, 0.1 * 0.25], rtol=2e-5, atol=1e-8)
