"""Periodic checkpoints (fleet.CheckpointConfig) and resuming from the latest valid one,
in local training; the distributed checks of load_checkpoint with a stand-in runtime."""
import os
import shutil

import numpy as np
import pytest

import fleet
import fleet.base
import fleet.checkpoint as ckpt
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError
from fleet.framework import io as fio
from role_makers import LocalRoleMaker, Role, RoleMakerBase

pytestmark = pytest.mark.usefixtures("fresh_fleet")


def _adam():
    return optimizer.Adam(0.05)


def _rmsprop_schedule():  # the step counter and the rate are state a resume restores
    return optimizer.RMSProp(layers.exponential_decay(0.05, 2, 0.5), regularization=fleet.regularizer.L2Decay(0.01))


def _build(role_maker=None, make_opt=_adam):
    fleet.init(role_maker or LocalRoleMaker())
    fleet.default_startup_program().random_seed = 4
    x = layers.data("x", shape=[3])
    ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    y = layers.data("y", shape=[1], dtype="int64")
    emb = layers.sequence_pool(layers.embedding(ids, size=[20, 2], is_sparse=True, param_attr="t"), "sum")
    pred = layers.fc(layers.concat([emb, x], axis=1), 2, act="softmax", param_attr="w", bias_attr="b")
    loss = layers.mean(layers.cross_entropy(pred, y))
    fleet.distributed_optimizer(make_opt()).minimize(loss)
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    return exe, loss


def _feed(step):
    rng = np.random.default_rng(step)
    return {"x": rng.normal(size=(4, 3)).astype(np.float32), "ids": (rng.integers(0, 20, 8), [2, 2, 2, 2]),
            "y": rng.integers(0, 2, (4, 1))}


def _train(exe, loss, cfg, until):
    for step in range(cfg.global_step, until):
        exe.run(fleet.main_program, feed=_feed(step), fetch_list=[loss])
        cfg.after_step(exe)


def _state():
    scope = fleet.global_scope()
    return {v.name: np.array(scope[v.name]) for v in fleet.main_program.list_vars()
            if v.persistable and not v.is_data}


def _steps(checkpoint_dir):
    return [step for step, _ in ckpt.list_checkpoints(str(checkpoint_dir))]


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs, message", [
    ({"checkpoint_dir": ""}, r"checkpoint_dir='' must be a directory path"),
    ({"checkpoint_dir": "c", "step_interval": 0}, r"step_interval=0 must be an int >= 1, or None"),
    ({"checkpoint_dir": "c", "step_interval": 2.5}, r"step_interval=2.5 must be an int >= 1, or None"),
    ({"checkpoint_dir": "c", "seconds_interval": -1}, r"seconds_interval=-1 must be a number > 0, or None"),
    ({"checkpoint_dir": "c", "max_num_checkpoints": 0},
     r"max_num_checkpoints=0 must be an int >= 1 \(the newest valid checkpoint is always kept\)"),
])
def test_bad_checkpoint_settings_are_errors_naming_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        fleet.CheckpointConfig(**kwargs)


# ------------------------------------------------------------------ periodic saves
def test_every_n_steps_a_checkpoint_is_written_and_only_the_newest_k_are_kept(tmp_path):
    exe, loss = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=3, max_num_checkpoints=2)
    written = []
    for step in range(10):
        exe.run(fleet.main_program, feed=_feed(step), fetch_list=[loss])
        path = cfg.after_step(exe)
        if path:
            written.append((step + 1, path))
    assert [s for s, _ in written] == [3, 6, 9]
    assert written[-1][1] == str(tmp_path / "c" / "ckpt-9")
    assert _steps(tmp_path / "c") == [6, 9]
    extra = fio.read_manifest(written[-1][1])["extra"]
    assert extra["kind"] == "checkpoint" and extra["step"] == 9 and extra["epoch"] == 0 and extra["mode"] == "local"
    assert cfg.global_step == 10


def test_a_seconds_interval_saves_when_that_much_time_passed(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(ckpt.time, "monotonic", lambda: clock[0])
    exe, loss = _build()
    exe.run(fleet.main_program, feed=_feed(0))  # a save needs something trained (or loaded)
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), seconds_interval=60)
    assert cfg.after_step(exe) is None
    clock[0] += 59.0
    assert cfg.after_step(exe) is None
    clock[0] += 1.0
    assert cfg.after_step(exe) == str(tmp_path / "c" / "ckpt-3")
    clock[0] += 30.0
    assert cfg.after_step(exe) is None  # the clock restarted at the save


def test_only_the_first_worker_writes_checkpoints(tmp_path):
    class SecondWorker(RoleMakerBase):
        def generate_role(self):
            self._role, self._current_id, self._worker_num = Role.WORKER, 1, 2
            self._server_endpoints = []
            self._role_is_generated = True
            self._is_local = True

    exe, loss = _build(SecondWorker())
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=1)
    assert cfg.after_step(exe) is None and fleet.save_checkpoint(exe, cfg) is None
    assert cfg.global_step == 1 and not (tmp_path / "c").exists()


def test_train_from_dataset_checkpoints_during_the_pass_and_counts_the_epoch(tmp_path):
    exe, loss = _build()
    lines = []
    rng = np.random.default_rng(0)
    for _ in range(40):
        x = rng.normal(size=3)
        lines.append(f"3 {x[0]:.4f} {x[1]:.4f} {x[2]:.4f} 2 {rng.integers(0, 20)} {rng.integers(0, 20)} "
                     f"1 {int(x[0] > 0)}\n")
    (tmp_path / "data").write_text("".join(lines))
    block = fleet.main_program.global_block()
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var([block.var("x"), block.var("ids"), block.var("y")])
    ds.set_batch_size(4)
    ds.set_thread(1)
    ds.set_filelist([str(tmp_path / "data")])
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=4, max_num_checkpoints=10)
    exe.train_from_dataset(fleet.main_program, ds, checkpoint=cfg, print_period=0)
    assert cfg.global_step == 10 and cfg.epoch == 1
    assert _steps(tmp_path / "c") == [4, 8]
    exe.train_from_dataset(fleet.main_program, ds, checkpoint=cfg, print_period=0)
    assert cfg.epoch == 2 and _steps(tmp_path / "c") == [4, 8, 12, 16, 20]
    extra = fio.read_manifest(str(tmp_path / "c" / "ckpt-12"))["extra"]
    assert (extra["step"], extra["epoch"], extra["epoch_step"]) == (12, 1, 2)


# ------------------------------------------------------------------ finding the latest
def test_latest_checkpoint_skips_torn_truncated_and_temporary_directories(tmp_path):
    exe, loss = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=2, max_num_checkpoints=5)
    _train(exe, loss, cfg, 4)
    base = tmp_path / "c"
    assert ckpt.latest_checkpoint(str(base)) == str(base / "ckpt-4")
    (base / "ckpt-6").mkdir()  # a directory with no manifest
    (base / "ckpt-6" / "w.npy").write_bytes(b"x")
    shutil.copytree(base / "ckpt-4", base / "ckpt-8")  # a manifest, but a truncated file
    victim = base / "ckpt-8" / fio.read_manifest(str(base / "ckpt-8"))["vars"]["w"]["file"]
    victim.write_bytes(victim.read_bytes()[:-2])
    shutil.copytree(base / "ckpt-4", base / ".ckpt-10.tmp-0badf00d")  # an interrupted save
    (base / "ckpt-x").mkdir()  # not a checkpoint name
    assert ckpt.latest_checkpoint(str(base)) == str(base / "ckpt-4")
    assert ckpt.latest_checkpoint(str(tmp_path / "nowhere")) is None
    assert ckpt.latest_checkpoint(str(tmp_path)) is None
    (tmp_path / "damaged" / "ckpt-3").mkdir(parents=True)
    with pytest.raises(DataError, match=r"holds checkpoints \['ckpt-3'\] but none is complete .* remove them "
                                        r"to start fresh"):
        ckpt.latest_checkpoint(str(tmp_path / "damaged"))
    # the next save prunes the leftovers older than it and the interrupted temporary
    _train(exe, loss, cfg, 10)
    assert sorted(os.listdir(base)) == ["ckpt-10", "ckpt-2", "ckpt-4", "ckpt-6", "ckpt-8", "ckpt-x"]
    assert ckpt.latest_checkpoint(str(base)) == str(base / "ckpt-10")
    assert all(ckpt.is_valid_checkpoint(str(base / n)) for n in ("ckpt-6", "ckpt-8", "ckpt-10"))


def test_pruning_keeps_the_newest_valid_checkpoint_even_when_newer_ones_are_damaged(tmp_path):
    exe, loss = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=1, max_num_checkpoints=1)
    _train(exe, loss, cfg, 2)
    assert _steps(tmp_path / "c") == [2]
    (tmp_path / "c" / "ckpt-9").mkdir()  # a damaged checkpoint newer than any valid one
    ckpt._prune(str(tmp_path / "c"), 1)
    assert _steps(tmp_path / "c") == [2, 9]


# ------------------------------------------------------------------ resuming
@pytest.mark.parametrize("make_opt", [_adam, _rmsprop_schedule])
def test_resuming_from_the_latest_checkpoint_continues_exactly_as_without_the_restart(tmp_path, make_opt):
    exe, loss = _build(make_opt=make_opt)
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=3)
    _train(exe, loss, cfg, 8)
    uninterrupted = _state()
    # a restart: new process state, resumed from ckpt-6, steps 6 and 7 trained again
    fleet.base.fleet = fleet.base.Fleet()
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        exe, loss = _build(make_opt=make_opt)
        cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=3)
        assert fleet.load_checkpoint(exe, cfg) == str(tmp_path / "c" / "ckpt-6")
        assert (cfg.global_step, cfg.epoch) == (6, 0)
        _train(exe, loss, cfg, 8)
        resumed = _state()
    assert sorted(resumed) == sorted(uninterrupted)
    if make_opt is _rmsprop_schedule:
        assert uninterrupted["@LR_DECAY_COUNTER@"][0] == 7  # steps 0..7
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_a_fresh_start_has_nothing_to_resume(tmp_path):
    exe, _ = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"))
    assert fleet.load_checkpoint(exe, cfg) is None
    assert (cfg.global_step, cfg.epoch) == (0, 0)


class _Runtime:
    """Stands in for a worker's runtime: what the servers say they loaded."""

    def __init__(self, info):
        self.info = info
        self.loaded = []

    def checkpoint_info(self):
        return self.info

    def load_persistables(self, dirname, program):
        self.loaded.append(dirname)
        return []


def test_a_distributed_worker_resumes_from_what_the_servers_loaded(tmp_path):
    exe, loss = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=2)
    _train(exe, loss, cfg, 4)
    save_id = fio.read_manifest(str(tmp_path / "c" / "ckpt-2"))["extra"]["save_id"]
    runtime = fleet.base.fleet._runtime = _Runtime({"dirname": str(tmp_path / "c" / "ckpt-2"),
                                                    "save_id": save_id, "step": 2, "epoch": 0})
    other = fleet.CheckpointConfig(str(tmp_path / "c"))
    assert fleet.load_checkpoint(exe, other) == str(tmp_path / "c" / "ckpt-2")  # not the newer ckpt-4
    assert other.global_step == 2 and runtime.loaded == [str(tmp_path / "c" / "ckpt-2")]
    runtime.info = dict(runtime.info, save_id="another save")
    with pytest.raises(ConfigError, match=r"ckpt-2 was rewritten after the servers loaded it; restart the job"):
        fleet.load_checkpoint(exe, other)
    runtime.info = {"dirname": None, "save_id": None, "step": None, "epoch": None}
    with pytest.raises(ConfigError, match=r"the servers started fresh but .*ckpt-4 exists; start them with "
                                          r"fleet.init_server\(fleet.latest_checkpoint\("):
        fleet.load_checkpoint(exe, other)
    assert fleet.load_checkpoint(exe, fleet.CheckpointConfig(str(tmp_path / "empty"))) is None


# ------------------------------------------------------------------ the place in the epoch
def _dataset(tmp_path, lines=40):
    rows = []
    rng = np.random.default_rng(0)
    for _ in range(lines):
        x = rng.normal(size=3)
        rows.append(f"3 {x[0]:.4f} {x[1]:.4f} {x[2]:.4f} 2 {rng.integers(0, 20)} {rng.integers(0, 20)} "
                    f"1 {int(x[0] > 0)}\n")
    (tmp_path / "data").write_text("".join(rows))
    block = fleet.main_program.global_block()
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var([block.var("x"), block.var("ids"), block.var("y")])
    ds.set_batch_size(4)
    ds.set_thread(1)
    ds.set_filelist([str(tmp_path / "data")])
    return ds


@pytest.mark.parametrize("resume_from", [8, 4])
def test_a_resumed_pass_skips_the_batches_trained_before_the_checkpoint_and_ends_as_without_the_restart(
        tmp_path, resume_from):
    exe, _ = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=4, max_num_checkpoints=5)
    exe.train_from_dataset(fleet.main_program, _dataset(tmp_path), checkpoint=cfg, print_period=0)
    uninterrupted = _state()
    extra = fio.read_manifest(str(tmp_path / "c" / "ckpt-8"))["extra"]
    assert extra["positions"] == {"0": {"epoch": 0, "batches": 8}}
    if resume_from == 4:
        shutil.rmtree(tmp_path / "c" / "ckpt-8")
    fleet.base.fleet = fleet.base.Fleet()
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        exe, _ = _build()
        cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=4, max_num_checkpoints=5)
        fleet.load_checkpoint(exe, cfg)
        assert (cfg.global_step, cfg.epoch, cfg.epoch_step) == (resume_from, 0, resume_from)
        summary = exe.train_from_dataset(fleet.main_program, _dataset(tmp_path), checkpoint=cfg, print_period=0)
        resumed = _state()
        # the pass trained only the batches after the checkpoint, then counted the epoch
        assert (summary["resumed_after_batches"], summary["batches"], summary["examples"]) == (
            resume_from, 10 - resume_from, 40 - 4 * resume_from)
        assert (cfg.global_step, cfg.epoch, cfg.epoch_step) == (10, 1, 0)
        # the next pass (a new epoch) is read whole
        assert exe.train_from_dataset(fleet.main_program, _dataset(tmp_path), checkpoint=cfg,
                                      print_period=0)["batches"] == 10
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_a_checkpoint_taken_at_the_end_of_an_epoch_resumes_with_an_empty_pass_not_an_error(tmp_path):
    exe, _ = _build()
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=10)
    exe.train_from_dataset(fleet.main_program, _dataset(tmp_path), checkpoint=cfg, print_period=0)
    fleet.base.fleet = fleet.base.Fleet()
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        exe, _ = _build()
        cfg = fleet.CheckpointConfig(str(tmp_path / "c"), step_interval=10)
        fleet.load_checkpoint(exe, cfg)
        summary = exe.train_from_dataset(fleet.main_program, _dataset(tmp_path), checkpoint=cfg, print_period=0)
    assert (summary["resumed_after_batches"], summary["examples"], cfg.epoch) == (10, 0, 1)


class _AsyncFleet:
    """A stand-in for the fleet singleton of worker ``index`` of an async job."""

    def __init__(self, index, workers):
        self._runtime = type("R", (), {"plan": type("P", (), {"mode": "async"})()})()
        self.index, self.workers = index, workers

    def worker_index(self):
        return self.index

    def worker_num(self):
        return self.workers


def test_async_workers_record_their_own_place_and_the_checkpoint_holds_every_workers(tmp_path, monkeypatch):
    places = {}
    for index, batches in ((1, 7), (2, 3)):  # workers 1 and 2 each train some batches of epoch 0
        monkeypatch.setattr(ckpt, "_fleet", lambda index=index: _AsyncFleet(index, 3))
        cfg = fleet.CheckpointConfig(str(tmp_path / "c"))
        assert cfg.begin_pass() == 0
        for _ in range(batches):
            cfg.after_step(None)
        places[index] = (tmp_path / "c" / ".positions" / f"worker-{index}").read_text()
    assert places == {1: '{"epoch": 0, "batches": 7, "resumed_from": null}',
                      2: '{"epoch": 0, "batches": 3, "resumed_from": null}'}
    positions = ckpt._positions(_AsyncFleet(0, 3), fleet.CheckpointConfig(str(tmp_path / "c")), 0, 5)
    assert positions == {"0": {"epoch": 0, "batches": 5}, "1": {"epoch": 0, "batches": 7},
                         "2": {"epoch": 0, "batches": 3}}
    # each worker resumes at its own place; a place of another epoch falls back to the checkpointing worker's
    extra = {"step": 5, "epoch": 0, "epoch_step": 5, "positions": positions}
    for index, skip in ((0, 5), (1, 7), (2, 3)):
        cfg = fleet.CheckpointConfig(str(tmp_path / "d"))
        cfg._restore(extra, index)
        monkeypatch.setattr(ckpt, "_fleet", lambda index=index: _AsyncFleet(index, 3))
        assert (cfg.begin_pass(), cfg.begin_pass()) == (skip, 0)
    cfg._restore(dict(extra, positions={"2": {"epoch": 1, "batches": 9}}), 2)
    assert cfg.epoch_step == 5


def test_after_a_resume_a_worker_not_yet_started_keeps_the_place_the_checkpoint_gave_it(tmp_path, monkeypatch):
    # worker 1's file is the first attempt's (150 batches); the job resumed from a checkpoint
    # that put it at 40: until worker 1 writes this attempt's place, the next checkpoint keeps 40
    folder = tmp_path / "c" / ".positions"
    folder.mkdir(parents=True)
    (folder / "worker-1").write_text('{"epoch": 0, "batches": 150, "resumed_from": null}')
    cfg = fleet.CheckpointConfig(str(tmp_path / "c"))
    cfg._restore({"step": 40, "epoch": 0, "epoch_step": 40, "save_id": "abc",
                  "positions": {"0": {"epoch": 0, "batches": 40}, "1": {"epoch": 0, "batches": 38}}}, 0)
    assert ckpt._positions(_AsyncFleet(0, 2), cfg, 0, 45)["1"] == {"epoch": 0, "batches": 38}
    (folder / "worker-1").write_text('{"epoch": 0, "batches": 44, "resumed_from": "abc"}')
    assert ckpt._positions(_AsyncFleet(0, 2), cfg, 0, 45)["1"] == {"epoch": 0, "batches": 44}


def test_a_checkpoint_config_notes_its_directory_for_fleetrun_only_under_max_restarts(tmp_path, monkeypatch):
    monkeypatch.delenv(ckpt.RESTART_STATE_ENV, raising=False)
    fleet.CheckpointConfig(str(tmp_path / "c"))
    assert not (tmp_path / "state").exists()
    monkeypatch.setenv(ckpt.RESTART_STATE_ENV, str(tmp_path / "state"))
    fleet.CheckpointConfig(str(tmp_path / "c"))
    assert fleet.latest_checkpoint(str(tmp_path / "d")) is None
    assert ckpt.noted_checkpoint_dirs(str(tmp_path / "state")) == [str(tmp_path / "c"), str(tmp_path / "d")]
