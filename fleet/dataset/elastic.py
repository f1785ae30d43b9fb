"""Passes of elastic jobs: a QueueDataset's pass reads work units from server 0's queue.

In an elastic job (``fleet.elastic``) ``train_from_dataset`` over a QueueDataset does not
read the files set by ``set_filelist`` whole: every worker gives the same list (what
``fleet.split_files`` returns there), the first worker to open a pass has server 0 cut it
into work units (byte ranges of ``FLEET_ELASTIC_UNIT_BYTES``, default 4 MiB, see
``fleet.server.work_queue``), and each worker's reader threads take units one at a time,
parse them and hand their batches to the training threads. Batches never span units.

A unit is acknowledged to server 0 once every one of its batches ran and the updates of
those steps were applied by the servers (``Communicator.pushes_sent``: async pushes sent
and answered, half-async at once, GEO after the next exchange; a worker left with trained
units whose updates wait in its communicator flushes it while no batch is in flight). A
worker holds at most ``2 x threads`` unacknowledged units, so a lost worker's double
training is bounded by that many units. A pass ends once every unit of the pass is
acknowledged by some worker; a worker with nothing left to take waits meanwhile (polling
every 0.1 s), because a lost worker's units come back after FLEET_HEARTBEAT_TIMEOUT_MS.

Training threads run without the async prefetch-ahead (a thread holding a batch it has not
run while it waits for the next one could hold up the last unit of a pass).

Thread-safety: ``get`` and ``batch_done`` are called from every training thread.
"""
import itertools
import logging
import os
import queue
import threading
import time

import numpy as np

from fleet.dataset.block import ExampleBlock
from fleet.dataset.parsers import BadLines
from fleet.elastic import elastic_range, unit_bytes
from fleet.errors import ConfigError, FleetTimeoutError
from fleet.logs import WaitLog

log = logging.getLogger("fleet.dataset")

POLL_S = 0.1  # between asks while the queue has nothing to hand out
_DONE = object()
_passes = itertools.count()  # this process's elastic passes: their ids in the work queue


def open_elastic_pass(dataset, consumers, comm):
    """The source of an elastic training pass over ``dataset``, or None when this process
    is not a started worker of an elastic job (then the dataset reads its files itself).

    Args:
        comm: the program's training hooks: a running parameter-server Communicator in a
            worker (anything else means no elastic pass).

    Raises:
        ConfigError: the dataset has a pipe command (units are byte ranges of the files).
    """
    if elastic_range() is None:
        return None
    if not getattr(comm, "running", False) or not hasattr(comm, "coordinator_request"):
        return None
    config = dataset._pass_config()
    if config.pipe_command is not None:
        raise ConfigError(
            f"an elastic job reads its data as byte ranges of the files (work units), which a pipe command "
            f"({config.pipe_command!r}) cannot take: preprocess the files instead, or train with a fixed "
            f"--worker_num")
    capacity = dataset._queue_num or max(4, 2 * max(config.threads, int(consumers)))
    return ElasticSource(config, comm, next(_passes), capacity)


class _Unit:
    __slots__ = ("index", "path", "start", "end", "batches", "done", "read", "examples", "mark", "acked")

    def __init__(self, index, path, start, end):
        self.index, self.path, self.start, self.end = index, path, start, end
        self.batches = 0  # handed to the queue
        self.done = 0  # run by a training thread
        self.read = False  # every batch is in the queue
        self.examples = 0
        self.mark = None  # the communicator's pushes_mark once trained
        self.acked = False

    def trained(self):
        return self.read and self.done == self.batches


def read_unit(path, start, end):
    """The bytes of the lines whose first byte lies in [start, end) of ``path``."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line that began before start belongs to the unit before
        pos = f.tell()
        if pos >= end:
            return b""
        data = f.read(end - pos)
        if data and not data.endswith(b"\n"):
            data += f.readline()
        return data


class ElasticSource:
    """One elastic pass (the executor's source contract: ``get``, ``close``, ``report``,
    plus ``batch_done`` and ``prefetch_ahead = False``).

    Args:
        config: the dataset's PassConfig. comm: the worker's Communicator.
        pass_id: this pass's id in the work queue. capacity: batches the queue holds.
    """

    prefetch_ahead = False

    def __init__(self, config, comm, pass_id, capacity):
        self._config = config
        self._comm = comm
        self.pass_id = pass_id
        files = [[path, os.path.getsize(path)] for path in config.files]
        status = comm.coordinator_request("units_open", {"pass": pass_id, "files": files,
                                                         "unit_bytes": unit_bytes()}).meta
        self.total_units = status["units"]
        # Units acknowledged before the checkpoint a restarted job resumed from (not handed out).
        self.restored = dict(status.get("restored") or {"units": 0, "examples": 0})
        comm.elastic_pass = pass_id  # barriers and metric reductions are grouped by pass
        self._queue = queue.Queue(capacity)
        self._lock = threading.Condition()
        self._units = {}  # unit index -> _Unit (held: taken, not acknowledged)
        self._by_batch = {}  # id(feed) -> _Unit
        self._max_held = 2 * max(1, config.threads)
        self._stop = threading.Event()
        self._flushing = False
        self._asking = 0  # readers asking the queue for a unit now
        self.error = None
        self.counts = {"units": 0, "acked": 0, "stale": 0, "lines": 0, "examples": 0, "batches": 0}
        self.bad = BadLines()
        self._running = max(1, config.threads)
        self._threads = [threading.Thread(target=self._run, name=f"fleet-elastic-reader-{i}", daemon=True)
                         for i in range(self._running)]
        for t in self._threads:
            t.start()
        if status.get("done"):
            log.info("elastic pass %d: every unit was trained by the other workers before this worker opened it",
                     pass_id)

    # ------------------------------------------------------------------ readers
    def _run(self):
        parser = self._config.make_parser()
        try:
            while not self._stop.is_set():
                unit = self._take()
                if unit is None:
                    break
                self._read(unit, parser)
        except BaseException as e:  # noqa: BLE001 - handed to the training threads
            if self.error is None and not self._stop.is_set():
                self.error = e
            self._stop.set()
        finally:
            with self._lock:
                self._running -= 1
                last = self._running == 0
            if last and self.error is None and not self._stop.is_set():
                log.info("elastic pass %d done here: %d units (%d examples) trained and acknowledged by this worker",
                         self.pass_id, self.counts["acked"], self.counts["examples"])
                self._put(_DONE)

    def _take(self):
        """The next unit for this reader, or None once the pass is over (every unit
        acknowledged). Acknowledges trained units meanwhile."""
        wait = None
        while not self._stop.is_set():
            self._ack_trained(flush_if_idle=False)
            with self._lock:  # a slot is reserved before asking: never more than _max_held units
                busy = self._flushing or len(self._units) + self._asking >= self._max_held
                if not busy:
                    self._asking += 1
            if busy:
                self._ack_trained(flush_if_idle=True)
                time.sleep(POLL_S / 4)
                continue
            try:
                meta = self._comm.coordinator_request("units_take", {"pass": self.pass_id}).meta
                if "unit" in meta:
                    unit = _Unit(meta["unit"], meta["path"], meta["start"], meta["end"])
                    with self._lock:
                        self._units[unit.index] = unit
                        self.counts["units"] += 1
                    return unit
            finally:
                with self._lock:
                    self._asking -= 1
            if meta.get("done"):
                return None
            self._ack_trained(flush_if_idle=True)
            if wait is None:
                wait = WaitLog(f"the other workers' work units of pass {self.pass_id} to be acknowledged (a lost "
                               f"worker's units come back to the queue)", logger=log)
            wait.tick()
            self._stop.wait(POLL_S)
        return None

    def _read(self, unit, parser):
        data = read_unit(unit.path, unit.start, unit.end)
        buf = np.frombuffer(data + b"\0", dtype=np.uint8).copy()
        where = f"file {unit.path!r} (work unit {unit.index}: bytes {unit.start}..{unit.end})"
        blocks, lines = parser.parse(buf, len(data), lambda line: f"{where}, line {line} of the unit", 0, self.bad)
        block = ExampleBlock.concat(blocks) if len(blocks) > 1 else (blocks[0] if blocks else None)
        n = 0 if block is None else block.n
        size = self._config.batch_size
        with self._lock:
            self.counts["lines"] += lines
            unit.examples = n
        for a in range(0, n, size):
            feed = block.slice(a, min(n, a + size)).to_feed(self._config.slots)
            with self._lock:
                unit.batches += 1
                self._by_batch[id(feed)] = unit
            self._put(feed)
        with self._lock:
            unit.read = True
            if unit.trained():
                unit.mark = self._comm.pushes_mark()

    def _put(self, item):
        while True:
            if self._stop.is_set() and item is not _DONE:
                raise _Closed()
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                if self._stop.is_set():
                    return

    def _ack_trained(self, flush_if_idle):
        """Acknowledges every trained unit whose updates are on the servers; with
        ``flush_if_idle``, flushes the communicator first when trained units wait for it
        and no batch is in flight (only then: a flush must not race a training step)."""
        with self._lock:
            trained = [u for u in self._units.values() if u.trained()]
            ready = [u for u in trained if self._comm.pushes_sent(u.mark)]
            idle = len(trained) == len(self._units) and not self._flushing and not self._asking
            flush = flush_if_idle and idle and len(ready) < len(trained)
            if flush:
                self._flushing = True
        if flush:
            try:
                self._comm.flush()
            finally:
                with self._lock:
                    self._flushing = False
            ready = trained
        for unit in ready:
            with self._lock:
                if unit.acked:
                    continue
                unit.acked = True
            ok = self._comm.coordinator_request(
                "units_ack", {"pass": self.pass_id, "unit": unit.index, "examples": unit.examples}).meta.get("accepted")
            with self._lock:
                self._units.pop(unit.index, None)
                if ok:
                    self.counts["acked"] += 1
                    self.counts["examples"] += unit.examples
                else:
                    self.counts["stale"] += 1
                    log.warning("elastic pass %d: unit %d was handed to another worker before this one acknowledged "
                                "it (this worker was taken for lost)", self.pass_id, unit.index)
                self._lock.notify_all()

    # ------------------------------------------------------------------ consumers
    def batch_done(self, feed):
        """A training thread ran ``feed`` (its step's updates were handed to the
        communicator). Never blocks for long."""
        with self._lock:
            unit = self._by_batch.pop(id(feed), None)
            if unit is None:
                return
            unit.done += 1
            if unit.trained():
                unit.mark = self._comm.pushes_mark()

    def get(self, timeout):
        """The next batch, or None once the pass is over. Blocks up to ``timeout`` s.

        Raises:
            the first reader's error; FleetTimeoutError when nothing came within timeout.
        """
        deadline = time.monotonic() + timeout
        while True:
            if self.error is not None:
                raise self.error
            if self._stop.is_set():
                return None
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise FleetTimeoutError(
                        f"elastic pass {self.pass_id}: no batch within {timeout:g} s; this worker holds units "
                        f"{sorted(self._units)} of {self.total_units}") from None
                continue
            if item is _DONE:
                self._queue.put(_DONE)  # for the other training threads
                return None
            with self._lock:
                self.counts["batches"] += 1
            return item

    def get_ready(self):
        """A batch that is ready now, or None (never blocks; lock-step threads fill a
        step with it without waiting while they hold batches)."""
        if self.error is not None:
            raise self.error
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return None
        if item is _DONE:
            self._queue.put(_DONE)
            return None
        with self._lock:
            self.counts["batches"] += 1
        return item

    def close(self):
        """Stops the readers (bounded wait). Units taken and not acknowledged stay with
        this worker until it stops or is lost. Idempotent."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(5.0)

    def report(self):
        """Counts of this pass: lines, examples (acknowledged here), batches,
        bad_lines_skipped, files (units acknowledged), and ``elastic`` True."""
        with self._lock:
            c = dict(self.counts)
        return {"lines": c["lines"], "examples": c["examples"], "batches": c["batches"],
                "bad_lines_skipped": self.bad.count, "files": c["acked"], "units_acked": c["acked"],
                "stale_acks": c["stale"], "elastic": True, "pass": self.pass_id}


class _Closed(Exception):
    """Raised in a reader when the pass was closed."""
