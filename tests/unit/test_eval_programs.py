"""What a distributed worker runs for programs built before minimize (no servers needed:
the worker is never connected). tests/integration/test_eval_clone.py runs them against
real servers."""
import numpy as np
import pytest

import fleet
import fleet.fluid as fluid
from fleet.errors import ConfigError
from fleet.framework.hooks import program_to_run
from fleet.framework.program import Program, deserialize_program, serialize_program
from fleet.transpiler.plan import build_plan
from fleet.transpiler.worker_program import has_server_updates, reads_server_params, transpile_eval
from role_makers import Role, UserDefinedRoleMaker
from strategies import DistributedStrategyFactory


def _model(distributed=True):
    x = fluid.layers.data("x", shape=[3])
    ids = fluid.layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    tags = fluid.layers.data("tags", shape=[1], dtype="int64", lod_level=1)
    label = fluid.layers.data("label", shape=[1], dtype="int64")
    pooled = [fluid.layers.sequence_pool(fluid.layers.embedding(ids, size=[50, 4], is_sparse=True,
                                                                param_attr=fluid.ParamAttr(name="sparse_t")), "sum")]
    if distributed:
        table = fluid.ParamAttr(name="dist_t", initializer=fluid.initializer.Uniform(-0.1, 0.1))
        pooled.append(fluid.layers.sequence_pool(fluid.layers.embedding(tags, size=[50, 4], is_sparse=True,
                                                                        is_distributed=True, param_attr=table), "sum"))
    predict = fluid.layers.fc(fluid.layers.concat(pooled + [x], axis=1), 2, act="softmax")
    return predict, fluid.layers.mean(fluid.layers.cross_entropy(predict, label))


def _ops(program):
    return [op.type for op in program.global_block().ops]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_test_clone_reads_tables_through_prefetches_and_pulls_the_dense_parameters_it_reads(fresh_fleet, mode):
    _, loss = _model()
    test = fluid.default_main_program().clone(for_test=True)
    strategy = getattr(DistributedStrategyFactory, f"create_{mode}_strategy")()
    fluid.optimizer.SGD(0.1).minimize(loss)
    plan = build_plan(fluid.default_main_program(), strategy, ["127.0.0.1:7000", "127.0.0.1:7001"], 2)
    assert has_server_updates(fluid.default_main_program(), plan) and not has_server_updates(test, plan)
    assert reads_server_params(test, plan)

    run = transpile_eval(test, plan)
    ops = run.global_block().ops
    assert ops[0].type == "pull_dense" and sorted(ops[0].attr("params")) == ["fc_0.b_0", "fc_0.w_0"]
    assert not ops[0].attr("only_in_test")
    prefetches = {op.attr("table"): op for op in ops if op.type == "prefetch"}
    assert sorted(prefetches) == ["dist_t", "sparse_t"]
    for table, op in prefetches.items():
        assert op.attr("is_test") is True  # unseen ids of the distributed table are not created
        first_lookup = next(i for i, o in enumerate(ops) if o.type == "lookup_table" and o.input("W") == [table])
        assert ops.index(op) < first_lookup
        assert not run.global_block().vars[table].persistable
    assert run._is_test and run._lineage == test._lineage
    assert _ops(test).count("prefetch") == 0  # the user's program is not changed


def test_in_geo_a_forward_program_reads_the_workers_own_copies(fresh_fleet):
    _, loss = _model(distributed=False)
    test = fluid.default_main_program().clone(for_test=True)
    fluid.optimizer.SGD(0.1).minimize(loss)
    plan = build_plan(fluid.default_main_program(), DistributedStrategyFactory.create_geo_strategy(5),
                      ["127.0.0.1:7000"], 1)
    assert _ops(transpile_eval(test, plan)) == _ops(test)


def _worker(mode="async"):
    fleet.init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=1,
                                    server_endpoints=["127.0.0.1:7000", "127.0.0.1:7001"]))
    predict, loss = _model()
    test = fluid.default_main_program().clone(for_test=True)
    strategy = getattr(DistributedStrategyFactory, f"create_{mode}_strategy")()
    fleet.distributed_optimizer(fluid.optimizer.Adam(0.01), strategy).minimize(loss)
    return test, predict


def test_on_a_worker_the_executor_runs_programs_built_before_minimize_through_the_servers(fresh_fleet):
    test, _ = _worker()
    main, startup = fluid.default_main_program(), fluid.default_startup_program()
    assert program_to_run(main) is fleet.main_program
    assert program_to_run(startup) is fleet.startup_program
    run = program_to_run(test)
    assert run is not test and run.training_hooks is fleet.main_program.training_hooks
    assert _ops(run)[0] == "pull_dense" and _ops(run).count("prefetch") == 2
    assert program_to_run(test) is run  # cached while the program is unchanged
    trains = program_to_run(main.clone())  # a clone with the optimizer: trains through the servers
    assert "send" in _ops(trains) and not any(t.startswith("adam") for t in _ops(trains))
    # a program of another origin runs unchanged: a loaded one, one built apart
    loaded = deserialize_program(serialize_program(test))
    assert program_to_run(loaded) is loaded
    apart = Program()
    assert program_to_run(apart) is apart


def test_running_a_test_clone_before_init_worker_says_to_call_it(fresh_fleet):
    test, predict = _worker()
    feed = {"x": np.zeros((2, 3), np.float32), "ids": ([1, 2], [1, 1]), "tags": ([3, 4], [1, 1]),
            "label": np.zeros((2, 1), np.int64)}
    with pytest.raises(ConfigError, match=r"^this worker is not connected to the servers: call "
                                          r"fleet.init_worker\(\) before running fleet.main_program$"):
        fluid.Executor().run(test, feed=feed, fetch_list=[predict])


def test_fleet_init_drops_the_previous_workers_rewriting(fresh_fleet):
    test, _ = _worker()
    assert program_to_run(test) is not test
    fleet.init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=1,
                                    server_endpoints=["127.0.0.1:7000"]))
    assert program_to_run(test) is test


def test_clones_keep_the_lineage_and_a_loaded_program_starts_its_own():
    program = Program()
    assert program.clone()._lineage == program.clone(for_test=True).clone()._lineage == program._lineage
    assert deserialize_program(serialize_program(program))._lineage != program._lineage
