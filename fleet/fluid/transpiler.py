"""Paddle 1.x's ``fluid.DistributeTranspiler`` on fleet's transpiler and runtime (the ones
``fleet.distributed_optimizer(...).minimize`` uses).

The manual's script works unchanged::

    t = fluid.DistributeTranspiler(config=config)
    t.transpile(trainer_id, pservers="10.0.0.1:6174,10.0.0.2:6174", trainers=2)
    if role == "PSERVER":
        prog = t.get_pserver_program(current_endpoint)
        startup = t.get_startup_program(current_endpoint, prog)
        exe.run(startup)            # this server's share of the parameters, initialized
        exe.run(prog)               # serves until every trainer called exe.close()
    else:
        prog = t.get_trainer_program()   # waits for the servers (bounded), pulls parameters
        exe.run(fluid.default_startup_program())
        ... exe.run(prog, feed=..., fetch_list=[loss]) ...
        exe.close()                 # tells the servers this trainer is done

The mode comes from the config and ``sync_mode``: sync (the default) averages every
trainer's gradients on the servers each step; ``sync_mode=False`` (or
``config.sync_mode = False``) sends each step's gradients and pulls the parameters back,
the servers applying them on arrival (fleet's half-async communicator with one thread,
the shape of Paddle's RPC async); ``config.runtime_split_send_recv = True`` is fleet's
async communicator; ``geo_sgd_mode`` GEO (``strategies.strategy_from_config`` decides, as
for ``fleet.distributed_optimizer``).
"""
import numpy as np

from fleet.base import Fleet
from fleet.errors import ConfigError, RoleError
from fleet.framework.program import OPTIMIZE, Program, default_main_program, default_startup_program
from fleet.framework.registry import OpDef, register_op
from fleet.runtime import ServerRuntime, WorkerRuntime
from fleet.transpiler.plan import build_plan
from role_makers import Role, UserDefinedRoleMaker
from strategies import DistributeTranspilerConfig, strategy_from_config


@register_op
class InitServer(OpDef):
    """The pserver startup program's op: creates this server's tables, initialized."""

    type = "fluid_pserver_init"

    def forward(self, ctx):
        _server_runtime(ctx).init_server()


@register_op
class ListenAndServ(OpDef):
    """The pserver program's op: serves until every trainer has finished (blocks)."""

    type = "fluid_listen_and_serv"

    def forward(self, ctx):
        _server_runtime(ctx).run_server()


def _server_runtime(ctx):
    runtime = getattr(ctx.op.block.program, "_pserver_runtime", None)
    if runtime is None:
        raise ConfigError("this pserver program has no server behind it: get it from "
                          "DistributeTranspiler.get_pserver_program(endpoint) in this process")
    return runtime


class DistributeTranspiler:
    """Turns a program with optimizer ops into a trainer's and a parameter server's programs
    (Paddle's ``fluid.DistributeTranspiler``; pserver mode only).

    Args:
        config: a ``DistributeTranspilerConfig`` (default: a new one: sync, RoundRobin
            placement, min_block_size 8192).

    Raises:
        TypeError: config is not a DistributeTranspilerConfig.
    """

    def __init__(self, config=None):
        if config is None:
            config = DistributeTranspilerConfig()
        if not isinstance(config, DistributeTranspilerConfig):
            raise TypeError(f"config must be a fluid.DistributeTranspilerConfig, got {type(config).__name__}")
        self.config = config
        self._plan = None
        self._worker = None
        self._servers = {}  # endpoint -> (pserver program, ServerRuntime)

    # ------------------------------------------------------------- transpile
    def transpile(self, trainer_id, program=None, pservers="127.0.0.1:6174", trainers=1, sync_mode=True,
                  startup_program=None, current_endpoint="127.0.0.1:6174"):
        """Plans where every parameter lives (the same on every process of the job).

        Args:
            trainer_id: this trainer's index in [0, trainers) (ignored on a pserver).
            program / startup_program: the programs after ``optimizer.minimize`` (default:
                the default main and startup programs).
            pservers: "ip:port,ip:port,..." of every server, in server order.
            trainers: the number of trainers (an int; Paddle's NCCL2 endpoint string is
                not supported).
            sync_mode: False trains without waiting for the other trainers (see the
                module docstring); training is sync only when this and
                ``config.sync_mode`` are both True.
            current_endpoint: accepted (Paddle uses it in NCCL2 mode only).

        Raises:
            ConfigError: bad endpoints, trainer counts or ids, or a program without
                optimizer ops (call ``optimizer.minimize(loss)`` first).
        """
        if self.config.mode != "pserver":
            raise ConfigError(f"DistributeTranspilerConfig.mode={self.config.mode!r}: fluid's "
                              f"DistributeTranspiler transpiles for parameter servers only (mode 'pserver'); "
                              f"train collectively with the Fleet API: fleet.init(PaddleCloudRoleMaker("
                              f"is_collective=True)) and fleet.distributed_optimizer(opt, CollectiveStrategy())")
        if isinstance(trainers, str) or isinstance(trainers, bool) or not isinstance(trainers, (int, np.integer)):
            raise ConfigError(f"trainers={trainers!r} must be the number of trainers (an int >= 1); a list "
                              f"of trainer endpoints is Paddle's NCCL2 mode, which fleet does not run")
        if trainers < 1:
            raise ConfigError(f"trainers={trainers} must be >= 1")
        if isinstance(trainer_id, bool) or not isinstance(trainer_id, (int, np.integer)) \
                or not 0 <= trainer_id < trainers:
            raise ConfigError(f"trainer_id={trainer_id!r} must be an int in [0, {trainers}) "
                              f"(PADDLE_TRAINER_ID with PADDLE_TRAINERS={trainers})")
        if not isinstance(pservers, str) or not pservers.strip():
            raise ConfigError(f"pservers={pservers!r} must be a comma list of ip:port, e.g. "
                              f"'127.0.0.1:6174,127.0.0.1:6175'")
        endpoints = [e.strip() for e in pservers.split(",")]
        try:  # the role maker's checks of endpoints: host:port, no duplicates
            UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=int(trainers),
                                 server_endpoints=endpoints).generate_role()
        except (RoleError, TypeError) as e:
            raise ConfigError(f"pservers={pservers!r}: {e}") from e
        program = default_main_program() if program is None else program
        startup_program = default_startup_program() if startup_program is None else startup_program
        for what, prog in (("program", program), ("startup_program", startup_program)):
            if not isinstance(prog, Program):
                raise ConfigError(f"{what} must be a fluid.Program, got {type(prog).__name__}")
        self._strategy = strategy_from_config(self._effective_config(bool(sync_mode)))
        if program._build_strategy is None:  # Reduce when CPU_NUM > 1, as the fleet API
            program._build_strategy = self._strategy.get_build_strategy()
        self._plan = build_plan(program, self._strategy, endpoints, int(trainers))
        self._main = program
        self._startup = startup_program
        self._origin_startup = startup_program.clone(for_test=False)
        self._trainer_id = int(trainer_id)
        self._trainers = int(trainers)
        self._endpoints = endpoints

    def _effective_config(self, sync_mode):
        config = DistributeTranspilerConfig()
        values = {k: getattr(self.config, k) for k in DistributeTranspilerConfig.keys()}
        # runtime_split_send_recv may only be set once sync_mode is False (Paddle's rule).
        split = values.pop("runtime_split_send_recv")
        values["sync_mode"] = bool(values["sync_mode"] and sync_mode and not split)
        config.update(values)
        config.runtime_split_send_recv = split
        return config

    def _need_transpiled(self, what):
        if self._plan is None:
            raise ConfigError(f"{what} needs transpile(trainer_id, pservers=..., trainers=...) first")

    @property
    def mode(self):
        """The training mode chosen by ``transpile``: "sync", "half_async", "async" or "geo"."""
        self._need_transpiled("mode")
        return self._strategy.mode

    # ------------------------------------------------------------- trainer
    def get_trainer_program(self, wait_port=True):
        """The trainer's program: gradients go to the servers instead of a local optimizer.

        This connects to the servers (waiting for them up to FLEET_CONNECT_TIMEOUT_MS, as
        Paddle's ``wait_port`` does; fleet needs the connection to pull the initial
        parameters, so it waits whatever ``wait_port`` says) and pulls the parameters
        they own. The startup program given to ``transpile`` stops initializing those
        parameters (as Paddle's transpiled startup receives them instead), so running it
        afterwards keeps the pulled values. ``exe.close()`` on an executor that ran the
        returned program tells the servers this trainer is done.

        Returns:
            The trainer Program (the same one on every call).

        Raises:
            ConfigError: ``transpile`` was not called. FleetTimeoutError: a server did
                not answer in time (names it).
        """
        self._need_transpiled("get_trainer_program")
        if self._worker is not None:
            return self._worker.program
        role = UserDefinedRoleMaker(current_id=self._trainer_id, role=Role.WORKER, worker_num=self._trainers,
                                    server_endpoints=self._endpoints)
        fleet = Fleet().init(role)
        worker = WorkerRuntime(fleet, self._strategy, self._plan, self._main, self._origin_startup)
        worker.init_worker()
        self._keep_local_initializers(worker.startup)
        worker.program._on_executor_close = [worker.stop_worker]
        worker.program._fleet_runtime = worker  # fluid.io saves through it
        worker.program._fleet_origin_program = self._main
        self._worker = worker
        return worker.program

    def _keep_local_initializers(self, worker_startup):
        """Drops from the user's startup program the initializers of what the servers own."""
        block = self._startup.global_block()
        owned = set(block.vars) - set(worker_startup.global_block().vars)
        block.ops[:] = [op for op in block.ops if not set(op.output_arg_names) & owned]
        for name in owned:
            block.vars.pop(name, None)
        self._startup._bump()

    # ------------------------------------------------------------- pserver
    def get_pserver_program(self, endpoint):
        """The program of the server at ``endpoint``: ``exe.run`` of it serves the trainers
        and returns once every trainer has finished (called ``exe.close()``).

        Raises:
            ConfigError: ``endpoint`` is not one of the pservers given to ``transpile``.
        """
        return self._server(endpoint)[0]

    def get_startup_program(self, endpoint, pserver_program=None, startup_program=None):
        """The startup program of the server at ``endpoint``: ``exe.run`` of it creates the
        server's share of every parameter, initialized as the startup program says.

        Raises:
            ConfigError: ``endpoint`` is not a pserver of ``transpile``, or
                ``pserver_program`` is not this endpoint's program.
        """
        program, runtime = self._server(endpoint)
        if pserver_program is not None and pserver_program is not program:
            raise ConfigError(f"pserver_program is not the program of {endpoint!r}: pass "
                              f"t.get_pserver_program({endpoint!r})")
        startup = Program()
        startup.global_block().append_op("fluid_pserver_init", {}, {}, {"op_role": OPTIMIZE})
        startup._pserver_runtime = runtime
        return startup

    def get_pserver_programs(self, endpoint):
        """Returns (pserver program, pserver startup program) of ``endpoint``."""
        program = self.get_pserver_program(endpoint)
        return program, self.get_startup_program(endpoint, program)

    def _server(self, endpoint):
        self._need_transpiled("get_pserver_program")
        if endpoint not in self._endpoints:
            raise ConfigError(f"endpoint {endpoint!r} is not one of the pservers {self._endpoints} given to "
                              f"transpile; pass PADDLE_CURRENT_IP:PADDLE_PSERVER_PORT of this server")
        if endpoint not in self._servers:
            role = UserDefinedRoleMaker(current_id=self._endpoints.index(endpoint), role=Role.SERVER,
                                        worker_num=self._trainers, server_endpoints=self._endpoints)
            fleet = Fleet().init(role)
            runtime = ServerRuntime(fleet, self._strategy, self._plan, self._main, self._origin_startup)
            program = Program()
            program.global_block().append_op("fluid_listen_and_serv", {}, {}, {"op_role": OPTIMIZE,
                                                                               "endpoint": endpoint})
            program._pserver_runtime = runtime
            self._servers[endpoint] = (program, runtime)
        return self._servers[endpoint]
