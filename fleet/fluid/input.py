"""Paddle 1.8's ``fluid.data``, ``fluid.embedding`` and ``fluid.one_hot`` (``fluid.input``),
which differ from ``fluid.layers.data`` / ``fluid.layers.embedding`` in the shapes they
give. Their ``one_hot_v2`` op is in ``fleet.framework.ops.tensor_ops``."""
from fleet import layers
from fleet.errors import ConfigError
from fleet.layers.helper import append_op, check_var, create_tmp


def data(name, shape, dtype="float32", lod_level=0):
    """Declares an input of exactly ``shape`` (Paddle's ``fluid.data``): no batch dimension
    is added, None or -1 marks the batch (``fluid.data("x", [None, 13])``).

    Returns:
        The Variable.
    """
    if not isinstance(shape, (list, tuple)):
        raise ConfigError(f"data {name!r}: shape={shape!r} must be a list, e.g. [None, 13]")
    return layers.data(name, list(shape), dtype=dtype, lod_level=lod_level, append_batch_size=False)


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None, param_attr=None,
              dtype="float32", entry=None):
    """Looks up rows of a table (Paddle 1.8's ``fluid.embedding``, the ``lookup_table_v2``
    op): the output is the ids' shape with the width appended, so ids [batch, 1] give
    [batch, 1, width] (``fluid.layers.embedding`` drops that trailing 1) and ids
    [batch, k] give [batch, k, width]. A lod_level=1 input gives [ids, 1, width] rows
    per id for ids declared [-1, 1] and [ids, width] for ids declared [-1]. Arguments as
    ``fluid.layers.embedding`` (``entry``: admission of new ids of an is_distributed
    table, see ``fleet.layers.sparse_embedding``).
    """
    out = layers.embedding(input, size, is_sparse=is_sparse, is_distributed=is_distributed,
                           padding_idx=padding_idx, param_attr=param_attr, dtype=dtype, entry=entry)
    if len(input.shape) > 1 and input.shape[-1] == 1:
        out = layers.unsqueeze(out, axes=[len(out.shape) - 1])
    return out


def one_hot(input, depth, allow_out_of_range=False):
    """One-hot rows of int64 ids (Paddle 1.8's ``fluid.one_hot``): the ids' shape with
    ``depth`` appended, float32. An id outside [0, depth) is a DataError at run time, or a
    zero row with ``allow_out_of_range``. A lod_level=1 input keeps its sequences.

    Raises:
        ConfigError: ids that are not int64, or a depth that is not a positive int.
    """
    check_var(input, "input", "one_hot")
    if input.dtype != "int64":
        raise ConfigError(f"one_hot input {input.name!r} must be int64 ids, got {input.dtype}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"one_hot depth={depth!r} must be a positive int")
    out = create_tmp("one_hot", tuple(input.shape) + (depth,), lod_level=input.lod_level, stop_gradient=True)
    append_op("one_hot_v2", {"X": input}, {"Out": out},
              {"depth": depth, "allow_out_of_range": bool(allow_out_of_range)})
    return out
