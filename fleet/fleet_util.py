"""Paddle's fleet utilities for training scripts: ``FleetUtil`` (Paddle 1.x's
``paddle.fluid.incubate.fleet.utils.fleet_util.FleetUtil``: printing from one worker,
zeroing a metric state, the global AUC) with the calls of Paddle 2.x's ``fleet.util``
(``all_reduce``, ``all_gather``, ``barrier``, ``print_on_rank``, ``get_file_shard``)::

    from fleet.fleet_util import FleetUtil      # was: from paddle.fluid.incubate.fleet.utils.fleet_util import FleetUtil
    fleet_util = FleetUtil()
    fleet_util.print_global_auc(fluid.global_scope(), stat_pos=states[2].name, stat_neg=states[3].name)

The reductions go through ``fleet.metrics`` (the job's worker group; local training:
the local value), so they are collective calls with its checks and timeouts: every
worker makes the same calls in the same order. Paddle's PSLib model, donefile and xbox
helpers have no counterpart (docs/porting.md).
"""
import logging

import numpy as np

from fleet import metrics
from fleet.errors import ConfigError, TransportError
from fleet.framework.scope import global_scope

log = logging.getLogger("fleet")

_MODES = {"sum": metrics.sum, "max": metrics.max, "min": metrics.min}


def _fleet():
    from fleet.base import fleet

    return fleet


def _rank():
    fleet = _fleet()
    return fleet.worker_index() if fleet._is_initialized and fleet.is_worker() else 0


class FleetUtil:
    """See the module's doc. ``mode`` is Paddle's "pslib" or "transpiler"; fleet's one
    fleet object serves both."""

    def __init__(self, mode="pslib"):
        if mode not in ("pslib", "transpiler"):
            raise ConfigError(f"FleetUtil(mode={mode!r}): mode is 'pslib' or 'transpiler'")
        self.mode = mode

    # ---------------------------------------------------------------- printing
    def rank0_print(self, s):
        """Prints ``s`` on worker 0 only."""
        if _rank() == 0:
            print(s, flush=True)

    def rank0_info(self, s):
        """Logs ``s`` (INFO, the "fleet" logger) on worker 0 only."""
        if _rank() == 0:
            log.info("%s", s)

    def rank0_error(self, s):
        """Logs ``s`` (ERROR) on worker 0 only."""
        if _rank() == 0:
            log.error("%s", s)

    def print_on_rank(self, message, rank_id):
        """Prints ``message`` on worker ``rank_id`` only."""
        if _rank() == rank_id:
            print(message, flush=True)

    # ---------------------------------------------------------------- metric state
    def set_zero(self, var_name, scope=None, place=None, param_type="int64"):
        """Zeroes the variable ``var_name`` of ``scope`` (default: the global scope) in
        place, as ``param_type`` (a metric state before the next pass)."""
        scope = global_scope() if scope is None else scope
        value = scope.value(var_name)
        if value is None:
            raise ConfigError(f"set_zero: {var_name!r} is not in the scope{_auc_hint(scope)}")
        scope.find_var(var_name).set(np.zeros(value.shape, dtype=param_type), place)

    def get_global_auc(self, scope=None, stat_pos="_generated_var_2", stat_neg="_generated_var_3"):
        """The AUC of the ``auc`` layer's statistics summed over the workers (the same on
        every worker; a collective call). ``stat_pos`` / ``stat_neg`` are variable names:
        fleet's are ``auc.stat_pos_N`` / ``auc.stat_neg_N`` (``layers.auc``'s third
        result, ``states[2].name`` and ``states[3].name``), not Paddle's
        ``_generated_var_N``."""
        scope = global_scope() if scope is None else scope
        for what, name in (("stat_pos", stat_pos), ("stat_neg", stat_neg)):
            if scope.value(name) is None:
                raise ConfigError(f"get_global_auc: {what}={name!r} is not in the scope{_auc_hint(scope)}")
        return metrics.auc(stat_pos, stat_neg, scope=scope)

    def print_global_auc(self, scope=None, stat_pos="_generated_var_2", stat_neg="_generated_var_3",
                         print_prefix=""):
        """Prints ``<print_prefix> global auc = <auc>`` on worker 0 (a collective call:
        every worker computes it)."""
        auc = self.get_global_auc(scope, stat_pos, stat_neg)
        self.rank0_print(f"{print_prefix} global auc = {auc}")

    # ---------------------------------------------------------------- Paddle 2.x's fleet.util
    def all_reduce(self, input, mode="sum", comm_world="worker"):
        """``input`` (a number or array) reduced over the workers by ``mode`` ("sum",
        "max" or "min"), as a numpy array of its shape; a collective call."""
        _workers_only(comm_world, "all_reduce")
        reduce = _MODES.get(mode)
        if reduce is None:
            raise ConfigError(f"all_reduce mode={mode!r} must be one of {sorted(_MODES)}")
        return reduce(np.asarray(input))

    def all_gather(self, input, comm_world="worker"):
        """Every worker's ``input`` (any picklable value), in worker order; a collective
        call (local training: ``[input]``)."""
        _workers_only(comm_world, "all_gather")
        group = _fleet()._metric_group("fleet_util.all_gather")
        if group is None:
            return [input]
        try:
            return list(group.all_gather_object(input))
        except TransportError as e:
            raise type(e)(f"fleet_util.all_gather: {e}; every worker must call it") from e

    def barrier(self, comm_world="worker"):
        """Blocks until every worker called it (``fleet.barrier_worker()``)."""
        _workers_only(comm_world, "barrier")
        fleet = _fleet()
        if fleet._is_initialized and not fleet.is_local():
            fleet.barrier_worker()

    def get_file_shard(self, files):
        """This worker's share of ``files`` (``fleet.split_files``; every file before
        fleet.init, as the only worker)."""
        if not isinstance(files, list):
            raise ConfigError(f"get_file_shard takes a list of files, got {type(files).__name__}")
        fleet = _fleet()
        return fleet.split_files(files) if fleet._is_initialized else list(files)


def _workers_only(comm_world, what):
    if comm_world != "worker":
        raise ConfigError(f"fleet_util.{what}(comm_world={comm_world!r}): fleet reduces over the workers only; "
                          f"servers take no part (comm_world='worker')")


def _auc_hint(scope):
    names = [n for n in scope.keys() if n.startswith("auc.stat_")]
    if not names:
        return "; run the startup program first (it creates the auc layer's statistics)"
    return (f"; fleet names the auc layer's statistics {names[:4]} (layers.auc's third result: states[2].name, "
            f"states[3].name), not Paddle's _generated_var_N")


util = FleetUtil()  # Paddle 2.x's ``fleet.util``
