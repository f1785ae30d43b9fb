"""`import fleet.fluid as fluid`: every name of the map resolves; fluid.io, DataFeeder,
fluid.data / fluid.embedding, unique_name, memory_optimize and the DistributeTranspiler's
planning and errors (its processes: tests/integration/test_fluid_transpiler.py)."""
import importlib
import os
import logging
import threading

import numpy as np
import pytest

import fleet.fluid as fluid
import fleet.framework as fw
from fleet.errors import ConfigError, DataError


def _model(seed=2):
    fw.unique_name.reset()
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.layers.data(name="x", shape=[3])
        ids = fluid.layers.data(name="ids", shape=[1], dtype="int64", lod_level=1)
        y = fluid.layers.data(name="y", shape=[1], dtype="int64")
        emb = fluid.layers.sequence_pool(fluid.layers.embedding(ids, size=[20, 4], is_sparse=True), "sum")
        pred = fluid.layers.fc(fluid.layers.concat([emb, x], axis=1), 2, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(pred, y))
        fluid.optimizer.Adam(0.01).minimize(loss)
    startup.random_seed = seed
    return main, startup, pred, loss


FEED = {"x": np.arange(12, dtype="float32").reshape(4, 3) / 10, "ids": [[1, 2], [3], [4, 5, 6], [7]],
        "y": np.array([[0], [1], [1], [0]])}


def test_every_mapped_name_resolves_and_submodules_import_both_ways():
    for name in fluid.__all__:
        if name == "regularizer":  # fleet.regularizer comes with the optimizer helpers
            continue
        assert getattr(fluid, name) is not None, name
    layers = importlib.import_module("fleet.fluid.layers")
    from fleet.fluid import layers as same
    import fleet.layers
    assert layers is same is fleet.layers
    for sub in ("optimizer", "initializer", "param_attr", "compiler", "dataset", "backward", "io",
                "unique_name", "transpiler"):
        assert importlib.import_module(f"fleet.fluid.{sub}") is getattr(fluid, sub)


def test_unknown_names_point_at_the_porting_table():
    with pytest.raises(AttributeError, match=r"fluid.dygraph .*docs/porting.md"):
        fluid.dygraph
    with pytest.raises(AttributeError, match=r"`import role_makers as role_maker`.*Import map"):
        fluid.incubate
    assert fluid.is_compiled_with_cuda() is False
    assert len(fluid.cpu_places(3)) == 3


def test_io_saves_and_loads_params_vars_and_persistables(tmp_path):
    main, startup, _, loss = _model()
    exe = fluid.Executor(fluid.CPUPlace())
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup)
        exe.run(main, feed=FEED, fetch_list=[loss])
        scope = fluid.global_scope()
        params = {p.name: np.array(scope[p.name]) for p in main.global_block().all_parameters()}
        moments = [v.name for v in main.list_vars() if v.persistable and "moment1" in v.name]
        fluid.io.save_params(exe, str(tmp_path / "params"), main)
        fluid.io.save_persistables(exe, str(tmp_path / "all"), main, filename="all.bin")
        fluid.io.save_persistables(exe, str(tmp_path / "files"), main)  # one file per variable
        assert set(params) | set(moments) <= set(os.listdir(tmp_path / "files"))
        fluid.io.save_vars(exe, str(tmp_path / "some"), main, vars=[moments[0]])
        saved_moment = np.array(scope[moments[0]])
        exe.run(main, feed=FEED, fetch_list=[loss])  # move everything on
        assert sorted(fluid.io.load_params(exe, str(tmp_path / "params"), main)) == sorted(params)
        for name, value in params.items():
            np.testing.assert_array_equal(scope[name], value)
        assert fluid.io.load_vars(exe, str(tmp_path / "some"), main, predicate=lambda v: v.name == moments[0]) \
            == [moments[0]]
        np.testing.assert_array_equal(scope[moments[0]], saved_moment)
        assert moments[0] in fluid.io.load_persistables(exe, str(tmp_path / "all"), main, filename="all.bin")
        assert moments[0] in fluid.io.load_persistables(exe, str(tmp_path / "files"), main)
        with pytest.raises(ConfigError, match=r"lacks \['fc_0.w_0'"):
            fluid.io.load_vars(exe, str(tmp_path / "some"), main, vars=["fc_0.w_0"])
        with pytest.raises(ConfigError, match="it was saved with filename='all.bin'"):
            fluid.io.load_persistables(exe, str(tmp_path / "all"), main, filename="other.bin")


def test_io_inference_model_takes_paddles_argument_order(tmp_path):
    main, startup, pred, _ = _model()
    exe = fluid.Executor()
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup)
        expected, = exe.run(main.clone(for_test=True), feed=FEED, fetch_list=[pred])
        assert fluid.io.save_inference_model(str(tmp_path / "m"), ["x", "ids"], [pred], exe, main) == [pred.name]
    with fluid.scope_guard(fluid.Scope()):
        program, feeds, fetches = fluid.io.load_inference_model(str(tmp_path / "m"), exe)
        got, = exe.run(program, feed={k: FEED[k] for k in feeds}, fetch_list=fetches)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    with pytest.raises(ConfigError, match="predicts without servers"):
        fluid.io.load_inference_model(str(tmp_path / "m"), exe, pserver_endpoints=["127.0.0.1:1"])


def test_fluid_data_keeps_its_shape_and_fluid_embedding_keeps_the_trailing_1():
    fw.unique_name.reset()
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = fluid.data(name="x", shape=[None, 5])
        ids = fluid.data(name="ids", shape=[None, 1], dtype="int64")
        seq = fluid.data(name="seq", shape=[None, 3], dtype="int64")
        v2 = fluid.embedding(ids, size=[10, 4])
        v1 = fluid.layers.embedding(ids, size=[10, 4])
        multi = fluid.embedding(seq, size=[10, 2])
    assert x.shape == (-1, 5) and v2.shape == (-1, 1, 4) and v1.shape == (-1, 4) and multi.shape == (-1, 3, 2)
    exe = fluid.Executor()
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    a, b, c = exe.run(main, feed={"ids": np.array([[1], [2]]), "seq": np.array([[1, 2, 3], [4, 5, 6]])},
                      fetch_list=[v2, v1, multi], scope=scope)
    assert a.shape == (2, 1, 4) and b.shape == (2, 4) and c.shape == (2, 3, 2)


def test_data_feeder_and_create_lod_tensor():
    main, _, _, _ = _model()
    feeder = fluid.DataFeeder(feed_list=["x", "ids", "y"], place=fluid.CPUPlace(), program=main)
    feed = feeder.feed([([0.1, 0.2, 0.3], [1, 2], [0]), ([0.4, 0.5, 0.6], [3], [1])])
    assert feed["x"].shape == (2, 3) and feed["y"].tolist() == [[0], [1]]
    assert [s.tolist() for s in feed["ids"]] == [[1, 2], [3]]
    with pytest.raises(DataError, match=r"sample 0 has 2 values but the feed list has 3 inputs"):
        feeder.feed([([0.1, 0.2, 0.3], [1])])
    t = fluid.create_lod_tensor(np.array([[1], [2], [3]], dtype="int64"), [[2, 1]], fluid.CPUPlace())
    assert t.values.tolist() == [1, 2, 3] and t.lengths.tolist() == [2, 1]
    with pytest.raises(DataError, match="sum to 4 but data has 3 rows"):
        fluid.create_lod_tensor(np.zeros((3, 1)), [[2, 2]])


def test_unique_name_guard_gives_fresh_prefixed_counters():
    fw.unique_name.reset()
    assert fluid.unique_name.generate("fc") == "fc_0"
    with fluid.unique_name.guard():
        assert fluid.unique_name.generate("fc") == "fc_0"
    with fluid.unique_name.guard("tower_"):
        assert fluid.unique_name.generate("fc") == "tower_fc_0"
    assert fluid.unique_name.generate("fc") == "fc_1"


def test_memory_optimize_and_release_memory_accept_a_program_and_change_nothing(caplog):
    main, _, _, _ = _model()
    before = [op.type for op in main.global_block().ops]
    with caplog.at_level(logging.INFO, logger="fleet"):
        assert fluid.memory_optimize(main, skip_grads=True) is None
        fluid.release_memory(main)
    assert [op.type for op in main.global_block().ops] == before
    with pytest.raises(TypeError, match="input_program must be a fluid.Program"):
        fluid.memory_optimize("main")


def test_executor_close_calls_what_a_program_registered_once():
    main, startup, _, loss = _model()
    calls = []
    main._on_executor_close = [lambda: calls.append("closed")]
    exe = fluid.Executor()
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup)
        exe.run(main, feed=FEED, fetch_list=[loss])
        exe.run(main, feed=FEED, fetch_list=[loss])
    exe.close()
    assert calls == ["closed"]
    with pytest.raises(ConfigError, match="this Executor was closed"):
        exe.run(main, feed=FEED)


@pytest.mark.parametrize("settings, sync_mode, mode", [
    ({}, True, "sync"),
    ({}, False, "half_async"),
    ({"sync_mode": False}, True, "half_async"),
    ({"sync_mode": False, "runtime_split_send_recv": True}, True, "async"),
    ({"sync_mode": False, "runtime_split_send_recv": True, "geo_sgd_mode": True}, False, "geo"),
])
def test_transpile_chooses_the_mode_and_leaves_the_config_alone(settings, sync_mode, mode):
    main, startup, _, _ = _model()
    config = fluid.DistributeTranspilerConfig()
    for key, value in settings.items():
        setattr(config, key, value)
    t = fluid.DistributeTranspiler(config=config)
    t.transpile(1, program=main, pservers="127.0.0.1:6170,127.0.0.1:6171", trainers=2, sync_mode=sync_mode,
                startup_program=startup)
    assert t.mode == mode
    assert {k: getattr(config, k) for k in settings} == settings and config.half_async is False


def test_transpiler_errors_name_the_value_and_the_fix():
    main, startup, _, _ = _model()
    t = fluid.DistributeTranspiler()
    with pytest.raises(ConfigError, match=r"get_trainer_program needs transpile\(trainer_id"):
        t.get_trainer_program()
    with pytest.raises(ConfigError, match=r"trainer_id=2 must be an int in \[0, 2\)"):
        t.transpile(2, program=main, pservers="127.0.0.1:6170", trainers=2, startup_program=startup)
    with pytest.raises(ConfigError, match="NCCL2 mode, which fleet does not run"):
        t.transpile(0, program=main, pservers="127.0.0.1:6170", trainers="127.0.0.1:1,127.0.0.1:2")
    with pytest.raises(ConfigError, match=r"pservers='127.0.0.1': .* must have exactly one ':' between host and port"):
        t.transpile(0, program=main, pservers="127.0.0.1", trainers=1)
    with pytest.raises(ConfigError, match=r"pservers='' must be a comma list of ip:port"):
        t.transpile(0, program=main, pservers="", trainers=1)
    with pytest.raises(ConfigError, match="no optimizer ops"):
        t.transpile(0, program=fluid.Program(), pservers="127.0.0.1:6170", trainers=1)
    t.transpile(0, program=main, pservers="127.0.0.1:6170", trainers=1, startup_program=startup)
    with pytest.raises(ConfigError, match=r"endpoint '127.0.0.1:9' is not one of the pservers"):
        t.get_pserver_program("127.0.0.1:9")
    program = t.get_pserver_program("127.0.0.1:6170")
    with pytest.raises(ConfigError, match="pserver_program is not the program of"):
        t.get_startup_program("127.0.0.1:6170", fluid.Program())
    assert t.get_pserver_programs("127.0.0.1:6170")[0] is program
    with pytest.raises(TypeError, match="config must be a fluid.DistributeTranspilerConfig"):
        fluid.DistributeTranspiler(config={"sync_mode": False})


def test_data_loader_feeds_batches_to_a_program_and_per_place_to_a_compiled_one(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "2")
    main, startup, _, loss = _model()
    x, ids, y = (main.global_block().vars[n] for n in ("x", "ids", "y"))
    samples = [([0.1 * i, 0.2, 0.3], [i % 7, 3], [i % 2]) for i in range(10)]
    loader = fluid.io.DataLoader.from_generator(feed_list=[x, ids, y], capacity=4)
    loader.set_sample_generator(lambda: iter(samples), batch_size=4, drop_last=True, places=fluid.CPUPlace())
    batches = list(loader())
    assert [len(b) for b in batches] == [1, 1] and batches[0][0]["x"].shape == (4, 3)
    exe = fluid.Executor()
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup)
        for data in loader():
            exe.run(main, feed=data, fetch_list=[loss])
        pairs = fluid.io.DataLoader.from_generator(feed_list=[x, ids, y], capacity=4)
        pairs.set_sample_list_generator(lambda: (samples[i:i + 2] for i in range(0, 10, 2)),
                                        places=fluid.cpu_places())
        compiled = fluid.CompiledProgram(main).with_data_parallel(loss_name=loss.name)
        groups = [exe.run(compiled, feed=data, fetch_list=[loss])[0] for data in pairs()]
        assert len(groups) == 2 and all(g.shape == (2,) for g in groups)  # 5 batches: the odd one dropped
        with pytest.raises(DataError, match=r"feed is a list of 2 dicts \(one per place\) but the program is not"):
            exe.run(main, feed=next(iter(pairs)))
        compiled.close()
    with pytest.raises(ConfigError, match="The capacity must be greater than 0"):
        fluid.io.DataLoader.from_generator(feed_list=[x], capacity=0)
    batch_loader = fluid.io.DataLoader.from_generator(feed_list=[x, y])
    batch_loader.set_batch_generator(lambda: iter([(np.zeros((2, 3)),)]))
    with pytest.raises(DataError, match=r"batch 0 of the batch generator has 1 values but feed_list has 2"):
        list(batch_loader())


def test_non_iterable_loaders_feed_runs_without_a_feed_until_eof_exception():
    """Paddle's start / reset loop, with DataLoader.from_generator(iterable=False) and
    fluid.io.PyReader: the same losses as feeding the batches, EOFException at the end,
    reset() and start() read the data again."""
    main, startup, _, loss = _model()
    x, ids, y = (main.global_block().vars[n] for n in ("x", "ids", "y"))
    samples = [([0.1 * i, 0.2, 0.3], [i % 7, 3], [i % 2]) for i in range(12)]
    exe = fluid.Executor()

    def losses(make):
        with fluid.scope_guard(fluid.Scope()):
            exe.run(startup)
            return make()

    fed_loader = fluid.io.DataLoader.from_generator(feed_list=[x, ids, y])
    fed_loader.set_sample_generator(lambda: iter(samples), batch_size=4)
    fed = losses(lambda: [float(exe.run(main, feed=d, fetch_list=[loss])[0][0]) for d in fed_loader()])
    for loader in (fluid.io.DataLoader.from_generator(feed_list=[x, ids, y], capacity=4, iterable=False),
                   fluid.io.PyReader(feed_list=[x, ids, y], capacity=4, iterable=False)):
        if isinstance(loader, fluid.io.PyReader):
            loader.decorate_sample_list_generator(lambda: (samples[i:i + 4] for i in range(0, 12, 4)))
        else:
            loader.set_sample_generator(lambda: iter(samples), batch_size=4)

        def loop():
            got = []
            for _ in range(2):  # two epochs: reset() then start() reads it again
                loader.start()
                try:
                    while True:
                        got.append(float(exe.run(main, fetch_list=[loss])[0][0]))
                except fluid.core.EOFException:
                    loader.reset()
            return got

        got = losses(loop)
        assert len(got) == 6 and got[:3] == fed  # the first epoch's losses are the fed loop's
        with pytest.raises(ConfigError, match="iterable=False: call start\\(\\), run the program without a feed"):
            loader()
    with pytest.raises(ConfigError, match="start\\(\\) is for a loader made with iterable=False"):
        fed_loader.start()
    twice = fluid.io.PyReader(feed_list=[x, ids, y], iterable=False)
    twice.decorate_sample_generator(lambda: iter(samples), batch_size=4)
    twice.start()
    with pytest.raises(ConfigError, match="this loader was started already; call reset\\(\\)"):
        twice.start()
    twice.reset()
    with fluid.scope_guard(fluid.Scope()):
        exe.run(startup)
        with pytest.raises(ConfigError, match="was not fed; pass it in feed=") as missing:  # not started
            exe.run(main, fetch_list=[loss])
        assert not isinstance(missing.value, fluid.core.EOFException)
    with pytest.raises(AttributeError, match="fleet.fluid.core has no attribute 'Scope': fleet has no C\\+\\+ core"):
        fluid.core.Scope


def test_fluid_one_hot_appends_depth_and_keeps_sequences():
    fw.unique_name.reset()
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        ids = fluid.data(name="ids", shape=[None, 1], dtype="int64")
        seq = fluid.data(name="seq", shape=[None], dtype="int64", lod_level=1)
        dense = fluid.one_hot(ids, depth=4)
        rows = fluid.one_hot(seq, depth=3, allow_out_of_range=True)
        pooled = fluid.layers.sequence_pool(rows, "sum")
    assert dense.shape == (-1, 1, 4) and rows.lod_level == 1
    exe = fluid.Executor()
    a, b = exe.run(main, feed={"ids": np.array([[2], [0]]), "seq": [[0, 2, 2], [7]]}, fetch_list=[dense, pooled],
                   scope=fluid.Scope())
    np.testing.assert_array_equal(a, [[[0, 0, 1, 0]], [[1, 0, 0, 0]]])
    np.testing.assert_array_equal(b, [[1, 0, 2], [0, 0, 0]])  # id 7 is out of range: a zero row
    with pytest.raises(DataError, match=r"id 4 is outside \[0, 4\); pass allow_out_of_range=True"):
        exe.run(main, feed={"ids": np.array([[4]]), "seq": [[1]]}, fetch_list=[dense], scope=fluid.Scope())


def test_save_params_on_a_worker_names_a_table_the_servers_hold(tmp_path):
    import fleet.communicator.ops  # noqa: F401  (the worker program's ops)
    from fleet.transpiler.plan import build_plan
    from fleet.transpiler.worker_program import transpile_worker
    from strategies import StrategyFactory

    main, startup, _, _ = _model()
    plan = build_plan(main, StrategyFactory.create_async_strategy(), ["127.0.0.1:6170"], 1)
    worker, worker_startup = transpile_worker(main, startup, plan)

    class Runtime:  # what fluid.io asks of a worker's runtime here
        def server_held(self):
            return set(plan.params)

    worker._fleet_runtime = Runtime()
    exe = fluid.Executor()
    with fluid.scope_guard(fluid.Scope()):
        exe.run(worker_startup)
        for p in plan.params.values():  # the dense parameters a worker pulled
            if p.kind == "dense":
                fluid.global_scope()[p.name] = np.zeros(p.shape, "float32")
        with pytest.raises(ConfigError, match=r"cannot save 'embedding.w_0' from this worker: it lives on the "
                                              r"servers; fluid.io.save_persistables"):
            fluid.io.save_params(exe, str(tmp_path / "p"), worker)
        saved = fluid.io.save_vars(exe, str(tmp_path / "v"), worker, vars=["fc_0.w_0"])
    assert os.path.isfile(os.path.join(saved, "fc_0.w_0"))


def test_gpu_places_run_on_the_cpu_with_one_warning_per_process(monkeypatch, caplog):
    from fleet.framework import place
    monkeypatch.setattr(place, "_said", threading.Event())
    with caplog.at_level(logging.WARNING, logger="fleet"):
        gpu = fluid.CUDAPlace(1)
        fluid.CUDAPlace(0)
        fluid.CUDAPinnedPlace()
    assert isinstance(gpu, fluid.CPUPlace) and gpu.device_id == 1 and repr(gpu) == "CUDAPlace(1) on the CPU"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("fluid.CUDAPlace(1): fleet has no GPU kernels; this "
                                                         "process computes on its CPUs")
    monkeypatch.setenv("FLAGS_selected_gpus", "0,3")
    assert [p.device_id for p in fluid.cuda_places()] == [0, 3]
    assert [p.device_id for p in fluid.cuda_places(2)] == [2]
    monkeypatch.delenv("FLAGS_selected_gpus")
    assert [p.device_id for p in fluid.cuda_places()] == [0]
    with pytest.raises(ConfigError, match=r"fluid.CUDAPlace\(-1\): the device id -1 must be an int >= 0"):
        fluid.CUDAPlace(-1)
    with pytest.raises(ConfigError, match=r"the device id '0' must be an int >= 0"):
        fluid.CUDAPlace("0")
    monkeypatch.setenv("FLAGS_selected_gpus", "gpu0")
    with pytest.raises(ConfigError, match="FLAGS_selected_gpus='gpu0' must be comma-separated device ids"):
        fluid.cuda_places()
    exe = fluid.Executor(gpu)  # an Executor on a GPU place runs on the CPU
    assert exe is not None
