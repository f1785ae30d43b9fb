"""Training strategies: `SyncStrategy`, `AsyncStrategy`, `HalfAsyncStrategy`, `GeoStrategy`,
their factory, and the conversion from a plain `DistributeTranspilerConfig`.

Each strategy bundles five settings objects and sets the flags Paddle 1.7 (generation G2)
sets for its mode; `DistributedStrategy.mode` names the mode for the communicator.
Strategies are plain settings: build and adjust them before ``minimize``; not
thread-safe.
"""
import numbers

from fleet.errors import ConfigError
from strategies._env import read_cpu_num
from strategies.execution import BuildStrategy, ExecutionStrategy
from strategies.runtime_config import ServerRuntimeConfig, TrainerRuntimeConfig
from strategies.transpiler_config import DistributeTranspilerConfig

# key -> (default, check(value) -> bool, what is expected)
_DEBUG_KEYS = {
    "dump_slot": (False, lambda v: isinstance(v, bool) or (_is_int(v) and v in (0, 1)), "True or False"),
    "dump_converter": ("", lambda v: isinstance(v, str), "a str"),
    "dump_fields": ([], lambda v: _is_str_list(v), "a list of variable names"),
    "dump_file_num": (16, lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "dump_fields_path": ("", lambda v: isinstance(v, str), "a str (a directory)"),
    "dump_param": ([], lambda v: _is_str_list(v), "a list of parameter names"),
}


# The CTR accessor's fields (fleet.entries.CtrAccessorConfig, which validates their values
# when the plan is built; a unit test keeps the two lists equal).
SPARSE_TABLE_FIELDS = ("nonclk_coeff", "click_coeff", "base_threshold", "delta_threshold", "delta_keep_days",
                       "show_click_decay_rate", "delete_threshold", "delete_after_unseen_days")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_str_list(value):
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


class DistributedStrategy:
    """Base of the strategies: program, trainer-runtime, server-runtime, execute and build
    settings, each replaceable by an object of its class or updated from a dict.

    Use `DistributedStrategyFactory` (or the subclasses) to get a strategy for a mode; the
    base class itself names no mode (``mode`` is None).

    On creation: ``ExecutionStrategy.num_threads`` = CPU_NUM, and
    ``BuildStrategy.reduce_strategy`` = Reduce when CPU_NUM > 1 (as Paddle).

    Raises:
        ConfigError: CPU_NUM or a FLAGS_ variable in the environment is invalid.
    """

    _MODE = None

    def __init__(self):
        cpu_num = read_cpu_num()
        self._program_config = DistributeTranspilerConfig()
        self._trainer_runtime_config = TrainerRuntimeConfig(mode=self._MODE)
        self._server_runtime_config = ServerRuntimeConfig()
        self._execute_strategy = ExecutionStrategy()  # num_threads = CPU_NUM
        self._build_strategy = BuildStrategy()
        if cpu_num > 1:
            self._build_strategy.reduce_strategy = BuildStrategy.ReduceStrategy.Reduce
        self._debug_opt = None
        self._sparse_table_configs = {}  # table name (None: every table) -> {field: value}
        self._configure()

    def _configure(self):
        """Set the mode's flags (subclasses)."""

    @property
    def mode(self):
        """The training mode: "sync", "async", "half_async", "geo" (None on the base class)."""
        return self._MODE

    def _set(self, attr, config, cls, arg_name):
        if isinstance(config, cls):
            setattr(self, attr, config)
        elif isinstance(config, dict):
            getattr(self, attr).update(config)
        else:
            raise TypeError(
                f"{arg_name} only accept input type: dict or {cls.__name__} "
                f"(got {type(config).__name__})"
            )

    def get_program_config(self):
        """Returns: the `DistributeTranspilerConfig` (live: changes apply to the strategy)."""
        return self._program_config

    def set_program_config(self, config):
        """Replace the program config, or update it from a dict (all keys or none).

        Raises:
            TypeError: "program_config only accept input type: dict or
                DistributeTranspilerConfig".
            ConfigError: "DistributeTranspilerConfig doesn't have key: <key>" (plus the
                valid keys), or an invalid value.
        """
        self._set("_program_config", config, DistributeTranspilerConfig, "program_config")

    def get_trainer_runtime_config(self):
        """Returns: the `TrainerRuntimeConfig` (the communicator's flags for this mode)."""
        return self._trainer_runtime_config

    def set_trainer_runtime_config(self, config):
        """Replace the trainer runtime config, or update its flags from a dict.

        Raises:
            TypeError: "trainer_runtime_config only accept input type: dict or
                TrainerRuntimeConfig".
            ConfigError: "TrainerRuntimeConfig doesn't have key: <key>", an invalid
                value, or a TrainerRuntimeConfig made for another mode.
        """
        if isinstance(config, TrainerRuntimeConfig) and config.mode != self._MODE:
            raise ConfigError(
                f"this TrainerRuntimeConfig is for mode {config.mode!r} but {type(self).__name__} "
                f"runs mode {self._MODE!r}; pass TrainerRuntimeConfig(mode={self._MODE!r}) or a dict"
            )
        self._set("_trainer_runtime_config", config, TrainerRuntimeConfig, "trainer_runtime_config")

    def get_server_runtime_config(self):
        """Returns: the `ServerRuntimeConfig` (servers' RPC thread counts)."""
        return self._server_runtime_config

    def set_server_runtime_config(self, config):
        """Replace the server runtime config, or update it from a dict.

        Raises:
            TypeError: "server_runtime_config only accept input type: dict or
                ServerRuntimeConfig".
            ConfigError: "ServerRuntimeConfig doesn't have key: <key>", or an invalid value.
        """
        self._set("_server_runtime_config", config, ServerRuntimeConfig, "server_runtime_config")

    def get_execute_strategy(self):
        """Returns: the `ExecutionStrategy` (training threads, thread barrier)."""
        return self._execute_strategy

    def set_execute_strategy(self, config):
        """Replace the execution strategy, or update it from a dict.

        Raises:
            TypeError: "execute_strategy only accept input type: dict or ExecutionStrategy".
            ConfigError: "ExecutionStrategy doesn't have key: <key>", or an invalid value.
        """
        self._set("_execute_strategy", config, ExecutionStrategy, "execute_strategy")

    def get_build_strategy(self):
        """Returns: the `BuildStrategy` (reduce strategy, async mode)."""
        return self._build_strategy

    def set_build_strategy(self, config):
        """Replace the build strategy, or update it from a dict.

        Raises:
            TypeError: "build_strategy only accept input type: dict or BuildStrategy".
            ConfigError: "BuildStrategy doesn't have key: <key>", or an invalid value.
        """
        self._set("_build_strategy", config, BuildStrategy, "build_strategy")

    def set_debug_opt(self, opt_info):
        """Set the dump options (Paddle's debug_opt); None clears them.

        Args:
            opt_info: dict with any of dump_slot (bool), dump_converter (str),
                dump_fields (list of str), dump_file_num (int >= 1), dump_fields_path
                (str), dump_param (list of str).

        Raises:
            TypeError: ``opt_info`` is not a dict or None.
            ConfigError: an unknown key or a value of the wrong type.
        """
        if opt_info is None:
            self._debug_opt = None
            return
        if not isinstance(opt_info, dict):
            raise TypeError(f"debug_opt only accept input type: dict (got {type(opt_info).__name__})")
        for key, value in opt_info.items():
            if key not in _DEBUG_KEYS:
                raise ConfigError(f"debug_opt doesn't have key: {key}; valid keys: {', '.join(_DEBUG_KEYS)}")
            _, is_valid, expected = _DEBUG_KEYS[key]
            if not is_valid(value):
                raise ConfigError(f"debug_opt[{key!r}]={value!r} is invalid: expected {expected}")
        self._debug_opt = dict(opt_info)

    def get_debug_opt(self):
        """Returns: a new dict of all six dump options (defaults filled in), or {} if unset."""
        if self._debug_opt is None:
            return {}
        opt = {key: self._debug_opt.get(key, default) for key, (default, _, _) in _DEBUG_KEYS.items()}
        opt["dump_slot"] = bool(opt["dump_slot"])
        opt["dump_fields"] = list(opt["dump_fields"])
        opt["dump_param"] = list(opt["dump_param"])
        return opt

    def set_sparse_table_config(self, table_name=None, **fields):
        """Sets the CTR accessor of a distributed table (Paddle's CtrCommonAccessor), or of
        every distributed table with ``table_name=None``; a table's own fields override
        those given for every table. A table with an accessor config keeps per-row
        statistics (show, click, unseen_days, delta_score) that ``fleet.shrink()`` decays
        and evicts by.

        Args:
            table_name: the table's parameter name (its ``param_attr`` name), or None.
            fields: ``fleet.entries.CtrAccessorConfig`` fields (nonclk_coeff,
                click_coeff, base_threshold, delta_threshold, delta_keep_days,
                show_click_decay_rate, delete_threshold, delete_after_unseen_days), each
                also accepted with Paddle 2.x's "sparse_" prefix. No fields: the defaults.

        Raises:
            ConfigError: an unknown field (names it and the valid ones), a value that is
                not a number, or a table_name that is not a str. Values out of range and a
                table the program does not have are refused by ``minimize`` (naming them).
        """
        if table_name is not None and (not isinstance(table_name, str) or not table_name):
            raise ConfigError(f"set_sparse_table_config table_name={table_name!r} must be a table's parameter "
                              f"name (a non-empty str) or None for every table")
        merged = dict(self._sparse_table_configs.get(table_name, {}))
        for key, value in fields.items():
            name = key[len("sparse_"):] if key.startswith("sparse_") else key
            if name not in SPARSE_TABLE_FIELDS:
                raise ConfigError(f"set_sparse_table_config field {key!r} is unknown; valid fields are "
                                  f"{', '.join(SPARSE_TABLE_FIELDS)} (each also with a 'sparse_' prefix)")
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigError(f"set_sparse_table_config {key}={value!r} must be a number")
            merged[name] = value
        self._sparse_table_configs[table_name] = merged

    def sparse_table_config(self, table_name):
        """The accessor fields set for ``table_name`` (those for every table, then its own),
        as a new dict, or None when none were set for it."""
        common = self._sparse_table_configs.get(None)
        own = self._sparse_table_configs.get(table_name)
        if common is None and own is None:
            return None
        return {**(common or {}), **(own or {})}

    def sparse_table_names(self):
        """The table names given to ``set_sparse_table_config`` (not None)."""
        return sorted(n for n in self._sparse_table_configs if n is not None)

    def __repr__(self):
        return (
            f"{type(self).__name__}(mode={self._MODE!r}, program_config={self._program_config!r}, "
            f"execute_strategy={self._execute_strategy!r}, build_strategy={self._build_strategy!r}, "
            f"communicator_flags={self._trainer_runtime_config.get_communicator_flags()!r})"
        )


class SyncStrategy(DistributedStrategy):
    """Synchronous training: every step, servers wait for all workers, average, apply once.

    Paddle 1.7 flags: sync_mode=False, runtime_split_send_recv=True, half_async=True,
    completely_not_async=True; build async_mode=True; execute use_thread_barrier=True.
    """

    _MODE = "sync"

    def _configure(self):
        config = self._program_config
        config.sync_mode = False
        config.runtime_split_send_recv = True
        config.half_async = True
        config.completely_not_async = True
        self._build_strategy.async_mode = True
        self._execute_strategy.use_thread_barrier = True


class AsyncStrategy(DistributedStrategy):
    """Asynchronous training: gradients queued, merged and sent; servers apply on arrival.

    Paddle 1.7 flags: sync_mode=False, runtime_split_send_recv=True; build async_mode=True.
    """

    _MODE = "async"

    def _configure(self):
        self._program_config.sync_mode = False
        self._program_config.runtime_split_send_recv = True
        self._build_strategy.async_mode = True


class HalfAsyncStrategy(DistributedStrategy):
    """Half-async: a worker's threads meet each step and send averaged gradients together.

    Paddle 1.7 flags: sync_mode=False, runtime_split_send_recv=True, half_async=True;
    build async_mode=True; execute use_thread_barrier=True.
    """

    _MODE = "half_async"

    def _configure(self):
        self._program_config.sync_mode = False
        self._program_config.runtime_split_send_recv = True
        self._program_config.half_async = True
        self._build_strategy.async_mode = True
        self._execute_strategy.use_thread_barrier = True


class GeoStrategy(DistributedStrategy):
    """GEO-SGD: workers train locally and exchange deltas every ``update_frequency`` steps.

    Paddle 1.7 flags: sync_mode=False, runtime_split_send_recv=True, geo_sgd_mode=True,
    geo_sgd_need_push_nums=update_frequency; build async_mode=True.

    Args:
        update_frequency: steps between pushes (int >= 1, default 100).

    Raises:
        ConfigError: ``update_frequency`` is not an int >= 1.
    """

    _MODE = "geo"

    def __init__(self, update_frequency=100):
        if not _is_int(update_frequency) or update_frequency < 1:
            raise ConfigError(
                f"GeoStrategy update_frequency={update_frequency!r} is invalid: expected an "
                "int >= 1 (steps between GEO pushes); e.g. GeoStrategy(update_frequency=100)"
            )
        self._update_frequency = int(update_frequency)
        super().__init__()

    def _configure(self):
        config = self._program_config
        config.sync_mode = False
        config.runtime_split_send_recv = True
        config.geo_sgd_mode = True
        config.geo_sgd_need_push_nums = self._update_frequency
        self._build_strategy.async_mode = True

    @property
    def update_frequency(self):
        """Steps between GEO pushes (the program config's geo_sgd_need_push_nums)."""
        return self._program_config.geo_sgd_need_push_nums


class DistributedStrategyFactory:
    """Creates the strategies; every method is static (call it on the class)."""

    @staticmethod
    def create_sync_strategy():
        """Returns: a new `SyncStrategy`."""
        return SyncStrategy()

    @staticmethod
    def create_half_async_strategy():
        """Returns: a new `HalfAsyncStrategy`."""
        return HalfAsyncStrategy()

    @staticmethod
    def create_async_strategy():
        """Returns: a new `AsyncStrategy`."""
        return AsyncStrategy()

    @staticmethod
    def create_geo_strategy(update_frequency=100):
        """Returns: a new `GeoStrategy` pushing every ``update_frequency`` steps.

        Raises:
            ConfigError: ``update_frequency`` is not an int >= 1.
        """
        return GeoStrategy(update_frequency)

    @staticmethod
    def create_collective_strategy():
        """Returns: a new `strategies.CollectiveStrategy` (no servers; gradients all-reduced
        among the workers every step)."""
        from strategies.collective import CollectiveStrategy

        return CollectiveStrategy()

    @staticmethod
    def create_hybrid_strategy():
        """Returns: a new `strategies.HybridStrategy` (dense parameters all-reduced among
        the workers every step; is_sparse / is_distributed tables on the servers, pushed
        asynchronously)."""
        from strategies.collective import HybridStrategy

        return HybridStrategy()


StrategyFactory = DistributedStrategyFactory


def _accepted():
    from strategies.collective import CollectiveStrategy, HybridStrategy

    return (DistributeTranspilerConfig, SyncStrategy, HalfAsyncStrategy, AsyncStrategy, GeoStrategy,
            CollectiveStrategy, HybridStrategy)


def strategy_from_config(config):
    """Turn a `DistributeTranspilerConfig` into the strategy it means (Paddle's rules).

    mode='nccl2' or 'collective' -> `CollectiveStrategy`; else sync_mode=True -> `SyncStrategy`; else with runtime_split_send_recv: geo_sgd_mode ->
    ``GeoStrategy(geo_sgd_need_push_nums)``, half_async -> `HalfAsyncStrategy`, otherwise
    `AsyncStrategy`; async without runtime_split_send_recv -> `HalfAsyncStrategy`, and the
    config is changed to half_async=True, runtime_split_send_recv=True. The strategy then
    takes ``config`` as its program config (the same object). A `DistributedStrategy` is
    returned unchanged.

    Args:
        config: a DistributeTranspilerConfig or a DistributedStrategy.

    Returns:
        DistributedStrategy: the strategy.

    Raises:
        TypeError: ``config`` is neither.
    """
    if isinstance(config, DistributedStrategy):
        return config
    if not isinstance(config, DistributeTranspilerConfig):
        raise TypeError(
            "config must be an instance of DistributeTranspilerConfig, SyncStrategy, "
            f"HalfAsyncStrategy, AsyncStrategy or GeoStrategy (got {type(config).__name__})"
        )
    if config.mode in ("nccl2", "collective"):
        from strategies.collective import CollectiveStrategy

        strategy = CollectiveStrategy()
        strategy.set_program_config(config)
        if config.collective_mode is not None:
            strategy.collective_mode = config.collective_mode
        return strategy
    if config.sync_mode:
        strategy = SyncStrategy()
    elif config.runtime_split_send_recv:
        if config.geo_sgd_mode:
            strategy = GeoStrategy(config.geo_sgd_need_push_nums)
        elif config.half_async:
            strategy = HalfAsyncStrategy()
        else:
            strategy = AsyncStrategy()
    else:
        strategy = HalfAsyncStrategy()
        config.half_async = True
        config.runtime_split_send_recv = True
    strategy.set_program_config(config)
    return strategy


def check_strategy(strategy, mode_name):
    """Check that ``strategy`` is something fleet can train with.

    Args:
        strategy: the object given to ``distributed_optimizer``.
        mode_name: the fleet mode, for the message (e.g. "DistributedTranspiler").

    Returns:
        the strategy, unchanged.

    Raises:
        TypeError: "In <mode_name> mode, strategy must be an instance of
            DistributeTranspilerConfig, SyncStrategy, HalfAsyncStrategy, AsyncStrategy, or
            GeoStrategy" (Paddle's), then that CollectiveStrategy and HybridStrategy are taken
            too, and the type seen.
    """
    if not isinstance(strategy, _accepted()):
        raise TypeError(
            f"In {mode_name} mode, strategy must be an instance of DistributeTranspilerConfig, "
            "SyncStrategy, HalfAsyncStrategy, AsyncStrategy, or GeoStrategy (fleet also takes "
            f"CollectiveStrategy and HybridStrategy; got {type(strategy).__name__})"
        )
    return strategy
