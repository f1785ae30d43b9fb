"""A worker's programs: the user's program with its updates routed through the
communicator instead of applied locally.

- sync / async / half-async: the optimizer ops are removed; one ``send`` op at the end of
  the step hands every gradient to the communicator. Tables that live on the servers
  (``is_sparse`` / ``is_distributed``) are read through one ``prefetch`` op per table,
  placed before the first lookup, which pulls just the rows of the batch.
- GEO: the program keeps its optimizer (each worker trains on local copies); a
  ``geo_step`` op at the end counts steps and reports the sparse rows touched.
- A ``pull_dense`` op first (not in GEO) refreshes the dense parameters the program reads
  from the servers; in the worker's training program it acts only in test clones
  (training refreshes them as the strategy says), so a test clone evaluates with the
  servers' current values.

``transpile_eval`` does the same for a program without optimizer ops built before
``minimize`` (a test clone of the user's program): its table reads become prefetches
(``is_test`` when the program is a test clone: unseen ids of a distributed table are not
created) and its dense reads a ``pull_dense`` at every run.

The startup program loses the initializers of the parameters the servers own: those
are pulled by ``init_worker``, and running the startup program afterwards must not
overwrite them.
"""
from fleet.entries import ShowClickEntry, entry_from_attr
from fleet.errors import ConfigError
from fleet.framework.passes import table_readers
from fleet.framework.program import FORWARD, OPTIMIZE, Operator
from fleet.transpiler.plan import DENSE

PREFETCH, SEND, GEO_STEP, PULL_DENSE = "prefetch", "send", "geo_step", "pull_dense"


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
    insert_prefetches(block, remote)
    if mode != "geo":
        _insert_pull_dense(block, plan, only_in_test=True)
    grads = [p.grad for p in plan.params.values() if p.grad in block.vars]
    if mode == "geo":
        sparse_grads = [p.grad for p in plan.params.values() if p.kind != DENSE and p.grad in block.vars]
        ops.append(Operator(block, GEO_STEP, {"Grad": sparse_grads}, {}, {"op_role": OPTIMIZE}))
    else:
        ops.append(Operator(block, SEND, {"Grad": grads}, {},
                            {"op_role": OPTIMIZE, "params": [p.name for p in plan.params.values()]}))
    _mark_remote(block, remote)
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


def has_server_updates(program, plan):
    """True when ``program`` has optimizer ops updating parameters of ``plan``."""
    return any(op.attr("op_role") == OPTIMIZE and op.input("Param") and op.input("Param")[0] in plan.params
               for op in program.global_block().ops)


def reads_server_params(program, plan):
    """True when an op of ``program`` reads a parameter of ``plan``."""
    return any(name in plan.params for op in program.global_block().ops for name in op.input_arg_names)


def transpile_eval(program, plan):
    """Returns a copy of ``program`` (no optimizer ops; built before minimize) whose reads
    of server-held parameters go to the servers at every run: one prefetch per table
    (``is_test`` as the program) and one ``pull_dense`` of the dense parameters it reads.
    In GEO the worker holds every parameter, so the copy is the program unchanged."""
    new = program.clone(for_test=False)
    new._is_test = program._is_test
    block = new.global_block()
    remote = {t for t in _remote_tables(plan, plan.mode) if table_readers(block.ops, t)[0] is not None}
    insert_prefetches(block, remote, is_test=program._is_test)
    if plan.mode != "geo":
        _insert_pull_dense(block, plan, only_in_test=False)
    _mark_remote(block, remote)
    new._is_distributed = True
    new._bump()
    return new


def insert_prefetches(block, remote, is_test=False):
    """Inserts one prefetch op per table of ``remote`` before its first reader in
    ``block`` (``is_test``: test lookups). A table with an entry gets the entry as an
    attribute, and with a ShowClickEntry (in training) its show and click inputs.

    Raises:
        ConfigError: a ShowClickEntry input that is not a variable of the block.
    """
    ops = block.ops
    for table in sorted(remote):
        first, id_vars = table_readers(ops, table)
        if first is None:
            continue
        attrs = {"table": table, "op_role": FORWARD, "padding_idx": ops[first].attr("padding_idx", -1)}
        inputs = {"Ids": id_vars}
        param = block.vars.get(table)
        entry = getattr(param, "entry", None)
        is_test = is_test or bool(ops[first].attr("is_test"))
        if entry:
            attrs["entry"] = entry
            if not is_test:
                inputs.update(statistics_inputs(block, table, entry))
        if is_test:
            attrs["is_test"] = True
        ops.insert(first, Operator(block, PREFETCH, inputs, {"Out": [table]}, attrs))


def statistics_inputs(block, table, entry):
    """The prefetch op's Show and Click inputs of a table with a ShowClickEntry ({} for
    other entries).

    Raises:
        ConfigError: the entry's show or click input is not a variable of ``block``.
    """
    parsed = entry_from_attr(entry)
    if not isinstance(parsed, ShowClickEntry):
        return {}
    for what, name in (("show", parsed.show_name), ("click", parsed.click_name)):
        if not block.has_var(name):
            raise ConfigError(f"table {table!r} has ShowClickEntry whose {what} input {name!r} is not a variable "
                              f"of this program: declare it with fleet.layers.data and feed it")
    return {"Show": [parsed.show_name], "Click": [parsed.click_name]}


def _insert_pull_dense(block, plan, only_in_test):
    """A pull_dense op first, for the dense parameters the block's ops read."""
    read = {n for op in block.ops for n in op.input_arg_names}
    dense = [p.name for p in plan.params.values() if p.kind == DENSE and p.name in read]
    if dense:
        block.ops.insert(0, Operator(block, PULL_DENSE, {}, {}, {"params": dense, "op_role": FORWARD,
                                                                 "only_in_test": bool(only_in_test)}))


def _mark_remote(block, remote):
    for table in remote:  # the table's values are not on this worker
        block.vars[table].persistable = False
