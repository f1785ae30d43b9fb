"""The module-level fleet API in local mode (no servers): roles, split_files, the
checks of distributed_optimizer / minimize (Paddle 1.7's messages), the programs after
minimize, and save_persistables / load_persistables."""
import logging
import os

import numpy as np
import pytest

import fleet
import fleet.base
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError
from role_makers import LocalRoleMaker, PaddleCloudRoleMaker, Role, RoleMakerBase, UserDefinedRoleMaker
from strategies import DistributedStrategyFactory, DistributeTranspilerConfig

pytestmark = pytest.mark.usefixtures("fresh_fleet")


class FakeWorkers(RoleMakerBase):
    """Worker ``index`` of ``count``, for split_files."""

    def __init__(self, index, count):
        super().__init__()
        self.index, self.count = index, count

    def generate_role(self):
        self._role, self._current_id, self._worker_num = Role.WORKER, self.index, self.count
        self._server_endpoints = ["127.0.0.1:1"]
        self._role_is_generated = True


def _model():
    x = layers.data("x", shape=[3])
    ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    y = layers.data("y", shape=[1], dtype="int64")
    emb = layers.sequence_pool(layers.embedding(ids, size=[10, 2], is_sparse=True, param_attr="table"), "sum")
    pred = layers.fc(layers.concat([emb, x], axis=1), 2, act="softmax", param_attr="w", bias_attr="b")
    loss = layers.mean(layers.cross_entropy(pred, y))
    return loss


def _feed(seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(4, 3)).astype(np.float32), "ids": (rng.integers(0, 10, 6), [2, 1, 1, 2]),
            "y": rng.integers(0, 2, (4, 1))}


# ------------------------------------------------------------------------------- roles
@pytest.mark.parametrize("make", [LocalRoleMaker, PaddleCloudRoleMaker], ids=["local", "paddle_cloud_unset"])
def test_a_local_role_is_the_single_first_worker_with_no_servers(make):
    fleet.init(make())
    assert fleet.is_worker() and not fleet.is_server()
    assert fleet.is_first_worker() and fleet.is_local()
    assert fleet.worker_num() == 1 and fleet.worker_index() == 0
    assert fleet.server_num() == 0
    assert fleet.server_endpoints() == [] and fleet.server_endpoints(to_string=True) == ""
    assert fleet.barrier_worker() is None


def test_init_without_a_role_maker_reads_the_environment_and_trains_locally():
    fleet.init()
    assert fleet.is_local() and fleet.is_worker() and fleet.worker_num() == 1


def test_paddle_cloud_role_maker_without_training_role_says_it_runs_locally(monkeypatch, caplog):
    from role_makers import paddle_cloud_role_maker as pcrm

    monkeypatch.setattr(pcrm, "_local_notice_given", False)
    with caplog.at_level(logging.WARNING, logger="fleet"):
        fleet.init(PaddleCloudRoleMaker())
        fleet.init(PaddleCloudRoleMaker())
    notices = [r for r in caplog.records if "TRAINING_ROLE is not set" in r.getMessage()]
    assert len(notices) == 1
    assert "one local worker" in notices[0].getMessage()


def test_init_rejects_what_is_not_a_role_maker():
    with pytest.raises(TypeError, match="^role_maker must be an instance of RoleMakerBase$"):
        fleet.init("local")


# ------------------------------------------------------------------------------- split_files
@pytest.mark.parametrize("files,workers,shares", [
    (list("abcde"), 2, [list("abc"), list("de")]),
    (list("ab"), 3, [["a"], ["b"], []]),
    (list("abcdefg"), 3, [list("abc"), list("de"), list("fg")]),
    ([], 2, [[], []]),
])
def test_split_files_gives_contiguous_blocks_the_first_workers_one_more(files, workers, shares):
    got = []
    for index in range(workers):
        fleet.init(FakeWorkers(index, workers))
        got.append(fleet.split_files(files))
    assert got == shares


def test_split_files_with_user_defined_workers_matches_paddles_docstring_example():
    got = []
    for index in range(2):
        fleet.init(UserDefinedRoleMaker(current_id=index, role=Role.WORKER, worker_num=2,
                                        server_endpoints=["127.0.0.1:6170"]))
        got.append(fleet.split_files(["a", "b", "c", "d", "e"]))
    assert got == [["a", "b", "c"], ["d", "e"]]


def test_split_files_in_local_training_returns_every_file():
    fleet.init(LocalRoleMaker())
    assert fleet.split_files(["x", "y", "z"]) == ["x", "y", "z"]


@pytest.mark.parametrize("files", [("a", "b"), "a,b", None])
def test_split_files_of_a_non_list_is_paddles_type_error(files):
    fleet.init(LocalRoleMaker())
    with pytest.raises(TypeError, match=r"^files should be a list of file need to be read\.$"):
        fleet.split_files(files)


# ------------------------------------------------------------------------------- distributed_optimizer
def test_distributed_optimizer_before_init_is_paddles_value_error():
    with pytest.raises(ValueError, match=r"^use fleet\.init\(role\) to initialize the role of current "
                                         r"node before optimizer\.minimize\(loss\)$"):
        fleet.distributed_optimizer(optimizer.SGD(0.1))


@pytest.mark.parametrize("bad", [None, "sgd", object()])
def test_distributed_optimizer_of_a_non_optimizer_is_paddles_value_error(bad):
    fleet.init(LocalRoleMaker())
    with pytest.raises(ValueError, match="^optimizer must be an instance of Optimizer$"):
        fleet.distributed_optimizer(bad)


@pytest.mark.parametrize("bad", [3, "sync", {"sync_mode": True}])
def test_distributed_optimizer_with_a_bad_strategy_is_paddles_type_error(bad):
    fleet.init(LocalRoleMaker())
    with pytest.raises(TypeError, match=r"mode, strategy must be an instance of DistributeTranspilerConfig, "
                                        r"SyncStrategy, HalfAsyncStrategy, AsyncStrategy, or GeoStrategy"):
        fleet.distributed_optimizer(optimizer.SGD(0.1), bad)


def test_minimize_with_a_list_loss_is_paddles_type_error():
    fleet.init(LocalRoleMaker())
    loss = _model()
    opt = fleet.distributed_optimizer(optimizer.SGD(0.1))
    with pytest.raises(TypeError, match="^DistributedTranspiler's minimize can not accept loss with list$"):
        opt.minimize([loss])
    with pytest.raises(TypeError, match="^DistributedTranspiler's minimize can not accept program with list$"):
        opt.minimize(loss, startup_program=[fleet.default_startup_program()])


@pytest.mark.parametrize("strategy", [
    None,
    DistributedStrategyFactory.create_sync_strategy(),
    DistributedStrategyFactory.create_async_strategy(),
    DistributedStrategyFactory.create_half_async_strategy(),
    DistributedStrategyFactory.create_geo_strategy(400),
    DistributeTranspilerConfig(),
], ids=["default", "sync", "async", "half_async", "geo", "config"])
def test_after_minimize_in_local_mode_fleet_programs_are_the_default_programs(strategy):
    fleet.init(LocalRoleMaker())
    loss = _model()
    ops, params_grads = fleet.distributed_optimizer(optimizer.SGD(0.1), strategy).minimize(loss)
    assert fleet.main_program is fleet.default_main_program()
    assert fleet.startup_program is fleet.default_startup_program()
    assert sorted(p.name for p, _ in params_grads) == ["b", "table", "w"]
    assert [op.type for op in ops] == ["sgd"] * 3
    fleet.init_worker()  # nothing to connect in local training
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    before = np.array(fleet.global_scope()["w"])
    exe.run(fleet.main_program, feed=_feed(), fetch_list=[loss])
    assert not np.array_equal(fleet.global_scope()["w"], before)
    fleet.stop_worker()


def test_minimize_under_program_guard_uses_the_guarded_programs():
    fleet.init(LocalRoleMaker())
    main, startup = fleet.Program(), fleet.Program()
    with fleet.program_guard(main, startup):
        loss = _model()
        fleet.distributed_optimizer(optimizer.Adam(0.01)).minimize(loss)
    assert fleet.main_program is main and fleet.startup_program is startup


def test_server_calls_in_local_training_say_this_process_is_a_worker():
    fleet.init(LocalRoleMaker())
    with pytest.raises(ValueError, match="^startup_program is None, need invoke DistributedOptimizer.minimize first$"):
        fleet.init_server()
    fleet.distributed_optimizer(optimizer.SGD(0.1)).minimize(_model())
    with pytest.raises(ConfigError, match=r"init_server\(\) is for servers; this process is a worker"):
        fleet.init_server()
    with pytest.raises(ConfigError, match=r"run_server\(\) is for servers; this process is a worker"):
        fleet.run_server()


def test_run_server_before_minimize_is_paddles_value_error():
    fleet.init(LocalRoleMaker())
    with pytest.raises(ValueError, match="^main_program is None, need invoke DistributedOptimizer.minimize first$"):
        fleet.run_server()


# ------------------------------------------------------------------------------- save / load
def _trained(steps=3):
    fleet.init(LocalRoleMaker())
    loss = _model()
    fleet.distributed_optimizer(optimizer.Adam(0.05)).minimize(loss)
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    for k in range(steps):
        exe.run(fleet.main_program, feed=_feed(k), fetch_list=[loss])
    return exe, loss


def _persistables():
    scope = fleet.global_scope()
    return {v.name: np.array(scope[v.name]) for v in fleet.main_program.list_vars()
            if v.persistable and not v.is_data}


def test_save_then_load_persistables_restores_every_value_bit_for_bit_in_place(tmp_path):
    exe, loss = _trained()
    saved = _persistables()
    assert {"w", "b", "table", "w_moment1_0", "table_moment2_0", "w_beta1_pow_0"} <= set(saved)
    fleet.save_persistables(exe, str(tmp_path / "epoch_0"))
    live_w = fleet.global_scope()["w"]
    exe.run(fleet.main_program, feed=_feed(9), fetch_list=[loss])  # train on: values move
    assert not np.array_equal(live_w, saved["w"])
    names = fleet.load_persistables(exe, str(tmp_path / "epoch_0"))
    assert sorted(names) == sorted(saved)
    for name, value in saved.items():
        got = fleet.global_scope()[name]
        assert got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)
    assert fleet.global_scope()["w"] is live_w  # loaded into the live array


def test_training_resumed_from_a_save_continues_exactly_as_without_the_save(tmp_path):
    exe, loss = _trained()
    fleet.save_persistables(exe, str(tmp_path / "ckpt"))
    (first,) = exe.run(fleet.main_program, feed=_feed(7), fetch_list=[loss])
    after_first = _persistables()
    fleet.load_persistables(exe, str(tmp_path / "ckpt"))
    (again,) = exe.run(fleet.main_program, feed=_feed(7), fetch_list=[loss])
    np.testing.assert_array_equal(first, again)
    for name, value in _persistables().items():
        np.testing.assert_array_equal(value, after_first[name])


def test_save_persistables_needs_a_fleet_executor():
    _trained(0)
    with pytest.raises(TypeError, match="executor must be as Executor type"):
        fleet.save_persistables("exe", "somewhere")


def test_load_persistables_refuses_a_directory_without_manifest(tmp_path):
    exe, _ = _trained(1)
    (tmp_path / "half").mkdir()
    with pytest.raises(ConfigError, match="has no MANIFEST.json: it is not a complete fleet save"):
        fleet.load_persistables(exe, str(tmp_path / "half"))
    with pytest.raises(ConfigError, match="There is no directory named"):
        fleet.load_persistables(exe, str(tmp_path / "missing"))


def test_load_persistables_refuses_a_truncated_or_corrupted_file(tmp_path):
    exe, _ = _trained(1)
    target = str(tmp_path / "ckpt")
    fleet.save_persistables(exe, target)
    before = _persistables()
    path = os.path.join(target, "w")  # Paddle's layout: the file is named as the variable
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-3])
    with pytest.raises(DataError, match=r"cannot read 'w' from .*/ckpt/w: it has \d+ bytes, the manifest says"):
        fleet.load_persistables(exe, target)
    with open(path, "wb") as f:
        f.write(data[:-1] + bytes([data[-1] ^ 0x40]))
    with pytest.raises(DataError, match=r"does not match its manifest entry for 'w' \(corrupt or altered save\)"):
        fleet.load_persistables(exe, target)
    for name, value in _persistables().items():  # nothing was half-loaded
        np.testing.assert_array_equal(value, before[name])


def test_load_persistables_of_another_model_names_the_missing_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_SAVE_UNTRAINED", "1")  # initial values are enough here
    exe, _ = _trained(0)
    fleet.save_persistables(exe, str(tmp_path / "a"))
    with fleet.program_guard(fleet.Program(), fleet.Program()):
        x = layers.data("x", shape=[3])
        layers.fc(x, 2, param_attr="other_w", bias_attr=False)
        other = fleet.default_main_program()
    with pytest.raises(ConfigError, match=r"lacks \['other_w'\] of this program; it was saved from a different model"):
        fleet.load_persistables(exe, str(tmp_path / "a"), main_program=other)


def test_save_persistables_writes_one_file_per_variable_named_as_the_variable(tmp_path):
    exe, _ = _trained(1)
    target = fleet.save_persistables(exe, str(tmp_path / "ckpt"))
    saved = _persistables()
    assert sorted(os.listdir(target)) == sorted(list(saved) + ["MANIFEST.json"])
    np.testing.assert_array_equal(np.load(os.path.join(target, "w")), saved["w"])


def test_save_persistables_with_filename_writes_one_file_and_loads_back_with_the_same_arguments(tmp_path):
    exe, loss = _trained(1)
    saved = _persistables()
    target = fleet.save_persistables(exe, str(tmp_path / "ckpt"), filename="persistables")
    assert sorted(os.listdir(target)) == ["MANIFEST.json", "persistables"]
    exe.run(fleet.main_program, feed=_feed(9), fetch_list=[loss])  # values move
    names = fleet.load_persistables(exe, target, filename="persistables")
    assert sorted(names) == sorted(saved)
    for name, value in saved.items():
        np.testing.assert_array_equal(fleet.global_scope()[name], value)


def test_load_persistables_with_another_filename_than_the_save_names_the_one_to_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_SAVE_UNTRAINED", "1")  # initial values are enough here
    exe, _ = _trained(0)
    fleet.save_persistables(exe, str(tmp_path / "a"), filename="params")
    fleet.save_persistables(exe, str(tmp_path / "b"))
    with pytest.raises(ConfigError, match=r"holds no file 'other'; it was saved with filename='params': pass that"):
        fleet.load_persistables(exe, str(tmp_path / "a"), filename="other")
    with pytest.raises(ConfigError, match=r"holds no file 'params'; it was saved with one file per variable "
                                          r"\(filename=None\)"):
        fleet.load_persistables(exe, str(tmp_path / "b"), filename="params")
