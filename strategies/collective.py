"""Strategies without a parameter server for the dense part: `CollectiveStrategy` (every
parameter on every worker, gradients all-reduced among the workers; Paddle's "nccl2" /
"collective" mode, on CPUs) and `HybridStrategy` (dense parameters as in collective, the
``is_sparse`` / ``is_distributed`` tables on parameter servers, pushed asynchronously).

`CollectiveStrategy` has the shape of Paddle 1.x's ``fleet.collective.DistributedStrategy``
(a BuildStrategy with the collective fields, plus ``exec_strategy``). Its fields that only
mean something on GPUs are accepted and validated but change nothing here: NCCL
communicators, hierarchical all-reduce, mixed precision, recomputation. Fields asking for
something fleet does not do on CPUs either (local SGD, distributed fc) refuse True with
the way to get the same effect.

Plain settings (layer 2): build and adjust before ``minimize``; not thread-safe.
"""
import logging

from fleet.errors import ConfigError
from strategies._fields import Field, Settings, boolean, choice, integer, invalid
from strategies.distributed_strategy import DistributedStrategy
from strategies.execution import ExecutionStrategy

log = logging.getLogger("fleet")

_GPU_ONLY = "it only matters on GPUs (NCCL), so fleet accepts it and it changes nothing"


def _gpu_bool(owner, name, value, obj):
    value = boolean()(owner, name, value, obj)
    if value:
        log.info("fleet: %s.%s = True has no effect: %s", owner, name, _GPU_ONLY)
    return value


def _refused_true(fix):
    def check(owner, name, value, obj):
        value = boolean()(owner, name, value, obj)
        if value:
            raise invalid(owner, name, value, "False", fix)
        return value
    return check


def _checkpoints(owner, name, value, obj):
    if isinstance(value, (list, tuple)):
        return list(value)
    raise invalid(owner, name, value, "a list of variables or names", f"{_GPU_ONLY}; e.g. []")


def _exec_strategy(owner, name, value, obj):
    if isinstance(value, ExecutionStrategy):
        return value
    raise invalid(owner, name, value, "a strategies.ExecutionStrategy",
                  "e.g. strategy.exec_strategy = ExecutionStrategy()")


def _loss_scaling(owner, name, value, obj):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return value
    raise invalid(owner, name, value, "a number > 0", f"{_GPU_ONLY}; e.g. 2 ** 15")


class CollectiveFields(Settings):
    """The fields of Paddle 1.x's ``fleet.collective.DistributedStrategy`` (validated)."""

    mode = Field("nccl2", choice(("nccl2", "collective"),
                                 "fleet's collective mode all-reduces gradients every step: "
                                 "'nccl2' (default) or 'collective' (the same on CPUs)"),
                 "Paddle's collective mode; both values all-reduce gradients every step. Reading "
                 "strategy.mode gives fleet's mode name, 'collective'.")
    collective_mode = Field(None, choice((None, "grad_allreduce"),
                                         "fleet all-reduces gradients every step; for local SGD "
                                         "(periodic averaging) use DistributedStrategyFactory."
                                         "create_geo_strategy(update_frequency=k) with servers"),
                            "None or 'grad_allreduce' (the same); 'local_sgd' is refused.")
    use_local_sgd = Field(False, _refused_true(
        "fleet all-reduces gradients every step; for periodic averaging use "
        "DistributedStrategyFactory.create_geo_strategy(update_frequency=k) with servers"),
        "Must stay False (see collective_mode).")
    use_dist_fc = Field(False, _refused_true(
        "fleet keeps every dense parameter whole on every worker; put large tables on servers "
        "with DistributedStrategyFactory.create_hybrid_strategy() instead"),
        "Must stay False (model-parallel fc is a GPU feature).")
    dist_fc_config = Field(None, choice((None,), "leave it None (use_dist_fc is not available)"),
                           "Must stay None.")
    nccl_comm_num = Field(1, integer(1, _GPU_ONLY), "NCCL communicators per device (GPU only; no effect).")
    use_hierarchical_allreduce = Field(False, _gpu_bool, "Two-level NCCL all-reduce (GPU only; no effect).")
    hierarchical_allreduce_inter_nranks = Field(0, integer(0, _GPU_ONLY),
                                                "GPUs per node for hierarchical all-reduce (no effect).")
    forward_recompute = Field(False, _gpu_bool, "Recompute activations to save GPU memory (no effect).")
    recompute_checkpoints = Field([], _checkpoints, "Recomputation checkpoints (no effect).")
    use_amp = Field(False, _gpu_bool, "Mixed precision on GPUs (no effect: fleet trains in float32).")
    amp_loss_scaling = Field(2 ** 15, _loss_scaling, "Loss scaling of mixed precision (no effect).")
    fuse_all_reduce_ops = Field(True, boolean(), "Accepted: fleet always sends a step's dense gradients "
                                                 "in one all-reduce.")


class CollectiveStrategy(DistributedStrategy):
    """Collective training: no servers; each worker keeps every parameter and runs the
    optimizer itself; every step the dense gradients are all-reduced (mean over workers)
    and the rows of sparse gradients exchanged, so every worker applies the same update.

    Paddle 1.x's ``fleet.collective.DistributedStrategy`` fields are attributes (see
    `CollectiveFields`: ``mode``, ``collective_mode``, ``nccl_comm_num``,
    ``use_hierarchical_allreduce``, ``use_local_sgd``, ``exec_strategy`` ...); the
    GPU-only ones are accepted with no effect. ``exec_strategy`` is the strategy's
    `ExecutionStrategy` (``get_execute_strategy()``).

    Raises:
        ConfigError: an invalid value for a field (names it and the fix).
    """

    _MODE = "collective"

    def __init__(self):
        object.__setattr__(self, "_collective", CollectiveFields())
        super().__init__()

    def _configure(self):
        self._program_config.mode = "collective"

    def set_sparse_table_config(self, table_name=None, **fields):
        """Refused: accessor statistics live on parameter servers, which collective
        training has none of.

        Raises:
            ConfigError: always (names the strategy to use instead).
        """
        raise ConfigError(
            "set_sparse_table_config configures the CTR accessor of tables kept on parameter servers; "
            "CollectiveStrategy has no servers: use DistributedStrategyFactory.create_hybrid_strategy() "
            "(tables on the servers) or a parameter-server strategy")

    @property
    def exec_strategy(self):
        """The `ExecutionStrategy` (training threads), as Paddle's attribute."""
        return self._execute_strategy

    @exec_strategy.setter
    def exec_strategy(self, value):
        self._execute_strategy = _exec_strategy(type(self).__name__, "exec_strategy", value, self)

    def __getattr__(self, name):
        fields = object.__getattribute__(self, "_collective")
        if name in CollectiveFields.keys():
            return getattr(fields, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in CollectiveFields.keys():
            try:
                setattr(self._collective, name, value)
            except ConfigError as e:
                raise ConfigError(str(e).replace("CollectiveFields.", f"{type(self).__name__}.", 1)) from None
        elif name.startswith("_") or isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        else:
            raise ConfigError(f"{type(self).__name__} doesn't have key: {name}; valid keys: "
                              f"{', '.join(CollectiveFields.keys() + ['exec_strategy'])}")

    def collective_fields(self):
        """Returns: a new dict of the Paddle collective fields' values."""
        return self._collective.to_dict()


class HybridStrategy(DistributedStrategy):
    """Hybrid training: dense parameters live on every worker and are all-reduced every
    step (synchronous, as `CollectiveStrategy`); ``is_sparse`` / ``is_distributed``
    tables live on the parameter servers, their rows prefetched and their gradients
    pushed asynchronously (the async communicator's path and flags). Needs servers and
    the workers' endpoints (PADDLE_TRAINER_ENDPOINTS; fleetrun sets them).

    Flags: as `AsyncStrategy` (sync_mode=False, runtime_split_send_recv=True; build
    async_mode=True), and the threads of a worker meet every step
    (use_thread_barrier=True) for the all-reduce.

    One update per step, as in sync training: ``merge_async_pushes`` defaults to 0 here,
    so the servers average the one push each worker makes per step into one update of
    the tables (the examples of every thread of every worker, as the dense update).
    Setting it to 1 applies each worker's push on arrival instead (Paddle's async): the
    tables then take one update per worker per step, each from a worker's share of the
    examples, which trains them faster than sync does (a different model, not a closer
    one).
    """

    _MODE = "hybrid"

    def _configure(self):
        self._program_config.sync_mode = False
        self._program_config.runtime_split_send_recv = True
        self._program_config.merge_async_pushes = 0
        self._build_strategy.async_mode = True
        self._execute_strategy.use_thread_barrier = True
