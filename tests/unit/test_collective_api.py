"""The collective strategy through the Fleet API, without sockets: which strategies a
job's roles can run, the ops minimize adds, and DistributeTranspilerConfig(mode='nccl2')."""
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError
from role_makers import Role, UserDefinedCollectiveRoleMaker, UserDefinedRoleMaker
from strategies import CollectiveStrategy, DistributeTranspilerConfig, DistributedStrategyFactory

WORKERS = ["127.0.0.1:7100", "127.0.0.1:7101"]


def _model():
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[3])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.sequence_pool(layers.embedding(ids, size=[20, 2], is_sparse=True), "sum")
        loss = layers.mean(layers.fc(layers.concat([x, emb], axis=1), 1))
    return main, startup, loss


@pytest.mark.parametrize("strategy", [CollectiveStrategy(), None, "nccl2"])
def test_minimize_adds_the_all_reduce_before_the_updates_and_the_broadcast_last(strategy, monkeypatch):
    fleet.init(UserDefinedCollectiveRoleMaker(1, WORKERS))
    if strategy == "nccl2":
        strategy = DistributeTranspilerConfig()
        strategy.mode = "nccl2"
    main, startup, loss = _model()
    with fw.program_guard(main, startup):
        fleet.distributed_optimizer(optimizer.Adam(0.01), strategy).minimize(loss)
    types = [op.type for op in fleet.main_program.global_block().ops]
    first_update = types.index("adam")
    assert types[first_update - 1] == "c_allreduce_grads" and types.count("adam") == 3
    op = fleet.main_program.global_block().ops[first_update - 1]
    assert dict(zip(op.attr("params"), op.attr("sparse"))) == {"embedding.w_0": True, "fc_0.w_0": False,
                                                                "fc_0.b_0": False}
    assert fleet.startup_program.global_block().ops[-1].type == "c_broadcast_params"
    assert fleet.main_program is main  # changed in place, as Paddle's collective transpiler does
    # Without init_worker(), the startup program joins the workers (as Paddle's collective
    # startup program does); here the join is recorded instead of opening sockets.
    comm = fleet.main_program.training_hooks
    joined = []
    monkeypatch.setattr(comm, "start", lambda: (joined.append("start"), setattr(comm, "running", True)))
    monkeypatch.setattr(comm, "stop", lambda: joined.append("stop"))
    fleet.Executor().run(fleet.startup_program)
    assert joined == ["start"]
    assert comm._pending_broadcast is not None  # the recorded join made no group: done when there is one
    fleet.init_worker()  # after the startup program joined: nothing more
    assert joined == ["start"]
    fleet.stop_worker()
    assert joined == ["start", "stop"]


def test_a_collective_job_refuses_server_strategies_and_servers_refuse_collective():
    fleet.init(UserDefinedCollectiveRoleMaker(0, WORKERS))
    main, startup, loss = _model()
    with fw.program_guard(main, startup):
        with pytest.raises(ConfigError, match="this job has no parameter servers \\(a collective role maker: "
                                              "workers only\\), so it cannot train with the 'async' strategy"):
            fleet.distributed_optimizer(optimizer.SGD(0.1), DistributedStrategyFactory.create_async_strategy())
    fleet.init(UserDefinedRoleMaker(0, Role.WORKER, 2, ["127.0.0.1:7200"]))
    with pytest.raises(ConfigError, match="CollectiveStrategy trains without parameter servers, but this job has 1 "
                                          "\\(127.0.0.1:7200\\)"):
        fleet.distributed_optimizer(optimizer.SGD(0.1), CollectiveStrategy())
