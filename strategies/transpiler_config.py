"""`DistributeTranspilerConfig`: how parameters are split and placed, and the training mode.

Field names, defaults and the sync_mode / runtime_split_send_recv rules are Paddle 1.7's.
"""
from fleet.errors import ConfigError
from strategies._fields import Field, Settings, boolean, choice, integer
from strategies.dispatcher import HashName, PSDispatcher, RoundRobin

MIN_BLOCK_SIZE = 8192
_DISPATCHERS = {"RoundRobin": RoundRobin, "HashName": HashName}


def _check_split_method(owner, name, value, obj):
    if value is None or (isinstance(value, str) and value in _DISPATCHERS):
        return value
    if isinstance(value, type) and issubclass(value, PSDispatcher) and value is not PSDispatcher:
        return value
    hint = " (pass the class, not an instance)" if isinstance(value, PSDispatcher) else ""
    raise ConfigError(
        f"{owner}.{name}={value!r} is invalid{hint}: expected None (RoundRobin), "
        "'RoundRobin', 'HashName', or a subclass of strategies.PSDispatcher; "
        "e.g. config.split_method = 'HashName'"
    )


def _check_runtime_split(owner, name, value, obj):
    if value is None:
        raise ConfigError("runtime_split_send_recv can't be None")
    value = boolean()(owner, name, value, obj)
    if value and obj.sync_mode:
        raise ConfigError(
            "if you want to set runtime_split_send_recv to be true, "
            "make ensure config.sync_mode is false at first"
        )
    return value


def _check_sync_mode(owner, name, value, obj):
    if value is None:
        raise ConfigError("sync_mode can't be None")
    value = boolean()(owner, name, value, obj)
    if value and obj.runtime_split_send_recv:
        raise ConfigError(
            "if you want to set sync_mode to be true, "
            "make ensure config.runtime_split_send_recv is false at first"
        )
    return value


_NCCL_FIX = "it only matters for NCCL on GPUs; fleet accepts it and it changes nothing"


class DistributeTranspilerConfig(Settings):
    """How the transpiler splits parameters across servers, and which mode training uses.

    Every field below can be set as an attribute or through a strategy's
    ``set_program_config(dict)``; a bad value raises `ConfigError` naming the field, the
    value and the fix. Assigning an unknown name raises
    ``ConfigError("DistributeTranspilerConfig doesn't have key: ...")``.

    Mode flags (set for you by the strategies; see `strategies.strategy_from_config`):
    ``sync_mode`` (default True) and ``runtime_split_send_recv`` (default False) cannot
    both be True: setting one to True while the other is True raises Paddle's ValueError
    ("if you want to set ... make ensure ... is false at first"); neither may be None.
    """

    slice_var_up = Field(True, boolean(), "Split parameters and gradients into blocks across servers.")
    split_method = Field(
        None, _check_split_method,
        "Placement of blocks: None or 'RoundRobin' (default), 'HashName' (stable crc32 of the "
        "block name), or a PSDispatcher subclass.",
    )
    min_block_size = Field(
        MIN_BLOCK_SIZE,
        integer(MIN_BLOCK_SIZE, f"set it to at least {MIN_BLOCK_SIZE} elements, e.g. 81920"),
        "Smallest block, in elements (>= 8192); a parameter smaller than two blocks stays whole.",
    )
    enable_dc_asgd = Field(
        False, boolean(),
        "Delay-compensated ASGD (async only): servers apply g + g*g*(param - param at the "
        "worker's last pull).",
    )
    merge_async_pushes = Field(
        1, integer(0, "e.g. config.merge_async_pushes = 0 (one update per round of workers)"),
        "Async and half-async servers average this many pushes, from any workers, into one "
        "update: 1 applies each push on arrival (Paddle's async); 0 means the number of "
        "workers still training (a worker's async threads push separately: give workers x "
        "threads for them). Merging keeps a worker's gradients about one update stale "
        "instead of one per other worker (accuracy as workers are added); read batch_size / "
        "workers per worker so an update still averages batch_size examples. The hybrid "
        "strategy's servers merge too (default 0 there: one update per step of all workers, "
        "as sync).",
    )
    mode = Field(
        "pserver",
        choice(("pserver", "nccl2", "collective"),
               "'pserver' trains with parameter servers; 'nccl2' and 'collective' mean collective "
               "training (no servers: gradients all-reduced among the workers)"),
        "Training mode: 'pserver' (default), or 'nccl2' / 'collective' (strategy_from_config makes "
        "a CollectiveStrategy of such a config).",
    )
    print_log = Field(False, boolean(), "Log the transpiler's decisions (block placement).")
    wait_port = Field(True, boolean(), "A worker waits until every server answers before training.")
    runtime_split_send_recv = Field(
        False, _check_runtime_split,
        "Send and receive through the communicator (async, half-async, GEO and G2 sync).",
    )
    sync_mode = Field(True, _check_sync_mode, "Legacy synchronous training (per-step server barrier).")
    half_async = Field(False, boolean(), "Half-async: a worker's threads meet each step, then send.")
    completely_not_async = Field(
        False, boolean(),
        "Sync on the communicator: servers wait for every worker, average, then apply.",
    )
    geo_sgd_mode = Field(False, boolean(), "GEO-SGD: train locally, send deltas every k steps.")
    geo_sgd_need_push_nums = Field(
        100, integer(1, "set it to the number of steps between GEO pushes, e.g. 100"),
        "GEO push interval k, in steps (>= 1).",
    )
    nccl_comm_num = Field(1, integer(1, _NCCL_FIX), "NCCL (GPU) setting: accepted, no effect.")
    use_hierarchical_allreduce = Field(False, boolean(), "NCCL (GPU) setting: accepted, no effect.")
    hierarchical_allreduce_inter_nranks = Field(
        0, integer(0, _NCCL_FIX), "NCCL (GPU) setting: accepted, no effect."
    )
    collective_mode = Field(
        None, choice((None, "grad_allreduce", "local_sgd"), _NCCL_FIX),
        "Paddle collective setting: None or 'grad_allreduce' (what fleet's collective mode does).",
    )

    def dispatcher_class(self):
        """Returns: the `PSDispatcher` subclass ``split_method`` names (RoundRobin for None)."""
        method = self.split_method
        if method is None:
            return RoundRobin
        return _DISPATCHERS.get(method, method)

    def make_dispatcher(self, pserver_endpoints):
        """Create the dispatcher that places blocks on these servers.

        Args:
            pserver_endpoints: list of "host:port", in server-index order.

        Returns:
            PSDispatcher: a new instance of `dispatcher_class()`.
        """
        return self.dispatcher_class()(pserver_endpoints)
