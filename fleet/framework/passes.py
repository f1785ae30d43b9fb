"""Execution passes: rewrite a program's op list into a faster equivalent for running.

The program itself is never changed (users can print, clone and save it as built); the
executor runs the list this module returns.

Fusions:
- ``lookup_table`` + ``sequence_pool`` -> ``fused_embedding_seq_pool`` (and their grad
  ops -> one grad op): the pooled rows are gathered straight from the table, and the
  backward emits the table's gradient rows without a per-id intermediate tensor.
"""
from fleet.framework.program import Operator

_FUSABLE_POOLS = ("SUM", "AVERAGE", "MAX", "SQRT")


def optimize_for_execution(program):
    """Returns the ops to run for ``program``, with fusions applied."""
    ops = list(program.global_block().ops)
    return _fuse_embedding_pool(program, ops)


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
