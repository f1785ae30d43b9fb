"""Slots: what a dataset reads for each variable given to ``set_use_var``."""
import math

import numpy as np

from fleet.errors import ConfigError
from fleet.kernels.parse import CRITEO_DENSE, CRITEO_SPARSE

_DTYPE_MESSAGE = "Currently, fluid.dataset only supports dtype=float32 and dtype=int64"


class Slot:
    """One input of a dataset, read from one variable.

    Attributes:
        name: the variable's name, the key of the batch feed dict.
        dtype: "float32" or "int64".
        lod_level: 0 (dense: a fixed number of values per example) or 1 (a sequence).
        shape: the variable's shape, first dimension the batch.
        width: values per example of a dense slot (product of ``shape[1:]``), -1 for lod.
    """

    __slots__ = ("name", "dtype", "lod_level", "shape", "width")

    def __init__(self, name, dtype, lod_level, shape):
        self.name = name
        self.dtype = dtype
        self.lod_level = lod_level
        self.shape = tuple(shape)
        self.width = math.prod(self.shape[1:]) if lod_level == 0 else -1

    @property
    def is_float(self):
        return self.dtype == "float32"

    @property
    def is_dense(self):
        return self.lod_level == 0

    @property
    def np_dtype(self):
        return np.float32 if self.is_float else np.int64

    def describe(self):
        """A short text such as ``'C1' (int64, lod_level=1)`` for messages."""
        if self.is_dense:
            return f"{self.name!r} ({self.dtype}, shape {list(self.shape[1:])})"
        return f"{self.name!r} ({self.dtype}, lod_level=1)"

    def __repr__(self):
        return f"Slot({self.describe()})"


def _dtype_name(dtype):
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def slots_from_vars(var_list):
    """Builds one Slot per variable, in order.

    Args:
        var_list: framework Variables (anything with ``name``, ``shape``, ``dtype``,
            ``lod_level``).

    Returns:
        list of Slot.

    Raises:
        ConfigError: not a non-empty list, a dtype other than float32 / int64 (Paddle's
            message), a lod_level other than 0 / 1, a dense shape with unknown
            dimensions after the batch, or two variables with the same name.
    """
    if not isinstance(var_list, (list, tuple)) or not var_list:
        raise ConfigError(
            f"set_use_var takes a non-empty list of variables (from layers.data), got {var_list!r}")
    slots = []
    seen = set()
    for var in var_list:
        for attr in ("name", "shape", "dtype", "lod_level"):
            if not hasattr(var, attr):
                raise ConfigError(
                    f"set_use_var: {var!r} is not a variable (it has no {attr!r}); pass the "
                    f"variables returned by layers.data")
        dtype = _dtype_name(var.dtype)
        if dtype not in ("float32", "int64"):
            raise ConfigError(f"{_DTYPE_MESSAGE} (variable {var.name!r} has dtype {dtype!r})")
        if var.lod_level not in (0, 1):
            raise ConfigError(
                f"set_use_var: variable {var.name!r} has lod_level={var.lod_level!r}; datasets "
                f"read lod_level 0 (dense) or 1 (sequences)")
        shape = tuple(var.shape)
        if var.lod_level == 0 and (len(shape) < 2 or any(d is None or d < 1 for d in shape[1:])):
            raise ConfigError(
                f"set_use_var: dense variable {var.name!r} has shape {list(shape)}; a dense slot "
                f"needs known sizes after the batch dimension, e.g. [-1, 13]")
        if var.name in seen:
            raise ConfigError(f"set_use_var: variable {var.name!r} is given twice")
        seen.add(var.name)
        slots.append(Slot(var.name, dtype, var.lod_level, shape))
    return slots


def check_criteo_layout(slots):
    """Checks that the slots are the CTR-DNN inputs, in the order the Criteo format fills.

    Expected: a float32 dense slot of width 13, 26 int64 lod_level=1 slots (C1..C26)
    and an int64 dense label of width 1.

    Raises:
        ConfigError: naming the expected layout and the first slot that differs.
    """
    expected = (
        "the 'criteo' data format fills 28 variables in this order: a float32 dense "
        "variable of shape [13] (I1..I13), 26 int64 lod_level=1 variables (C1..C26) and an "
        "int64 label of shape [1]")
    if len(slots) != 2 + CRITEO_SPARSE:
        raise ConfigError(f"{expected}; set_use_var was given {len(slots)} variables")
    dense, label, sparse = slots[0], slots[-1], slots[1:-1]
    if not (dense.is_float and dense.is_dense and dense.width == CRITEO_DENSE):
        raise ConfigError(f"{expected}; the first variable is {dense.describe()}")
    for i, slot in enumerate(sparse):
        if slot.is_float or slot.is_dense:
            raise ConfigError(f"{expected}; variable {i + 2} (for C{i + 1}) is {slot.describe()}")
    if not (label.dtype == "int64" and label.is_dense and label.width == 1):
        raise ConfigError(f"{expected}; the last variable is {label.describe()}")
