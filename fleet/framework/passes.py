"""Execution passes: rewrite a program's op list into a faster equivalent for running.

The program itself is never changed (users can print, clone and save it as built); the
executor runs the list this module returns.

Fusions:
- ``lookup_table`` + ``sequence_pool`` -> ``fused_embedding_seq_pool`` (and their grad
  ops -> one grad op): the pooled rows are gathered straight from the table, and the
  backward emits the table's gradient rows without a per-id intermediate tensor.
- the ``fused_embedding_seq_pool`` ops of one table (same attributes, a sum, average or
  sqrt pool) -> one ``fused_multi_embedding_seq_pool``: every slot's rows gathered and
  pooled in one kernel call (CTR models look 26 slots up in one table; each op's fixed cost
  was paid 26 times a step). When the slots' sparse gradients meet in one ``sum`` op and
  nowhere else, their grad ops and that ``sum`` become one grad op writing the same rows
  and values, in the ``sum``'s order, as the ``sum`` did.
"""
from fleet.framework.program import Operator

_FUSABLE_POOLS = ("SUM", "AVERAGE", "MAX", "SQRT")


def optimize_for_execution(program):
    """Returns the ops to run for ``program``, with fusions applied."""
    ops = list(program.global_block().ops)
    return _fuse_table_slots(_fuse_embedding_pool(program, ops))


def table_readers(ops, table):
    """Where ``ops`` look up ``table``: (index of the first ``lookup_table`` reading it, or
    None, and the distinct Ids variable names of all its lookups, in order). Rewrites that
    put a table read before its lookups (server prefetch, saved tables) start here."""
    readers = [i for i, op in enumerate(ops) if op.type == "lookup_table" and op.input("W") == [table]]
    id_vars = []
    for i in readers:
        for name in ops[i].input("Ids"):
            if name not in id_vars:
                id_vars.append(name)
    return (readers[0] if readers else None), id_vars


def _consumers(ops):
    users = {}
    for i, op in enumerate(ops):
        for name in op.input_arg_names:
            users.setdefault(name, []).append(i)
    return users


def _fuse_embedding_pool(program, ops):
    block = program.global_block()
    users = _consumers(ops)
    replace = {}  # index -> new op (None: drop)
    for i, op in enumerate(ops):
        if op.type != "lookup_table":
            continue
        emb_out = op.output("Out")[0]
        var = block.vars.get(emb_out)
        if var is None or var.lod_level != 1 or var.persistable:
            continue
        fwd_users = [j for j in users.get(emb_out, []) if ops[j].type == "sequence_pool"]
        grad_users = [j for j in users.get(emb_out, []) if ops[j].type.endswith("_grad")]
        if len(fwd_users) != 1 or len(users.get(emb_out, [])) != 1 + len(grad_users):
            continue
        pool_i = fwd_users[0]
        pool = ops[pool_i]
        if pool.attr("pooltype") not in _FUSABLE_POOLS or pool.input("X") != [emb_out]:
            continue
        # Backward: the pool's grad op feeds only the lookup's grad op.
        pool_grad = [j for j in grad_users if ops[j].type == "sequence_pool_grad"]
        lookup_grad = [j for j in grad_users if ops[j].type == "lookup_table_grad"]
        if grad_users and (len(pool_grad) != 1 or len(lookup_grad) != 1 or len(grad_users) != 2):
            continue
        if grad_users:
            emb_grad = ops[pool_grad[0]].output("X@GRAD")[0]
            if users.get(emb_grad, []) != [lookup_grad[0]]:
                continue
        attrs = {k: v for k, v in op.attrs.items()}
        attrs["pooltype"] = pool.attr("pooltype")
        outputs = {"Out": pool.output("Out")}
        if pool.output("MaxIndex"):
            outputs["MaxIndex"] = pool.output("MaxIndex")
        inputs = {"Ids": op.input("Ids"), "W": op.input("W")}
        replace[i] = None
        replace[pool_i] = Operator(block, "fused_embedding_seq_pool", inputs, outputs, attrs)
        if grad_users:
            pg, lg = ops[pool_grad[0]], ops[lookup_grad[0]]
            g_inputs = dict(inputs)
            g_inputs.update(outputs)
            g_inputs["Out@GRAD"] = pg.input("Out@GRAD")
            g_attrs = dict(attrs)
            g_attrs["op_role"] = lg.attr("op_role")
            replace[pool_grad[0]] = None
            replace[lookup_grad[0]] = Operator(block, "fused_embedding_seq_pool_grad", g_inputs,
                                               {"W@GRAD": lg.output("W@GRAD")}, g_attrs)
    if not replace:
        return ops
    return [replace.get(i, op) for i, op in enumerate(ops) if replace.get(i, op) is not None]


# Pools whose per-example result does not depend on other slots and that need no
# per-slot side output (MAX writes MaxIndex positions into its own Ids).
_MULTI_POOLS = ("SUM", "AVERAGE", "SQRT")


def _slot_key(op):
    attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items()))
    return op.input("W")[0], attrs


def _fuse_table_slots(ops):
    """Merges the fused_embedding_seq_pool ops of one table into one op (and, where
    their gradients are only summed, their grad ops and the sum into one grad op)."""
    groups = {}
    for i, op in enumerate(ops):
        if (op.type == "fused_embedding_seq_pool" and op.attr("pooltype") in _MULTI_POOLS
                and len(op.input("Ids")) == 1 and len(op.input("W")) == 1):
            groups.setdefault(_slot_key(op), []).append(i)
    replace = {}  # index -> new op (None: drop)
    for members in groups.values():
        members = _movable(ops, members)
        if len(members) < 2:
            continue
        replace.update(_fuse_group(ops, members))
    if not replace:
        return ops
    return [replace.get(i, op) for i, op in enumerate(ops) if replace.get(i, op) is not None]


def _movable(ops, members):
    """The members that can run at the first one's place: nothing in between writes
    their ids, their table or their output."""
    first = members[0]
    kept = [first]
    for i in members[1:]:
        names = set(ops[i].input_arg_names) | set(ops[i].output_arg_names)
        if not any(names & set(ops[j].output_arg_names) for j in range(first, i)):
            kept.append(i)
    return kept


def _fuse_group(ops, members):
    fwd = [ops[i] for i in members]
    block = fwd[0].block
    replace = {i: None for i in members}
    grads = _grad_group(ops, fwd)
    if grads is not None:
        # Order the slots as the sum concatenates their gradient rows.
        sum_i, grad_ix, order = grads
        fwd = [fwd[k] for k in order]
    inputs = {"Ids": [op.input("Ids")[0] for op in fwd], "W": fwd[0].input("W")}
    outputs = {"Out": [op.output("Out")[0] for op in fwd]}
    replace[members[0]] = Operator(block, "fused_multi_embedding_seq_pool", inputs, outputs, fwd[0].attrs)
    if grads is not None:
        g_inputs = dict(inputs)
        g_inputs.update(outputs)
        g_inputs["Out@GRAD"] = [ops[j].input("Out@GRAD")[0] for j in grad_ix]
        g_attrs = dict(fwd[0].attrs)
        g_attrs["op_role"] = ops[sum_i].attr("op_role")
        for j in grad_ix:
            replace[j] = None
        replace[sum_i] = Operator(block, "fused_multi_embedding_seq_pool_grad", g_inputs,
                                  {"W@GRAD": ops[sum_i].output("Out")}, g_attrs)
    return replace


def _grad_group(ops, fwd):
    """(index of the sum op, indices of the slots' grad ops, slot order of the sum's
    inputs) when every slot's sparse gradient goes only into one sum of exactly them;
    else None (the slots' grad ops stay as they are: they read only the ids, the table
    and the output gradient, which the merged forward op leaves unchanged)."""
    attrs = fwd[0].attrs
    if not (attrs.get("is_sparse") or attrs.get("is_distributed")):
        return None  # dense gradients are added array by array: keep that order of additions
    outs = {op.output("Out")[0]: k for k, op in enumerate(fwd)}
    grad_of = {}  # slot -> grad op index
    for j, op in enumerate(ops):
        if op.type == "fused_embedding_seq_pool_grad" and op.input("Out")[0] in outs:
            k = outs[op.input("Out")[0]]
            if (k in grad_of or op.input("Ids") != fwd[k].input("Ids") or op.input("W") != fwd[k].input("W")
                    or len(op.input("Out@GRAD")) != 1 or not op.input("Out@GRAD")[0]):
                return None
            grad_of[k] = j
    if len(grad_of) != len(fwd):
        return None
    slot_of_grad = {ops[j].output("W@GRAD")[0]: k for k, j in grad_of.items()}
    users = _consumers(ops)
    sums = {i for name in slot_of_grad for i in users.get(name, [])}
    if len(sums) != 1:
        return None
    sum_i = sums.pop()
    xs = ops[sum_i].input("X")
    if (ops[sum_i].type != "sum" or len(xs) != len(fwd) or set(xs) != set(slot_of_grad)
            or any(users[name] != [sum_i] for name in xs) or sum_i < max(grad_of.values())):
        return None
    order = [slot_of_grad[name] for name in xs]
    return sum_i, [grad_of[k] for k in order], order
