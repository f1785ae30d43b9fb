"""Scopes: where variables' values live between runs.

``global_scope()`` holds parameters and other persistable state; training threads run in
child scopes whose temporaries are private while lookups fall through to the parent.
Values are numpy arrays (or ``SparseRows`` / ``LoDTensor``), and the array in the scope is
the live one: writing into it in place changes the parameter. ``scope[name]`` and
``value(name)`` give it as it is; ``find_var(name)`` and ``var(name)`` (Paddle's calls) as a
view that also has Paddle's tensor methods (``ScopeTensor``).

Thread-safety: reads and writes of distinct names from several threads are safe (dict
operations are atomic under the GIL); creating and dropping child scopes is locked.
"""
import contextlib
import threading

import numpy as np

from fleet.errors import ConfigError


class ScopeTensor(np.ndarray):
    """A variable's array as ``Scope.find_var`` and ``Scope.var`` give it: a view of the
    live array (writing into it changes the variable) that also answers what Paddle scripts
    call on a variable and its tensor: ``get_tensor()`` (itself), ``set(array, place)`` and
    ``_get_dims()``; ``np.array(...)`` copies it as in Paddle. Arithmetic on it gives plain
    arrays."""

    def __array_finalize__(self, obj):
        self._owner = getattr(obj, "_owner", None)
        self._name = getattr(obj, "_name", None)

    def __array_wrap__(self, array, context=None, return_scalar=False):
        if return_scalar:
            return array[()]
        return array.view(np.ndarray)

    def get_tensor(self):
        """Paddle's ``Variable.get_tensor()``: this same array."""
        return self

    def _get_dims(self):
        """Paddle's ``LoDTensor._get_dims()``: the shape as a list."""
        return list(self.shape)

    def set(self, array, place=None):
        """Paddle's ``LoDTensor.set(array, place)``: the variable's value becomes a copy of
        ``array`` (``place`` is accepted: everything is on the CPU). Of this array's shape
        and dtype it is written in place; otherwise the scope gets the copy, and this array
        is no longer the variable's (find it again).

        Raises:
            ConfigError: the shape or dtype differs and this array is not a scope variable's.
        """
        value = np.array(array, copy=True)
        if value.shape == self.shape and value.dtype == self.dtype:
            self[...] = value
            return
        if self._owner is None or self._name is None:
            raise ConfigError(f"set(): an array of shape {value.shape} and dtype {value.dtype} cannot replace this "
                              f"one ({self.shape}, {self.dtype}): it is not a scope variable's array; "
                              "use scope.find_var(name).set(...)")
        self._owner.vars[self._name] = value


class Scope:
    """A mapping of variable names to values, with an optional parent for lookups."""

    def __init__(self, parent=None):
        self.vars = {}
        self.parent = parent
        self._kids = []
        self._lock = threading.Lock()
        # What the values here come from (fleet's saves refuse a scope with neither):
        self.trained_examples = 0  # examples run through training programs in this scope
        self.trained_steps = 0     # batches (steps) of those examples
        self.loaded_from = None    # the directory a load put values here from, if any

    def record_training(self, examples):
        """Counts one step of ``examples`` trained into this scope (the executor calls it,
        once per batch). Thread-safe."""
        with self._lock:
            self.trained_examples += int(examples)
            self.trained_steps += 1

    def _lookup(self, name):
        """(the scope holding a value of ``name``, here or in an ancestor, and the value),
        or (None, None)."""
        scope = self
        while scope is not None:
            value = scope.vars.get(name)
            if value is not None:
                return scope, value
            scope = scope.parent
        return None, None

    def value(self, name):
        """Returns the value of ``name`` here or in an ancestor (the live object), or None."""
        return self._lookup(name)[1]

    def find_var(self, name):
        """Paddle's ``Scope.find_var``: the value of ``name`` here or in an ancestor, or
        None. An array comes as a :class:`ScopeTensor`, a view of the live array (write
        into it to change the variable) with Paddle's ``get_tensor()``, ``set()`` and
        ``_get_dims()``; other values (SparseRows, LoDTensor) as they are."""
        scope, value = self._lookup(name)
        if type(value) is not np.ndarray:
            return value
        view = value.view(ScopeTensor)
        view._owner, view._name = scope, name
        return view

    def var(self, name):
        """Paddle's ``Scope.var``: ``find_var(name)``, creating the variable here first (an
        empty float32 array, for ``.set(array, place)`` to give a value) when it does not
        exist."""
        if not isinstance(name, str):
            raise ConfigError(f"scope variable names are str, got {name!r}")
        if self.value(name) is None:
            self.vars[name] = np.zeros(0, np.float32)
        return self.find_var(name)

    def owner_of(self, name):
        """Returns the scope (this or an ancestor) that holds ``name``, or None."""
        scope = self
        while scope is not None:
            if name in scope.vars:
                return scope
            scope = scope.parent
        return None

    def new_scope(self):
        """Returns a new child scope."""
        kid = Scope(self)
        with self._lock:
            self._kids.append(kid)
        return kid

    def drop_kids(self):
        with self._lock:
            self._kids.clear()

    def __getitem__(self, name):
        value = self.value(name)
        if value is None:
            raise KeyError(
                f"{name!r} is not in the scope; run the startup program first "
                f"(exe.run(fleet.startup_program)) or check the variable name"
            )
        return value

    def __setitem__(self, name, value):
        if not isinstance(name, str):
            raise ConfigError(f"scope keys are variable names (str), got {name!r}")
        self.vars[name] = value

    def __delitem__(self, name):
        del self.vars[name]

    def __contains__(self, name):
        return self.value(name) is not None

    def keys(self):
        names = set()
        scope = self
        while scope is not None:
            names.update(scope.vars)
            scope = scope.parent
        return sorted(names)

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def __repr__(self):
        return f"Scope({len(self.vars)} vars{', child' if self.parent else ''})"


_global_scope = Scope()


def global_scope():
    """Returns the process-wide scope that ``Executor.run`` uses by default."""
    return _global_scope


@contextlib.contextmanager
def scope_guard(scope):
    """Within the block, ``global_scope()`` returns ``scope``."""
    global _global_scope
    if not isinstance(scope, Scope):
        raise TypeError(f"scope_guard takes a fleet Scope, got {type(scope).__name__}")
    prev, _global_scope = _global_scope, scope
    try:
        yield
    finally:
        _global_scope = prev
