"""Input layers."""
from fleet.errors import ConfigError
from fleet.framework.program import normalize_dtype
from fleet.layers.helper import main_block


def data(name, shape, dtype="float32", lod_level=0, append_batch_size=True, stop_gradient=True):
    """Declares an input fed at run time (Paddle's ``fluid.layers.data``).

    Args:
        name: the feed name.
        shape: per-example shape (the batch dimension -1 is prepended unless
            ``append_batch_size`` is False or shape already starts with -1). None stands
            for -1, so ``fluid.data``'s shapes ([None, 13]) mean the same here.
        dtype: "float32" or "int64" (ids).
        lod_level: 1 for variable-length sequences fed as (values, lengths).

    Returns:
        The Variable.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"data name must be a non-empty str, got {name!r}")
    shape = [-1 if d is None else int(d) for d in shape]
    if append_batch_size and (not shape or shape[0] != -1):
        shape = [-1] + shape
    if lod_level not in (0, 1):
        raise ConfigError(f"data {name!r}: lod_level={lod_level} is not supported; use 0 or 1")
    block = main_block()
    if name in block.vars:
        raise ConfigError(f"data {name!r} is declared twice in this program; names of inputs must be unique")
    return block.create_var(name, shape=shape, dtype=normalize_dtype(dtype), lod_level=lod_level,
                            stop_gradient=stop_gradient, is_data=True)
