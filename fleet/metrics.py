"""Global metrics: a value over every worker of the job (Paddle 2.x's ``fleet.metrics``).

Each worker accumulates its own metric state while it trains (the ``auc`` layer's
``stat_pos`` / ``stat_neg`` buckets, counters of correct predictions, sums of errors).
These functions merge that state over the workers and compute the metric of the whole
job, as if one process had seen every worker's examples::

    auc, batch_auc, [batch_pos, batch_neg, stat_pos, stat_neg] = layers.auc(predict, label)
    ...
    exe.train_from_dataset(fleet.main_program, dataset)
    global_auc = fleet.metrics.auc(stat_pos, stat_neg)   # on every worker

Arguments are numpy arrays, or variable names / Variables whose values are read from
``scope`` (default: the global scope). Every function is a collective call: every worker
of the job calls the same functions in the same order, between training passes, and each
call returns the same value on every worker. Before reducing, the workers compare what
they were asked (the function, the call's number on each worker, the shapes and dtypes
of what they reduce):
a worker that called another function, or arrays of another shape, makes every worker
raise a ``ConfigError`` naming the workers and what each called; a worker that does not
call at all is named by the ``FleetTimeoutError`` the others raise after
``FLEET_RPC_TIMEOUT_MS``.

Which workers take part:

- Local training (one process, or fleet not initialized; also a job of one worker): the
  local value, nothing is exchanged.
- A parameter-server job: the workers form a ``WorkerGroup`` from the role maker's worker
  endpoints (``PADDLE_TRAINER_ENDPOINTS`` and ``PADDLE_TRAINER_ID``; fleetrun sets them),
  created on the first call and closed by ``fleet.stop_worker()``. Servers never join:
  calling a metric on a server is a ``ConfigError``.
- A job whose runtime already has a worker group (collective training, the dense part of
  hybrid): that group.
- ``util``: any object with ``all_reduce(array, op)`` (a ``WorkerGroup``, or Paddle's
  ``fleet.util`` shape); the comparison of calls runs only when it also has
  ``all_gather_object``.

Thread-safety: a call's exchanges are not interleaved with another thread's call, but the
order of calls from several threads differs between workers: call from one thread (the
main thread, between passes).
"""
import math
import threading
import weakref

import numpy as np

from fleet.errors import ConfigError, DataError, FleetTimeoutError, PeerLostError, TransportError
from fleet.framework.program import Variable
from fleet.framework.scope import Scope, global_scope
from fleet.framework.tensor import LoDTensor, SparseRows

__all__ = ["sum", "max", "min", "auc", "acc", "mae", "mse", "rmse"]

_WIRE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))
_calls = weakref.WeakKeyDictionary()  # group -> number of metric calls made on it by this process
_locks = weakref.WeakKeyDictionary()  # group -> the lock that keeps one call's exchanges together
_calls_lock = threading.Lock()


# ------------------------------------------------------------------ arguments
def _scope_of(scope, metric):
    if scope is None:
        return global_scope()
    if not isinstance(scope, Scope):
        raise ConfigError(f"fleet.metrics.{metric}: scope={scope!r} is not a fleet Scope; pass "
                          f"fleet.global_scope() (the default) or the scope the program ran in")
    return scope


def _value(x, what, metric, scope):
    """The numpy value of an argument: an array (or number), a variable name or a Variable."""
    name = x.name if isinstance(x, Variable) else x if isinstance(x, str) else None
    if name is not None:
        found = scope.value(name)
        if found is None:
            raise ConfigError(f"fleet.metrics.{metric}: {what} names variable {name!r}, which is not in the "
                              f"scope; run the program that computes it first (exe.run(fleet.startup_program) "
                              f"creates metric states) or check the name")
        x = found
    if isinstance(x, LoDTensor):
        x = x.values
    if isinstance(x, SparseRows):
        raise ConfigError(f"fleet.metrics.{metric}: {what} ({name or 'the argument'}) holds sparse rows; "
                          f"pass a dense metric array")
    try:
        value = np.array(x)  # a copy: the live array in the scope is never handed to the wire
    except (TypeError, ValueError) as e:
        raise ConfigError(f"fleet.metrics.{metric}: {what}={x!r} is not a numeric array ({e}); pass a "
                          f"numpy array, a variable name or a Variable") from None
    if value.dtype.kind not in "iuf":
        raise ConfigError(f"fleet.metrics.{metric}: {what} has dtype {value.dtype}; pass numbers "
                          f"(e.g. {what}.astype('int64') or .astype('float32'))")
    return value


def _wire(value, what, metric):
    """value as one of the dtypes workers exchange (float32/64, int32/64)."""
    if value.dtype in _WIRE_DTYPES:
        return value
    if value.dtype.kind in "iu" and value.dtype.itemsize <= 4 and value.dtype != np.uint32:
        return value.astype(np.int32)
    if value.dtype.kind in "iu":
        return value.astype(np.int64)
    if value.dtype.itemsize < 4:
        return value.astype(np.float32)
    raise ConfigError(f"fleet.metrics.{metric}: {what} has dtype {value.dtype}, which workers do not "
                      f"exchange; pass float32, float64, int32 or int64 (e.g. {what}.astype('float64'))")


def _scalar(value, what, metric):
    if value.size != 1:
        raise ConfigError(f"fleet.metrics.{metric}: {what} has {value.size} values (shape "
                          f"{list(value.shape)}); it takes one accumulated value (shape [1])")
    return float(value.reshape(-1)[0])


# ------------------------------------------------------------------ reduction
def _reducer(metric, util):
    """The object whose all_reduce merges the workers' values, or None: local value."""
    if util is not None:
        if not callable(getattr(util, "all_reduce", None)):
            raise ConfigError(f"fleet.metrics.{metric}: util={util!r} has no all_reduce(array, op); pass a "
                              f"fleet.transport.group.WorkerGroup, or None for the job's worker group")
        return util
    from fleet.base import fleet as _fleet

    return _fleet._metric_group(f"fleet.metrics.{metric}")


def _shapes(arrays):
    return [[[int(d) for d in a.shape], str(a.dtype)] for a in arrays]


def _describe(sig):
    seq, metric, _, args = sig
    text = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in args)
    return f"{metric}({text}) as its call {seq}"


def _check_same_call(group, metric, arrays, args):
    """Every worker compares what it was asked: the function, this call's number on the
    worker and the shapes and dtypes of the arrays to reduce (``args``, the caller's
    arguments, name them in the error). A mismatch raises the same error everywhere.

    Returns:
        The call's number on this worker (1 for the first metric call on ``group``).
    """
    with _calls_lock:
        seq = _calls.get(group, 0) + 1
        _calls[group] = seq
    try:
        sigs = group.all_gather_object([seq, metric, _shapes(arrays), _shapes(args)])
    except TransportError as e:
        raise _timeout(e, metric, seq) from e
    if all(s[:3] == sigs[group.rank][:3] for s in sigs):
        return seq
    lines = "; ".join(f"worker {rank} called {_describe(s)}" for rank, s in enumerate(sigs))
    raise ConfigError(f"fleet.metrics.{metric}: the workers made different metric calls: {lines}. Every worker "
                      f"must call the same fleet.metrics functions, on arrays of the same shapes and dtypes, in "
                      f"the same order (they are collective calls)")


def _timeout(error, metric, seq):
    """``error`` (the group's TransportError: a timeout, a lost or closed worker) saying
    what this call was; it keeps its class (a lost worker stays a PeerLostError naming its
    rank and endpoint)."""
    text = (f"fleet.metrics.{metric} (this worker's metric call {seq}): {error}. Metric calls are collective: "
            f"every worker must make the same fleet.metrics calls in the same order, so a worker that skips one, "
            f"reaches it more than FLEET_RPC_TIMEOUT_MS after the others, stopped (fleet.stop_worker()) or died "
            f"leaves the others waiting")
    if isinstance(error, PeerLostError):
        return PeerLostError(error.rank, error.endpoint, text)
    return (FleetTimeoutError if isinstance(error, FleetTimeoutError) else TransportError)(text)


def _all_reduce(reducer, arrays, op, metric, args):
    """Element-wise ``op`` of each array over the workers (the arrays themselves when
    local); ``args`` are the caller's arguments, compared between workers first."""
    if reducer is None:
        return [np.array(a) for a in arrays]
    with _calls_lock:
        lock = _locks.setdefault(reducer, threading.Lock())
    with lock:  # one call's exchanges in a row, whichever thread calls
        checked = callable(getattr(reducer, "all_gather_object", None))
        seq = _check_same_call(reducer, metric, arrays, args) if checked else None
        out = []
        for a in arrays:
            if a.size == 0:
                out.append(np.array(a))
                continue
            try:
                merged = reducer.all_reduce(np.ascontiguousarray(a.reshape(-1)), op)
            except TransportError as e:
                raise _timeout(e, metric, seq if seq is not None else "?") from e
            out.append(np.asarray(merged).reshape(a.shape))
        return out


def _elementwise(metric, input, op, scope, util):
    scope = _scope_of(scope, metric)
    value = _value(input, "input", metric, scope)
    wire = _wire(value, "input", metric)  # small integer / float16 inputs widen: the sum must not wrap
    return _all_reduce(_reducer(metric, util), [wire], op, metric, [value])[0]


# ------------------------------------------------------------------ public
def sum(input, scope=None, util=None):
    """Element-wise sum of ``input`` over the workers.

    Args:
        input: a numpy array, a variable name or a Variable (read from ``scope``).
        scope: where names are looked up (default: the global scope).
        util: what reduces over the workers (default: the job's worker group).

    Returns:
        A numpy array of ``input``'s shape and dtype, the same on every worker (integers
        narrower than 32 bits come back as int32, uint32 / uint64 as int64, float16 as
        float32: the workers exchange float32/64 and int32/64).

    Raises:
        ConfigError: a name not in the scope, a non-numeric input, a server calling it,
            or workers making different metric calls.
        FleetTimeoutError: a worker did not make this call (named).
    """
    return _elementwise("sum", input, "sum", scope, util)


def max(input, scope=None, util=None):
    """Element-wise maximum of ``input`` over the workers (arguments and errors as ``sum``)."""
    return _elementwise("max", input, "max", scope, util)


def min(input, scope=None, util=None):
    """Element-wise minimum of ``input`` over the workers (arguments and errors as ``sum``)."""
    return _elementwise("min", input, "min", scope, util)


def auc_of_buckets(stat_pos, stat_neg):
    """The ROC AUC of bucketed counts, computed as Paddle's ``fleet.metrics.auc`` does.

    Walks the buckets from the highest prediction down, adding each bucket's trapezoid
    (its negatives times the mean of the positives above it before and after the bucket)
    in that order, in float64; divides by positives x negatives.

    Args:
        stat_pos / stat_neg: counts per bucket, 1-D of equal length.

    Returns:
        The AUC as a float; 0.5 when the buckets hold no positive or no negative.
    """
    pos = np.asarray(stat_pos, dtype=np.float64)[::-1]
    neg = np.asarray(stat_neg, dtype=np.float64)[::-1]
    tp = np.add.accumulate(pos) if len(pos) else np.zeros(0)
    fp = np.add.accumulate(neg) if len(neg) else np.zeros(0)
    total_pos = float(tp[-1]) if len(tp) else 0.0
    total_neg = float(fp[-1]) if len(fp) else 0.0
    if total_pos * total_neg == 0:
        return 0.5
    area = np.add.accumulate(neg * ((tp - pos) + tp) / 2.0)[-1]  # sequential, in Paddle's order
    return float(area / (total_pos * total_neg))


def _buckets(value, what, metric):
    if value.ndim == 2 and value.shape[0] == 1:
        value = value[0]
    if value.ndim != 1 or value.size == 0:
        raise ConfigError(f"fleet.metrics.{metric}: {what} has shape {list(value.shape)}; it takes the auc layer's "
                          f"{what} (shape [buckets] or [1, buckets]): the third and fourth of the state list "
                          f"layers.auc returns, [batch_stat_pos, batch_stat_neg, stat_pos, stat_neg]")
    if (value < 0).any():
        raise ConfigError(f"fleet.metrics.{metric}: {what} holds negative counts (bucket "
                          f"{int(np.argmax(value < 0))}: {value[value < 0][0]}); pass the auc layer's bucket counts")
    return value


def auc(stat_pos, stat_neg, scope=None, util=None):
    """The AUC of every worker's predictions together, from the ``auc`` layer's buckets.

    Sums the buckets element-wise over the workers (exact integer counts) and computes
    the area under the ROC curve of the merged buckets as Paddle does: the AUC one
    process would compute over all the workers' predictions with the same buckets.

    Args:
        stat_pos / stat_neg: the auc layer's ``stat_pos`` / ``stat_neg`` (the third and
            fourth state variables ``layers.auc`` returns), as arrays, names or Variables.
        scope: where names are looked up (default: the global scope).
        util: what reduces over the workers (default: the job's worker group).

    Returns:
        The AUC as a float, the same on every worker; 0.5 when the merged buckets hold
        no positive or no negative example (the ``auc`` layer itself gives 0.0 there).

    Raises:
        ConfigError: buckets of another shape than [buckets] / [1, buckets], of different
            lengths or with negative counts, a server calling it, or workers making
            different metric calls.
        FleetTimeoutError: a worker did not make this call (named).
    """
    scope = _scope_of(scope, "auc")
    pos = _buckets(_value(stat_pos, "stat_pos", "auc", scope), "stat_pos", "auc")
    neg = _buckets(_value(stat_neg, "stat_neg", "auc", scope), "stat_neg", "auc")
    if pos.shape != neg.shape:
        raise ConfigError(f"fleet.metrics.auc: stat_pos has {pos.size} buckets and stat_neg {neg.size}; pass the "
                          f"two bucket states of the same auc layer")
    dtype = np.int64 if pos.dtype.kind in "iu" and neg.dtype.kind in "iu" else np.float64
    both = np.concatenate([pos.astype(dtype), neg.astype(dtype)])
    merged = _all_reduce(_reducer("auc", util), [both], "sum", "auc", [pos, neg])[0]
    return auc_of_buckets(merged[:pos.size], merged[pos.size:])


def _ratio(metric, num, num_name, total, total_name, scope, util):
    scope = _scope_of(scope, metric)
    num, total = _value(num, num_name, metric, scope), _value(total, total_name, metric, scope)
    a, b = _scalar(num, num_name, metric), _scalar(total, total_name, metric)
    reducer = _reducer(metric, util)
    merged = _all_reduce(reducer, [np.array([a, b], dtype=np.float64)], "sum", metric, [num, total])[0]
    if merged[1] == 0:
        over = "" if reducer is None else f" summed over the {_group_size(reducer)} workers"
        raise DataError(f"fleet.metrics.{metric}: {total_name} is 0{over}: no example was counted, so the "
                        f"{metric} is undefined; compute it after a pass that ran examples")
    return float(merged[0]) / float(merged[1])


def _group_size(reducer):
    return getattr(reducer, "size", "?")


def acc(correct, total, scope=None, util=None):
    """Accuracy over the workers: the sum of ``correct`` over the sum of ``total``.

    Args:
        correct / total: accumulated counts of one value each (shape [1]), as arrays,
            names or Variables (e.g. the ``correct`` / ``total`` of ``layers.accuracy``
            summed over the batches).
        scope / util: as ``sum``.

    Returns:
        A float, the same on every worker.

    Raises:
        ConfigError: an argument with more than one value; as ``sum``.
        DataError: ``total`` sums to 0.
    """
    return _ratio("acc", correct, "correct", total, "total", scope, util)


def mae(abserr, total_ins_num, scope=None, util=None):
    """Mean absolute error over the workers: the sum of ``abserr`` (accumulated absolute
    errors) over the sum of ``total_ins_num`` (examples). Arguments and errors as ``acc``."""
    return _ratio("mae", abserr, "abserr", total_ins_num, "total_ins_num", scope, util)


def mse(sqrerr, total_ins_num, scope=None, util=None):
    """Mean squared error over the workers: the sum of ``sqrerr`` (accumulated squared
    errors) over the sum of ``total_ins_num``. Arguments and errors as ``acc``."""
    return _ratio("mse", sqrerr, "sqrerr", total_ins_num, "total_ins_num", scope, util)


def rmse(sqrerr, total_ins_num, scope=None, util=None):
    """Root mean squared error over the workers: the square root of ``mse``."""
    return math.sqrt(_ratio("rmse", sqrerr, "sqrerr", total_ins_num, "total_ins_num", scope, util))
