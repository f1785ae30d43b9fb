"""Helpers of the sparse table: initializer specs, optimizer state layout, argument checks."""
import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.kernels.hashtable import (
    INIT_CONSTANT,
    INIT_NORMAL,
    INIT_TRUNCATED_NORMAL,
    INIT_UNIFORM,
)

_INITIALIZERS = {
    "uniform": (INIT_UNIFORM, ("low", "high")),
    "normal": (INIT_NORMAL, ("mean", "std")),
    "truncated_normal": (INIT_TRUNCATED_NORMAL, ("mean", "std")),
    "constant": (INIT_CONSTANT, ("value",)),
}


def parse_initializer(spec):
    """Returns (kind, a, b) from ("uniform", low, high) | ("normal", mean, std) |
    ("truncated_normal", mean, std) | ("constant", value).

    Raises:
        ConfigError: the spec is none of these (the message shows it and the forms).
    """
    forms = " | ".join(f"({name!r}, {', '.join(args)})" for name, (_, args) in _INITIALIZERS.items())
    if not isinstance(spec, (tuple, list)) or not spec or spec[0] not in _INITIALIZERS:
        raise ConfigError(f"initializer {spec!r} is not one of {forms}")
    kind, args = _INITIALIZERS[spec[0]]
    if len(spec) != 1 + len(args):
        raise ConfigError(f"initializer {tuple(spec)!r} needs {len(args)} numbers: use one of {forms}")
    try:
        numbers = [float(x) for x in spec[1:]]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"initializer {tuple(spec)!r} has a non-number argument; use one of {forms}") from e
    if kind == INIT_UNIFORM and not numbers[0] <= numbers[1]:
        raise ConfigError(f"initializer {tuple(spec)!r}: low must not exceed high")
    if kind in (INIT_NORMAL, INIT_TRUNCATED_NORMAL) and numbers[1] < 0:
        raise ConfigError(f"initializer {tuple(spec)!r}: std must be >= 0")
    numbers += [0.0] * (2 - len(numbers))
    return kind, numbers[0], numbers[1]


def split_state(rule, dim, name):
    """Returns ({row state: initial row}, {scalar state: array}) from ``rule.init_state``."""
    state = rule.init_state((2, dim))
    missing = [key for key in rule.state_names if key not in state]
    if missing:
        raise ConfigError(f"sparse table {name!r}: rule {rule!r} init_state() lacks {missing}")
    row_names = getattr(rule, "row_state_names", None)
    if row_names is None:
        row_names = [key for key, arr in state.items() if np.shape(arr) == (2, dim)]
    rows, scalars = {}, {}
    for key, arr in state.items():
        arr = np.asarray(arr)
        if key in row_names:
            if arr.shape != (2, dim):
                raise ConfigError(f"sparse table {name!r}: per-row state {key!r} has shape {arr.shape}, "
                                  f"expected {(2, dim)} from init_state((2, {dim}))")
            rows[key] = np.ascontiguousarray(arr[0])
        else:
            scalars[key] = np.array(arr, copy=True)
    return rows, scalars


def as_ids(ids, name):
    """Returns ``ids`` as a C-contiguous int64 [n] array.

    Raises:
        DataError: the ids are not integers (the message names the table ``name``).
    """
    ids = np.asarray(ids)
    if ids.dtype == np.int64 and ids.ndim == 1 and ids.flags.c_contiguous:
        return ids
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"sparse table {name!r}: ids must be integers; got dtype {ids.dtype}")
    return np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)


def need(state, key, name):
    """Returns ``state[key]`` as an array.

    Raises:
        ConfigError: ``state`` has no ``key`` (the message lists the keys it has).
    """
    if key not in state:
        raise ConfigError(f"sparse table {name!r}: the state to load has no {key!r}; keys are {sorted(state)}")
    return np.asarray(state[key])


def check_shape(arr, shape, dtype, key, name):
    """Raises ConfigError naming ``key`` unless ``arr`` has ``shape`` and ``dtype``."""
    if arr.shape != tuple(shape) or arr.dtype != dtype:
        raise ConfigError(
            f"sparse table {name!r}: {key!r} to load is {arr.dtype}{list(arr.shape)}, "
            f"expected {np.dtype(dtype)}{list(shape)}"
        )
