"""The ops a worker's transpiled program runs to talk to the servers (prefetch, send,
geo_step, pull_dense) and to the other workers (c_allreduce_grads, c_broadcast_params).

They reach the worker's communicator through ``program.training_hooks`` (set by the runtime),
so a test clone of the program (``clone(for_test=True)``) prefetches with the same
communicator, pulls the dense parameters it reads and sends nothing (its ``send`` op is
dropped with the optimizer role).
"""
from fleet.communicator.statistics import occurrence_statistics
from fleet.errors import ConfigError
from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import flat_ids


def _communicator(ctx):
    comm = ctx.op.block.program.training_hooks
    if comm is None or not comm.running:
        raise ConfigError(
            "this worker is not connected to the servers: call fleet.init_worker() before "
            "running fleet.main_program")
    return comm


@register_op
class Prefetch(OpDef):
    """Pulls the rows of a server-side table that this batch's ids need.

    A training lookup (neither the op's ``is_test`` nor a test clone) of a table with a
    ShowClickEntry also reads the op's ``Show`` and ``Click`` inputs: each occurrence of
    an id counts its example's show and click (see ``fleet.communicator.statistics``).
    Test lookups send no statistics and create nothing."""

    type = "prefetch"

    def forward(self, ctx):
        comm = _communicator(ctx)
        table = ctx.attrs["table"]
        is_test = bool(ctx.attrs.get("is_test")) or ctx.op.block.program._is_test
        values = ctx.inputs("Ids")
        if is_test or not ctx.op.input("Show"):
            rows = comm.prefetch(table, flat_ids(values), is_test=is_test)
        else:
            names = (ctx.input_name("Show"), ctx.input_name("Click"))
            ids, shows, clicks = occurrence_statistics(values, ctx.input("Show"), ctx.input("Click"), names)
            rows = comm.prefetch(table, ids, is_test=False, shows=shows, clicks=clicks)
        ctx.local[ctx.output_name("Out")] = rows


def _step_grads(ctx):
    return {n: v for n, v in zip(ctx.op.input("Grad"), ctx.inputs("Grad")) if v is not None}


@register_op
class Send(OpDef):
    """Hands the step's gradients to the communicator (sync waits for the update)."""

    type = "send"

    def forward(self, ctx):
        _communicator(ctx).send(_step_grads(ctx))


@register_op
class GeoStep(OpDef):
    """Counts a local GEO step and reports the sparse rows it touched."""

    type = "geo_step"

    def forward(self, ctx):
        _communicator(ctx).geo_step(_step_grads(ctx))


@register_op
class PullDense(OpDef):
    """Refreshes the dense parameters ``params`` from the servers (in the scope the
    communicator writes, the global scope). With ``only_in_test`` it acts only when the
    program is a test clone: training programs get their values as the strategy says."""

    type = "pull_dense"

    def forward(self, ctx):
        if ctx.attrs.get("only_in_test") and not ctx.op.block.program._is_test:
            return
        comm = _communicator(ctx)
        comm.pull_dense([comm.plan.params[name] for name in ctx.attrs["params"]])


def _collective(ctx, what):
    comm = ctx.op.block.program.training_hooks
    if comm is None or not getattr(comm, "uses_worker_group", False):
        raise ConfigError(f"{what} needs a collective or hybrid worker's communicator: build the program with "
                          f"fleet.distributed_optimizer(opt, CollectiveStrategy()).minimize(loss)")
    return comm


def _join(comm, where):
    """Joins the workers' group at ``where`` if the runtime lets this op do it (a collective
    worker whose script did not call fleet.init_worker(): ``join_implicitly``)."""
    join = getattr(comm, "join_implicitly", None)
    if not comm.running and join is not None:
        join(where)


@register_op
class AllReduceGrads(OpDef):
    """Replaces the step's gradients by their mean over the workers (before the optimizer
    ops; see ``fleet.transpiler.collective_program``)."""

    type = "c_allreduce_grads"

    def forward(self, ctx):
        comm = _collective(ctx, "c_allreduce_grads")
        _join(comm, "its first training step")
        if not comm.running:
            raise ConfigError("this worker is not connected to the other workers: call fleet.init_worker() "
                              "before running fleet.main_program")
        reduced = comm.all_reduce_grads(ctx.attrs, ctx.inputs("Grad"), ctx.scope)
        for name, value in zip(ctx.op.input("Grad"), reduced):
            ctx.local[name] = value


@register_op
class BroadcastParams(OpDef):
    """Gives every worker worker 0's values of ``names`` (the startup program's last op).
    A collective worker that did not call fleet.init_worker() joins the group here (as
    Paddle's collective startup program does); a hybrid worker's communicator remembers the
    broadcast and does it when init_worker() joins the group."""

    type = "c_broadcast_params"

    def forward(self, ctx):
        comm = _collective(ctx, "c_broadcast_params")
        _join(comm, "the startup program")
        comm.broadcast_params(ctx.scope, ctx.attrs["names"])
