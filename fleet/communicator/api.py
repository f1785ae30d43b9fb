"""The communicator contract: what a worker's ops and its runtime may call, per strategy.

A communicator belongs to one worker process and moves its updates for one strategy
(mode). The training ops call ``prefetch``, ``send`` and ``geo_step`` from training
threads; the runtime calls the lifecycle (``start``, ``flush``, ``stop``), the pass hooks
of ``fleet.framework.hooks.TrainingHooks`` and the coordination calls. Each method below
says whether it blocks and whether several threads may call it at once; an implementation
must keep both promises.

Implementations register their mode with ``@register("mode")``;
``make_communicator(mode, ...)`` builds one by mode. ``fleet.communicator.base.Communicator``
implements everything but ``send`` for communicators that talk to parameter servers; each
strategy lives in a module of its own (``sync``, ``half_async``, ``asynchronous``, ``geo``,
``collective``, ``hybrid``). The collective and hybrid communicators talk to the other
workers through a ``fleet.transport.group.WorkerGroup`` (``uses_worker_group``).
"""
import abc

from fleet.errors import ConfigError
from fleet.framework.hooks import TrainingHooks

_REGISTRY = {}


class CommunicatorAPI(TrainingHooks, abc.ABC):
    """The methods every communicator offers (see the module docstring).

    Class attributes:
        mode: the strategy's name ("sync", "async", ...), set by ``register``.
        requires_thread_barrier: True when the training threads of a step must meet before
            ``send`` (the step's gradients are reduced over threads first).
    """

    mode = None
    requires_thread_barrier = False

    # -- lifecycle (runtime's thread) ---------------------------------------------------
    @abc.abstractmethod
    def start(self):
        """Connects and starts background threads. Blocks until connected (bounded by the
        transport's timeouts). Not thread-safe: called once, before training."""

    @abc.abstractmethod
    def flush(self):
        """Sends everything queued (async, GEO). Blocks until sent (bounded). Not called
        concurrently with ``send`` of the same pass."""

    @abc.abstractmethod
    def stop(self):
        """Flushes, tells the peers this worker is done, closes. Blocks (bounded).
        Idempotent; not thread-safe."""

    @abc.abstractmethod
    def check_alive(self):
        """Raises the job's failure (a lost peer, a failure reported elsewhere) if there is
        one. Never blocks; thread-safe."""

    # -- steps (training threads) -------------------------------------------------------
    @abc.abstractmethod
    def prefetch(self, table, ids, is_test=False, shows=None, clicks=None):
        """The rows of ``table`` that ``ids`` name, as ``PrefetchedRows``; a training lookup
        of a table with statistics sends the ids' shows and clicks (``shows``/``clicks``:
        float32 per occurrence of ``ids``, or None for occurrence counts and no clicks).
        Blocks until they arrive (bounded); thread-safe."""

    @abc.abstractmethod
    def send(self, grads):
        """Hands one step's gradients ({name: array or SparseRows}) over as the strategy
        wants. Sync and half-async block until the step is applied and fresh parameters are
        in the scope; async blocks only while its queues are full (back-pressure). Thread-safe."""

    @abc.abstractmethod
    def geo_step(self, grads):
        """One local GEO step's bookkeeping; every k steps starts an exchange with the
        servers in the background and applies its replies at a later step (blocks, bounded,
        only when the exchange before is still in flight). Thread-safe. Other modes raise
        ConfigError."""

    # -- coordination (runtime's thread) -------------------------------------------------
    @abc.abstractmethod
    def barrier_worker(self, timeout=None):
        """Blocks until every live worker called it, at most ``timeout`` seconds (default
        FLEET_RPC_TIMEOUT_MS); the timeout names who did not come. Not thread-safe."""

    @abc.abstractmethod
    def report_failure(self, text):
        """Tells the peers this worker cannot go on, because of ``text``. Bounded; never
        raises; once per worker. Thread-safe."""


def register(mode):
    """Class decorator: makes ``cls`` the communicator of ``mode``.

    Raises:
        ConfigError: another class is registered for ``mode`` already.
    """
    def decorate(cls):
        if mode in _REGISTRY and _REGISTRY[mode] is not cls:
            raise ConfigError(f"communicator mode {mode!r} is registered twice: "
                              f"{_REGISTRY[mode].__name__} and {cls.__name__}")
        cls.mode = mode
        _REGISTRY[mode] = cls
        return cls
    return decorate


def modes():
    """The registered modes, sorted."""
    return sorted(_REGISTRY)


def communicator_class(mode):
    """The class registered for ``mode``.

    Raises:
        ConfigError: no communicator is registered for ``mode``; names it and the modes
            there are.
    """
    cls = _REGISTRY.get(mode)
    if cls is None:
        raise ConfigError(f"no communicator for training mode {mode!r}: the modes are "
                          f"{', '.join(repr(m) for m in modes())}; build the strategy with "
                          "DistributedStrategyFactory (create_sync_strategy(), ...)")
    return cls


def make_communicator(mode, plan, worker_id, scope, flags, connect, update_frequency=100,
                      liveness=None, make_group=None):
    """A new communicator of ``mode`` for one worker.

    Args:
        mode: "sync", "async", "half_async", "geo" (or another registered mode).
        plan, worker_id, scope, flags, connect, liveness: as for
            ``fleet.communicator.base.Communicator``.
        update_frequency: GEO's k (steps between exchanges); other modes ignore it.
        make_group: for the modes whose class has ``uses_worker_group`` ("collective",
            "hybrid"): a callable returning the joined ``fleet.transport.group.WorkerGroup``.

    Raises:
        ConfigError: ``mode`` is not registered (see ``communicator_class``).
    """
    cls = communicator_class(mode)
    extra = {"update_frequency": update_frequency} if mode == "geo" else {}
    if getattr(cls, "uses_worker_group", False):
        extra["make_group"] = make_group
    return cls(plan, worker_id, scope, flags, connect, liveness=liveness, **extra)
