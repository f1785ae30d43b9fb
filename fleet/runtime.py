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
import atexit
import json
import logging
import os
import sys
import threading
import time
import uuid
import weakref

import numpy as np

from fleet import telemetry
from fleet.local_tables import local_tables  # noqa: F401  (fleet.runtime.local_tables(): the local tables)
from fleet.communicator import make_communicator
from fleet.elastic import check_elastic_mode, elastic_range, expected_workers
from fleet.errors import ConfigError, FleetTimeoutError, ServerError, TransportError
from fleet.framework import io as fio
from fleet.framework.executor import Executor
from fleet.framework.hooks import set_program_rewriter
from fleet.framework.inference import file_names, manifest_extra, persistable_names, use_saved_tables
from fleet.framework.program import serialize_program
from fleet.framework.save_chain import (ALL, DELTA, check_next_delta, check_save_mode, new_link, read_chain,
                                       resolve_chain)
from fleet.framework.scope import Scope, global_scope
from fleet.logs import WaitLog
from fleet.rules import rule_from_op_attrs
from fleet.server.checkpoint import initial_values, state_var
from fleet.server.parameter_server import ParameterServer
from fleet.server_saves import table_snapshots, write_server_lr_steps, write_server_params
from fleet.transpiler.collective_program import ALLREDUCE, insert_collective_ops, local_updates
from fleet.transpiler.plan import DISTRIBUTED, SPARSE, build_plan
from fleet.transpiler.worker_program import (has_server_updates, reads_server_params, transpile_eval,
                                             transpile_worker)
from fleet.transport import Client, CurveConfig, Heartbeat, ServerSocket, wait_for_servers
from fleet.transport.settings import heartbeat_settings, worker_connect_timeout_ms

log = logging.getLogger("fleet")


def build_runtime(fleet, strategy, main, startup, optimizer):
    """Returns the WorkerRuntime, ServerRuntime or CollectiveRuntime of this process."""
    check_elastic_mode(strategy.mode)
    if strategy.mode == "collective":
        return CollectiveRuntime(fleet, strategy, main, startup)
    plan = build_plan(main, strategy, fleet.server_endpoints(), fleet.worker_num())
    if fleet.is_server():
        return ServerRuntime(fleet, strategy, plan, main, startup)
    runtime = WorkerRuntime(fleet, strategy, plan, main, startup)
    set_program_rewriter(runtime.program_for_run)
    return runtime


def _curve():
    return CurveConfig.from_env()


def _group_maker(fleet, strategy_name):
    """A callable joining this worker's ``WorkerGroup`` (the workers of the job, from the
    role maker: PADDLE_TRAINER_ENDPOINTS), for the collective and hybrid communicators.

    Raises:
        ConfigError: the role maker knows no worker endpoints (names the variable).
    """
    endpoints = list(fleet.worker_endpoints())
    rank = fleet.worker_index()
    if len(endpoints) != fleet.worker_num():
        raise ConfigError(
            f"{strategy_name} all-reduces gradients among the workers, which needs every worker's host:port: "
            f"set PADDLE_TRAINER_ENDPOINTS to the comma list of the {fleet.worker_num()} workers' endpoints "
            f"(fleetrun sets it; got {endpoints or 'none'})")

    def make_group():
        from fleet.transport.group import WorkerGroup

        return WorkerGroup(endpoints, rank, curve=_curve())

    return make_group


_uncaught = {}  # the exception that ended the main thread ("error": its text), once there is one
_previous_excepthook = None


def _record_uncaught(kind, value, tb):
    if not isinstance(value, (TransportError, ServerError)):  # those are the job's failure, told to us
        _uncaught["error"] = f"{kind.__name__}: {value}"
    else:
        _uncaught["told"] = True
    (_previous_excepthook or sys.__excepthook__)(kind, value, tb)


def _report_at_exit(runtime):
    """At interpreter exit, a worker that did not call stop_worker() tells the servers
    why (the exception that ended the script, else that it ended without stop_worker), so
    the job fails at once instead of after FLEET_HEARTBEAT_TIMEOUT_MS. A process killed by
    a signal cannot do this; the heartbeats find it."""
    global _previous_excepthook
    if sys.excepthook is not _record_uncaught:
        _previous_excepthook, sys.excepthook = sys.excepthook, _record_uncaught
    ref = weakref.ref(runtime)

    def report():
        rt = ref()
        if rt is None or not rt.started or _uncaught.get("told"):
            return
        if getattr(rt, "stops_at_exit", False) and "error" not in _uncaught:
            # A collective script may end without stop_worker(), as Paddle's do: the
            # script ended normally, so this is the worker's last round with the others.
            try:
                rt.stop_worker()
            except Exception as e:  # the process is ending: say why the round failed
                log.error("fleet: %s could not have its last round with the other workers at exit: %s",
                          rt.comm.who, e)
            return
        rt.comm.report_failure(_uncaught.get("error") or "its script ended without calling fleet.stop_worker()")

    atexit.register(report)


def _allreduce_attrs(program):
    return next(op.attrs for op in program.global_block().ops if op.type == ALLREDUCE)


class CollectiveRuntime:
    """A collective worker (no servers): the user's programs with the collective ops
    (``fleet.transpiler.collective_program``; changed in place, as Paddle's collective
    transpiler does) and the collective communicator they talk through.

    ``init_worker`` joins the worker group (bounded by FLEET_CONNECT_TIMEOUT_MS) and, if
    the startup program already ran, takes worker 0's initial values; ``stop_worker`` has
    the final round with the others and leaves the group. Saves are local saves of this
    worker's scope (every worker holds the same values; save from one worker).

    A Paddle 1.x collective script calls neither: its startup program joins the workers
    and broadcasts worker 0's values, and it ends without a stop. So here too: the
    startup program's broadcast (or else the first training step) joins the group when
    init_worker() was not called, and a script that ends normally without stop_worker()
    has its final round at exit.
    """

    save_mode = "collective"
    stops_at_exit = True

    def __init__(self, fleet, strategy, main, startup):
        self.fleet = fleet
        self.strategy = strategy
        self.worker_id = fleet.worker_index()
        insert_collective_ops(main, startup)
        self.comm = make_communicator("collective", None, self.worker_id, global_scope(),
                                      strategy.get_trainer_runtime_config().get_communicator_flags(),
                                      connect=None, make_group=_group_maker(fleet, "CollectiveStrategy"))
        self.comm.who = f"worker {self.worker_id} of {fleet.worker_num()}"
        main.training_hooks = startup.training_hooks = self.comm
        self.comm.set_layout(_allreduce_attrs(main))
        self.comm.join_implicitly = self._join_implicitly
        self.program, self.startup = main, startup
        self.started = False
        self._implicit = False

    def programs(self):
        return self.program, self.startup

    def _join_implicitly(self, where):
        """Joins the group at ``where`` when the script did not call init_worker()."""
        if not self.started:
            log.info("fleet: %s joins the other workers at %s (fleet.init_worker() was not called; Paddle's "
                     "collective startup program joins them the same way)", self.comm.who, where)
            self.init_worker()
            self._implicit = True

    def init_worker(self):
        """Joins the group of workers (bounded); takes worker 0's initial values if the
        startup program ran already (else its last op does)."""
        if self.started:
            if self._implicit:  # the startup program joined already: nothing left to do
                self._implicit = False
                return
            log.warning("fleet: init_worker() was called twice; the worker group is already joined")
            return
        self.comm.start()
        self.started = True
        log.info("fleet: %s joined the group of %d workers (collective)", self.comm.who, self.fleet.worker_num())
        _report_at_exit(self)

    def stop_worker(self):
        """The final round with the other workers, then leaves the group (bounded)."""
        if self.started:
            self.started = False
            self.comm.stop()

    def barrier_worker(self, timeout=None):
        """Blocks until every worker called it (bounded; the timeout names who did not)."""
        self._need_started("barrier_worker")
        self.comm.barrier_worker(timeout)

    def all_to_all(self, blobs):
        self._need_started("exchanging data between workers")
        return self.comm.all_to_all(blobs)

    def _need_started(self, what):
        if not self.started:
            raise ConfigError(f"{what} needs the other workers: call fleet.init_worker() first")


class WorkerRuntime:
    """A worker: transpiled programs plus the communicator they talk through."""

    def __init__(self, fleet, strategy, plan, main, startup):
        self.fleet = fleet
        self.strategy = strategy
        self.plan = plan
        self.program, self.startup = transpile_worker(main, startup, plan)
        self._user_main, self._user_startup = main, startup
        self._rewritten = weakref.WeakKeyDictionary()  # user program -> (its version, program to run)
        self._rewrite_lock = threading.Lock()
        self.worker_id = fleet.worker_index()
        flags = strategy.get_trainer_runtime_config().get_communicator_flags()
        update_frequency = strategy.get_program_config().geo_sgd_need_push_nums
        curve = _curve()
        worker_id = self.worker_id
        self.heartbeat = heartbeat = Heartbeat(plan.server_endpoints, worker_id, curve=curve)
        make_group = None
        if plan.mode == "hybrid":  # dense parameters stay here, all-reduced among the workers
            make_group = _group_maker(fleet, "HybridStrategy")
            self.local_params = [n for n, _, _, _ in local_updates(self.program)[1] if n not in plan.params]
            insert_collective_ops(self.program, self.startup, self.local_params)
        self.comm = make_communicator(
            strategy.mode, plan, worker_id, global_scope(), flags,
            connect=lambda ep: Client(ep, worker_id, curve=curve, liveness=heartbeat),
            update_frequency=update_frequency, liveness=heartbeat, make_group=make_group)
        self.program.training_hooks = self.comm
        if plan.mode == "hybrid":
            self.startup.training_hooks = self.comm
            self.comm.set_layout(_allreduce_attrs(self.program))
        block = self.program.global_block()
        # Tables whose prefetch reads only fed inputs (ids, and a ShowClickEntry's show and
        # click) can be pulled ahead from the next batch's feed.
        fed = [op for op in block.ops if op.type == "prefetch" and all(
            block.vars[n].is_data for n in op.input("Ids") + op.input("Show") + op.input("Click"))]
        self.comm.set_prefetch_inputs(
            {op.attr("table"): op.input("Ids") for op in fed},
            {op.attr("table"): (op.input("Show")[0], op.input("Click")[0]) for op in fed if op.input("Show")})
        self.started = False
        self.last_save = None  # (chain record, directory) of the last committed save: a delta's parent
        telemetry.TELEMETRY.attach_worker(self)

    def programs(self):
        return self.program, self.startup

    def program_for_run(self, program):
        """What the executor runs on this worker for ``program`` (see
        ``fleet.framework.hooks.set_program_rewriter``), as Paddle 1.x's transpiler, which
        rewrote the default programs in place: the programs ``minimize`` was called on run
        as ``fleet.main_program`` / ``fleet.startup_program``; another program of theirs
        (cloned from them, e.g. ``clone(for_test=True)`` before ``minimize``) that reads
        server-held parameters is transpiled too: with optimizer ops it trains through the
        servers, without them it evaluates with the servers' current values (its table
        reads prefetch rows, unseen ids of a distributed table not created when it is a
        test clone; its dense parameters are pulled at every run). In GEO a worker holds
        every parameter, so a program without optimizer ops runs unchanged. Programs of
        other origins (loaded inference models, programs built apart) run unchanged.
        Thread-safe; cached per program and version."""
        if program is self._user_main:
            return self.program
        if program is self._user_startup:
            return self.startup
        if program.training_hooks is not None or program._lineage != self._user_main._lineage:
            return program
        with self._rewrite_lock:
            cached = self._rewritten.get(program)
            if cached is not None and cached[0] == program._version:
                return cached[1]
            if not reads_server_params(program, self.plan):
                run = program
            elif has_server_updates(program, self.plan):
                run = transpile_worker(program, self._user_startup, self.plan)[0]
                if self.plan.mode == "hybrid":
                    insert_collective_ops(run, None, self.local_params)
            elif self.plan.mode == "geo":
                run = program
            else:
                run = transpile_eval(program, self.plan)
            if run is not program:
                run.training_hooks = self.comm
            self._rewritten[program] = (program._version, run)
            return run

    def init_worker(self):
        """Waits for every server (bounded by FLEET_CONNECT_TIMEOUT_MS), starts the
        heartbeats, connects, and pulls the initial parameters so every worker starts from
        the same values."""
        if self.started:
            log.warning("fleet: init_worker() was called twice; the communicator is already running")
            return
        wait_for_servers(self.plan.server_endpoints, worker_id=self.worker_id, curve=_curve())
        log.info("fleet: %s connected to %s (%s)", self.comm.who, ", ".join(self.plan.server_endpoints),
                 self.plan.mode)
        self.heartbeat.start()
        try:
            self.comm.start()
            if elastic_range() is not None:  # before the pull: a replacement's id is taken again
                live = self.comm.join()
                log.info("fleet: %s joined the elastic job (workers training: %s)", self.comm.who, live)
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
        _report_at_exit(self)

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
        """Sends this worker's queued updates, then waits for every worker (bounded): after
        it, every worker's updates before the barrier are on the servers."""
        self._need_started("barrier_worker")
        self.comm.flush()
        return self.comm.barrier_worker(timeout)

    def all_to_all(self, blobs):
        self._need_started("exchanging data between workers")
        return self.comm.all_to_all(blobs)

    def shrink(self):
        """``fleet.shrink()`` on a worker: flushes, waits for every worker, the first
        worker makes every server shrink, waits again, and returns the summed counts on
        every worker (the others read them from the servers). Blocks (bounded).

        Raises:
            ConfigError: no table of the plan keeps statistics, or init_worker() was not
                called.
        """
        self._need_started("fleet.shrink()")
        if not self.plan.statistics_tables():
            raise ConfigError(
                "fleet.shrink() evicts rows of tables that keep statistics, and this job has none: give the "
                "sparse_embedding an entry (fleet.CountFilterEntry(...)) or set its accessor with "
                "strategy.set_sparse_table_config(...)")
        first = self.fleet.is_first_worker()
        self.barrier_worker()
        deleted = self.comm.shrink(first=True) if first else None
        self.comm.barrier_worker()
        if deleted is None:
            deleted = self.comm.shrink(first=False)
        log.info("fleet: %s: shrink deleted %s", self.comm.who, deleted)
        return deleted

    def _need_started(self, what):
        if not self.started:
            raise ConfigError(f"{what} needs the servers: call fleet.init_worker() first")

    def server_held(self):
        """Names whose values live on the servers: every parameter of the plan and, except
        in GEO (whose workers run their own optimizer), its optimizer state."""
        names = set(self.plan.params)
        if self.plan.mode != "geo":
            for p in self.plan.params.values():
                rule = rule_from_op_attrs(p.rule_type, p.rule_attrs)
                names.update(state_var(p.name, key) for key in rule.state_names)
        return names

    def save_persistables(self, dirname, program, extra=None, filename=None, mode=0, commit=True):
        """Saves every parameter (pulled whole from the servers), its optimizer state and
        every server's share of each distributed table, with this worker's own
        persistables (metric states; GEO's local optimizer state), atomically.

        This worker's queued updates are sent first. Distributed tables are read through
        snapshots opened on every server at once before anything is read (see
        ``table_snapshots``): each server's tables are of one instant (in sync mode the
        state after this worker's last step). Dense and ``is_sparse`` parameters are read
        whole, block by block, in every mode; in async, half-async and GEO modes other
        workers keep pushing meanwhile, so they may be a few updates apart from the tables.

        Args:
            mode: 0 every row, 1 delta (rows changed since each table's previous committed
                save, plus ``<table>@deleted`` tombstones), 2 base (rows passing
                base_threshold); see ``fleet.framework.save_chain``.
            commit: once the directory is written, make this save each table's previous
                save (what the next delta is relative to) and the parent of the next
                delta. Checkpoints (``fleet.CheckpointConfig``) do not commit.

        Returns:
            The directory.

        Raises:
            ConfigError: a bad mode, a delta without a previous save, or a table that
                cannot save in this mode (mode 2 without statistics).
        """
        self._need_started("save_persistables")
        mode = check_save_mode(mode)
        self.comm.flush()
        held = self.server_held()
        scope = global_scope()
        meta = self._manifest_extra("persistables", extra)
        parent, parent_dir = self._previous_save() if mode == DELTA else (None, None)
        meta["chain"] = new_link(mode, meta["save_id"], dirname, parent, parent_dir)
        with_state = self.plan.mode != "geo"
        with table_snapshots(self.comm, meta["save_id"], mode, self.plan.distributed_tables(), commit) as snapshots:
            with fio.VarsWriter(dirname, meta, filename) as writer:
                for v in program.list_vars():
                    if v.persistable and not v.is_data and v.name not in held:
                        value = scope.value(v.name)
                        if value is not None:
                            writer.add(v.name, np.asarray(value))
                tables = write_server_params(writer, self.comm, self.plan.params.values(), with_state=with_state,
                                             snapshots=snapshots)
                write_server_lr_steps(writer, self.comm, self.plan)
                writer.extra["tables"] = tables
        if commit:
            self.last_save = (meta["chain"], writer.dirname)
        return writer.dirname

    def load_model(self, dirname, mode=0):
        """Makes every server load the save at ``dirname`` while the job runs (Paddle 2.x's
        ``fleet.load_model``): mode 0 the save, with its chain if it is a delta, replaces
        the servers' tables and parameters; mode 1 applies the one delta at ``dirname``,
        which must follow the save the servers loaded last. The next delta this worker
        saves follows the loaded save. Call it from one worker while no worker trains
        (e.g. between ``fleet.barrier_worker()`` calls); workers read the new values at
        their next pull. Not in GEO mode, whose workers train their own copies.

        Raises:
            ConfigError: GEO mode, a mode other than 0 or 1, a broken chain, or a delta
                that does not follow the servers' save (names both).
        """
        self._need_started("load_model")
        if self.plan.mode == "geo":
            raise ConfigError("fleet.load_model() cannot reach GEO workers' own copies of the parameters (an "
                              "exchange sends only rows they changed): restart the job with "
                              "fleet.init_server(dirname) to load a save")
        if mode not in (0, 1) or isinstance(mode, bool):
            raise ConfigError(f"load_model mode {mode!r} is not 0 (load the save, and its chain) or 1 (apply one "
                              f"delta onto the save loaded last)")
        path = os.path.abspath(dirname)
        if mode == 0:
            resolve_chain(path)  # the same errors as the servers', before asking them
        else:
            check_next_delta(fio.VarsReader(path), self.checkpoint_info(), "the servers")
        self.comm.flush()
        self.comm.load_model(path, mode)
        self.last_save = (read_chain(path), path)
        return path

    def _previous_save(self):
        """(chain record, directory) of the save a delta follows: this worker's last
        committed save, else the save the servers loaded, else (None, None)."""
        if getattr(self, "last_save", None) is not None:
            return self.last_save
        dirname = self.checkpoint_info().get("dirname")
        if dirname:
            return read_chain(dirname), dirname
        return None, None

    def load_persistables(self, dirname, program):
        """Loads this worker's own persistables (metric states; GEO's local optimizer
        state) from a save; parameters and their optimizer state live on the servers and
        are loaded by ``fleet.init_server(dirname)``.

        Returns:
            The names loaded.

        Raises:
            ConfigError: a needed variable is not in the save. DataError: a damaged file.
        """
        held = self.server_held()
        names = [v.name for v in program.list_vars()
                 if v.persistable and not v.is_data and v.name not in held]
        manifest = fio.read_manifest(dirname)
        missing = [n for n in names if n not in manifest["vars"]]
        if missing:
            raise ConfigError(f"{dirname!r} lacks {missing[:5]} of this program; it was saved from a "
                              f"different model")
        values = fio.read_vars(dirname, names)
        _assign(global_scope(), values)
        return sorted(values)

    def save_inference_model(self, dirname, program, feed_names, fetch_names, model_filename=None,
                             params_filename=None, program_only=False):
        """Saves the pruned inference ``program`` with the values it reads: parameters
        pulled whole from the servers, each distributed table as ``<table>@ids`` /
        ``<table>@values`` (the program reads it through ``saved_table_prefetch``), in
        Paddle's layout (see ``fleet.framework.inference``)."""
        self._need_started("save_inference_model")
        self.comm.flush()
        tables = {p.name: p.width for p in self.plan.distributed_tables()}
        use_saved_tables(program, tables)
        names = set() if program_only else set(persistable_names(program))
        scope = global_scope()
        model_file, params_file = file_names(model_filename, params_filename)
        extra = manifest_extra(feed_names, fetch_names, model_filename=model_file, params_filename=params_file,
                               program_only=bool(program_only), **self._manifest_extra("inference", None))
        params = [p for p in self.plan.params.values() if p.name in names or p.name + "@ids" in names]
        with table_snapshots(self.comm, extra["save_id"], ALL, [p for p in params if p.kind == DISTRIBUTED],
                             False) as snapshots, \
                fio.VarsWriter(dirname, extra, params_file) as writer:
            writer.add_file(model_file, serialize_program(program))
            write_server_params(writer, self.comm, params, with_state=False, snapshots=snapshots)
            for name in sorted(names):
                saved_table = name.endswith(("@ids", "@values")) and name.rsplit("@", 1)[0] in tables
                if name in self.plan.params or saved_table:
                    continue
                value = scope.value(name)
                if value is None:
                    raise ConfigError(f"cannot save the inference model: {name!r} has no value on this "
                                      f"worker; run the startup program first")
                writer.add(name, np.asarray(value))
        return writer.dirname

    def job_progress(self, what="save_persistables"):
        """(updates, loaded): the pushes the servers applied since they started, from any
        worker, and whether any server loaded a checkpoint. Blocks for one round trip.

        Raises:
            ConfigError: init_worker() was not called (``what`` names the call).
        """
        self._need_started(what)
        infos = self.comm.checkpoint_info()
        return (sum(int(i.get("updates") or 0) for i in infos.values()),
                any(i.get("dirname") for i in infos.values()))

    def work_units_progress(self):
        """In an elastic job, which work units of the pass this worker is in were
        acknowledged so far (server 0's ``units_status`` with ``mine``: {"files",
        "unit_bytes", "units", "acked"}), for a checkpoint; None in other jobs or before
        this worker opened a pass. Blocks for one request to server 0."""
        if elastic_range() is None:
            return None
        self._need_started("work_units_progress")
        return self.comm.coordinator_request("units_status", {"mine": True}).meta.get("mine")

    def checkpoint_info(self):
        """{"dirname", "save_id", "step", "epoch"} of the checkpoint every server loaded.

        Raises:
            ConfigError: servers loaded different checkpoints (names them).
        """
        self._need_started("checkpoint_info")
        infos = self.comm.checkpoint_info()
        if len({info.get("save_id") for info in infos.values()}) > 1:
            detail = ", ".join(f"{ep}: {i.get('dirname')}" for ep, i in infos.items())
            raise ConfigError(f"the servers loaded different checkpoints ({detail}); start every server "
                              f"with the same fleet.init_server(model_dir)")
        return {k: v for k, v in next(iter(infos.values())).items() if k != "updates"}

    def _manifest_extra(self, kind, extra):
        config = self.strategy.get_program_config()
        meta = {"kind": kind, "mode": self.plan.mode, "save_id": uuid.uuid4().hex,
                "strategy": {"class": type(self.strategy).__name__,
                             "program_config": config.to_dict() if hasattr(config, "to_dict") else repr(config)},
                "server_num": len(self.plan.server_endpoints), "worker_num": self.plan.worker_num,
                "saved_by_worker": self.worker_id}
        meta.update(extra or {})
        return meta


def _assign(scope, values):
    """Puts loaded values into ``scope``, in place where an array of that shape exists."""
    for name, value in values.items():
        current = scope.value(name)
        if isinstance(current, np.ndarray) and current.shape == value.shape and current.dtype == value.dtype:
            current[...] = value
        else:
            scope[name] = np.array(value)


class ServerRuntime:
    """A server: its tables and the loop that serves them."""

    def __init__(self, fleet, strategy, plan, main, startup):
        self.fleet = fleet
        self.strategy = strategy
        self.plan = plan
        self.main, self.startup = main, startup
        self.endpoint = fleet.server_endpoints()[fleet.server_index()]
        self.name = f"server {fleet.server_index()}"
        self.server = None
        self.sock = None  # the ServerSocket while run_server serves (telemetry reads its counters)
        telemetry.TELEMETRY.attach_server(self)

    def programs(self):
        return self.main, self.startup

    def _initial_values(self):
        """Full initial values of the parameters this server holds blocks of, from the
        startup program (only the ops that fill them)."""
        needed = {p.name for p, _ in self.plan.blocks_on(self.endpoint) if p.kind != DISTRIBUTED}
        program = self.startup.clone(for_test=False)
        block = program.global_block()
        block.ops[:] = [op for op in block.ops if set(op.output_arg_names) & needed]
        scope = Scope()
        Executor().run(program, scope=scope)
        missing = [n for n in needed if scope.value(n) is None]
        if missing:
            raise ConfigError(f"server {self.endpoint}: the startup program does not initialize {missing}")
        return {n: scope[n] for n in needed}

    def init_server(self, model_dir=None):
        """Creates this server's tables, initialized, or loaded from ``model_dir``: its
        blocks' rows of every saved parameter and optimizer state, and its share
        (id % server_num) of each distributed table, whatever the server count was
        when saved. ``model_dir`` may be any save of a chain (``save_persistables`` mode
        0, 1 or 2): a delta loads its base, then every delta up to it, in order. A
        checkpoint of an elastic job also restores which work units of its pass were
        trained (``fleet.server.work_queue``).

        Raises:
            ConfigError: a variable is missing or has another shape (names it); a link
                of the chain is missing or out of order (names it).
            DataError: a damaged file (names it).
        """
        config = self.strategy.get_program_config()
        options = {"dc_asgd": config.enable_dc_asgd, "merge_pushes": config.merge_async_pushes,
                   "worker_endpoints": self.fleet.worker_endpoints(), "elastic": elastic_range(),
                   "expected": expected_workers()}
        if model_dir is None:
            self.server = ParameterServer(self.endpoint, self.plan, self._initial_values(), **options)
            return
        dirs = resolve_chain(model_dir)
        reader = fio.VarsReader(dirs[0])
        server = ParameterServer(self.endpoint, self.plan, initial_values(reader, self.plan, self.endpoint),
                                 **options)
        deltas = [fio.VarsReader(d) for d in dirs[1:]]
        server.load(reader, deltas)
        work_units = (deltas[-1] if deltas else reader).extra.get("work_units")
        if server.elastic is not None and work_units:
            # An elastic checkpoint: its pass resumes where it was (fleet.server.work_queue).
            server.work.restore(work_units)
        self.server = server
        log.info("fleet: server %s loaded %s (step %s, epoch %s)%s", self.endpoint, model_dir,
                 server.loaded.get("step"), server.loaded.get("epoch"),
                 f": the base {dirs[0]} and {len(dirs) - 1} deltas" if len(dirs) > 1 else "")

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
        ps.warm_up()
        interval_ms, timeout_ms = heartbeat_settings()
        stop = threading.Event()
        with ServerSocket(self.endpoint, curve=_curve()) as sock:
            self.sock = sock
            watch = _ServerWatch(ps, sock, stop, timeout_ms / 1000.0, self.name)
            log.info("fleet: %s listening on %s; expecting %s (%s): %d blocks, %d tables",
                     self.name, self.endpoint, _plural(ps.workers, "worker"), ps.mode, len(ps.blocks),
                     len(ps.shards))
            try:
                sock.serve(ps.handle, stop, poll_ms=_TICK_MS, tick=watch.tick, threaded=True)
            finally:
                self.stats = sock.stats()
        _report_bad_input(self.endpoint, self.stats)
        if ps.elastic is not None and ps.work.passes:
            for status in ps.work.status().values():
                log.info("fleet: %s work queue: %s", self.name, json.dumps(status, sort_keys=True))
        if ps.failure is not None:
            raise FleetTimeoutError(f"server {self.endpoint} stopped: {ps.failure}")
        log.info("fleet: server %s done: every worker stopped", self.endpoint)


_TICK_MS = 100
_DRAIN_S = 0.25  # serving goes on this long after the end, so the last replies leave


class _ServerWatch:
    """The periodic part of run_server (run in the handler thread): lost workers, the
    failure published in heartbeat replies, when to stop serving, and what the server
    waits for (logged by ``WaitLog``: workers to connect, parked steps and barriers,
    workers to stop)."""

    def __init__(self, ps, sock, stop, timeout_s, name="server"):
        self.ps, self.sock, self.stop, self.timeout_s = ps, sock, stop, timeout_s
        self.name = name
        self.since = time.monotonic()
        self.first_contact_s = worker_connect_timeout_ms() / 1000.0
        self.published = None  # when heartbeat replies started to carry the failure
        self.stop_at = None
        self.connect_wait = WaitLog(f"{_plural(ps.workers, 'worker')} to connect to {name} ({sock.endpoint})",
                                    limit=f"failing the job after {self.first_contact_s:g} s "
                                          f"(FLEET_WORKER_CONNECT_TIMEOUT_MS)", logger=log)
        self.waits = {}  # what -> WaitLog of the parked wait that began at its `since`
        self.stop_wait = None

    def _log_waits(self, last_heard):
        ps = self.ps
        if self.connect_wait is not None:
            expected = ps.expected_workers()
            missing = [w for w in expected if w not in last_heard and w not in ps.stopped and w not in ps.lost]
            if not missing:
                self.connect_wait = None
            else:
                self.connect_wait.tick(f"{len(expected) - len(missing)} of {len(expected)} connected; not yet "
                                       f"{_workers(missing)}")
        current = {}
        for what, since, arrived, missing in ps.waits():
            wait = self.waits.get(what)
            if wait is None or wait.started != since or wait.missing != missing:
                wait = WaitLog(f"{_workers(missing)} at {what} on {self.name}", logger=log, started=since)
                wait.missing = missing
            current[what] = wait
            wait.tick(f"{len(arrived)} of {len(arrived) + len(missing)} arrived")
        self.waits = current
        if ps.stopped and ps.failure is None:
            running = [w for w in ps.expected_workers() if w not in ps.stopped and w not in ps.lost]
            if running:
                if self.stop_wait is None or self.stop_wait.running != running:
                    self.stop_wait = WaitLog(f"{_workers(running)} to call fleet.stop_worker() "
                                             f"({self.name} serves until every worker did)", logger=log,
                                             started=ps.first_stop)
                    self.stop_wait.running = running
                self.stop_wait.tick(f"{len(ps.stopped)} of {ps.workers} stopped")

    def tick(self):
        now = time.monotonic()
        ps = self.ps
        last_heard = self.sock.last_heard()
        ps.check_liveness(last_heard, self.timeout_s, now, since=self.since,
                          first_contact_s=self.first_contact_s)
        self._log_waits(last_heard)
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


def _plural(count, noun):
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _workers(ids):
    return ("worker " if len(ids) == 1 else "workers ") + ", ".join(map(str, ids))


def _report_bad_input(endpoint, stats):
    bad = stats.get("malformed", 0) + stats.get("handler_errors", 0)
    if bad:
        log.warning("fleet: server %s answered %d malformed messages and %d failed requests with errors "
                    "(of %d messages received)", endpoint, stats.get("malformed", 0),
                    stats.get("handler_errors", 0), stats.get("received", 0))
