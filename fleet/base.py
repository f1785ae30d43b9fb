"""The Fleet singleton behind the module-level API of ``fleet``.

One ``Fleet`` per process: ``init`` decides the role, ``distributed_optimizer(...).minimize``
builds this role's programs, and the lifecycle calls (``init_worker``, ``run_server``,
``stop_worker``...) start and stop the runtime. With no servers (``LocalRoleMaker``, or
``PaddleCloudRoleMaker`` without ``TRAINING_ROLE``) the same script trains locally: the
programs are the defaults and the lifecycle calls have nothing to connect. A collective
role maker (workers only) with ``CollectiveStrategy`` trains collectively: the workers
all-reduce their gradients (``fleet.runtime.CollectiveRuntime``).

Thread-safety: the lifecycle calls are meant for the main thread; the role getters are
safe anywhere.
"""
import logging
import os
import threading
import uuid

import numpy as np

from fleet import local_tables, table_saves, telemetry
from fleet.elastic import ServerReducer, elastic_range
from fleet.errors import ConfigError, FleetTimeoutError, ServerLostError
from fleet.framework import io as fio
from fleet.framework.executor import Executor
from fleet.framework.hooks import set_program_rewriter
from fleet.framework.inference import inference_program, load_inference_model, save_inference_model
from fleet.framework.program import Program, default_main_program, default_startup_program
from fleet.framework.save_chain import DELTA, check_next_delta, check_save_mode, new_link, read_chain, resolve_chain
from fleet.framework.scope import global_scope
from fleet.logs import install_default_handler
from fleet.optimizer import Optimizer
from role_makers import PaddleCloudRoleMaker, RoleMakerBase
from strategies import (DistributeTranspilerConfig, check_strategy,
                        strategy_from_config, DistributedStrategyFactory)

log = logging.getLogger("fleet")

SAVE_UNTRAINED_ENV = "FLEET_SAVE_UNTRAINED"


class Fleet:
    """Training for one process (worker, server, collective worker, or local)."""

    def __init__(self):
        self._role_maker = None
        self._is_initialized = False
        self._optimizer = None
        self._strategy = None
        self._origin_program = None
        self.main_program = None
        self.startup_program = None
        self._runtime = None
        self._executor = None
        self._group = None  # the workers' WorkerGroup of fleet.metrics (made on first use)
        self._group_lock = threading.Lock()

    # ------------------------------------------------------------- roles
    def init(self, role_maker=None):
        """Decides this process's role.

        Args:
            role_maker: a ``role_makers`` object; default ``PaddleCloudRoleMaker()``, which
                reads Paddle's environment variables (and trains locally when
                ``TRAINING_ROLE`` is unset).

        Raises:
            TypeError: role_maker is not a RoleMakerBase.
            RoleError: the environment does not describe a valid role.
        """
        if role_maker is None:
            role_maker = PaddleCloudRoleMaker()
        if not isinstance(role_maker, RoleMakerBase):
            raise TypeError("role_maker must be an instance of RoleMakerBase")
        install_default_handler()  # fleet's INFO messages reach stderr unless logging is configured
        role_maker.generate_role()
        self._close_group()  # a previous job's metric group
        self._role_maker = role_maker
        self._is_initialized = True
        telemetry.start(self)  # describes this process; serves its metrics if FLEET_METRICS_PORT is set
        self._executor = Executor()
        self._runtime = None
        set_program_rewriter(None)  # a previous job's worker runtime no longer rewrites programs
        self.main_program = self.startup_program = None
        return self

    def _rm(self):
        if not self._is_initialized:
            raise ConfigError("fleet is not initialized: call fleet.init(role_maker) first")
        return self._role_maker

    def is_local(self):
        """True when this process trains alone (no parameter servers)."""
        rm = self._rm()
        return rm.is_local() if hasattr(rm, "is_local") else not rm.get_pserver_endpoints()

    def is_worker(self):
        return self._rm().is_worker()

    def is_server(self):
        return self._rm().is_server()

    def is_first_worker(self):
        return self._rm().is_first_worker()

    def worker_index(self):
        return self._rm().worker_index()

    def worker_num(self):
        return self._rm().worker_num()

    def server_index(self):
        return self._rm().server_index()

    def server_num(self):
        return len(self._rm().get_pserver_endpoints())

    def worker_endpoints(self, to_string=False):
        eps = list(self._rm().get_trainer_endpoints())
        return ",".join(eps) if to_string else eps

    def server_endpoints(self, to_string=False):
        eps = list(self._rm().get_pserver_endpoints())
        return ",".join(eps) if to_string else eps

    def split_files(self, files):
        """Returns this worker's contiguous share of ``files``: ``len(files) // workers``
        each, the first ``len(files) % workers`` workers one more. In an elastic job
        (FLEET_ELASTIC, ``fleetrun --np``) the whole list: ``train_from_dataset`` then
        takes the worker's share as work units from the servers while it trains
        (``fleet.dataset.elastic``), so workers that join or are lost change the split.

        Raises:
            TypeError: files is not a list (Paddle's message).
        """
        if not isinstance(files, list):
            raise TypeError("files should be a list of file need to be read.")
        if elastic_range() is not None and not self.is_local():
            log.info("fleet.split_files: elastic job: every worker gets the %d files; the servers' work queue "
                     "splits them while the workers train", len(files))
            return list(files)
        trainers = self.worker_num()
        trainer_id = self.worker_index()
        blocksize = len(files) // trainers
        remainder = len(files) % trainers
        begin = trainer_id * blocksize + min(trainer_id, remainder)
        end = begin + blocksize + (1 if trainer_id < remainder else 0)
        return files[begin:end]

    def barrier_worker(self, timeout=None):
        """Blocks until every worker called it (timeout names the missing workers). A
        distributed worker first sends its queued updates, so after the barrier every
        worker's updates from before it are on the servers.

        Local training has one worker, so it returns at once.
        """
        self._rm()
        if self._runtime is not None and hasattr(self._runtime, "barrier_worker"):
            return self._runtime.barrier_worker(timeout)
        if not self.is_local() and self.worker_num() > 1:
            raise ConfigError("barrier_worker needs the workers connected: call fleet.init_worker() first")
        return None

    def _metric_group(self, what):
        """The group a global metric reduces over, or None when this process is the job's
        only worker (local training, fleet not initialized, a job of one worker).

        A communicator that trains over a worker group (collective training, hybrid) lends
        it; otherwise the workers of a parameter-server job form one from the role maker's
        worker endpoints on first use (a bounded wait for every worker), kept until
        ``stop_worker()``.

        Args:
            what: the caller, for errors (e.g. "fleet.metrics.auc").

        Raises:
            ConfigError: this process is a server, or the worker endpoints are unknown.
        """
        if not self._is_initialized:
            return None
        if self.is_server():
            raise ConfigError(
                f"{what} is for workers: this process is server {self.server_index()}, and servers hold no "
                f"metrics and do not join the workers' group; call it in the worker branch of the script "
                f"(if fleet.is_worker(): ...), on every worker")
        lent = self._runtime_group(what)
        if lent is not None:
            return lent
        if elastic_range() is not None and not self.is_local():
            comm = getattr(self._runtime, "comm", None)
            if not getattr(self._runtime, "started", False):
                raise ConfigError(f"{what} in an elastic job reduces over the live workers through server 0: call "
                                  f"it after fleet.init_worker() and before fleet.stop_worker()")
            return ServerReducer(comm)
        if self.is_local() or self.worker_num() == 1:
            return None
        with self._group_lock:
            if self._group is None:
                from fleet.transport.group import group_from_env

                log.info("%s: worker %d of %d joins the workers' group for global metrics (every worker "
                         "must call the same fleet.metrics functions in the same order)", what,
                         self.worker_index(), self.worker_num())
                try:
                    # A lost server fails the job: the group's waits end with that error (the
                    # ranks it took down would never answer) instead of at their timeout.
                    comm = getattr(self._runtime, "comm", None)
                    self._group = group_from_env(self._role_maker, alive_check=getattr(comm, "check_alive", None))
                except ServerLostError:
                    raise  # the job's failure, not the group's
                except FleetTimeoutError as e:
                    raise FleetTimeoutError(
                        f"{what}: the workers' group for global metrics did not form: {e}. Every worker makes the "
                        f"same fleet.metrics calls; a worker that makes none, or its first one more than "
                        f"FLEET_CONNECT_TIMEOUT_MS after the others, leaves them waiting") from e
            return self._group

    def _runtime_group(self, what):
        """The worker group this worker's communicator trains with (collective, hybrid:
        ``comm.uses_worker_group``), or None when it has none.

        Raises:
            ConfigError: the communicator uses a group, but it is not joined (before
                ``init_worker()`` or after ``stop_worker()``).
        """
        comm = getattr(self._runtime, "comm", None)
        if not getattr(comm, "uses_worker_group", False):
            return None
        group = getattr(comm, "group", None)
        if group is None:
            raise ConfigError(f"{what} runs over the workers' group this job trains with, which this worker has "
                              f"not joined: call it after fleet.init_worker() and before fleet.stop_worker()")
        return group

    def _close_group(self):
        with self._group_lock:
            group, self._group = self._group, None
        if group is not None:
            group.close()

    def _all_to_all(self, blobs):
        """Exchanges byte strings between workers (used by InMemoryDataset.global_shuffle)."""
        if self._runtime is not None and hasattr(self._runtime, "all_to_all"):
            return self._runtime.all_to_all(blobs)
        if self.worker_num() == 1:
            return list(blobs)
        raise ConfigError("exchanging data between workers needs fleet.init_worker() first")

    # ------------------------------------------------------------- building
    def distributed_optimizer(self, optimizer, strategy=None):
        """Wraps ``optimizer`` so that ``minimize`` builds this role's programs.

        Args:
            optimizer: a ``fleet.optimizer`` object.
            strategy: a strategy from ``DistributedStrategyFactory`` or a
                ``DistributeTranspilerConfig`` (default: sync, as Paddle 1.7).

        Raises:
            ValueError: fleet.init was not called, or optimizer is not an Optimizer.
            TypeError: strategy has the wrong type.
        """
        if not isinstance(optimizer, Optimizer):
            raise ValueError("optimizer must be an instance of Optimizer")
        if not self._is_initialized:
            raise ValueError(
                "use fleet.init(role) to initialize the role of current node before optimizer.minimize(loss)")
        if strategy is None:  # Paddle's default: sync with servers, all-reduce without
            strategy = (DistributedStrategyFactory.create_collective_strategy() if self._is_collective_role()
                        else DistributedStrategyFactory.create_sync_strategy())
        check_strategy(strategy, "pserver")
        self._check_roles_fit(strategy)
        self._optimizer = DistributedOptimizer(self, optimizer, strategy)
        return self._optimizer

    def _is_collective_role(self):
        """True for a worker of a job without servers (PaddleCloudRoleMaker(is_collective=True),
        UserDefinedCollectiveRoleMaker)."""
        return not self.is_local() and self.is_worker() and not self.server_endpoints()

    def _check_roles_fit(self, strategy):
        """Refuses a strategy the job's roles cannot run (servers without a use, or a
        parameter-server strategy without servers)."""
        if self.is_local():
            return
        mode = strategy_from_config(strategy).mode if isinstance(strategy, DistributeTranspilerConfig) \
            else strategy.mode
        if self._is_collective_role() and mode != "collective":
            raise ConfigError(
                f"this job has no parameter servers (a collective role maker: workers only), so it cannot train "
                f"with the {mode!r} strategy, which needs servers: use strategies.CollectiveStrategy() "
                f"(DistributedStrategyFactory.create_collective_strategy()), or start servers and use "
                f"PaddleCloudRoleMaker() (fleetrun --server_num N)")
        if mode == "collective" and self.server_endpoints():
            raise ConfigError(
                f"CollectiveStrategy trains without parameter servers, but this job has {self.server_num()} "
                f"({', '.join(self.server_endpoints())}): start the workers only (fleetrun --collective, "
                f"PaddleCloudRoleMaker(is_collective=True)), or use DistributedStrategyFactory."
                f"create_hybrid_strategy() to keep the embedding tables on the servers")

    def _transpile(self, strategy, loss):
        if isinstance(strategy, DistributeTranspilerConfig):
            strategy = strategy_from_config(strategy)
        self._strategy = strategy
        main = loss.block.program
        startup = main._paired or default_startup_program()
        main._build_strategy = strategy.get_build_strategy()
        self._origin_program = main.clone(for_test=False)
        if strategy.mode == "collective":
            _refuse_entries(main)
        if self.is_local():
            self.main_program, self.startup_program = main, startup
            local_tables.LOCAL.configure(main, strategy)
            return
        from fleet.runtime import build_runtime  # distributed roles only

        self._runtime = build_runtime(self, strategy, main, startup, self._optimizer._optimizer)
        self.main_program, self.startup_program = self._runtime.programs()

    # ------------------------------------------------------------- lifecycle
    def _need_minimize(self, what):
        if self.main_program is None:
            raise ValueError(f"{what} is None, need invoke DistributedOptimizer.minimize first")

    def init_server(self, model_dir=None):
        """Prepares this server's tables (optionally loaded from ``model_dir``)."""
        self._need_minimize("startup_program")
        if not self.is_server():
            raise ConfigError("init_server() is for servers; this process is a worker (check TRAINING_ROLE)")
        if model_dir is not None and not os.path.isdir(model_dir):
            raise ValueError(f"There is no directory named '{model_dir}'")
        self._runtime.init_server(model_dir)

    def run_server(self):
        """Serves until every worker has called ``stop_worker()``; blocks."""
        self._need_minimize("main_program")
        if not self.is_server():
            raise ConfigError("run_server() is for servers; this process is a worker (check TRAINING_ROLE)")
        self._runtime.run_server()

    def init_worker(self):
        """Connects to the servers (waiting for them, bounded) and pulls the initial
        parameters. A collective worker joins the other workers (bounded) and takes worker
        0's initial values. Local training has nothing to connect."""
        self._need_minimize("main_program")
        if self.is_server():
            raise ConfigError("init_worker() is for workers; this process is a server (check TRAINING_ROLE)")
        if self._runtime is not None:
            self._runtime.init_worker()

    def stop_worker(self):
        """Flushes pending updates and tells the servers this worker is done (a collective
        worker: has the last round with the other workers and leaves their group); closes
        the workers' group of ``fleet.metrics``, if one was made."""
        try:
            if self._runtime is not None and self.is_worker():
                self._runtime.stop_worker()
        finally:
            self._close_group()
        if self._executor is not None:
            self._executor.close()

    def shrink(self, threshold=None):
        """Decays, ages and evicts the rows of every table that keeps statistics (Paddle
        2.x's ``fleet.shrink``; call it once per day or pass): show and click are
        multiplied by show_click_decay_rate, unseen_days grows by one, and rows whose
        score falls below delete_threshold or unseen longer than
        delete_after_unseen_days are deleted (``SparseTable.shrink``).

        Distributed: every worker calls it; it flushes this worker's updates and waits
        for every worker, then the first worker makes every server shrink, and after a
        second barrier every worker returns the same counts. Locally: the local tables
        (``fleet.local_tables``) shrink.

        Args:
            threshold: Paddle's argument; the thresholds are the accessor's
                (``strategy.set_sparse_table_config(delete_threshold=...)``), so only None
                is accepted.

        Returns:
            {table: rows deleted} (summed over the servers).

        Raises:
            ConfigError: no table keeps statistics (no entry, no accessor config), a
                threshold, or a process that is a server or a collective worker.

        Blocks: until every worker called it and every server shrank (bounded by the
        barrier's and requests' timeouts).
        """
        if threshold is not None:
            raise ConfigError(f"fleet.shrink(threshold={threshold!r}): the eviction thresholds are the tables' "
                              f"accessor fields; set them with strategy.set_sparse_table_config("
                              f"delete_threshold=..., delete_after_unseen_days=...) and call fleet.shrink()")
        if self._is_initialized and not self.is_local():
            if self.is_server():
                raise ConfigError("fleet.shrink() is called by the workers (each of them); this process is a "
                                  "server, which shrinks when the first worker asks")
            if self._runtime is None or not hasattr(self._runtime, "shrink"):
                raise ConfigError("fleet.shrink() shrinks tables kept on parameter servers: build the program "
                                  "with a parameter-server strategy (fleet.distributed_optimizer(...).minimize) "
                                  "and call fleet.init_worker() first")
            return self._runtime.shrink()
        return local_tables.LOCAL.shrink()

    # ------------------------------------------------------------- saving
    def _persistable_names(self, program):
        return [v.name for v in program.list_vars() if v.persistable and not v.is_data]

    @staticmethod
    def _check_executor(executor, what):
        if type(executor).__name__ == "ParallelExecutor":
            raise TypeError(f"in fleet.{what}() function, executor must be as Executor type, "
                            f"ParallelExecutor is not allowed")
        if not isinstance(executor, Executor):
            raise TypeError(f"in fleet.{what}() function, executor must be as Executor type")

    @staticmethod
    def _check_program(program, what):
        if type(program).__name__ == "CompiledProgram":
            raise TypeError(f"in fleet.{what}() function, main_program must be as Program type, "
                            f"CompiledProgram is not allowed")
        if not isinstance(program, Program):
            raise TypeError(f"in fleet.{what}() function, main_program must be as Program type")

    def save_persistables(self, executor, dirname, main_program=None, mode=0, filename=None):
        """Saves every parameter and its optimizer state to ``dirname`` atomically (see
        ``fleet.framework.io``): complete, or not there at all. As Paddle lays it out,
        each variable is a file named as the variable, or with ``filename`` every
        variable is in that one file; ``MANIFEST.json`` holds the checksums.

        Locally: every persistable variable of the program. On a distributed worker:
        every parameter pulled whole from the servers with its optimizer state, every
        server's share of each distributed table (as ``<table>@ids`` / ``@values`` /
        ``<table>_<key>_0@values``), and this worker's own persistables; names are the
        ones local training uses, so local and distributed saves load into each other
        where shapes allow. Call it from one worker (``fleet.is_first_worker()``); it
        flushes this worker's queued updates first. In sync mode the save is exactly the
        state after this worker's last step (the other workers wait for this worker's
        next step, so the save must end within their FLEET_RPC_TIMEOUT_MS); in the other
        modes other workers keep training while it reads: each server's tables are read
        from snapshots opened on every server at once when the save starts (one instant
        per server), dense parameters block by block (a few updates apart).

        Save modes (Paddle 2.x's numbers; ``fleet.framework.save_chain``): 0 every row;
        1 a delta: of each table the rows changed since its previous save (of any mode,
        by ``save_persistables``) and ``<table>@deleted``, the ids deleted since; 2 a
        base: the rows of tables with statistics that pass base_threshold. Dense and
        ``is_sparse`` parameters are saved whole in every mode. A mode-0 or mode-2 save
        starts a chain, each delta extends it; ``fleet.init_server(dirname)`` (and
        ``load_persistables`` locally) on any save of a chain loads its base and every
        delta up to it. Checkpoints (``fleet.CheckpointConfig``) are full saves outside
        the chain: they never change what the next delta holds.

        Args:
            mode: 0, 1 or 2 (a str here is taken as ``filename``, the 4th argument of
                earlier versions).
            filename: one file for every variable (default: one file per variable).

        Returns:
            The directory written.

        Raises:
            TypeError: executor is not a fleet Executor, main_program not a Program
                (Paddle's messages).
            ConfigError: a mode other than 0, 1, 2; a delta with no save before it; mode
                2 without a table keeping statistics.
        """
        if isinstance(mode, str):  # save_persistables(exe, dirname, program, "params") of earlier versions
            if filename is not None:
                raise ConfigError(f"save_persistables got filename twice ({mode!r} as the 4th argument and "
                                  f"filename={filename!r}); pass mode=0|1|2 and filename=")
            mode, filename = 0, mode
        return self._save_persistables(executor, dirname, main_program, None, filename, mode=mode)

    def _check_trained(self, what):
        """Refuses a save of parameters nothing trained or loaded (they would be the
        initial values: the mark of a job that read no data).

        Fine when this process trained an example into the global scope (``exe.run`` of a
        training program, ``train_from_dataset``) or loaded values into it
        (``load_persistables``, ``load_checkpoint``, ``load_inference_model``); on a
        distributed worker also when the servers applied an update (from any worker) or
        loaded a checkpoint; and always with FLEET_SAVE_UNTRAINED=1.

        Raises:
            ConfigError: none of these holds (names the process and the way out).
        """
        scope = global_scope()
        if scope.trained_examples or scope.loaded_from is not None:
            return
        flag = os.environ.get(SAVE_UNTRAINED_ENV, "0").strip()
        if flag not in ("0", "1", ""):
            raise ConfigError(f"{SAVE_UNTRAINED_ENV}={flag!r} must be 0 or 1 (1: allow saving parameters "
                              f"that nothing trained or loaded)")
        if flag == "1":
            return
        job = ""
        if self._runtime is not None and hasattr(self._runtime, "job_progress"):
            updates, loaded = self._runtime.job_progress(what)
            if updates or loaded:
                return
            job = (f"worker {self.worker_index()} of {self.worker_num()}: ", ", the servers applied no update "
                   "from any worker and loaded no checkpoint (fleet.init_server(dirname))")
        who, servers = job or ("", "")
        raise ConfigError(
            f"{who}fleet.{what}() refused: this process trained no example (no exe.run of a training program "
            f"or train_from_dataset pass ran one) and loaded no model{servers}, so the save would hold the "
            f"initial parameters as if they were a trained model. Check that this process got data; to save "
            f"untrained parameters on purpose, set {SAVE_UNTRAINED_ENV}=1")

    def _save_persistables(self, executor, dirname, main_program, extra, filename=None, mode=0):
        mode = check_save_mode(mode)
        self._check_executor(executor, "save_persistables")
        program = main_program or self.main_program or default_main_program()
        self._check_program(program, "save_persistables")
        checkpoint = (extra or {}).get("kind") == "checkpoint"
        self._check_trained("save_checkpoint" if checkpoint else "save_persistables")
        meta = {"kind": "persistables", "save_id": uuid.uuid4().hex}
        meta.update(extra or {})
        if self._runtime is not None and hasattr(self._runtime, "save_persistables"):
            return self._runtime.save_persistables(dirname, program, meta, filename, mode=mode,
                                                   commit=not checkpoint)
        return self._save_local(dirname, program, meta, filename, mode, commit=not checkpoint)

    def _save_local(self, dirname, program, meta, filename, mode, commit):
        """The local save: the program's persistables from the global scope, and the local
        sparse tables (``fleet.local_tables``) read through snapshots."""
        scope = global_scope()
        tables = table_saves.program_tables(program)
        from_tables = table_saves.table_var_names(tables)
        parent, parent_dir = self._previous_local_save() if mode == DELTA else (None, None)
        meta["chain"] = new_link(mode, meta["save_id"], dirname, parent, parent_dir)
        arrays = {}
        for name in self._persistable_names(program):
            value = scope.value(name)
            if value is not None and name not in from_tables:  # a local table is saved from its snapshot
                arrays[name] = value
        meta.update(mode=getattr(self._runtime, "save_mode", "local"), program_vars=sorted(arrays),
                    strategy={"class": type(self._strategy).__name__} if self._strategy is not None else None)
        with table_saves.open_local_snapshots(tables, mode, commit) as snapshots:
            with fio.VarsWriter(dirname, meta, filename) as writer:
                for name, value in arrays.items():
                    writer.add(name, value)
                writer.extra["tables"] = table_saves.write_local_tables(writer, snapshots, mode)
        if commit:
            self._last_local_save = (meta["chain"], writer.dirname)
        return writer.dirname

    def _previous_local_save(self):
        """(chain record, directory) a local delta follows: the last committed local save,
        else the save loaded into the global scope, else (None, None)."""
        if getattr(self, "_last_local_save", None) is not None:
            return self._last_local_save
        loaded = global_scope().loaded_from
        if loaded and os.path.isfile(os.path.join(loaded, fio.MANIFEST)):
            return read_chain(loaded), loaded
        return None, None

    def load_persistables(self, executor, dirname, main_program=None, filename=None):
        """Loads what ``save_persistables`` wrote into the global scope, in place where the
        variable already exists (so arrays held by users stay live). ``filename`` is the
        one given when saving (the manifest records it, so None reads either layout).

        Locally: every persistable variable of the program (an ``is_sparse`` or
        ``is_distributed`` table saved by a distributed job, as ``<table>@ids`` /
        ``@values``, is scattered into the local table, whose size must hold every id);
        the local sparse tables (``fleet.local_tables``) take their rows,
        optimizer state and statistics. ``dirname`` may be any save of a chain
        (``save_persistables`` modes): the tables load its base, then every delta up to
        it, in order; other variables come from ``dirname`` itself (every save holds
        them whole).
        On a distributed worker: only the worker's own persistables (metric states;
        GEO's local optimizer state); the servers load parameters and optimizer state
        with ``fleet.init_server(dirname)``.

        Returns:
            The names loaded.

        Raises:
            ConfigError / DataError: missing directory, incomplete save, corrupt file,
                a variable the program needs that the save lacks.
        """
        self._check_executor(executor, "load_persistables")
        program = main_program or self.main_program or default_main_program()
        self._check_program(program, "load_persistables")
        check_saved_filename(dirname, filename)
        global_scope().loaded_from = os.path.abspath(dirname)
        if self._runtime is not None and hasattr(self._runtime, "load_persistables"):
            return self._runtime.load_persistables(dirname, program)
        return self._load_local(dirname, program)

    def _load_local(self, dirname, program, delta_only=False):
        """Local load: the program's variables from ``dirname`` into the global scope, the
        local tables from its chain (``delta_only``: the one delta at ``dirname`` applied
        onto them). The next local delta follows this save."""
        tables = table_saves.program_tables(program)
        chain = None if delta_only else resolve_chain(dirname)
        from_tables = table_saves.table_var_names(tables)
        names = [n for n in self._persistable_names(program) if n not in from_tables]
        manifest = fio.read_manifest(dirname)
        saved = manifest["vars"]
        by_id = [n for n in names if n not in saved and _id_keyed(n, saved) is not None]
        missing = [n for n in names if n not in saved and n not in by_id]
        if missing:
            raise ConfigError(
                f"{dirname!r} lacks {missing[:5]} of this program; it was saved from a "
                f"different model")
        values = fio.read_vars(dirname, [n for n in names if n in saved])
        scope = global_scope()
        scattered = {n: _scatter_by_id(dirname, n, _id_keyed(n, saved), scope) for n in by_id}
        for name, value in values.items():
            current = scope.value(name)
            if current is not None and getattr(current, "shape", None) == value.shape:
                current[...] = value
            else:
                scope[name] = value
        for name, value in scattered.items():
            scope.value(name)[...] = value
        if delta_only:
            table_saves.apply_local_delta(fio.VarsReader(dirname), tables)
        else:
            table_saves.load_local_tables(chain, tables)
        self._last_local_save = (read_chain(dirname), os.path.abspath(dirname))
        return sorted(values) + sorted(scattered) + sorted(tables)

    def load_model(self, path, mode=0, main_program=None):
        """Loads a save while the job runs (Paddle 2.x's ``fleet.load_model``): the
        explicit way to apply deltas as they arrive.

        Args:
            path: a directory written by ``save_persistables`` (any save of a chain).
            mode: 0 the save replaces what the tables hold (a delta: its base, then every
                delta up to it); 1 the one delta at ``path`` is applied onto the tables,
                and must follow the save they hold (the last one loaded or committed).
            main_program: locally, the program whose variables and tables to load
                (default: the one ``minimize`` built, else the default main program).

        On a distributed worker every server loads (``WorkerRuntime.load_model``; call it
        from one worker while no worker trains); locally the local tables and the
        program's variables (as ``load_persistables``). The next delta saved follows
        ``path``.

        Returns:
            The absolute path loaded.

        Raises:
            ConfigError: a server process, a mode other than 0 or 1, a broken chain, or a
                delta that does not follow the save the tables hold (names both).
        """
        self._rm()
        if self.is_server():
            raise ConfigError("fleet.load_model() is for workers (servers load a save with fleet.init_server(dirname)); "
                              "call it on one worker")
        if self._runtime is not None and hasattr(self._runtime, "load_model"):
            return self._runtime.load_model(path, mode)
        if mode not in (0, 1) or isinstance(mode, bool):
            raise ConfigError(f"load_model mode {mode!r} is not 0 (load the save, and its chain) or 1 (apply one "
                              f"delta onto the save loaded last)")
        program = main_program or self.main_program or default_main_program()
        self._check_program(program, "load_model")
        if mode == 1:
            record, dirname = self._previous_local_save()
            check_next_delta(fio.VarsReader(path), {"save_id": record and record["save_id"], "dirname": dirname},
                             "the local tables")
        self._load_local(path, program, delta_only=mode == 1)
        global_scope().loaded_from = os.path.abspath(path)
        return os.path.abspath(path)

    def save_inference_model(self, executor, dirname, feeded_var_names, target_vars, main_program=None,
                             export_for_deployment=True, model_filename=None, params_filename=None,
                             program_only=False):
        """Saves a program that computes ``target_vars`` from ``feeded_var_names``, with
        the parameters it reads, atomically; ``fleet.load_inference_model`` reads it back
        and predicts with a plain Executor, no servers needed.

        Args:
            executor: a fleet Executor.
            dirname: the directory to write.
            feeded_var_names: names of the inputs (a str or a list of str).
            target_vars: the Variables to predict (one or a list).
            main_program: the program to prune (default: the program as built before
                ``minimize`` split it for the servers).
            export_for_deployment: prune to what the targets need (else a whole test
                clone of the program is saved).
            model_filename: the program's file (Paddle's default ``__model__``).
            params_filename: one file for every variable (default: one file per
                variable, named as the variable, as Paddle).
            program_only: save the program only.

        The directory is Paddle's layout: ``__model__`` holds the program (fleet's JSON
        format: ``fleet.Program.parse_from_string`` reads it), each parameter is a file
        named as the parameter, and ``MANIFEST.json`` holds the checksums and the feed
        and fetch names.

        On a distributed worker the parameters are pulled whole from the servers and a
        distributed table is saved as ``<table>@ids`` / ``<table>@values``: in the loaded
        program an id the table does not hold reads as a zero row, as a server answers
        an unseen id under ``is_test``.

        Returns:
            The directory written.

        Raises:
            TypeError: Paddle's messages for a wrong executor or program type.
            ValueError: feed names or targets of the wrong type (Paddle's messages).
            ConfigError: a target needs an input that is not fed.
        """
        self._check_executor(executor, "save_inference_model")
        if main_program is not None:
            self._check_program(main_program, "save_inference_model")
        program = main_program or self._origin_program or default_main_program()
        pruned, feeds, fetches = inference_program(program, feeded_var_names, target_vars,
                                                   export_for_deployment)  # checks the arguments first
        if not program_only:
            self._check_trained("save_inference_model")
        if self._runtime is not None and hasattr(self._runtime, "save_inference_model"):
            return self._runtime.save_inference_model(dirname, pruned, feeds, fetches, model_filename,
                                                      params_filename, program_only)
        save_inference_model(dirname, feeded_var_names, target_vars, program,
                             export_for_deployment=export_for_deployment, model_filename=model_filename,
                             params_filename=params_filename, program_only=program_only)
        return os.path.abspath(dirname)

    def load_inference_model(self, dirname, executor=None, model_filename=None, params_filename=None):
        """Loads an inference model into the global scope.

        Args:
            dirname: the saved directory.
            executor: a fleet Executor, or None.
            model_filename / params_filename: the file names given when saving.

        Returns:
            [program, feed_names, fetch_targets], as Paddle's
            ``fluid.io.load_inference_model``: ``exe.run(program, feed={...},
            fetch_list=fetch_targets)`` predicts.

        Raises:
            ConfigError: not an inference model, or other file names than the save's.
            DataError: a damaged file (names it).
        """
        if executor is not None:
            self._check_executor(executor, "load_inference_model")
        loaded = load_inference_model(dirname, executor, model_filename, params_filename)
        global_scope().loaded_from = os.path.abspath(dirname)
        return loaded


def _refuse_entries(program):
    """Collective training keeps every table on every worker: admission and statistics,
    which need one place that sees every worker's lookups, are refused.

    Raises:
        ConfigError: a table with an entry (names it and the strategy to use).
    """
    for param in program.all_parameters():
        if getattr(param, "entry", None):
            raise ConfigError(
                f"table {param.name!r} has entry {param.entry!r}, which needs one table that sees every worker's "
                f"lookups; CollectiveStrategy keeps a copy on each worker: use "
                f"DistributedStrategyFactory.create_hybrid_strategy() (tables on parameter servers)")


def check_saved_filename(dirname, filename):
    """Checks that ``filename`` (given to a load) is the combined file the save at
    ``dirname`` has (None: any layout).

    Raises:
        ConfigError: the save has another layout (names the argument to pass).
    """
    if filename is None:
        return
    saved = sorted(fio.read_manifest(dirname).get("combined", {}))
    if saved != [os.path.basename(filename)]:
        how = f"filename={saved[0]!r}" if saved else "one file per variable (filename=None)"
        raise ConfigError(f"{dirname!r} holds no file {filename!r}; it was saved with {how}: pass that "
                          f"to load_persistables")


def _id_keyed(name, saved):
    """For a table variable saved keyed by id (``<table>@ids`` + ``<name>@values``),
    returns the table name, else None."""
    if name + "@values" not in saved:
        return None
    parts = name.split("_")
    for end in range(len(parts), 0, -1):
        table = "_".join(parts[:end])
        if table + "@ids" in saved:
            return table
    return None


def _scatter_by_id(dirname, name, table, scope):
    """The local value of ``name`` with the rows a distributed save holds put in place."""
    current = scope.value(name)
    if current is None or getattr(current, "ndim", 0) != 2:
        raise ConfigError(f"{name!r} must exist as a [rows, width] table before loading {dirname!r} into it; "
                          f"run the startup program first")
    saved = fio.read_vars(dirname, [table + "@ids", name + "@values"])
    ids, rows = saved[table + "@ids"], saved[name + "@values"]
    if rows.shape[1:] != current.shape[1:]:
        raise ConfigError(f"{dirname!r}: {name + '@values'!r} has rows of shape {list(rows.shape[1:])}, "
                          f"the local {name!r} {list(current.shape[1:])}")
    if len(ids) and (ids.min() < 0 or ids.max() >= current.shape[0]):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise ConfigError(f"{dirname!r}: table {table!r} holds id {bad}, outside the local table's "
                          f"[0, {current.shape[0]}); enlarge the embedding's size[0] to load it")
    value = np.array(current, copy=True)
    value[ids] = rows
    return value


class DistributedOptimizer:
    """What ``fleet.distributed_optimizer`` returns: ``minimize`` runs the wrapped
    optimizer, then builds this role's programs."""

    def __init__(self, fleet, optimizer, strategy):
        self._fleet = fleet
        self._optimizer = optimizer
        self._strategy = strategy

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        return self._optimizer.backward(loss, startup_program, parameter_list, no_grad_set)

    def apply_gradients(self, params_grads):
        return self._optimizer.apply_gradients(params_grads)

    def minimize(self, loss, scopes=None, startup_program=None, parameter_list=None,
                 no_grad_set=None):
        """Appends backward and optimizer ops, then prepares this role's programs.

        Returns:
            (optimize_ops, params_grads).
        """
        if isinstance(loss, list):
            raise TypeError("DistributedTranspiler's minimize can not accept loss with list")
        if isinstance(startup_program, list):
            raise TypeError("DistributedTranspiler's minimize can not accept program with list")
        result = self._optimizer.minimize(loss, startup_program, parameter_list, no_grad_set)
        self._fleet._transpile(self._strategy, loss)
        return result


fleet = Fleet()
