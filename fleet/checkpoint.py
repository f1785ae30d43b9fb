"""Periodic checkpoints and resuming from the latest one.

A job that checkpoints writes ``checkpoint_dir/ckpt-<global step>`` from its first worker
every N steps and/or S seconds (``CheckpointConfig``), each one a complete
``fleet.save_persistables`` directory written atomically, keeping the newest
``max_num_checkpoints``. After a restart of the whole job::

    cfg = fleet.CheckpointConfig("ckpt", step_interval=1000, max_num_checkpoints=3)
    if fleet.is_server():
        fleet.init_server(fleet.latest_checkpoint("ckpt"))  # None: fresh start
        fleet.run_server()
    else:
        fleet.init_worker()
        exe.run(fleet.startup_program)
        fleet.load_checkpoint(exe, cfg)  # the counters (and worker-local state) of what the servers loaded
        for epoch in range(cfg.epoch, epochs):
            exe.train_from_dataset(fleet.main_program, dataset, checkpoint=cfg)
        fleet.stop_worker()

What resuming restores: every parameter, its optimizer state (including scalar state such
as Adam's beta powers), every distributed table with its optimizer state, the first
worker's own persistables (metric states), and the counters ``global_step`` and
``epoch``. What it does not: the position inside an interrupted epoch (the epoch is read
again from its start; ``epoch_step`` in the manifest says how far it had got), nor the
updates made after the checkpoint.

Checkpoints are full saves (``save_persistables`` mode 0) that commit nothing: the next
delta save (mode 1) of the job still holds every change since its previous committed
save. A job resumed from a checkpoint loads it as a base, and its next delta follows it.
"""
import logging
import os
import re
import shutil
import threading
import time

from fleet.errors import ConfigError, DataError
from fleet.framework import io as fio

log = logging.getLogger("fleet")

PREFIX = "ckpt-"
_NAME = re.compile(r"^ckpt-(\d+)$")
_LEFTOVER = re.compile(r"^\.ckpt-\d+\.(tmp|old)-[0-9a-f]+$")


def _fleet():
    from fleet.base import fleet  # the singleton, looked up at call time (tests replace it)

    return fleet


class CheckpointConfig:
    """Where and how often the first worker checkpoints, and the counters it records.

    Args:
        checkpoint_dir: the directory of ``ckpt-<step>`` subdirectories (created on the
            first save).
        step_interval: checkpoint every this many steps (batches of this worker), or None.
        seconds_interval: checkpoint when this many seconds passed since the last one (or
            since the config was made), checked after each step; or None.
        max_num_checkpoints: how many of the newest valid checkpoints to keep (>= 1).

    Attributes:
        global_step: steps trained (restored by ``fleet.load_checkpoint``).
        epoch: epochs completed (passes of ``train_from_dataset`` with this config, or
            ``after_epoch`` calls).

    Raises:
        ConfigError: a bad value (names it and the fix).

    Thread-safe: ``after_step`` may be called from several training threads; one of them
    saves at a time while the others go on.
    """

    def __init__(self, checkpoint_dir, step_interval=None, seconds_interval=None, max_num_checkpoints=3):
        if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
            raise ConfigError(f"checkpoint_dir={checkpoint_dir!r} must be a directory path")
        if step_interval is not None and (isinstance(step_interval, bool) or not isinstance(step_interval, int)
                                          or step_interval < 1):
            raise ConfigError(f"step_interval={step_interval!r} must be an int >= 1, or None")
        if seconds_interval is not None and (isinstance(seconds_interval, bool)
                                             or not isinstance(seconds_interval, (int, float))
                                             or not seconds_interval > 0):
            raise ConfigError(f"seconds_interval={seconds_interval!r} must be a number > 0, or None")
        if isinstance(max_num_checkpoints, bool) or not isinstance(max_num_checkpoints, int) \
                or max_num_checkpoints < 1:
            raise ConfigError(f"max_num_checkpoints={max_num_checkpoints!r} must be an int >= 1 (the newest "
                              f"valid checkpoint is always kept)")
        self.checkpoint_dir = os.fspath(checkpoint_dir)
        self.step_interval = step_interval
        self.seconds_interval = seconds_interval
        self.max_num_checkpoints = max_num_checkpoints
        self.global_step = 0
        self.epoch = 0
        self._epoch_start = 0
        self._last_step = 0
        self._last_time = time.monotonic()
        self._lock = threading.Lock()
        self._saving = False

    def __repr__(self):
        return (f"CheckpointConfig({self.checkpoint_dir!r}, step_interval={self.step_interval}, "
                f"seconds_interval={self.seconds_interval}, max_num_checkpoints={self.max_num_checkpoints}, "
                f"global_step={self.global_step}, epoch={self.epoch})")

    def _due(self):
        if self.step_interval and self.global_step - self._last_step >= self.step_interval:
            return True
        return bool(self.seconds_interval) and time.monotonic() - self._last_time >= self.seconds_interval

    def after_step(self, executor, steps=1):
        """Counts ``steps`` trained steps; on the first worker, checkpoints when due.

        ``exe.train_from_dataset(..., checkpoint=cfg)`` calls it after every batch; a
        loop of ``exe.run`` calls it after each step. Blocks while it saves.

        Returns:
            The checkpoint written, or None.
        """
        with self._lock:
            self.global_step += int(steps)
            if self._saving or not self._due():
                return None
            self._saving = True
        try:
            return save_checkpoint(executor, self)
        finally:
            with self._lock:
                self._saving = False

    def after_epoch(self, executor=None):
        """Counts one finished epoch (``train_from_dataset`` with this config calls it at
        the end of its pass)."""
        with self._lock:
            self.epoch += 1
            self._epoch_start = self.global_step

    def _restore(self, extra):
        with self._lock:
            self.global_step = int(extra.get("step") or 0)
            self.epoch = int(extra.get("epoch") or 0)
            self._epoch_start = self.global_step - int(extra.get("epoch_step") or 0)
            self._last_step = self.global_step
            self._last_time = time.monotonic()


def list_checkpoints(checkpoint_dir):
    """Returns [(step, path)] of the ``ckpt-<step>`` directories, oldest first, valid or not."""
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(checkpoint_dir, n)) for n in names for m in [_NAME.match(n)] if m]
    return sorted(found)


def is_valid_checkpoint(path):
    """True when ``path`` is a complete save: a manifest, every file there with its size."""
    try:
        fio.check_files(path)
    except (ConfigError, DataError):
        return False
    return True


def latest_checkpoint(checkpoint_dir):
    """Returns the path of the newest valid checkpoint in ``checkpoint_dir``, or None when
    it holds no checkpoint (a fresh start).

    A ``ckpt-<step>`` directory without a manifest or with a missing or truncated file is
    skipped (logged); checksums are verified when the checkpoint is loaded. An
    interrupted save leaves only a hidden temporary, which is not a checkpoint.

    Raises:
        DataError: there are checkpoints but none is valid (resuming from nothing would
            silently lose the training they hold; the message says how to start fresh).
    """
    found = list_checkpoints(checkpoint_dir)
    for _, path in reversed(found):
        if is_valid_checkpoint(path):
            return path
        log.warning("fleet: skipping checkpoint %s: it is incomplete or damaged", path)
    if found:
        raise DataError(
            f"{checkpoint_dir!r} holds checkpoints {[os.path.basename(p) for _, p in found][-5:]} but none "
            f"is complete (a manifest and every file at its recorded size); restore one, or remove them to "
            f"start fresh")
    return None


def save_checkpoint(executor, config):
    """Writes ``checkpoint_dir/ckpt-<global_step>`` now (on the first worker; other
    workers return None), then deletes all but the newest ``max_num_checkpoints`` valid
    checkpoints and any leftovers of interrupted saves. Blocks while saving.

    Returns:
        The checkpoint's path, or None on a worker that is not the first.
    """
    fleet = _fleet()
    if not fleet.is_first_worker():
        return None
    with config._lock:
        step, epoch = config.global_step, config.epoch
        epoch_step = step - config._epoch_start
    path = os.path.join(config.checkpoint_dir, f"{PREFIX}{step}")
    started = time.monotonic()
    fleet._save_persistables(executor, path, None,
                             {"kind": "checkpoint", "step": step, "epoch": epoch, "epoch_step": epoch_step})
    with config._lock:
        config._last_step = step
        config._last_time = time.monotonic()
    _prune(config.checkpoint_dir, config.max_num_checkpoints)
    log.info("fleet: checkpoint %s written in %.2f s", path, time.monotonic() - started)
    return path


def _prune(checkpoint_dir, keep):
    found = list_checkpoints(checkpoint_dir)
    valid = [(step, path) for step, path in found if is_valid_checkpoint(path)]
    if not valid:
        return
    keep_paths = {path for _, path in valid[-keep:]}
    newest = valid[-1][0]
    for step, path in found:
        if path not in keep_paths and (step < newest or (step, path) in valid):
            shutil.rmtree(path, ignore_errors=True)
    for name in os.listdir(checkpoint_dir):
        if _LEFTOVER.match(name):  # an interrupted save's temporary (one writer: none is live)
            shutil.rmtree(os.path.join(checkpoint_dir, name), ignore_errors=True)


def load_checkpoint(executor, config):
    """Restores what a worker needs to resume: the counters of ``config`` and this
    worker's own persistables, from the checkpoint the servers loaded (distributed) or
    from the latest valid checkpoint in ``config.checkpoint_dir`` (local training, which
    also loads every parameter and its optimizer state).

    Returns:
        The checkpoint's path, or None for a fresh start.

    Raises:
        ConfigError: the servers loaded no checkpoint although ``checkpoint_dir`` has
            one, or they loaded different ones.
    """
    fleet = _fleet()
    runtime = fleet._runtime
    if runtime is None:
        path = latest_checkpoint(config.checkpoint_dir)
        if path is None:
            return None
        fleet.load_persistables(executor, path)
        config._restore(fio.read_manifest(path).get("extra", {}))
        return path
    info = runtime.checkpoint_info()
    path = info.get("dirname")
    if path is None:
        latest = latest_checkpoint(config.checkpoint_dir)
        if latest is not None:
            raise ConfigError(
                f"the servers started fresh but {latest} exists; start them with "
                f"fleet.init_server(fleet.latest_checkpoint({config.checkpoint_dir!r})) to resume, or "
                f"use an empty checkpoint_dir for a new run")
        return None
    extra = fio.read_manifest(path).get("extra", {})
    if extra.get("save_id") != info.get("save_id"):
        raise ConfigError(f"{path} was rewritten after the servers loaded it; restart the job")
    fleet.load_persistables(executor, path)
    config._restore(extra)
    return path
