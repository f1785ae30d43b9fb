"""Sequence layers for lod_level=1 inputs (besides sequence_pool, in nn.py):
sequence_expand / sequence_expand_as and sequence_softmax (Paddle 1.x signatures)."""
from fleet.errors import ConfigError
from fleet.layers.helper import append_op, check_var, create_tmp


def sequence_expand_as(x, y, name=None):
    """Repeats row b of ``x`` (one row per example) once per id of sequence b of ``y``: the
    result has y's LoD and lines up row by row with y (e.g. a target item next to each
    item of a history, as DIN compares them).

    Raises:
        ConfigError: y is not lod_level=1, or x is (x must have one row per example).
    """
    check_var(x, "x", "sequence_expand_as")
    check_var(y, "y", "sequence_expand_as")
    out = create_tmp(name or "sequence_expand_as", x.shape, x.dtype, 1)
    append_op("sequence_expand_as", {"X": x, "Y": y}, {"Out": out})
    return out


def sequence_expand(x, y, ref_level=-1, name=None):
    """Paddle's sequence_expand for an ``x`` with one row per example: row b repeated once
    per id of sequence b of ``y`` (what sequence_expand_as does; fleet has one LoD level,
    so ``ref_level`` is -1 or 0).

    Raises:
        ConfigError: another ref_level, a lod_level=1 x (not supported), or a y that is not
            lod_level=1.
    """
    check_var(x, "x", "sequence_expand")
    check_var(y, "y", "sequence_expand")
    if ref_level not in (-1, 0):
        raise ConfigError(f"sequence_expand ref_level={ref_level}: fleet sequences have one LoD level; "
                          f"use -1 or 0")
    out = create_tmp(name or "sequence_expand", x.shape, x.dtype, 1)
    append_op("sequence_expand", {"X": x, "Y": y}, {"Out": out}, {"ref_level": ref_level})
    return out


def sequence_softmax(input, use_cudnn=False, name=None):
    """A softmax over the ids of each sequence of ``input`` (lod_level=1, one value per id,
    [-1, 1]): each example's weights sum to 1.

    Raises:
        ConfigError: the input is not lod_level=1 or has more than one value per row.
    """
    check_var(input, "input", "sequence_softmax")
    out = create_tmp(name or "sequence_softmax", input.shape, input.dtype, 1)
    append_op("sequence_softmax", {"X": input}, {"Out": out})
    return out
