"""Shape layers (Paddle 1.x names and signatures): transpose, unsqueeze, squeeze, expand,
stack, split, slice, flatten, and create_tensor.

On a lod_level=1 input (one row per id) these work row by row as long as they leave dim
0 alone; one that would move it is refused when the program is built.
"""
import math

from fleet.errors import ConfigError
from fleet.framework.ops.shape_ops import slice_bounds, split_sizes, squeezed_axes, unsqueezed_shape
from fleet.framework.program import normalize_dtype
from fleet.layers.helper import append_op, check_var, create_tmp, main_block


def _ints(value, what, layer):
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                       for v in value):
        raise ConfigError(f"{layer} {what}={value!r} must be a list of ints")
    return [int(v) for v in value]


def transpose(x, perm, name=None):
    """Permutes the dims of x: out.shape[i] = x.shape[perm[i]].

    Raises:
        ConfigError: ``perm`` is not a permutation of x's dims.
    """
    check_var(x, "x", "transpose")
    perm = _ints(perm, "perm", "transpose")
    if sorted(perm) != list(range(len(x.shape))):
        raise ConfigError(f"transpose perm={perm} is not a permutation of the {len(x.shape)} dims of "
                          f"{x.name!r} {list(x.shape)}; list each of 0..{len(x.shape) - 1} once")
    out = create_tmp(name or "transpose", [x.shape[p] for p in perm], x.dtype)
    append_op("transpose", {"X": x}, {"Out": out}, {"axis": perm})
    return out


def unsqueeze(input, axes, name=None):
    """Inserts dims of size 1 at ``axes`` (in order, each into the shape so far; negative
    axes count from its end)."""
    check_var(input, "input", "unsqueeze")
    axes = _ints(axes, "axes", "unsqueeze")
    size = len(input.shape)
    for a in axes:
        if not -size - 1 <= a <= size:
            raise ConfigError(f"unsqueeze axis {a} is out of range for {input.name!r} {list(input.shape)}; "
                              f"use axes in [{-size - 1}, {size}]")
        size += 1
    out = create_tmp(name or "unsqueeze", unsqueezed_shape(input.shape, axes), input.dtype)
    append_op("unsqueeze", {"X": input}, {"Out": out}, {"axes": axes})
    return out


def squeeze(input, axes, name=None):
    """Removes the dims of size 1 at ``axes`` (every dim of size 1 when ``axes`` is []).

    Raises:
        ConfigError: an axis out of range, or a dim that is not 1 (or unknown).
    """
    check_var(input, "input", "squeeze")
    axes = _ints(axes, "axes", "squeeze")
    nd = len(input.shape)
    for a in axes:
        if not -nd <= a < nd or input.shape[a] != 1:
            raise ConfigError(f"squeeze axis {a} of {input.name!r} {list(input.shape)} is not a dim of size 1; "
                              f"squeeze only dims of size 1")
    drop = squeezed_axes(input.shape, axes)
    out = create_tmp(name or "squeeze", [d for i, d in enumerate(input.shape) if i not in drop], input.dtype)
    append_op("squeeze", {"X": input}, {"Out": out}, {"axes": axes})
    return out


def expand(x, expand_times, name=None):
    """Tiles x ``expand_times[i]`` times along each dim i (one positive int per dim)."""
    check_var(x, "x", "expand")
    times = _ints(expand_times, "expand_times", "expand")
    if len(times) != len(x.shape) or any(t < 1 for t in times):
        raise ConfigError(f"expand expand_times={times} must hold one positive int per dim of {x.name!r} "
                          f"{list(x.shape)}")
    out = create_tmp(name or "expand", x.shape, x.dtype)
    append_op("expand", {"X": x}, {"Out": out}, {"expand_times": times})
    return out


def stack(x, axis=0, name=None):
    """Stacks variables of one shape along a new dim ``axis``."""
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    if not xs:
        raise ConfigError("stack x must be a non-empty list of Variables")
    for v in xs:
        check_var(v, "x", "stack")
    if not -len(xs[0].shape) - 1 <= axis <= len(xs[0].shape):
        raise ConfigError(f"stack axis={axis} is out of range for inputs of rank {len(xs[0].shape)}")
    out = create_tmp(name or "stack", xs[0].shape, xs[0].dtype)
    append_op("stack", {"X": xs}, {"Y": out}, {"axis": int(axis)})
    return out


def split(input, num_or_sections, dim=-1, name=None):
    """Splits ``input`` along ``dim`` into ``num_or_sections`` equal parts (an int) or parts
    of the listed sizes (one may be -1: the rest).

    Returns:
        A list of Variables.

    Raises:
        ConfigError: the dim does not divide into the parts.
    """
    check_var(input, "input", "split")
    nd = len(input.shape)
    if not isinstance(dim, int) or not -nd <= dim < nd:
        raise ConfigError(f"split dim={dim!r} is out of range for {input.name!r} of rank {nd}")
    dim = dim + nd if dim < 0 else dim
    size = input.shape[dim]
    if isinstance(num_or_sections, int) and not isinstance(num_or_sections, bool):
        num, sections = num_or_sections, []
        if num < 1 or (size >= 0 and size % num):
            raise ConfigError(f"split of {input.name!r} dim {dim} (size {size}) into {num} equal parts: "
                              f"pick a number of parts that divides {size}")
    else:
        num, sections = 0, _ints(num_or_sections, "num_or_sections", "split")
        known = [s for s in sections if s != -1]
        bad = sections.count(-1) > 1 or any(s < 0 for s in known) or (
            size >= 0 and (sum(known) > size or (-1 not in sections and sum(known) != size)))
        if bad or not sections:
            raise ConfigError(f"split sections {sections} do not add up to dim {dim} (size {size}) of "
                              f"{input.name!r}; give sizes summing to it (one may be -1)")
    outs = [create_tmp(name or "split", input.shape, input.dtype)
            for _ in split_sizes(size, sections, num)]
    append_op("split", {"X": input}, {"Out": outs}, {"axis": dim, "sections": sections, "num": num})
    return outs


def slice(input, axes, starts, ends):
    """input[starts[i]:ends[i]] along each dim ``axes[i]``; negative bounds count from the
    end, bounds past it are clipped (Paddle's rules)."""
    check_var(input, "input", "slice")
    axes, starts, ends = (_ints(v, w, "slice") for v, w in ((axes, "axes"), (starts, "starts"), (ends, "ends")))
    return _slice(input, axes, starts, ends, [])


def _slice(input, axes, starts, ends, decrease_axis, name=None):
    nd = len(input.shape)
    if not len(axes) == len(starts) == len(ends):
        raise ConfigError(f"slice axes {axes}, starts {starts} and ends {ends} must have one entry per axis")
    if any(not 0 <= a < nd for a in axes):
        raise ConfigError(f"slice axes {axes} are out of range for {input.name!r} of rank {nd}")
    for a, s, e in zip(axes, starts, ends):
        if input.shape[a] >= 0:
            lo, hi = slice_bounds(input.shape[a], s, e)
            if hi <= lo:
                raise ConfigError(f"slice of {input.name!r} dim {a} (size {input.shape[a]}) from {s} to {e} "
                                  f"is empty; pick start < end")
    out = create_tmp(name or "slice", input.shape, input.dtype)
    append_op("slice", {"Input": input}, {"Out": out},
              {"axes": axes, "starts": starts, "ends": ends, "decrease_axis": list(decrease_axis)})
    return out


def flatten(x, axis=1, name=None):
    """Reshapes x to 2-D: [prod(shape[:axis]), prod(shape[axis:])].

    Raises:
        ConfigError: ``axis`` out of [0, rank], or unknown dims on both sides of it.
    """
    from fleet.layers.nn import reshape

    check_var(x, "x", "flatten")
    if not isinstance(axis, int) or not 0 <= axis <= len(x.shape):
        raise ConfigError(f"flatten axis={axis!r} must be in [0, {len(x.shape)}] for {x.name!r}")
    outer, inner = x.shape[:axis], x.shape[axis:]
    if any(d < 0 for d in outer) and any(d < 0 for d in inner):
        raise ConfigError(f"flatten of {x.name!r} {list(x.shape)} at axis {axis}: unknown dims on both "
                          f"sides; flatten at an axis with known dims on one side")
    shape = [-1 if any(d < 0 for d in outer) else math.prod(outer),
             -1 if any(d < 0 for d in inner) else math.prod(inner)]
    return reshape(x, shape, name=name)


def create_tensor(dtype, name=None, persistable=False):
    """Creates a variable for an op to write (e.g. accuracy's ``total``)."""
    block = main_block()
    if name is not None and block.has_var(name):
        return block.var(name)
    return block.create_var(name=name, dtype=normalize_dtype(dtype), persistable=persistable,
                            prefix="create_tensor")
