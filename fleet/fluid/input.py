"""Paddle 1.8's ``fluid.data`` and ``fluid.embedding`` (``fluid.input``), which differ from
``fluid.layers.data`` / ``fluid.layers.embedding`` in the shapes they give."""
from fleet import layers
from fleet.errors import ConfigError


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
              dtype="float32"):
    """Looks up rows of a table (Paddle 1.8's ``fluid.embedding``, the ``lookup_table_v2``
    op): the output is the ids' shape with the width appended, so ids [batch, 1] give
    [batch, 1, width] (``fluid.layers.embedding`` drops that trailing 1) and ids
    [batch, k] give [batch, k, width]. A lod_level=1 input gives [ids, 1, width] rows
    per id for ids declared [-1, 1] and [ids, width] for ids declared [-1]. Arguments as
    ``fluid.layers.embedding``.
    """
    out = layers.embedding(input, size, is_sparse=is_sparse, is_distributed=is_distributed,
                           padding_idx=padding_idx, param_attr=param_attr, dtype=dtype)
    if len(input.shape) > 1 and input.shape[-1] == 1:
        out = layers.unsqueeze(out, axes=[len(out.shape) - 1])
    return out
