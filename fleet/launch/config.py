"""What a fleetrun job is: the frozen `LaunchConfig`, and each process's environment."""
from __future__ import annotations

import dataclasses
import math
import os

from fleet.endpoints import parse_endpoint
from fleet.elastic import ELASTIC_ENV, EXPECTED_ENV
from fleet.errors import ConfigError
from fleet.telemetry import METRICS_PORT_ENV
from fleet.transport.curve import KEYS_DIR_ENV
from fleet.transport.settings import BIND_HOST_ENV

EXIT_OK = 0
EXIT_PROCESS_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124

# Set in every process under --max_restarts (torchrun's TORCHELASTIC_RESTART_COUNT and
# TORCHELASTIC_MAX_RESTARTS, in fleet's namespace).
RESTART_COUNT_ENV = "FLEET_RESTART_COUNT"
MAX_RESTARTS_ENV = "FLEET_MAX_RESTARTS"

ROLE_VARIABLES = (
    "TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT",
)
# Read by Paddle's other role makers; removed so a value left in the launcher's own
# environment cannot contradict the role fleetrun gives.
STALE_VARIABLES = ("PADDLE_TRAINING_ROLE", "PADDLE_CURRENT_ENDPOINT", "PADDLE_PSERVER_ID")
# Thread counts of the BLAS pools; set per process unless the user set any of them.
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# After the first failure, how long the others may take to exit by themselves (see the
# LaunchConfig docstring for why 3 s and not the heartbeat timeout).
DEFAULT_FAILURE_GRACE = 3.0


def check_restart_options(max_restarts, restart_from_scratch):
    """Checks --max_restarts K and --restart_from_scratch (one-host, per-host and --hosts jobs).

    Raises:
        ConfigError: K is not a whole number >= 0, or --restart_from_scratch without K >= 1.
    """
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"--max_restarts {max_restarts!r} must be a whole number >= 0 (0: the "
                          "first failure ends the job)")
    if restart_from_scratch and not max_restarts:
        raise ConfigError("--restart_from_scratch only matters with --max_restarts K (K >= 1): give "
                          "both, or neither")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """What fleetrun starts and how it watches it. Validated on construction.

    Attributes:
        training_script: path of the Python script every process runs.
        script_args: arguments given to the script.
        server_endpoints: "host:port" of each parameter server; empty for local training.
        worker_endpoints: "host:port" of each worker (PADDLE_TRAINER_ENDPOINTS); empty
            for local training, at least one otherwise.
        log_dir: directory of serverlog.N and workerlog.N.
        server_exit_timeout: seconds servers may take to exit after every worker exited 0.
        kill_timeout: seconds between SIGTERM and SIGKILL when stopping a process.
        timeout: seconds the whole job may run, or None for no limit.
        failure_grace: seconds the other processes may take to exit by themselves after
            the first failure before they are stopped; 0 stops them at once. None (the
            default) means DEFAULT_FAILURE_GRACE (3 s): long enough for processes told of
            a reported failure to exit saying what they saw, short enough that survivors
            of a silent death (SIGKILL, noticed by heartbeats only after
            FLEET_HEARTBEAT_TIMEOUT_MS) do not go on training and saving meanwhile.
        local_servers, local_workers: in a job that spans several hosts, the global
            indexes of the servers and workers this host starts (see
            `fleet.launch.this_host.place`); None (the default): every process of the job
            runs here.
        host: this host's address in a multi-host job, for messages and the result file.
        bind_any: indexes of local servers that bind the wildcard address (FLEET_BIND_HOST)
            because their endpoint's address is not on an interface here.
        bind_any_workers: the same for local workers (a worker binds its endpoint for the
            workers' group of collective and hybrid training and of global metrics).
        keys_dir: a CURVE key directory every process gets as FLEET_CURVE_KEYS_DIR (see
            `fleet.transport.curve`); None leaves the environment as it is.
        stop_on_stdin_eof: stop every process, as for SIGHUP, when fleetrun's standard
            input reaches end of file (the dispatching fleetrun --hosts or its ssh
            connection is gone).
        result_json: a file to write at the end: how the job here ended, as JSON.
        metrics_port: the base port of the processes' metrics endpoints (each gets
            FLEET_METRICS_PORT: server i BASE+i, worker j BASE+servers+j, on its own host;
            local training: BASE), or None to leave FLEET_METRICS_PORT as it is.
        live_summary: every this many seconds print one line about the processes here,
            read from their metrics endpoints (needs metrics_port), or None.
        collective: a collective job (``fleetrun --collective``): workers only, each with
            the variables of ``PaddleCloudRoleMaker(is_collective=True)``.
        max_restarts: after a process fails, stop every process here and start them all
            again, up to this many times (``fleetrun --max_restarts``; see
            `fleet.launch.restart`); 0 (the default): the first failure ends the job.
        restart_from_scratch: restart even when no process of the job made a
            ``fleet.CheckpointConfig`` (the restarted job trains from the start).
        elastic: (MIN, MAX) of an elastic job (``fleetrun --np MIN:MAX``, see
            ``fleet.launch.elastic``), or None. ``worker_endpoints`` then lists MAX slots,
            every process gets FLEET_ELASTIC=MIN:MAX, and ``initial_workers`` of them start.
        initial_workers: elastic jobs: workers started at first (MIN..MAX; default MIN). In
            a multi-host elastic job (``local_workers`` given, e.g. by a rendezvous) this host
            starts its ``local_workers`` and ``initial_workers`` is their count.
        worker_replacements: elastic jobs: how many lost workers fleetrun restarts in
            total, each under its lost id (0: a lost worker's share goes to the others).
        expected_workers: elastic jobs: the worker ids the servers count as training from
            the start (FLEET_ELASTIC_EXPECTED; a round of an etcd job, whose slots are the
            hosts' kept ids), or None for 0..MIN-1.

    Raises:
        ConfigError: a value is malformed; the message names it and the fix.
    """

    training_script: str
    script_args: tuple[str, ...] = ()
    server_endpoints: tuple[str, ...] = ()
    worker_endpoints: tuple[str, ...] = ()
    log_dir: str = "log"
    server_exit_timeout: float = 30.0
    kill_timeout: float = 10.0
    timeout: float | None = None
    failure_grace: float | None = None
    local_servers: tuple[int, ...] | None = None
    local_workers: tuple[int, ...] | None = None
    host: str | None = None
    bind_any: tuple[int, ...] = ()
    bind_any_workers: tuple[int, ...] = ()
    keys_dir: str | None = None
    stop_on_stdin_eof: bool = False
    result_json: str | None = None
    metrics_port: int | None = None
    live_summary: float | None = None
    collective: bool = False
    max_restarts: int = 0
    restart_from_scratch: bool = False
    elastic: tuple[int, int] | None = None
    initial_workers: int | None = None
    worker_replacements: int = 0
    expected_workers: tuple[int, ...] | None = None

    def __post_init__(self):
        for name in ("script_args", "server_endpoints", "worker_endpoints"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not isinstance(self.training_script, str) or not self.training_script:
            raise ConfigError(f"training_script={self.training_script!r}: give the path "
                              "of the Python script to run")
        for role, endpoints in (("server", self.server_endpoints),
                                ("worker", self.worker_endpoints)):
            for i, endpoint in enumerate(endpoints):
                parse_endpoint(endpoint, f"{role} {i}'s endpoint")
        if self.server_endpoints and not self.worker_endpoints:
            raise ConfigError(f"{len(self.server_endpoints)} servers and no worker: servers "
                              "wait for workers forever; give at least one worker endpoint")
        if self.collective and self.server_endpoints:
            raise ConfigError(f"a collective job has no servers, got server_endpoints="
                              f"{list(self.server_endpoints)}; drop --servers/--server_num or --collective")
        if self.collective and not self.worker_endpoints:
            raise ConfigError("a collective job needs at least one worker endpoint (--worker_num N)")
        if not self.server_endpoints and len(self.worker_endpoints) > 0 and not self.collective:
            raise ConfigError(f"worker_endpoints={list(self.worker_endpoints)} without servers: "
                              "local training runs one process with no endpoints; give server "
                              "endpoints to train with several workers")
        _check_unique(self.server_endpoints, self.worker_endpoints)
        for name, count in (("local_servers", len(self.server_endpoints)),
                            ("local_workers", len(self.worker_endpoints))):
            indexes = getattr(self, name)
            if indexes is None:
                continue
            object.__setattr__(self, name, tuple(indexes))
            bad = [i for i in indexes if not (isinstance(i, int) and 0 <= i < count)]
            if bad or len(set(indexes)) != len(indexes):
                raise ConfigError(f"{name}={list(indexes)}: each must be a distinct index in "
                                  f"0..{count - 1} of the job's {name.split('_')[1]}")
        if (self.local_servers is None) != (self.local_workers is None):
            raise ConfigError("give both local_servers and local_workers (a multi-host job) or "
                              "neither (every process runs here)")
        for name, role in (("bind_any", "server"), ("bind_any_workers", "worker")):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not set(getattr(self, name)) <= set(self.here(role)):
                raise ConfigError(f"{name}={list(getattr(self, name))} names {role}s that do not run here")
        for name in ("server_exit_timeout", "kill_timeout", "timeout"):
            value = getattr(self, name)
            if value is None and name == "timeout":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} {value!r} (--{name}) must be a positive number "
                                  "of seconds")
        if self.metrics_port is not None:
            last = self.metrics_port + max(1, len(self.server_endpoints) + len(self.worker_endpoints)) - 1
            if not isinstance(self.metrics_port, int) or not 1 <= self.metrics_port or last > 65535:
                raise ConfigError(f"--metrics_port {self.metrics_port!r} leaves no room for a port per process "
                                  f"(server i gets BASE+i, worker j BASE+servers+j); give a port in "
                                  f"1..{65535 - (last - self.metrics_port)}")
        if self.live_summary is not None:
            value = self.live_summary
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"--live_summary {value!r} must be a positive number of seconds")
            if self.metrics_port is None:
                raise ConfigError("--live_summary reads the processes' metrics endpoints: give --metrics_port "
                                  "BASE too (server i then serves on BASE+i, worker j on BASE+servers+j)")
        check_restart_options(self.max_restarts, self.restart_from_scratch)
        _check_elastic(self)
        if self.failure_grace is None:
            object.__setattr__(self, "failure_grace", DEFAULT_FAILURE_GRACE)
        grace = self.failure_grace
        if not isinstance(grace, (int, float)) or not math.isfinite(grace) or grace < 0:
            raise ConfigError(f"failure_grace {grace!r} (--failure_grace) must be a number of "
                              "seconds >= 0 (0 stops the other processes at once)")

    def metrics_port_of(self, role, index):
        """The metrics port of a process (server i: BASE+i, worker j: BASE+servers+j), or None."""
        if self.metrics_port is None:
            return None
        return self.metrics_port + (index if role == "server" else len(self.server_endpoints) + index)

    @property
    def is_local(self) -> bool:
        """True when no servers are configured: one plain process, local training."""
        return not self.server_endpoints and not self.collective

    @property
    def multi_host(self) -> bool:
        """True when only some of the job's processes run here (the others on other hosts)."""
        return self.local_servers is not None

    def here(self, role):
        """Global indexes of the processes of ``role`` ("server"/"worker") started here."""
        local = self.local_servers if role == "server" else self.local_workers
        if local is not None:
            return local
        if role == "worker" and self.is_local:
            return (0,)
        if role == "worker" and self.elastic is not None:
            return tuple(range(self.initial_workers))
        return tuple(range(len(self.server_endpoints if role == "server" else self.worker_endpoints)))


def _check_elastic(config):
    """Validates the elastic fields of a LaunchConfig (and sets initial_workers)."""
    if config.elastic is None:
        if config.initial_workers is not None or config.worker_replacements:
            raise ConfigError("initial_workers and worker_replacements are for elastic jobs: give elastic=(MIN, MAX) "
                              "(fleetrun --np MIN:MAX)")
        return
    low, high = config.elastic
    object.__setattr__(config, "elastic", (int(low), int(high)))
    if config.collective or config.is_local:
        raise ConfigError(f"--np {low}:{high} makes a parameter-server job elastic; a "
                          f"{'collective' if config.collective else 'local'} job cannot be: give --server_num 1 or "
                          f"more, without --collective")
    if len(config.worker_endpoints) != high:
        raise ConfigError(f"an elastic job with --np {low}:{high} needs {high} worker endpoints (one per slot); got "
                          f"{len(config.worker_endpoints)}")
    if config.multi_host:  # a rendezvous places the slots: this host starts its local_workers
        object.__setattr__(config, "initial_workers", len(config.local_workers))
        return
    initial = low if config.initial_workers is None else config.initial_workers
    if not isinstance(initial, int) or not low <= initial <= high:
        raise ConfigError(f"--worker_num {initial} is outside --np {low}:{high}: start between {low} and {high} "
                          f"workers")
    object.__setattr__(config, "initial_workers", initial)
    if not isinstance(config.worker_replacements, int) or config.worker_replacements < 0:
        raise ConfigError(f"--worker_replacements {config.worker_replacements!r} must be an integer >= 0")


def _check_unique(servers, workers):
    seen = {}
    for role, endpoints in (("server", servers), ("worker", workers)):
        for i, endpoint in enumerate(endpoints):
            if endpoint in seen:
                raise ConfigError(f"endpoint {endpoint} is given to both {seen[endpoint]} and "
                                  f"{role} {i}; every process needs a port of its own")
            seen[endpoint] = f"{role} {i}"


def process_environment(config: LaunchConfig, role: str, index: int, base=None) -> dict:
    """The environment of one process of the job.

    Args:
        config: the job.
        role: "server" or "worker".
        index: the process's index within its role.
        base: the environment to start from (default ``os.environ``).

    Returns:
        A new dict: ``base`` without ROLE_VARIABLES and STALE_VARIABLES, plus the role
        variables of this process (PADDLE_TRAINER_ENDPOINTS left out in an elastic job
        across hosts, whose slots' hosts change) (none in local training; in a collective job
        PADDLE_TRAINING_ROLE=TRAINER, PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT,
        PADDLE_TRAINER_ID and PADDLE_TRAINERS_NUM, no TRAINING_ROLE; and, unless set already,
        FLAGS_selected_gpus: the worker's rank on its host, as Paddle's launcher sets it).

    Raises:
        ConfigError: role is not "server" or "worker", or index is out of range.

    FLEET_BIND_HOST is set for the servers of ``config.bind_any`` and the workers of
    ``config.bind_any_workers``, FLEET_CURVE_KEYS_DIR
    when ``config.keys_dir`` is given, FLEET_METRICS_PORT when ``config.metrics_port`` is.
    """
    if role not in ("server", "worker"):
        raise ConfigError(f"role {role!r} is neither 'server' nor 'worker'")
    endpoints = config.server_endpoints if role == "server" else config.worker_endpoints
    count = 1 if config.is_local and role == "worker" else len(endpoints)
    if not 0 <= index < count:
        raise ConfigError(f"{role} {index} does not exist: the job has {count} {role}s")
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ROLE_VARIABLES and k not in STALE_VARIABLES}
    env.pop(ELASTIC_ENV, None)  # fleetrun decides: --np MIN:MAX makes FLEET_ELASTIC, else a fixed job
    env.pop(EXPECTED_ENV, None)
    if config.metrics_port is not None:
        env[METRICS_PORT_ENV] = str(config.metrics_port_of(role, index))
    if config.is_local:
        return env
    host, port = parse_endpoint(endpoints[index], f"{role} {index}'s endpoint")
    if config.collective:  # PaddleCloudRoleMaker(is_collective=True)'s variables
        env.update({
            "PADDLE_TRAINING_ROLE": "TRAINER",
            "PADDLE_TRAINER_ENDPOINTS": ",".join(config.worker_endpoints),
            "PADDLE_CURRENT_ENDPOINT": endpoints[index],
            "PADDLE_TRAINER_ID": str(index),
            "PADDLE_TRAINERS_NUM": str(len(config.worker_endpoints)),
        })
        # Paddle's launcher gives each collective worker its GPU; a GPU script reads it
        # for fluid.CUDAPlace (which runs on the CPU here): the worker's rank on this host.
        here = config.here("worker")
        env.setdefault("FLAGS_selected_gpus", str(here.index(index) if index in here else 0))
        _common_environment(config, env, role, index, host)
        return env
    env.update({
        "TRAINING_ROLE": "PSERVER" if role == "server" else "TRAINER",
        "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(config.server_endpoints),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(config.worker_endpoints),
        "PADDLE_TRAINERS_NUM": str(len(config.worker_endpoints)),
        "POD_IP": host,
        "PADDLE_PORT": str(port),
    })
    if config.elastic is not None and config.multi_host:
        # Worker slots across hosts (--np with --elastic_server): a slot's host is known
        # only once one takes it, so no list of the job's worker endpoints exists. Paddle's
        # role maker takes the variable as optional; an elastic job's processes use it for
        # messages only (its metrics reduce through server 0, not a workers' group).
        del env["PADDLE_TRAINER_ENDPOINTS"]
    if role == "worker":
        env["PADDLE_TRAINER_ID"] = str(index)
    if config.elastic is not None:
        env[ELASTIC_ENV] = f"{config.elastic[0]}:{config.elastic[1]}"
        if config.expected_workers is not None:
            env[EXPECTED_ENV] = ",".join(map(str, config.expected_workers))
    _common_environment(config, env, role, index, host)
    return env


def binds_any(config, role, index):
    """True when the process binds the wildcard address instead of its endpoint's host
    (FLEET_BIND_HOST): its address is not on an interface here (see ``bind_any``)."""
    return index in (config.bind_any if role == "server" else config.bind_any_workers)


def _common_environment(config, env, role, index, host):
    if binds_any(config, role, index):
        env[BIND_HOST_ENV] = "::" if ":" in host else "0.0.0.0"
    if config.keys_dir is not None:
        env[KEYS_DIR_ENV] = os.path.abspath(config.keys_dir)
    if not any(k in env for k in BLAS_THREAD_VARIABLES):
        # Every process started here shares this machine's cores: a worker's BLAS gets its
        # share, a server (numba kernels, no BLAS) one thread. Oversubscribed BLAS pools
        # spin against each other (measured 4x slower with 2 workers on 2 cores).
        # (A host joining an elastic job across hosts starts with none: its workers join later.)
        share = 1 if role == "server" else max(1, (os.cpu_count() or 1) // max(1, len(config.here("worker"))))
        env.update({k: str(share) for k in BLAS_THREAD_VARIABLES})


def restart_state_dir(config):
    """Where the processes of a --max_restarts job note their checkpoint directories
    (FLEET_RESTART_STATE_DIR): LOG_DIR/.restart, absolute."""
    return os.path.abspath(os.path.join(config.log_dir, ".restart"))


def restart_environment(config, attempt):
    """The variables a process gets under --max_restarts: FLEET_RESTART_COUNT (0 on the
    first run, k on the k-th restart), FLEET_MAX_RESTARTS and FLEET_RESTART_STATE_DIR."""
    from fleet.checkpoint import RESTART_STATE_ENV
    return {RESTART_COUNT_ENV: str(attempt), MAX_RESTARTS_ENV: str(config.max_restarts),
            RESTART_STATE_ENV: restart_state_dir(config)}
