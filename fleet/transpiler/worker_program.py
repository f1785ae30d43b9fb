"""A worker's programs: the user's program with its updates routed through the
communicator instead of applied locally.

- sync / async / half-async: the optimizer ops are removed; one ``send`` op at the end of
  the step hands every gradient to the communicator. Tables that live on the servers
  (``is_sparse`` / ``is_distributed``) are read through one ``prefetch`` op per table,
  placed before the first lookup, which pulls just the rows of the batch.
- GEO: the program keeps its optimizer (each worker trains on local copies); a
  ``geo_step`` op at the end counts steps and reports the sparse rows touched.

The startup program loses the initializers of the parameters the servers own: those
are pulled by ``init_worker``, and running the startup program afterwards must not
overwrite them.
"""
from fleet.framework.passes import table_readers
from fleet.framework.program import FORWARD, OPTIMIZE, Operator
from fleet.transpiler.plan import DENSE

PREFETCH, SEND, GEO_STEP = "prefetch", "send", "geo_step"


def _remote_tables(plan, mode):
    if mode == "geo":
        return set()
    return {p.name for p in plan.params.values() if p.kind != DENSE}


def transpile_worker(main, startup, plan):
    """Returns (worker main program, worker startup program) for ``plan``."""
    mode = plan.mode
    program = main.clone(for_test=False)
    block = program.global_block()
    remote = _remote_tables(plan, mode)
    ops = block.ops
    removed_state = set()
    if mode != "geo":
        kept = []
        for op in ops:
            if op.attr("op_role") == OPTIMIZE and op.input("Param") and op.input("Param")[0] in plan.params:
                removed_state.update(n for slot, names in op.inputs.items()
                                     if slot not in ("Param", "Grad") for n in names)
                continue
            kept.append(op)
        ops[:] = kept
    # One prefetch per remote table, before its first reader.
    for table in sorted(remote):
        first, id_vars = table_readers(ops, table)
        if first is None:
            continue
        pre = Operator(block, PREFETCH, {"Ids": id_vars}, {"Out": [table]},
                       {"table": table, "op_role": FORWARD,
                        "padding_idx": ops[first].attr("padding_idx", -1)})
        ops.insert(first, pre)
    grads = [p.grad for p in plan.params.values() if p.grad in block.vars]
    if mode == "geo":
        sparse_grads = [p.grad for p in plan.params.values() if p.kind != DENSE and p.grad in block.vars]
        ops.append(Operator(block, GEO_STEP, {"Grad": sparse_grads}, {}, {"op_role": OPTIMIZE}))
    else:
        ops.append(Operator(block, SEND, {"Grad": grads}, {},
                            {"op_role": OPTIMIZE, "params": [p.name for p in plan.params.values()]}))
    for table in remote:  # the table's values are not on this worker
        var = block.vars[table]
        var.persistable = False
    program._is_distributed = True
    program._bump()

    worker_startup = startup.clone(for_test=False)
    sblock = worker_startup.global_block()
    owned = set(plan.params) | removed_state
    sblock.ops[:] = [op for op in sblock.ops if not (set(op.output_arg_names) & owned)]
    for name in owned:
        sblock.vars.pop(name, None)
    worker_startup._bump()
    program._paired = worker_startup
    worker_startup._paired = program
    return program, worker_startup
