"""Running a prepared program: the op methods in order (``Plan``), one thread's
temporaries (``Runner``), converting fed values, and combining threads' gradients.

``Executor.run`` (plain and data-parallel: ``fleet.framework.compiler``) and the dataset
trainer all run programs through these; none imports another's internals.
"""
import numpy as np

from fleet.errors import DataError
from fleet.framework import passes
from fleet.framework.context import OpContext
from fleet.framework.program import LRSCHED, OPTIMIZE
from fleet.framework.registry import get_op_def, has_op
from fleet.framework.tensor import LoDTensor, SparseRows, as_lod_tensor
from fleet.kernels import sparse as sparse_kernels

_NP_DTYPES = {"float32": np.float32, "int64": np.int64, "float64": np.float64,
              "int32": np.int32, "bool": np.bool_}


# The phases of a step. Schedule ops (the learning-rate counter's increment and the
# schedule) run once per update, like the optimizer ops, but before the compute ops read
# the rate: when threads split a batch, the lead runs them first, then the others compute.
COMPUTE, OPTIMIZE_PHASE, SCHEDULE = 0, 1, 2


class Plan:
    """A program prepared for running: the op methods in order, split by role."""

    def __init__(self, program):
        block = program.global_block()
        ops = passes.optimize_for_execution(program)
        self.persistable = frozenset(n for n, v in block.vars.items() if v.persistable)
        self.data_vars = {n: v for n, v in block.vars.items() if v.is_data}
        self.steps = []  # (method, op, phase): COMPUTE, OPTIMIZE or SCHEDULE
        for op in ops:
            opdef = get_op_def(op.type)
            is_grad = op.type.endswith("_grad") and not has_op(op.type)
            method = opdef.backward if is_grad else opdef.forward
            role = op.attr("op_role")
            phase = SCHEDULE if role == LRSCHED else OPTIMIZE_PHASE if role == OPTIMIZE else COMPUTE
            self.steps.append((method, op, phase))
        # Every gradient an optimizer-role op reads: one per optimizer op locally, all of
        # them for a distributed worker's single send op.
        self.grad_names = list(dict.fromkeys(n for _, op, phase in self.steps if phase == OPTIMIZE_PHASE
                                             for n in op.input("Grad")))
        # updates parameters (or sends updates)
        self.trains = any(phase == OPTIMIZE_PHASE for _, _, phase in self.steps)


class Runner:
    """Runs a plan with one private dict of temporaries (one per thread and scope)."""

    def __init__(self, plan, scope):
        self.plan = plan
        self.scope = scope
        self.local = {}
        # Set by the dataset trainer on the runners of one batch split across Reduce
        # threads (metric ops count the parts as one step); None otherwise.
        self.step_group = None
        self.contexts = [(m, OpContext(op, self.local, scope, plan.persistable, self), phase)
                         for m, op, phase in plan.steps]

    def run(self, optimize=True, compute=True, schedule=None):
        """Runs the ops of the chosen phases in program order; ``schedule`` (the
        learning-rate ops) defaults to ``optimize``."""
        wanted = (compute, optimize, optimize if schedule is None else schedule)
        for method, ctx, phase in self.contexts:
            if wanted[phase]:
                method(ctx)

    def value(self, name):
        value = self.local.get(name)
        return self.scope.value(name) if value is None else value


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


def combine_step(runners, sizes, grad_names, split):
    """Combines the gradients the ``runners`` of one step computed into ``runners[0]``.

    Args:
        runners: the runners that ran the forward and backward ops of this step (each on
            its own batch, or on its part of one batch).
        sizes: examples each runner ran.
        grad_names: the gradients the optimizer ops read (``Plan.grad_names``).
        split: the runners ran parts of one batch: weight each gradient by its part's
            share of the examples, so the result is the whole batch's mean gradient (as
            one runner on the whole batch computes it); else average them.

    Returns:
        The lead runner (``runners[0]``), holding the combined gradients: its
        ``run(compute=False)`` applies them once.
    """
    lead = runners[0]
    shares = [n / sum(sizes) for n in sizes] if split else None
    for name in grad_names:
        got = [(r.local.get(name), i) for i, r in enumerate(runners)]
        got = [(v, i) for v, i in got if v is not None]
        if len(got) > 1 or (got and shares):
            weights = [shares[i] for _, i in got] if shares else None
            lead.local[name] = reduce_gradients([v for v, _ in got], weights=weights)
        elif got:
            lead.local[name] = got[0][0]
    return lead


def run_combined_step(runners, parts, compute, grad_names, split, map_parts=map):
    """One update from several runners, each computing its part of the step: the
    learning-rate ops once (on the lead, before any compute op reads the rate),
    ``compute(runner, part) -> examples`` on every runner (through ``map_parts``: ``map``
    or a thread pool's), their gradients combined (``combine_step``), the optimizer ops
    once. Used by the dataset trainer's Reduce / lock-step threads and by data-parallel
    CompiledPrograms.

    Returns:
        (the lead runner, the examples each runner computed).
    """
    runners[0].run(optimize=False, compute=False, schedule=True)
    sizes = list(map_parts(compute, runners, parts))
    lead = combine_step(runners, sizes, grad_names, split)
    lead.run(compute=False, schedule=False)
    return lead, sizes


def batch_size(feed):
    """Examples in a feed dict (the first value's rows, or a LoDTensor's sequences)."""
    for value in feed.values():
        return len(value) if not hasattr(value, "batch_size") else value.batch_size
    return 0


def split_batch(feed, parts):
    """Splits a batch into at most ``parts`` consecutive batches whose sizes differ by at
    most one example (Paddle's ParallelExecutor splits its feed across devices so).

    Returns:
        A list of feed dicts, none empty (fewer than ``parts`` when the batch is smaller).
    """
    n = batch_size(feed)
    parts = max(1, min(int(parts), n))
    if parts == 1:
        return [feed]
    bounds = [n * i // parts for i in range(parts + 1)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        piece = {}
        for name, value in feed.items():
            if isinstance(value, LoDTensor):
                lo, hi = int(value.offsets[a]), int(value.offsets[b])
                piece[name] = LoDTensor(value.values[lo:hi], value.offsets[a:b + 1] - lo)
            else:
                piece[name] = value[a:b]
        out.append(piece)
    return out
