"""How ops treat lod_level=1 values (Paddle's LoD semantics, one level).

A lod_level=1 variable is a batch of variable-length sequences: at run time a
``LoDTensor`` whose ``values`` hold one row per id (or per position), [total, ...], and
whose ``offsets`` say which rows belong to which example. An embedding of a lod_level=1
input is such a value, [total_ids, dim].

Every op type says in its ``OpDef.lod`` what it does with lod_level=1 inputs:

- ``DENSE`` (the default): the op needs one row per example. A lod_level=1 input is
  refused when the program is built, with a ``ConfigError`` naming the layer, the
  variable and the fix (pool the sequence first with ``layers.sequence_pool``).
- ``ROWWISE``: the op works on the values row by row and the LoD passes through (fc,
  elementwise ops, activations, concat on axis >= 1, reshape keeping the rows, dropout,
  ...). The op's code sees plain arrays: the ``OpContext`` hands it the values of
  LoDTensor inputs and wraps each output whose variable is lod_level=1 back into a
  LoDTensor with the inputs' offsets. At build time its outputs in ``lod_outputs`` become
  lod_level=1, and an input with one row per example (a leading -1 dimension, not
  lod_level=1) next to a lod_level=1 input is refused: their rows do not line up. At run
  time every lod_level=1 input must have the same sequence lengths. An op whose
  ``joins_single_ids`` is true (concat) takes both kinds as Paddle does, joining the rows
  as they come: its output has one row per example and at run time every sequence must
  hold exactly one id (Paddle's CTR scripts concatenate the embeddings of one-id slots
  with the dense features without pooling them); a batch with other lengths is a
  ``DataError`` naming the fix.
- ``SEQUENCE``: the op reads LoDTensors itself (lookup_table, sequence_pool,
  sequence_expand_as, ...) and checks its own inputs.

Inputs without a batch dimension (parameters, constants) mix freely with lod_level=1
inputs in ROWWISE ops: they apply to every row alike.
"""
from fleet.errors import ConfigError

DENSE, ROWWISE, SEQUENCE = "dense", "rowwise", "sequence"
ONE_ID_PER_SEQUENCE = "one_id_per_sequence"  # the op attribute of a ROWWISE op joining both kinds

# op type -> the layer users call (for messages); other ops are named by their type.
_LAYER_NAMES = {"lookup_table": "embedding", "sum": "sums"}

POOL_HINT = "pool the sequence first with layers.sequence_pool(emb, 'sum') where emb is {name!r}"


def layer_name(op):
    """The layer that appended ``op``, for messages."""
    return _LAYER_NAMES.get(op.type, op.type)


def _input_vars(op, block):
    return [block.var(n) for names in op.inputs.values() for n in names if n]


def _per_example(var):
    """True for a lod_level=0 variable with a batch dimension (one row per example)."""
    return not var.lod_level and bool(var.shape) and var.shape[0] == -1


def check(opdef, op, block):
    """Checks ``op``'s lod_level=1 inputs against its policy and sets the lod level of
    its outputs (called by ``Block.append_op`` after shape inference).

    Raises:
        ConfigError: a lod_level=1 input the op cannot take; the message names the layer,
            the variables and the fix.
    """
    inputs = _input_vars(op, block)
    seqs = [v for v in inputs if v.lod_level]
    if not seqs or opdef.lod == SEQUENCE:
        return
    layer = layer_name(op)
    if opdef.lod == DENSE:
        raise ConfigError(
            f"{layer} of {seqs[0].name!r} (lod_level=1, one row per id): {layer} needs one row "
            f"per example; " + POOL_HINT.format(name=seqs[0].name))
    dense = [v for v in inputs if _per_example(v)]
    if dense:
        if not opdef.joins_single_ids:
            raise ConfigError(mixed_message(layer, seqs[0], dense[0]))
        # Paddle joins the rows as they come: right when every sequence holds one id
        # (the op checks that at run time); the output has one row per example.
        op.attrs[ONE_ID_PER_SEQUENCE] = True
        opdef.check_rowwise(op, block, seqs)
        return
    opdef.check_rowwise(op, block, seqs)
    for slot in opdef.lod_outputs_of(op):
        for name in op.output(slot):
            if name:
                block.var(name).lod_level = 1


def mixed_message(layer, seq, dense):
    """The message for a layer that gets one row per id and one row per example."""
    return (f"{layer} of {seq.name!r} (lod_level=1, one row per id) with {dense.name!r} (one row "
            f"per example): " + POOL_HINT.format(name=seq.name)
            + f", or repeat {dense.name!r} once per id with layers.sequence_expand_as")


def refuse(op, var, what, fix=None):
    """A ConfigError for a ROWWISE op that cannot take ``var`` (lod_level=1) as configured:
    ``what`` says why (e.g. "concat along axis 0 mixes the rows of examples")."""
    return ConfigError(f"{layer_name(op)} of {var.name!r} (lod_level=1, one row per id): {what}; "
                       + (fix or POOL_HINT.format(name=var.name)))
