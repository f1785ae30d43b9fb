"""Collective programs: the worker keeps its optimizer ops, and its gradients are
exchanged among the workers right before them.

- ``c_allreduce_grads`` (op_role OPTIMIZE, inserted before the first optimizer op of the
  parameters the worker updates itself): the runner's optimize phase runs it after the
  threads of a step were combined (``fleet.framework.runner.run_combined_step``), so one
  exchange per step carries the whole worker's gradients; it replaces each gradient by the
  mean over the workers (dense: one all-reduce of every gradient at once; sparse rows:
  all-gathered, then concatenated in rank order), and the optimizer ops that follow apply
  the same update on every worker.
- ``c_broadcast_params`` (last op of the startup program): rank 0's values of every
  variable the startup program initializes (the parameters it leaves to the worker and
  their optimizer state) replace every other worker's, so all start identical.

Both ops reach the worker's collective communicator through ``program.training_hooks``
(``fleet.communicator.ops``).
"""
from fleet.errors import ConfigError
from fleet.framework.program import LRSCHED, OPTIMIZE, Operator, Parameter

ALLREDUCE, BROADCAST = "c_allreduce_grads", "c_broadcast_params"


def local_updates(program, params=None):
    """The optimizer ops of ``program`` for ``params`` (default: every parameter).

    Returns:
        (index of the first optimizer-role op, [(param name, grad name, shape, is_sparse)]).
    """
    block = program.global_block()
    first, found = None, []
    for i, op in enumerate(block.ops):
        if op.attr("op_role") != OPTIMIZE:
            continue
        first = i if first is None else first
        if not op.input("Param") or not op.input("Grad"):
            continue
        name = op.input("Param")[0]
        if params is not None and name not in params:
            continue
        var = block.vars.get(name)
        sparse = isinstance(var, Parameter) and (var.is_sparse or var.is_distributed)
        found.append((name, op.input("Grad")[0], tuple(int(d) for d in var.shape), bool(sparse)))
    return first, found


def insert_collective_ops(program, startup, params=None, skip_broadcast=()):
    """Adds the all-reduce op to ``program`` and the broadcast op to ``startup``, in place.

    Args:
        program: a training program (optimizer ops present).
        startup: its startup program (None: no broadcast op).
        params: the parameters whose gradients are all-reduced (default: every parameter
            with an optimizer op; a hybrid worker gives its dense ones).
        skip_broadcast: variables not to broadcast (held by servers).

    Raises:
        ConfigError: ``program`` has no optimizer op for these parameters (minimize was not
            called, or a hybrid program has no dense parameter).
    """
    first, updates = local_updates(program, params)
    if not updates:
        raise ConfigError("the program has no optimizer ops to all-reduce gradients for: call "
                          "fleet.distributed_optimizer(optimizer, strategy).minimize(loss) first")
    block = program.global_block()
    if any(op.type == ALLREDUCE for op in block.ops):
        return
    # A step that the workers agree not to apply (another worker's shard ended) takes back
    # the learning-rate counter's increment, which ran before the step's compute ops.
    undo = [[op.output("Out")[0], float(op.attr("step", 1.0))] for op in block.ops
            if op.type == "increment" and op.attr("op_role") == LRSCHED and op.output("Out") == op.input("X")]
    attrs = {"op_role": OPTIMIZE, "params": [u[0] for u in updates],
             "shapes": [list(u[2]) for u in updates], "sparse": [u[3] for u in updates],
             "undo_increments": undo}
    block.ops.insert(first, Operator(block, ALLREDUCE, {"Grad": [u[1] for u in updates]}, {}, attrs))
    program._bump()
    if startup is None:
        return
    sblock = startup.global_block()
    if any(op.type == BROADCAST for op in sblock.ops):
        return
    skip = set(skip_broadcast)
    names = sorted({n for op in sblock.ops for n in op.output_arg_names
                    if n not in skip and sblock.vars.get(n) is not None and sblock.vars[n].persistable})
    sblock.ops.append(Operator(sblock, BROADCAST, {}, {}, {"names": names}))
    startup._bump()
