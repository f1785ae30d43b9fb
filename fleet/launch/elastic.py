"""Elastic jobs under fleetrun (``--np MIN:MAX``): lost workers, replacements, joining workers.

fleetrun starts ``--worker_num`` workers (default MIN) in the slots 0..MAX-1 (every slot
has an endpoint; every process sees PADDLE_TRAINERS_NUM=MAX and FLEET_ELASTIC=MIN:MAX).
While the job runs, ``ElasticPolicy.tick`` (called from the job loop):

- takes a worker that exits non-zero or is killed as lost, not as the job's failure, while
  at least MIN workers still run (or the data is done: a worker exited 0); the servers
  forget it after FLEET_HEARTBEAT_TIMEOUT_MS and its unacknowledged work units go to the
  others. With ``--worker_replacements K`` fleetrun restarts up to K lost workers in
  total, each under its lost id (its log is appended to). Below MIN workers the job fails,
  naming every lost worker;
- admits new workers on request: ``fleetrun --add_workers N --log_dir DIR`` (DIR being the
  running job's --log_dir) or ``kill -USR1 <fleetrun pid>`` (one worker), each in the
  lowest slot that never ran (then the lowest lost one), up to MAX running.

``admit_worker(job, worker_id=None)`` is the one call that starts a worker in a running
job (used by the request path and by rendezvous code that assigns ids itself). In a job
whose slots span hosts (``fleetrun --np --elastic_server``: the launch monitor carries a
``fleet.launch.etcd_slots.SlotRegistry`` as ``slots``) each host's fleetrun tolerates its
lost workers and frees their slots in etcd, marks a slot done when its worker exits 0,
takes free slots from etcd for added workers, and the registry enforces MIN over every
host.

Thread-safety: everything runs in fleetrun's main thread (the SIGUSR1 handler only sets a
flag).
"""
from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time
import uuid

from fleet.elastic import JOINING_ENV
from fleet.errors import ConfigError, FleetError
from fleet.launch.report import plural, say

STATE_FILE = "fleetrun.elastic.json"
REQUESTS_DIR = "elastic_requests"


class ElasticPolicy:
    """What fleetrun does about workers in an elastic job (see the module docstring).

    Args:
        job: the running ``fleet.launch.local._Job``.
    """

    def __init__(self, job):
        self.job = job
        self.low, self.high = job.config.elastic
        self.replacements_left = job.config.worker_replacements
        self.lost = []  # the _Child of every worker taken for lost, in order
        self.signals = 0  # SIGUSR1 received and not handled yet
        self._previous = None
        self._dir = os.path.join(job.config.log_dir, REQUESTS_DIR)
        self.slots = getattr(job.monitor, "slots", None)  # a SlotRegistry across hosts, or None
        self._finished = set()  # slots marked done in etcd

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """Writes LOG_DIR/fleetrun.elastic.json and listens for SIGUSR1."""
        os.makedirs(self._dir, exist_ok=True)
        self.write_state()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR1, self._on_signal)
        if self.slots is not None:
            for slot in self.slots.join_slots:  # taken in etcd when this host joined a running job
                admit_worker(self.job, slot, why="joining the running job through etcd")

    def write_state(self):
        """LOG_DIR/fleetrun.elastic.json: fleetrun's pid, --np, the endpoints, and the pid
        of each running worker ({"running": {worker id: pid}}, "lost": [ids]), rewritten
        whenever a worker starts or is lost."""
        state = {"pid": os.getpid(), "np": [self.low, self.high],
                 "servers": list(self.job.config.server_endpoints),
                 "workers": list(self.job.config.worker_endpoints),
                 "running": {str(ch.index): ch.popen.pid for ch in self.running()},
                 "lost": [ch.index for ch in self.lost]}
        path = os.path.join(self.job.config.log_dir, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    def stop(self):
        """Removes the state file and restores SIGUSR1's handler."""
        if self._previous is not None:
            signal.signal(signal.SIGUSR1, self._previous)
            self._previous = None
        try:
            os.remove(os.path.join(self.job.config.log_dir, STATE_FILE))
        except OSError:
            pass

    def _on_signal(self, signum, frame):
        self.signals += 1
        self.job.exited.set()  # wake the job loop

    # ------------------------------------------------------------------ the job loop
    def workers(self):
        return [ch for ch in self.job.children if ch.role == "worker"]

    def running(self):
        return [ch for ch in self.workers() if ch.returncode is None]

    def data_done(self):
        """True once a worker exited 0 (here, or in any slot across hosts): it ended its
        last pass, so every unit was trained."""
        return (any(ch.returncode == 0 for ch in self.workers())
                or (self.slots is not None and self.slots.data_done()))

    def tick(self):
        """Handles lost workers and requests to add workers. Returns None to go on; when
        the job fell below MIN workers, un-tolerates the lost ones so the job loop fails
        it with the first of them as the root cause."""
        for ch in self.workers():
            if ch.returncode == 0 and self.slots is not None and ch.index not in self._finished:
                self._finished.add(ch.index)
                self.slots.mark_done(ch.index)
            if ch.returncode in (None, 0) or ch.stopped_by_us or ch.tolerated:
                continue
            ch.tolerated = True
            self.lost.append(ch)
            error = ch.error_line()
            say(f"{ch.label} {ch.describe_exit()}{f': {error}' if error else ''}: lost (elastic job --np "
                f"{self.low}:{self.high}); the servers forget it after FLEET_HEARTBEAT_TIMEOUT_MS and its "
                f"unacknowledged work units go to the other workers")
            if self.replacements_left > 0 and not self.data_done():
                self.replacements_left -= 1
                admit_worker(self.job, ch.index, why=f"replacing lost {ch.name}")
            elif self.slots is not None:
                self.slots.release(ch.index)
            self.write_state()
        if (self.slots is not None and self.lost and not self.job.config.here("server")
                and all(ch.tolerated for ch in self.workers())):
            # A host of workers only whose every worker was lost, none finishing: it has
            # nothing left to run and must not say "done" (its workers may have died with
            # the server's host). The job goes on elsewhere while MIN workers live.
            self._fail("every worker of this host was lost and none finished the data: {names}; this host leaves "
                       f"(the job goes on on the other hosts while --np {self.low}:{self.high}'s minimum live)")
            return
        # Multi-host (slots placed by a rendezvous): MIN counts every host's workers, which
        # the rendezvous knows; this host only tolerates its lost workers.
        if (self.lost and not self.data_done() and not self.job.config.multi_host
                and len(self.running()) < self.low):
            self._fail(f"only {plural(len(self.running()), 'worker')} left, fewer than --np {self.low}:{self.high}'s "
                       f"minimum {self.low}: the job fails. Lost: {{names}}")
            return
        self._handle_requests()

    def _fail(self, text):
        """Says ``text`` ({names}: the lost workers and how each ended) and un-tolerates the
        lost workers, so the job loop fails with the first of them as the root cause."""
        names = ", ".join(f"{ch.name} ({ch.describe_exit()})" for ch in self.lost)
        say(text.format(names=names))
        for ch in self.lost:
            ch.tolerated = False

    def workers_done(self):
        """True once no worker runs and every worker exited 0 or was lost, one exiting 0;
        across hosts, a host without servers is done once every worker it started ended
        (the job goes on on the other hosts)."""
        workers = self.workers()
        ended = all(ch.returncode == 0 or ch.tolerated for ch in workers)
        if self.slots is not None and workers and not self.job.config.here("server"):
            return ended
        return ended and any(ch.returncode == 0 for ch in workers)

    def _handle_requests(self):
        files = sorted(glob.glob(os.path.join(self._dir, "*.json")))
        if not files and not self.signals:
            return
        signals, self.signals = self.signals, 0
        for path in files:
            try:
                with open(path) as f:
                    count = int(json.load(f)["add"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                _answer(path, {"error": f"unreadable request: {e}"})
                continue
            signals = max(0, signals - 1)  # the request's own signal
            _answer(path, self.admit(count))
        if signals:
            self.admit(signals)

    def admit(self, count):
        """Starts up to ``count`` new workers; returns {"admitted": [ids], "refused": n,
        "why": text}."""
        if self.slots is not None:
            return self._admit_from_etcd(count)
        admitted, why = [], ""
        for _ in range(count):
            if self.data_done():
                why = "the data is done: a worker already exited 0"
                break
            if len(self.running()) >= self.high:
                why = f"{self.high} workers run already (--np {self.low}:{self.high})"
                break
            admitted.append(admit_worker(self.job, why="added on request"))
        if len(admitted) < count:
            say(f"refused {count - len(admitted)} of {count} requested workers: {why}")
        return {"admitted": admitted, "refused": count - len(admitted), "why": why}


    def _admit_from_etcd(self, count):
        """admit() across hosts: free slots taken in etcd, one transaction each."""
        try:
            slots = self.slots.claim(count)
            why = self.slots.why_none
        except FleetError as e:
            slots, why = [], str(e)
        admitted = [admit_worker(self.job, slot, why="added on request, in a slot taken in etcd") for slot in slots]
        if len(admitted) < count:
            say(f"refused {count - len(admitted)} of {count} requested workers: {why}")
        return {"admitted": admitted, "refused": count - len(admitted), "why": why}


def _answer(path, result):
    done = path[:-len(".json")] + ".done"
    with open(done + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(done + ".tmp", done)
    os.remove(path)


def free_slot(job):
    """The lowest worker slot that never ran, else the lowest whose process was lost, or
    None when every slot runs or finished."""
    high = job.config.elastic[1]
    started = {ch.index for ch in job.children if ch.role == "worker"}
    busy = {ch.index for ch in job.children if ch.role == "worker" and (ch.returncode is None or ch.returncode == 0)}
    for i in range(high):
        if i not in started:
            return i
    for i in range(high):
        if i not in busy:
            return i
    return None


def admit_worker(job, worker_id=None, why="added"):
    """Starts a worker of the running elastic ``job`` in slot ``worker_id`` (default:
    ``free_slot``), with the slot's endpoint and the job's environment; it joins the
    servers in fleet.init_worker(), pulls the current parameters and takes work units.

    Args:
        job: the running ``_Job`` (its config must be elastic).
        worker_id: the slot, 0..MAX-1; a slot whose previous process was lost is taken over.
        why: for fleetrun's message.

    Returns:
        The worker id started.

    Raises:
        ConfigError: no free slot, or a slot that runs or finished.
        FleetError: the process could not be started.
    """
    if job.config.elastic is None:
        raise ConfigError("admit_worker needs an elastic job (fleetrun --np MIN:MAX)")
    if worker_id is None:
        worker_id = free_slot(job)
        if worker_id is None:
            raise ConfigError(f"every worker slot of --np {job.config.elastic[0]}:{job.config.elastic[1]} runs or "
                              f"finished; none is free")
    for ch in job.children:
        if ch.role == "worker" and ch.index == worker_id and ch.returncode in (None, 0):
            raise ConfigError(f"worker slot {worker_id} {'runs' if ch.returncode is None else 'finished'} already")
    again = any(ch.role == "worker" and ch.index == worker_id for ch in job.children)
    child = job.start_process("worker", worker_id, append=again, extra_env={JOINING_ENV: "1"})
    if job.elastic is not None:
        job.elastic.write_state()
    say(f"started {child.label} ({why}), endpoint {child.endpoint}; {plural(len(_running(job)), 'worker')} running")
    return worker_id


def _running(job):
    return [ch for ch in job.children if ch.role == "worker" and ch.returncode is None]


def request_add_workers(log_dir, count, timeout=15.0):
    """Asks the fleetrun running the elastic job whose --log_dir is ``log_dir`` to start
    ``count`` more workers; waits (up to ``timeout`` s) for its answer.

    Returns:
        {"admitted": [worker ids], "refused": n, "why": text}.

    Raises:
        ConfigError: no elastic fleetrun runs with that log directory.
        FleetError: it did not answer within ``timeout``.
    """
    if count < 1:
        raise ConfigError(f"--add_workers {count}: give a number of workers >= 1")
    path = os.path.join(log_dir, STATE_FILE)
    try:
        with open(path) as f:
            state = json.load(f)
        pid = int(state["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"no elastic fleetrun runs with --log_dir {log_dir} ({path}: {e}); give the --log_dir "
                          f"of a job started with --np MIN:MAX") from None
    requests = os.path.join(log_dir, REQUESTS_DIR)
    name = os.path.join(requests, f"{time.time():.6f}-{uuid.uuid4().hex[:8]}")
    with open(name + ".tmp", "w") as f:
        json.dump({"add": int(count)}, f)
    os.replace(name + ".tmp", name + ".json")
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(name + ".done") as f:
                result = json.load(f)
            os.remove(name + ".done")
            return result
        except (OSError, ValueError):
            time.sleep(0.05)
    raise FleetError(f"fleetrun (pid {pid}) did not answer the request to add {count} workers within {timeout:g} s")
