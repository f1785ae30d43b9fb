"""The distributed runtime behind fleet's lifecycle calls.

``build_runtime`` is called by ``minimize`` on a process that has servers: it computes
the placement plan (the same on every process), then
- on a worker: the worker's programs (``fleet.transpiler``) and its communicator, which
  ``init_worker`` connects and ``stop_worker`` closes;
- on a server: what ``init_server`` loads and ``run_server`` serves.

Liveness: ``init_worker`` starts the worker's ``Heartbeat`` (every request client checks
it while waiting, so a dead server fails every blocked call within
FLEET_HEARTBEAT_TIMEOUT_MS); ``run_server`` serves with the handler in a thread of its
own (heartbeats are answered even while a handler is busy) and fails workers whose
heartbeats stop (``ParameterServer.check_liveness``).
"""
import logging
import threading
import time

from fleet.communicator import make_communicator
from fleet.errors import ConfigError, FleetTimeoutError
from fleet.framework import io as fio
from fleet.framework.executor import Executor
from fleet.framework.scope import Scope, global_scope
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import DENSE, DISTRIBUTED, SPARSE, build_plan
from fleet.transpiler.worker_program import transpile_worker
from fleet.transport import Client, CurveConfig, Heartbeat, ServerSocket, wait_for_servers
from fleet.transport.settings import heartbeat_settings

log = logging.getLogger("fleet")


def build_runtime(fleet, strategy, main, startup, optimizer):
    """Returns the WorkerRuntime or ServerRuntime of this process."""
    plan = build_plan(main, strategy, fleet.server_endpoints(), fleet.worker_num())
    if fleet.is_server():
        return ServerRuntime(fleet, strategy, plan, main, startup)
    return WorkerRuntime(fleet, strategy, plan, main, startup)


def _curve():
    return CurveConfig.from_env()


class WorkerRuntime:
    """A worker: transpiled programs plus the communicator they talk through."""

    def __init__(self, fleet, strategy, plan, main, startup):
        self.fleet = fleet
        self.strategy = strategy
        self.plan = plan
        self.program, self.startup = transpile_worker(main, startup, plan)
        self.worker_id = fleet.worker_index()
        flags = strategy.get_trainer_runtime_config().get_communicator_flags()
        update_frequency = strategy.get_program_config().geo_sgd_need_push_nums
        curve = _curve()
        worker_id = self.worker_id
        self.heartbeat = heartbeat = Heartbeat(plan.server_endpoints, worker_id, curve=curve)
        self.comm = make_communicator(
            strategy.mode, plan, worker_id, global_scope(), flags,
            connect=lambda ep: Client(ep, worker_id, curve=curve, liveness=heartbeat),
            update_frequency=update_frequency, liveness=heartbeat)
        self.program._dist_info = self.comm
        self.started = False

    def programs(self):
        return self.program, self.startup

    def init_worker(self):
        """Waits for every server (bounded by FLEET_CONNECT_TIMEOUT_MS), starts the
        heartbeats, connects, and pulls the initial parameters so every worker starts from
        the same values."""
        if self.started:
            log.warning("fleet: init_worker() was called twice; the communicator is already running")
            return
        wait_for_servers(self.plan.server_endpoints, worker_id=self.worker_id, curve=_curve())
        self.heartbeat.start()
        try:
            self.comm.start()
            self.comm.pull_dense()
            if self.plan.mode == "geo":
                scope = global_scope()
                for p in self.plan.params.values():
                    if p.kind == SPARSE:
                        scope[p.name] = self.comm.pull_whole(p)
                self.comm.snapshot()
        except BaseException:
            self.heartbeat.stop()
            raise
        self.started = True

    def stop_worker(self):
        """Sends what is queued, tells the servers this worker is done and stops the
        heartbeats (also when that fails: the error is raised)."""
        if self.started:
            self.started = False
            try:
                self.comm.stop()
            finally:
                self.heartbeat.stop()

    def barrier_worker(self, timeout=None):
        self._need_started("barrier_worker")
        return self.comm.barrier_worker(timeout)

    def all_to_all(self, blobs):
        self._need_started("exchanging data between workers")
        return self.comm.all_to_all(blobs)

    def _need_started(self, what):
        if not self.started:
            raise ConfigError(f"{what} needs the servers: call fleet.init_worker() first")

    def save_persistables(self, dirname, program):
        """Pulls every parameter whole from the servers and saves it with this worker's own
        persistable state (metrics), atomically."""
        self._need_started("save_persistables")
        self.comm.flush()
        scope = global_scope()
        arrays = {}
        for v in program.list_vars():
            if v.persistable and not v.is_data and v.name not in self.plan.params:
                value = scope.find_var(v.name)
                if value is not None:
                    arrays[v.name] = value
        for p in self.plan.params.values():
            if p.kind == DISTRIBUTED:
                raise ConfigError(
                    f"saving the distributed table {p.name!r} is done by the servers' checkpoints; "
                    f"save_persistables on a worker covers dense and is_sparse parameters")
            if p.kind == DENSE:
                self.comm.pull_dense([p])
                arrays[p.name] = scope[p.name]
            else:
                arrays[p.name] = self.comm.pull_whole(p)
        return fio.write_vars(dirname, arrays, {"mode": self.plan.mode})


class ServerRuntime:
    """A server: its tables and the loop that serves them."""

    def __init__(self, fleet, strategy, plan, main, startup):
        self.fleet = fleet
        self.strategy = strategy
        self.plan = plan
        self.main, self.startup = main, startup
        self.endpoint = fleet.server_endpoints()[fleet.server_index()]
        self.server = None

    def programs(self):
        return self.main, self.startup

    def _initial_values(self, model_dir):
        """Full initial values of the parameters this server holds blocks of: from the
        startup program (only the ops that fill them), or from a saved model."""
        needed = {p.name for p, _ in self.plan.blocks_on(self.endpoint) if p.kind != DISTRIBUTED}
        if model_dir is not None:
            return fio.read_vars(model_dir, sorted(needed))
        program = self.startup.clone(for_test=False)
        block = program.global_block()
        block.ops[:] = [op for op in block.ops if set(op.output_arg_names) & needed]
        scope = Scope()
        Executor().run(program, scope=scope)
        missing = [n for n in needed if scope.find_var(n) is None]
        if missing:
            raise ConfigError(f"server {self.endpoint}: the startup program does not initialize {missing}")
        return {n: scope[n] for n in needed}

    def init_server(self, model_dir=None):
        """Creates this server's tables, initialized or loaded from ``model_dir``."""
        dc_asgd = self.strategy.get_program_config().enable_dc_asgd
        self.server = ParameterServer(self.endpoint, self.plan, self._initial_values(model_dir),
                                      dc_asgd=dc_asgd)

    def run_server(self):
        """Serves until every worker has stopped. Blocks.

        Raises:
            TransportError: the endpoint cannot be bound (e.g. the port is taken; names it).
            FleetTimeoutError: a worker was lost (its heartbeats stopped before it called
                fleet.stop_worker()); raised once every other worker has been told, or
                after FLEET_HEARTBEAT_TIMEOUT_MS.
        """
        if self.server is None:
            self.init_server()
        ps = self.server
        interval_ms, timeout_ms = heartbeat_settings()
        stop = threading.Event()
        with ServerSocket(self.endpoint, curve=_curve()) as sock:
            watch = _ServerWatch(ps, sock, stop, timeout_ms / 1000.0)
            log.info("fleet: server %s serving %d blocks, %d tables for %d workers (%s)",
                     self.endpoint, len(ps.blocks), len(ps.shards), ps.workers, ps.mode)
            try:
                sock.serve(ps.handle, stop, poll_ms=_TICK_MS, tick=watch.tick, threaded=True)
            finally:
                self.stats = sock.stats()
        _report_bad_input(self.endpoint, self.stats)
        if ps.failure is not None:
            raise FleetTimeoutError(f"server {self.endpoint} stopped: {ps.failure}")
        log.info("fleet: server %s done: every worker stopped", self.endpoint)


_TICK_MS = 100
_DRAIN_S = 0.25  # serving goes on this long after the end, so the last replies leave


class _ServerWatch:
    """The periodic part of run_server (run in the handler thread): lost workers, the
    failure published in heartbeat replies, and when to stop serving."""

    def __init__(self, ps, sock, stop, timeout_s):
        self.ps, self.sock, self.stop, self.timeout_s = ps, sock, stop, timeout_s
        self.published = None  # when heartbeat replies started to carry the failure
        self.stop_at = None

    def tick(self):
        now = time.monotonic()
        ps = self.ps
        last_heard = self.sock.last_heard()
        ps.check_liveness(last_heard, self.timeout_s, now)
        if ps.failure is not None and self.published is None:
            self.sock.set_heartbeat_status(ps.status())
            self.published = time.monotonic()
        if self.stop_at is None:
            if ps.finished():
                self.stop_at = now + _DRAIN_S
            elif self.published is not None:
                heard = {w for w, t in last_heard.items() if t > self.published}
                if ps.all_told(heard) or now - self.published > self.timeout_s:
                    self.stop_at = now + _DRAIN_S
        elif now >= self.stop_at:
            self.stop.set()


def _report_bad_input(endpoint, stats):
    bad = stats.get("malformed", 0) + stats.get("handler_errors", 0)
    if bad:
        log.warning("fleet: server %s answered %d malformed messages and %d failed requests with errors "
                    "(of %d messages received)", endpoint, stats.get("malformed", 0),
                    stats.get("handler_errors", 0), stats.get("received", 0))
