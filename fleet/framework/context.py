"""The per-op execution context handed to ``OpDef.forward`` / ``OpDef.backward``."""
import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework.lod import ROWWISE, layer_name
from fleet.framework.tensor import LoDTensor


class OpContext:
    """Reads an op's inputs and writes its outputs for one runner (one thread).

    Temporaries go to the runner's private dict (``local``); persistable variables go to
    the scope that holds them. Not thread-safe: each training thread has its own contexts.

    For a ROWWISE op (``fleet.framework.lod``) the context hides the LoD: inputs that are
    LoDTensors are read as their values, and an output whose variable is lod_level=1 is
    stored as a LoDTensor with the offsets of the op's lod_level=1 inputs (which must
    agree).
    """

    __slots__ = ("op", "attrs", "local", "scope", "persistable", "runner", "rowwise", "_lod_in",
                 "_lod_out")

    def __init__(self, op, local, scope, persistable, runner=None):
        from fleet.framework.registry import get_op_def

        self.op = op
        self.attrs = op.attrs
        self.local = local
        self.scope = scope
        self.persistable = persistable
        self.runner = runner
        self.rowwise = get_op_def(op.type).lod == ROWWISE
        if self.rowwise:
            block = op.block
            is_lod = lambda n: n in block.vars and block.vars[n].lod_level > 0  # noqa: E731
            self._lod_in = [n for n in op.input_arg_names if is_lod(n)]
            self._lod_out = frozenset(n for n in op.output_arg_names if is_lod(n))
        else:
            self._lod_in, self._lod_out = (), frozenset()

    def _raw(self, name):
        value = self.local.get(name)
        if value is None:
            value = self.scope.value(name)
        return value

    def _get(self, name):
        value = self._raw(name)
        if self.rowwise and type(value) is LoDTensor:
            return value.values
        return value

    def _offsets(self, out_name):
        """The offsets of the op's lod_level=1 inputs (a ROWWISE op's output gets them).

        Raises:
            DataError: two inputs have different sequence lengths.
        """
        found = found_name = None
        for name in self._lod_in:
            value = self._raw(name)
            if type(value) is not LoDTensor:
                continue
            if found is None:
                found, found_name = value.offsets, name
            elif value.offsets is not found and not np.array_equal(value.offsets, found):
                raise DataError(
                    f"{layer_name(self.op)}: {found_name!r} and {name!r} are sequences of different "
                    f"lengths ({np.diff(found).tolist()[:8]} and {np.diff(value.offsets).tolist()[:8]}); "
                    f"row-by-row ops need the same lengths: pool each with layers.sequence_pool first")
        if found is None:
            raise DataError(f"{layer_name(self.op)}: output {out_name!r} is lod_level=1 but no input "
                            f"of {self._lod_in} holds sequences at this point")
        return found

    def input(self, slot, index=0):
        """Returns the value of input ``slot`` (its ``index``-th name).

        Raises:
            ConfigError: the variable has no value (not fed, or startup not run).
        """
        names = self.op.inputs.get(slot)
        if not names or not names[index]:
            raise ConfigError(f"op {self.op.type!r} has no input {slot!r}")
        value = self._get(names[index])
        if value is None:
            raise ConfigError(self._missing_message(names[index]))
        return value

    def input_opt(self, slot, index=0):
        """Returns the value of input ``slot`` or None when absent (e.g. no gradient flows)."""
        names = self.op.inputs.get(slot)
        if not names or index >= len(names) or not names[index]:
            return None
        return self._get(names[index])

    def inputs(self, slot):
        """Returns the values of every name of input ``slot`` (None for absent ones)."""
        return [self._get(n) if n else None for n in self.op.inputs.get(slot, ())]

    def input_name(self, slot, index=0):
        return self.op.inputs[slot][index]

    def output_name(self, slot, index=0):
        names = self.op.outputs.get(slot)
        return names[index] if names and index < len(names) else ""

    def wants(self, slot, index=0):
        """True when output ``slot`` (entry ``index``) is used, i.e. has a name."""
        return bool(self.output_name(slot, index))

    def set_output(self, slot, value, index=0):
        name = self.output_name(slot, index)
        if name:
            if name in self._lod_out and isinstance(value, np.ndarray):
                value = LoDTensor(value, self._offsets(name))
            self._set(name, value)

    def _set(self, name, value):
        if name in self.persistable:
            owner = self.scope.owner_of(name) or self.scope
            owner.vars[name] = value
        else:
            self.local[name] = value

    def buffer(self, slot, shape, dtype=np.float32, index=0):
        """Returns an array for output ``slot`` reused across steps when shape and dtype
        match the previous step's (saves the allocation and page faults of a new one)."""
        name = self.output_name(slot, index)
        prev = self.local.get(name)
        if type(prev) is LoDTensor:
            prev = prev.values
        if isinstance(prev, np.ndarray) and prev.shape == tuple(shape) and prev.dtype == dtype:
            return prev
        return np.empty(shape, dtype=dtype)

    def _missing_message(self, name):
        block = self.op.block
        var = block.vars.get(name)
        if var is not None and var.is_data:
            return (f"input {name!r} of op {self.op.type!r} was not fed; pass it in "
                    f"feed={{'{name}': ...}} or list it in dataset.set_use_var")
        if var is not None and var.persistable:
            return (f"{name!r} has no value in the scope; run the startup program "
                    f"(exe.run(fleet.startup_program)) before the main program")
        return f"variable {name!r} (input of op {self.op.type!r}) has no value at this point"
