"""CompiledProgram.with_data_parallel and ParallelExecutor: a step split across CPU_NUM
replicas equals one replica on the whole batch (float tolerance), for SGD and Adam, a
dense and a sparse table; fetched values are the replicas' values concatenated."""
import numpy as np
import pytest

import fleet.fluid as fluid
import fleet.framework as fw
from fleet.errors import ConfigError, DataError
from fleet import layers, optimizer

VOCAB = 50
OPTIMIZERS = {"sgd": lambda: optimizer.SGD(0.1), "adam": lambda: optimizer.Adam(0.02),
              # a schedule the forward reads too: one counter step per step, before the replicas
              "rmsprop_schedule": lambda: optimizer.RMSProp(layers.exponential_decay(0.05, 2, 0.5))}


def _program(opt, sparse):
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[3])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        y = layers.data("y", shape=[1], dtype="int64")
        emb = layers.sequence_pool(layers.embedding(ids, size=[VOCAB, 4], is_sparse=sparse), "sum")
        h = layers.fc(layers.concat([emb, x], axis=1), 6, act="relu")
        pred = layers.fc(h, 2, act="softmax")
        loss = layers.mean(layers.cross_entropy(pred, y))
        layers.auc(pred, y, slide_steps=3)
        optimizer_ = OPTIMIZERS[opt]()
        if isinstance(optimizer_._learning_rate, fw.Variable):
            loss = loss * (optimizer_._learning_rate / optimizer_._learning_rate)
        optimizer_.minimize(loss)
    startup.random_seed = 3
    return main, startup, loss


def _batches(steps, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lengths = rng.integers(1, 4, n)
        out.append({"x": rng.normal(size=(n, 3)).astype("float32"),
                    "ids": (rng.integers(0, VOCAB, lengths.sum()), lengths),
                    "y": rng.integers(0, 2, (n, 1))})
    return out


def _params(main, scope):
    return {p.name: np.array(scope[p.name]) for p in main.global_block().all_parameters()}


def _state(main, scope):
    """Every persistable value: parameters, optimizer state, auc statistics and window."""
    return {v.name: np.array(scope[v.name]) for v in main.list_vars() if v.persistable and not v.is_data}


@pytest.mark.parametrize("opt", ["sgd", "adam", "rmsprop_schedule"])
@pytest.mark.parametrize("sparse", [False, True])
def test_two_replicas_with_reduce_equal_one_replica_on_the_whole_batch(opt, sparse, monkeypatch):
    monkeypatch.setenv("CPU_NUM", "2")
    batches = _batches(4, 9)  # 9 examples: parts of 4 and 5
    main, startup, loss = _program(opt, sparse)
    one, two = fw.Scope(), fw.Scope()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=one)
    exe.run(startup, scope=two)
    initial = _params(main, one)
    build = fluid.BuildStrategy()
    build.reduce_strategy = fluid.BuildStrategy.ReduceStrategy.Reduce
    compiled = fluid.compiler.CompiledProgram(main).with_data_parallel(loss_name=loss.name,
                                                                      build_strategy=build)
    for feed in batches:
        whole, = exe.run(main, feed=feed, fetch_list=[loss], scope=one)
        parts, = exe.run(compiled, feed=feed, fetch_list=[loss], scope=two)
        assert parts.shape == (2,)  # one loss per replica, concatenated
        assert np.isclose((4 * parts[0] + 5 * parts[1]) / 9, whole[0], rtol=1e-5)
    a, b = _params(main, one), _params(main, two)
    assert set(a) == set(b) == set(initial)
    assert all(not np.allclose(a[n], initial[n]) for n in a)  # every parameter trained
    a, b = _state(main, one), _state(main, two)  # and the optimizer and metric state
    assert len(a) > len(initial)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)
    if opt == "rmsprop_schedule":
        assert b["@LR_DECAY_COUNTER@"][0] == 3  # four steps from -1
    compiled.close()


def test_allreduce_is_the_same_arithmetic_and_threads_follow_exec_strategy(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "3")
    feed = _batches(1, 7, seed=5)[0]
    main, startup, loss = _program("sgd", True)
    results = []
    for reduce in (fluid.BuildStrategy.ReduceStrategy.Reduce, fluid.BuildStrategy.ReduceStrategy.AllReduce):
        scope = fw.Scope()
        exe = fluid.Executor()
        exe.run(startup, scope=scope)
        build, run = fluid.BuildStrategy(), fluid.ExecutionStrategy()
        build.reduce_strategy = reduce
        run.num_threads = 2
        compiled = fluid.CompiledProgram(main).with_data_parallel(loss.name, build, run)
        assert compiled._threads(compiled.replica_count()) == 2
        exe.run(compiled, feed=feed, scope=scope)
        results.append(_params(main, scope))
        compiled.close()
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name])


def test_parallel_executor_runs_a_step_and_splits_a_list_feed_per_replica(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "2")
    main, startup, loss = _program("sgd", False)
    scope = fw.Scope()
    with fw.scope_guard(scope):
        fluid.Executor().run(startup)
        pe = fluid.ParallelExecutor(use_cuda=False, loss_name=loss.name, main_program=main)
        assert pe.device_count == 2
        feed = _batches(1, 4)[0]
        merged, = pe.run(fetch_list=[loss.name], feed=feed)
        parts = [{"x": feed["x"][:2], "ids": (feed["ids"][0][:feed["ids"][1][:2].sum()], feed["ids"][1][:2]),
                  "y": feed["y"][:2]},
                 {"x": feed["x"][2:], "ids": (feed["ids"][0][feed["ids"][1][:2].sum():], feed["ids"][1][2:]),
                  "y": feed["y"][2:]}]
        per_replica, = pe.run([loss], feed=parts, return_numpy=True)
        assert merged.shape == (2,) and per_replica.shape == (2,)
        with pytest.raises(DataError, match=r"feed is a list of 1 dicts but the program runs on 2 replicas"):
            pe.run([loss], feed=parts[:1])
        pe.drop_local_exe_scopes()


def test_data_parallel_errors_name_the_value_and_the_fix(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "4")
    main, startup, loss = _program("sgd", False)
    scope = fw.Scope()
    exe = fluid.Executor()
    exe.run(startup, scope=scope)
    compiled = fluid.CompiledProgram(main).with_data_parallel(loss_name=loss.name)
    with pytest.raises(DataError, match=r"the fed batch has 3 examples, fewer than the 4 replicas"):
        exe.run(compiled, feed=_batches(1, 3)[0], scope=scope)
    with pytest.raises(ConfigError, match="Already compiled with parallel"):
        compiled.with_data_parallel(loss_name=loss.name)
    with pytest.raises(ConfigError, match="The loss name of CompiledProgram is None"):
        fluid.CompiledProgram(main).with_data_parallel()
    assert fluid.CompiledProgram(main).with_data_parallel(loss.name, places=fluid.cpu_places(3)).replica_count() == 3
    with pytest.raises(ConfigError, match="The shared Program is not data parallel"):
        fluid.CompiledProgram(main).with_data_parallel(loss.name, share_vars_from=fluid.CompiledProgram(main))
    with pytest.raises(ConfigError, match=r"fleet runs on CPUs only; pass \[fluid.CPUPlace\(\)\] \* n"):
        fluid.CompiledProgram(main).with_data_parallel(loss.name, places=["gpu:0"])
    # a GPU script's ParallelExecutor and places run on the CPU
    assert fluid.ParallelExecutor(use_cuda=True, loss_name=loss.name, main_program=main) is not None
    gpu = fluid.CompiledProgram(main).with_data_parallel(loss.name, places=fluid.cuda_places([0, 1]))
    assert gpu.replica_count() == 2
    with pytest.raises(TypeError, match="expected Graph or Program"):
        fluid.CompiledProgram("main")
    compiled.close()


def test_a_worker_programs_plan_combines_every_gradient_its_send_op_reads():
    import fleet.communicator.ops  # noqa: F401  (registers the prefetch and send ops)
    from fleet.framework.runner import Plan
    from fleet.transpiler.plan import build_plan
    from fleet.transpiler.worker_program import transpile_worker
    from strategies import StrategyFactory

    main, startup, _ = _program("sgd", True)
    plan = build_plan(main, StrategyFactory.create_sync_strategy(), ["127.0.0.1:6170"], 1)
    worker, _ = transpile_worker(main, startup, plan)
    grads = {p.grad for p in plan.params.values()}
    assert len(grads) == 5 and set(Plan(worker).grad_names) == grads


def test_train_from_dataset_takes_a_compiled_programs_program(tmp_path):
    import fleet

    main, startup, loss = _program("sgd", True)
    rng = np.random.default_rng(4)
    with open(tmp_path / "part", "w") as f:
        for _ in range(40):
            ids = rng.integers(0, VOCAB, 2)
            f.write(f"3 {' '.join(f'{v:.3f}' for v in rng.normal(size=3))} 2 {ids[0]} {ids[1]} 1 {rng.integers(0, 2)}\n")
    runs = []
    for wrap in (False, True):
        scope = fw.Scope()
        exe = fluid.Executor()
        exe.run(startup, scope=scope)
        ds = fleet.DatasetFactory().create_dataset("QueueDataset")
        block = main.global_block()
        ds.set_use_var([block.vars["x"], block.vars["ids"], block.vars["y"]])
        ds.set_batch_size(10)
        ds.set_thread(1)
        ds.set_filelist([str(tmp_path / "part")])
        program = fluid.CompiledProgram(main).with_data_parallel(loss_name=loss.name) if wrap else main
        summary = exe.train_from_dataset(program, ds, scope=scope, print_period=0)
        assert summary["batches"] == 4
        runs.append(_params(main, scope))
    for name in runs[0]:
        np.testing.assert_array_equal(runs[0][name], runs[1][name])


def test_a_half_async_worker_step_split_across_replicas_equals_local_training(monkeypatch):
    """In process: one server behind fake clients, the worker's transpiled program with its
    communicator as training hooks, run as a CompiledProgram of two replicas."""
    from fake_cluster import FakeClient, endpoints, startup_values
    from fleet.communicator import make_communicator
    from fleet.server.parameter_server import ParameterServer
    from fleet.transpiler.plan import build_plan
    from fleet.transpiler.worker_program import transpile_worker
    from strategies import StrategyFactory

    monkeypatch.setenv("CPU_NUM", "2")
    batches = _batches(3, 8, seed=9)
    main, startup, loss = _program("sgd", True)
    local = fw.Scope()
    exe = fluid.Executor()
    exe.run(startup, scope=local)
    for feed in batches:
        exe.run(main, feed=feed, scope=local)

    strategy = StrategyFactory.create_half_async_strategy()
    plan = build_plan(main, strategy, endpoints(1), 1)
    server = ParameterServer(plan.server_endpoints[0], plan, startup_values(startup))
    worker, worker_startup = transpile_worker(main, startup, plan)
    scope = fw.Scope()
    comm = make_communicator("half_async", plan, 0, scope, {}, connect=lambda ep: FakeClient(server, 0))
    worker.training_hooks = comm
    comm.start()
    comm.pull_dense()
    exe.run(worker_startup, scope=scope)
    compiled = fluid.CompiledProgram(worker).with_data_parallel(loss_name=loss.name)
    for feed in batches:
        losses, = exe.run(compiled, feed=feed, fetch_list=[loss], scope=scope)
        assert losses.shape == (2,)
    table = comm.pull_whole(plan.params["embedding.w_0"])
    comm.stop()
    compiled.close()
    np.testing.assert_allclose(table, local["embedding.w_0"], rtol=1e-5, atol=1e-7)
    for name in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"):
        np.testing.assert_allclose(scope[name], local[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_data_parallel_step_counts_its_examples_as_trained(monkeypatch):
    """fleet's saves refuse parameters nothing trained; a CompiledProgram step trains."""
    monkeypatch.setenv("CPU_NUM", "2")
    main, startup, loss = _program("sgd", False)
    scope = fw.Scope()
    exe = fluid.Executor()
    exe.run(startup, scope=scope)
    compiled = fluid.CompiledProgram(main).with_data_parallel(loss.name)
    assert scope.trained_examples == 0
    exe.run(compiled, feed=_batches(1, 9)[0], scope=scope)
    assert scope.trained_examples == 9
    test = fluid.CompiledProgram(main.clone(for_test=True)).with_data_parallel(loss.name)
    exe.run(test, feed=_batches(1, 5)[0], scope=scope)
    assert scope.trained_examples == 9  # a forward-only program trains nothing
    compiled.close()
    test.close()
