"""Scopes: where variables' values live between runs.

``global_scope()`` holds parameters and other persistable state; training threads run in
child scopes whose temporaries are private while lookups fall through to the parent.
Values are numpy arrays (or ``SparseRows`` / ``LoDTensor``), and the array in the scope is
the live one: writing into it in place changes the parameter.

Thread-safety: reads and writes of distinct names from several threads are safe (dict
operations are atomic under the GIL); creating and dropping child scopes is locked.
"""
import contextlib
import threading

from fleet.errors import ConfigError


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

    def find_var(self, name):
        """Returns the value of ``name`` here or in an ancestor, or None."""
        scope = self
        while scope is not None:
            value = scope.vars.get(name)
            if value is not None:
                return value
            scope = scope.parent
        return None

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
        value = self.find_var(name)
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
        return self.find_var(name) is not None

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
