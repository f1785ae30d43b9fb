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
worker's own persistables (metric states), the counters ``global_step`` and ``epoch``,
and each worker's place in the interrupted epoch: the first ``train_from_dataset(...,
checkpoint=cfg)`` pass after ``load_checkpoint`` skips the batches this worker had
trained in that epoch when the checkpoint was taken, so they are not trained twice.
What it does not restore: the updates made after the checkpoint (their batches are
trained again, at most one checkpoint interval of them).

Where each worker's place comes from (the manifest's ``positions``, {worker index:
{"epoch": e, "batches": b}}):

- sync, hybrid and collective (workers in lock step): the checkpoint is the state after
  the checkpointing worker's step, which is every worker's same step, so every worker
  resumes after as many batches of the epoch as the first worker had trained (exact).
- async, half-async and GEO: each worker records its own place after every batch in
  ``checkpoint_dir/.positions/worker-<i>`` and the first worker copies them into the
  manifest as it saves. A worker's updates still queued in its communicator when its
  place was read are skipped after a resume, and batches it trained while the save
  read the servers are trained twice: both at most the batches a worker trains during
  one save (its send queue plus the save's duration).

The skip counts batches, so it resumes at the same examples when the dataset yields them
in a fixed order: one reader thread (``dataset.set_thread(1)``, or ``--threads 1`` in
the example) or an InMemoryDataset without shuffle. With several reader threads the
files are read in parallel and the same number of batches is skipped, but which ones
depends on the threads' timing. The checkpoint directory must be one directory that
every worker and server reaches (one host, or a shared filesystem).

Under ``fleetrun --max_restarts K`` fleetrun restarts the whole job after a failure and
this idiom resumes it; ``FLEET_RESTART_COUNT`` tells the script which attempt it is.

Checkpoints are full saves (``save_persistables`` mode 0) that commit nothing: the next
delta save (mode 1) of the job still holds every change since its previous committed
save. A job resumed from a checkpoint loads it as a base, and its next delta follows it.
"""
import json
import logging
import os
import re
import shutil
import threading
import time
import zlib

from fleet.elastic import JOINING_ENV
from fleet.errors import ConfigError, DataError
from fleet.framework import io as fio

log = logging.getLogger("fleet")

PREFIX = "ckpt-"
POSITIONS_DIR = ".positions"
# Set by fleetrun --max_restarts: a directory where every CheckpointConfig (and
# latest_checkpoint) notes its checkpoint directory, so that fleetrun can tell at a
# failure whether the script checkpoints at all.
RESTART_STATE_ENV = "FLEET_RESTART_STATE_DIR"
CHECKPOINT_NOTE = "checkpoint_dir."
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
        self._resume_skip = 0          # batches of the current epoch to skip on its next pass
        self._position_file = None     # this worker's place in its data (async modes)
        self._resumed_from = None      # the save_id of the checkpoint this job resumed from
        self._resumed_positions = {}   # that checkpoint's positions
        note_checkpoint_dir(self.checkpoint_dir)

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
            if self._position_file is not None:
                self._write_position()
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
            self._resume_skip = 0
            if self._position_file is not None:
                self._write_position()

    @property
    def epoch_step(self):
        """Batches this worker trained in the current epoch (after a resume: counting
        the ones it trained before the checkpoint)."""
        with self._lock:
            return self.global_step - self._epoch_start

    def begin_pass(self):
        """Called by ``train_from_dataset`` before a pass: returns how many batches the
        pass must skip (the ones this worker trained in this epoch before the checkpoint
        it resumed from; 0 but once after ``fleet.load_checkpoint``), and starts recording
        this worker's place when the job's workers are not in lock step."""
        fleet = _fleet()
        if self._position_file is None and not _lockstep(fleet):
            self._position_file = os.path.join(self.checkpoint_dir, POSITIONS_DIR,
                                               f"worker-{fleet.worker_index()}")
            os.makedirs(os.path.dirname(self._position_file), exist_ok=True)
        with self._lock:
            skip, self._resume_skip = self._resume_skip, 0
            if self._position_file is not None:
                self._write_position()  # this attempt's place, before its first batch
            return skip

    def _write_position(self):
        # Under self._lock. One small file replaced atomically: a reader sees the old
        # place or the new one.
        tmp = f"{self._position_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps({"epoch": self.epoch, "batches": self.global_step - self._epoch_start,
                                "resumed_from": self._resumed_from}))
        os.replace(tmp, self._position_file)

    def _restore(self, extra, worker_index=0):
        with self._lock:
            self.global_step = int(extra.get("step") or 0)
            self.epoch = int(extra.get("epoch") or 0)
            epoch_step = int(extra.get("epoch_step") or 0)
            place = (extra.get("positions") or {}).get(str(worker_index))
            if place is not None and int(place.get("epoch", -1)) == self.epoch:
                epoch_step = int(place.get("batches") or 0)
            self._epoch_start = self.global_step - epoch_step
            self._resume_skip = epoch_step
            self._resumed_from = extra.get("save_id")
            self._resumed_positions = dict(extra.get("positions") or {})
            self._last_step = self.global_step
            self._last_time = time.monotonic()


def note_checkpoint_dir(checkpoint_dir):
    """Under ``fleetrun --max_restarts``: notes that this process uses checkpoints in
    ``checkpoint_dir`` (a file in FLEET_RESTART_STATE_DIR), so fleetrun can tell a job
    that checkpoints from one that does not. Does nothing otherwise."""
    state = os.environ.get(RESTART_STATE_ENV, "").strip()
    if not state:
        return
    try:
        os.makedirs(state, exist_ok=True)
        path = os.path.abspath(checkpoint_dir)
        name = f"{CHECKPOINT_NOTE}{os.getpid()}.{zlib.crc32(path.encode()):08x}"
        with open(os.path.join(state, name), "w") as f:
            f.write(path)
    except OSError as e:
        log.warning("fleet: could not note the checkpoint directory for fleetrun in %s (%s)", state, e)


def noted_checkpoint_dirs(state_dir):
    """The checkpoint directories the processes of a job noted (``note_checkpoint_dir``),
    sorted; empty when none made a CheckpointConfig."""
    found = set()
    try:
        names = os.listdir(state_dir)
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith(CHECKPOINT_NOTE):
            try:
                with open(os.path.join(state_dir, name)) as f:
                    found.add(f.read().strip())
            except OSError:
                continue
    return sorted(d for d in found if d)


def _lockstep(fleet):
    """True when every worker trains the same steps at once (or there is one worker)."""
    runtime = fleet._runtime
    if runtime is None:
        return True
    plan = getattr(runtime, "plan", None)
    mode = getattr(plan, "mode", None) or getattr(runtime, "save_mode", None)
    return mode in ("sync", "hybrid", "collective") or fleet.worker_num() == 1


def _positions(fleet, config, epoch, epoch_step):
    """{worker index: {"epoch", "batches"}} of every worker, for the manifest."""
    workers = 1 if fleet._runtime is None else fleet.worker_num()
    mine = {"epoch": epoch, "batches": epoch_step}
    if _lockstep(fleet):
        return {str(i): dict(mine) for i in range(workers)}
    positions = {str(fleet.worker_index()): mine}
    folder = os.path.join(config.checkpoint_dir, POSITIONS_DIR)
    for i in range(workers):
        if str(i) in positions:
            continue
        try:
            with open(os.path.join(folder, f"worker-{i}")) as f:
                place = json.load(f)
        except (OSError, ValueError):
            place = None
        if place is None or place.get("resumed_from") != config._resumed_from:
            # Not started yet in this attempt (its file, if any, is an earlier attempt's): it
            # will resume where the checkpoint this attempt started from put it.
            place = config._resumed_positions.get(str(i)) or {"epoch": epoch, "batches": 0}
        positions[str(i)] = {"epoch": int(place.get("epoch", epoch)), "batches": int(place.get("batches") or 0)}
    return positions


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
    note_checkpoint_dir(checkpoint_dir)
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
    positions = _positions(fleet, config, epoch, epoch_step)
    extra = {"kind": "checkpoint", "step": step, "epoch": epoch, "epoch_step": epoch_step, "positions": positions}
    # Elastic: the work units acknowledged so far, asked before the save reads the servers,
    # so their updates are in it; a restarted job does not train them again.
    work_units = getattr(fleet._runtime, "work_units_progress", None)
    work_units = work_units() if work_units is not None else None
    if work_units is not None:
        extra["work_units"] = work_units
    fleet._save_persistables(executor, path, None, extra)
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
        The checkpoint's path, or None for a fresh start (also for a worker fleetrun
        admitted into a running elastic job, FLEET_ELASTIC_JOINING=1, whose servers
        started fresh: it trains on their current parameters).

    Raises:
        ConfigError: the servers loaded no checkpoint although ``checkpoint_dir`` has
            one (and this is no joining elastic worker), or they loaded different ones.
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
        if latest is not None and os.environ.get(JOINING_ENV) == "1":
            # A worker admitted into a running elastic job: the checkpoints are this run's own
            # (written since the servers started fresh); it trains on their current parameters.
            log.info("fleet: joining a running elastic job (%s=1): starting from the servers' current "
                     "parameters, not from %s", JOINING_ENV, latest)
            return None
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
    config._restore(extra, fleet.worker_index())
    return path
