"""The executor: runs programs on feeds, and trains from datasets with threads.

``Executor.run`` runs every op of a program in order on one batch. ``train_from_dataset``
runs N training threads, each on its own child scope, over batches made by the dataset's
producer threads; parameters are shared (Hogwild), or, when the program's build strategy
says Reduce, the threads' gradients are averaged by a numba kernel and applied once.

Thread-safety: one Executor may be used from several threads; each thread gets its own
temporaries. Running the same program concurrently on the same scope races on the
parameters by design (Hogwild).
"""
import logging
import threading

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework import passes
from fleet.framework.context import OpContext
from fleet.framework.program import OPTIMIZE, Program, Variable, default_main_program
from fleet.framework.registry import get_op_def, has_op
from fleet.framework.scope import global_scope
from fleet.framework.tensor import LoDTensor, SparseRows, as_lod_tensor
from fleet.kernels import sparse as sparse_kernels

log = logging.getLogger("fleet")

_NP_DTYPES = {"float32": np.float32, "int64": np.int64, "float64": np.float64,
              "int32": np.int32, "bool": np.bool_}

# How long a training thread waits for the dataset's next batch before it reports the
# producers that are stuck (a pipe command that never ends, a file on a dead mount).
DATASET_BATCH_TIMEOUT_S = 600.0


class _Plan:
    """A program prepared for running: the op methods in order, split by role."""

    def __init__(self, program):
        block = program.global_block()
        ops = passes.optimize_for_execution(program)
        self.persistable = frozenset(n for n, v in block.vars.items() if v.persistable)
        self.data_vars = {n: v for n, v in block.vars.items() if v.is_data}
        self.steps = []  # (method, op, is_optimize)
        for op in ops:
            opdef = get_op_def(op.type)
            is_grad = op.type.endswith("_grad") and not has_op(op.type)
            method = opdef.backward if is_grad else opdef.forward
            self.steps.append((method, op, op.attr("op_role") == OPTIMIZE))
        self.grad_names = [op.input("Grad")[0] for _, op, opt in self.steps if opt and op.input("Grad")]


class _Runner:
    """Runs a plan with one private dict of temporaries (one per thread and scope)."""

    def __init__(self, plan, scope):
        self.plan = plan
        self.scope = scope
        self.local = {}
        # Set by the dataset trainer on the runners of one batch split across Reduce
        # threads (metric ops count the parts as one step); None otherwise.
        self.step_group = None
        self.contexts = [(m, OpContext(op, self.local, scope, plan.persistable, self), opt)
                         for m, op, opt in plan.steps]

    def run(self, optimize=True, compute=True):
        for method, ctx, is_opt in self.contexts:
            if (optimize if is_opt else compute):
                method(ctx)

    def value(self, name):
        value = self.local.get(name)
        return self.scope.find_var(name) if value is None else value


class Executor:
    """Runs programs (Paddle's ``fluid.Executor``; the place argument is accepted and ignored:
    fleet runs on CPUs)."""

    def __init__(self, place=None):
        self.place = place
        self._plans = {}
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._closed = False

    # ---------------------------------------------------------------- preparing
    def _plan(self, program):
        key = program._id
        with self._lock:
            entry = self._plans.get(key)
            if entry is None or entry[0] != program._version:
                entry = (program._version, _Plan(program))
                self._plans[key] = entry
        return entry[1]

    def _runner(self, program, scope):
        plan = self._plan(program)
        runners = getattr(self._tls, "runners", None)
        if runners is None:
            runners = self._tls.runners = {}
        key = (program._id, id(scope))
        runner = runners.get(key)
        if runner is None or runner.plan is not plan:
            runner = runners[key] = _Runner(plan, scope)
        return runner

    # ---------------------------------------------------------------- run
    def run(self, program=None, feed=None, fetch_list=None, feed_var_name="feed",
            fetch_var_name="fetch", scope=None, return_numpy=True, use_program_cache=True):
        """Runs ``program`` once on ``feed`` and returns the fetched values.

        Args:
            program: a Program (default: the default main program).
            feed: {name: value}; a lod_level=0 input as an array [batch, *shape], a
                lod_level=1 input as ``(values, lengths)`` or a list of sequences.
            fetch_list: variables or names whose values to return.
            scope: where parameters live (default: ``global_scope()``).
            return_numpy: return numpy arrays (copies); else the raw values.

        Returns:
            A list with one value per fetched variable.

        Raises:
            ConfigError / DataError: unknown feed names, wrong shapes or dtypes, missing
                inputs; each message names the variable and what was expected.
            TypeError: ``program`` is not a Program.

        Blocks until every op ran (for a distributed worker, until its communication for
        this step is done as the strategy requires).
        """
        if self._closed:
            raise ConfigError("this Executor was closed; create a new fleet.Executor()")
        program = default_main_program() if program is None else program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a fleet.Program, got {type(program).__name__}")
        scope = global_scope() if scope is None else scope
        runner = self._runner(program, scope)
        local = runner.local
        try:
            if feed:
                self._feed(program, runner.plan, feed, local)
            runner.run()
            return self._fetch(runner, fetch_list, return_numpy)
        finally:
            for name in feed or ():  # a later run must not see this run's inputs
                local.pop(name.name if isinstance(name, Variable) else name, None)

    def _feed(self, program, plan, feed, local):
        if not isinstance(feed, dict):
            raise DataError(f"feed must be a dict of {{name: value}}, got {type(feed).__name__}")
        block = program.global_block()
        for name, value in feed.items():
            if isinstance(name, Variable):
                name = name.name
            var = block.vars.get(name)
            if var is None:
                raise DataError(
                    f"feed {name!r} is not a variable of this program; its inputs are "
                    f"{sorted(plan.data_vars) or 'none'}"
                )
            local[name] = feed_value(var, value)

    def _fetch(self, runner, fetch_list, return_numpy):
        if not fetch_list:
            return []
        out = []
        for item in fetch_list:
            name = item.name if isinstance(item, Variable) else item
            if not isinstance(name, str):
                raise ConfigError(f"fetch_list entries are variables or names, got {item!r}")
            value = runner.value(name)
            if value is None:
                raise ConfigError(
                    f"cannot fetch {name!r}: no op of this program produced it and it is not "
                    f"in the scope; fetch a variable of the program you run"
                )
            if return_numpy:
                if isinstance(value, LoDTensor):
                    value = np.array(value.values)
                elif isinstance(value, SparseRows):
                    value = value.to_dense()
                else:
                    value = np.array(value)
            out.append(value)
        return out

    # ---------------------------------------------------------------- datasets
    def train_from_dataset(self, program=None, dataset=None, scope=None, thread=0, debug=False,
                           fetch_list=None, fetch_info=None, print_period=100,
                           fetch_handler=None, checkpoint=None):
        """Trains ``program`` on one pass over ``dataset`` with several threads.

        Args:
            program: the program to run (default: the default main program).
            dataset: a fleet dataset (``DatasetFactory().create_dataset(...)``).
            thread: training threads (default: the dataset's ``set_thread`` value).
            fetch_list / fetch_info: variables printed every ``print_period`` batches,
                each with its label.
            fetch_handler: a ``FetchHandler`` called with the latest fetched values every
                ``period_secs`` seconds from a monitor thread.
            debug: print a timing line per printed batch.
            checkpoint: a ``fleet.CheckpointConfig``: its ``after_step`` runs after every
                batch (the first worker checkpoints when due) and its ``after_epoch``
                once the pass is over.

        Returns:
            A dict summary of the pass: examples, batches, seconds, examples_per_sec,
            bad_lines_skipped and the last fetched values (Paddle returns None; the extra
            information is for scripts that want it).

        Raises:
            RuntimeError: no dataset, or no thread count (Paddle's messages).
            DataError: a producer met bad data (file, line and field named).

        Blocks until the pass is over; every wait for data is bounded.
        """
        return self._run_from_dataset(program, dataset, scope, thread, debug, fetch_list,
                                      fetch_info, print_period, fetch_handler, train=True,
                                      checkpoint=checkpoint)

    def infer_from_dataset(self, program=None, dataset=None, scope=None, thread=0, debug=False,
                           fetch_list=None, fetch_info=None, print_period=100,
                           fetch_handler=None):
        """Like ``train_from_dataset`` but runs only the forward ops (no parameter updates)."""
        return self._run_from_dataset(program, dataset, scope, thread, debug, fetch_list,
                                      fetch_info, print_period, fetch_handler, train=False)

    def _run_from_dataset(self, program, dataset, scope, thread, debug, fetch_list, fetch_info,
                          print_period, fetch_handler, train, checkpoint=None):
        from fleet.framework.trainer import DatasetTrainer

        if dataset is None:
            raise RuntimeError("dataset is need and should be initialized")
        program = default_main_program() if program is None else program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a fleet.Program, got {type(program).__name__}")
        if not train:
            program = program.clone(for_test=True)
        thread = int(thread) if thread else int(getattr(dataset, "thread_num", 0) or 0)
        if thread <= 0:
            raise RuntimeError(
                "You should set thread num first, either in Dataset or in Executor.train_from_dataset"
            )
        fetch_list = list(fetch_list or [])
        fetch_info = list(fetch_info or [])
        if fetch_info and len(fetch_info) != len(fetch_list):
            raise ConfigError(
                f"fetch_info has {len(fetch_info)} labels for {len(fetch_list)} fetch_list "
                f"entries; give one label per fetched variable"
            )
        scope = global_scope() if scope is None else scope
        trainer = DatasetTrainer(self, program, dataset, scope, thread, fetch_list, fetch_info,
                                 print_period, fetch_handler, debug)
        trainer.checkpoint = checkpoint
        summary = trainer.run()
        if checkpoint is not None:
            checkpoint.after_epoch(self)
        return summary

    def close(self):
        """Releases the executor's buffers (a distributed worker's ``stop_worker`` does the
        talking to servers)."""
        self._plans.clear()
        self._tls = threading.local()
        self._closed = True


def feed_value(var, value):
    """Converts a fed value to what ops of ``var`` consume, validating it against ``var``.

    Raises:
        DataError: wrong shape or a value that cannot be converted; the message names the
            variable, the shape seen and the shape expected.
    """
    dtype = _NP_DTYPES[var.dtype]
    if var.lod_level:
        return as_lod_tensor(var.name, value, dtype)
    if isinstance(value, LoDTensor):
        raise DataError(f"feed {var.name!r} is a lod_level=0 input; feed an array, not a LoDTensor")
    if dtype == np.int64 and isinstance(value, np.ndarray) and value.dtype.kind == "f":
        if not np.array_equal(value, np.round(value)):
            raise DataError(
                f"feed {var.name!r} is int64 (ids or class labels) but got non-integer floats; "
                f"feed integers (e.g. labels 0/1 as int64)")
    try:
        arr = np.ascontiguousarray(value, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise DataError(f"feed {var.name!r}: cannot convert {type(value).__name__} to {var.dtype}: {e}") from e
    want = var.shape
    if want and want[0] == -1 and arr.ndim >= 1:
        rest = tuple(want[1:])
        if arr.shape[1:] != rest:
            per_example = int(np.prod(rest)) if rest else 1
            if arr.size == arr.shape[0] * per_example and -1 not in rest:
                arr = arr.reshape((arr.shape[0],) + rest)
            else:
                raise DataError(
                    f"feed {var.name!r} has shape {list(arr.shape)} but the variable is "
                    f"{list(want)}; feed an array of shape [batch, {', '.join(map(str, rest))}]"
                )
    elif want and -1 not in want and arr.shape != want:
        if arr.size != int(np.prod(want)):
            raise DataError(f"feed {var.name!r} has shape {list(arr.shape)}, expected {list(want)}")
        arr = arr.reshape(want)
    return arr


def reduce_gradients(values, average=True, weights=None):
    """Sums (or averages) gradients of one parameter from several threads or steps.

    Dense arrays are added with a numba kernel into a new array; SparseRows are
    concatenated (the optimizer merges duplicate rows).

    Args:
        values: the gradients (arrays of one shape, or SparseRows of one table).
        average: divide the sum by ``len(values)``.
        weights: instead of ``average``, one factor per gradient (e.g. each part's share of
            a split batch, so the result is the whole batch's mean gradient).
    """
    first = values[0]
    if weights is None:
        weights = [1.0 / len(values) if average else 1.0] * len(values)
    if isinstance(first, SparseRows):
        rows = np.concatenate([v.rows for v in values])
        vals = np.concatenate([v.values for v in values])
        if any(w != 1.0 for w in weights):
            start = 0
            for v, w in zip(values, weights):
                part = vals[start:start + len(v.rows)]
                start += len(v.rows)
                if w != 1.0 and part.size:
                    sparse_kernels.scale_into(part.reshape(-1), w)
        return SparseRows(rows, vals, first.height)
    out = np.array(first, dtype=np.float32, copy=True)
    flat = out.reshape(-1)
    if len(set(weights)) == 1:  # equal weights: add, then scale once
        for v in values[1:]:
            sparse_kernels.add_into(flat, np.ascontiguousarray(v, dtype=np.float32).reshape(-1))
        if weights[0] != 1.0:
            sparse_kernels.scale_into(flat, weights[0])
        return out
    sparse_kernels.scale_into(flat, weights[0])
    for v, w in zip(values[1:], weights[1:]):
        part = np.multiply(np.ascontiguousarray(v, dtype=np.float32), np.float32(w), dtype=np.float32)
        sparse_kernels.add_into(flat, part.reshape(-1))
    return out
