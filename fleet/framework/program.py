"""The static program: variables, operators, blocks and programs (Paddle's ProgramDesc).

A ``Program`` is built once by the layers and run many times by the ``Executor``. Layers
append to the default main and startup programs unless ``program_guard`` redirects them.

Thread-safety: building a program is single-threaded; a built program is read-only while
executors run it (several threads may run the same program).
"""
import contextlib
import copy
import itertools
import json
import threading
import zlib

import numpy as np

from fleet.errors import ConfigError, DataError

DTYPES = ("float32", "int64", "float64", "int32", "bool")

# op_role values (Paddle's OpRole): what a pass or clone(for_test) may drop.
FORWARD, BACKWARD, OPTIMIZE, LOSS = "forward", "backward", "optimize", "loss"
# The learning-rate schedule's ops (the step counter's increment and the schedule): they
# run once per update, with the optimizer ops, and test clones drop them.
LRSCHED = "lr_sched"


class _UniqueNames:
    """Paddle-style unique names ("fc_0", "fc_1", "tmp_3"), one counter per prefix."""

    def __init__(self):
        self._counters = {}
        self._prefix = ""  # put before every name (Paddle's unique_name.guard("prefix"))
        self._lock = threading.Lock()

    def generate(self, prefix):
        with self._lock:
            n = self._counters.get(prefix, 0)
            self._counters[prefix] = n + 1
        return f"{self._prefix}{prefix}_{n}"

    def swap(self, counters, prefix=""):
        """Replaces the counters and the name prefix; returns the old (counters, prefix)."""
        with self._lock:
            old = (self._counters, self._prefix)
            self._counters, self._prefix = counters, prefix
        return old

    def reset(self):
        with self._lock:
            self._counters.clear()


unique_name = _UniqueNames()


def normalize_dtype(dtype):
    """Returns the dtype as one of ``DTYPES``; accepts numpy dtypes and their names."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    name = {"float": "float32", "int": "int64", "uint64": "int64", "bool_": "bool"}.get(name, name)
    if name not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return name


class Variable:
    """A named value of a program: an input, an intermediate, a parameter or a state.

    Attributes:
        name: unique within the program.
        shape: tuple of ints, -1 for the batch dimension.
        dtype: "float32", "int64", ...
        lod_level: 0 for a dense tensor, 1 for a batch of variable-length sequences.
        persistable: lives in the global scope across runs (parameters, optimizer state).
        stop_gradient: no gradient flows into it.
    """

    def __init__(self, block, name, shape=(), dtype="float32", lod_level=0, persistable=False,
                 stop_gradient=False, is_data=False):
        self.block = block
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.dtype = normalize_dtype(dtype)
        self.lod_level = int(lod_level)
        self.persistable = bool(persistable)
        self.stop_gradient = bool(stop_gradient)
        self.is_data = bool(is_data)

    @property
    def program(self):
        return self.block.program

    @property
    def grad_name(self):
        return self.name + "@GRAD"

    def _copy_to(self, block):
        new = copy.copy(self)
        new.block = block
        return new

    def __repr__(self):
        kind = type(self).__name__
        return (f"{kind}(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype}"
                f"{', lod_level=1' if self.lod_level else ''}"
                f"{', persistable' if self.persistable else ''})")


class Parameter(Variable):
    """A trainable persistable variable with its initializer and optimizer settings.

    Attributes:
        initializer: a ``fleet.initializer`` object run by the startup program.
        trainable: whether optimizers update it.
        learning_rate: a multiplier of the optimizer's learning rate.
        is_sparse: its gradient is sent as ``SparseRows`` (embedding tables).
        is_distributed: the table lives only on the servers, keyed by any int64 id.
        entry: the admission entry of an ``is_distributed`` table as Paddle's attribute
            string ("count_filter_entry:2", ...; ``fleet.entries.entry_from_attr`` parses
            it), or None.
        regularizer: a ``fleet.regularizer`` object or None (the optimizer's then applies).
    """

    regularizer = None

    def __init__(self, block, name, shape, dtype="float32", initializer=None, trainable=True,
                 learning_rate=1.0, is_sparse=False, is_distributed=False, entry=None):
        super().__init__(block, name, shape, dtype, persistable=True, stop_gradient=not trainable)
        self.initializer = initializer
        self.trainable = bool(trainable)
        self.learning_rate = float(learning_rate)
        self.is_sparse = bool(is_sparse)
        self.is_distributed = bool(is_distributed)
        self.entry = entry or None


class Operator:
    """One op of a block: a type, named input and output slots (lists of variable names)
    and attributes. What it computes is its ``OpDef`` in the registry."""

    def __init__(self, block, type, inputs=None, outputs=None, attrs=None):
        self.block = block
        self.type = type
        self.inputs = {k: list(v) for k, v in (inputs or {}).items()}
        self.outputs = {k: list(v) for k, v in (outputs or {}).items()}
        self.attrs = dict(attrs or {})
        self.attrs.setdefault("op_role", FORWARD)

    def input(self, slot):
        return self.inputs.get(slot, [])

    def output(self, slot):
        return self.outputs.get(slot, [])

    @property
    def input_arg_names(self):
        return [n for names in self.inputs.values() for n in names if n]

    @property
    def output_arg_names(self):
        return [n for names in self.outputs.values() for n in names if n]

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def _copy_to(self, block):
        new = Operator(block, self.type, self.inputs, self.outputs, self.attrs)
        return new

    def __repr__(self):
        ins = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        outs = ", ".join(f"{k}={v}" for k, v in self.outputs.items())
        return f"{{{outs}}} = {self.type}({ins})"


class Block:
    """The variables and the ordered ops of a program (fleet programs have one block)."""

    def __init__(self, program, idx=0):
        self.program = program
        self.idx = idx
        self.vars = {}
        self.ops = []

    def var(self, name):
        """Returns the variable ``name``.

        Raises:
            ConfigError: no such variable in this block.
        """
        try:
            return self.vars[name]
        except KeyError:
            raise ConfigError(
                f"variable {name!r} is not in this program; build it with fleet.layers in the "
                f"same program (see program_guard), or check the name"
            ) from None

    def has_var(self, name):
        return name in self.vars

    def create_var(self, name=None, shape=(), dtype="float32", lod_level=0, persistable=False,
                   stop_gradient=False, is_data=False, prefix="tmp"):
        """Creates (or returns the existing) variable ``name`` (a unique name if None)."""
        if name is None:
            name = unique_name.generate(prefix)
        if name in self.vars:
            return self.vars[name]
        var = Variable(self, name, shape, dtype, lod_level, persistable, stop_gradient, is_data)
        self.vars[name] = var
        self.program._bump()
        return var

    def create_parameter(self, name, shape, dtype="float32", **kwargs):
        """Creates parameter ``name`` or returns the existing one (shared by name).

        Raises:
            ConfigError: a parameter of that name exists with another shape or dtype.
        """
        existing = self.vars.get(name)
        if existing is not None:
            if not isinstance(existing, Parameter):
                raise ConfigError(f"{name!r} is already a non-parameter variable; pick another name")
            if existing.shape != tuple(shape) or existing.dtype != normalize_dtype(dtype):
                raise ConfigError(
                    f"parameter {name!r} is shared with shape {list(existing.shape)} "
                    f"{existing.dtype} but requested as {list(shape)} {dtype}; shared parameters "
                    f"(same param_attr name) must have the same shape and dtype"
                )
            return existing
        param = Parameter(self, name, shape, dtype, **kwargs)
        self.vars[name] = param
        self.program._bump()
        return param

    def append_op(self, type, inputs=None, outputs=None, attrs=None):
        """Appends an op and infers its outputs' shapes. Returns the Operator."""
        from fleet.framework.registry import get_op_def, has_op

        op = Operator(self, type, inputs, outputs, attrs)
        opdef = get_op_def(type)
        if has_op(type):  # grad ops take their shapes and lod levels from the forward variables
            opdef.infer_shape(op, self)
            opdef.infer_lod(op, self)
        self.ops.append(op)
        self.program._bump()
        return op

    def _insert_op(self, index, op):
        self.ops.insert(index, op)
        self.program._bump()

    def _remove_op(self, index):
        del self.ops[index]
        self.program._bump()

    def all_parameters(self):
        return [v for v in self.vars.values() if isinstance(v, Parameter)]


_program_ids = itertools.count()


class Program:
    """A static program: one block of variables and ops.

    Attributes:
        random_seed: when non-zero, every random initializer of the program (and of the
            startup program paired with it) is seeded from it and its variable's name, so
            a whole run is repeatable.
    """

    def __init__(self):
        self.blocks = [Block(self, 0)]
        self._random_seed = 0
        self._paired = None  # the main program of a startup program, and vice versa
        self._version = 0
        self._id = next(_program_ids)
        # The program this one was cloned from, transitively (its own id when built):
        # a distributed worker's runtime recognises programs built before minimize by it.
        self._lineage = self._id
        self._is_distributed = False
        self._is_test = False
        self._fleet_opt = None
        # A distributed worker's communicator (fleet.framework.hooks.TrainingHooks), or None.
        self.training_hooks = None
        self._build_strategy = None  # how train_from_dataset combines threads

    def _bump(self):
        self._version += 1

    @property
    def random_seed(self):
        return self._random_seed

    @random_seed.setter
    def random_seed(self, seed):
        if not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"random_seed={seed!r} must be a non-negative int (0 means unseeded)")
        self._random_seed = seed
        self._bump()

    def _effective_seed(self):
        if self._random_seed:
            return self._random_seed
        return self._paired._random_seed if self._paired is not None else 0

    def seed_for(self, name, explicit_seed=0):
        """Returns the seed of the random op that initializes ``name`` (0: unseeded)."""
        if explicit_seed:
            return int(explicit_seed)
        base = self._effective_seed()
        if not base:
            return 0
        return (zlib.crc32(name.encode()) ^ (base * 0x9E3779B1)) & 0x7FFFFFFF or 1

    def global_block(self):
        return self.blocks[0]

    def current_block(self):
        return self.blocks[0]

    def block(self, idx):
        return self.blocks[idx]

    @property
    def num_blocks(self):
        return len(self.blocks)

    def list_vars(self):
        return list(self.global_block().vars.values())

    def all_parameters(self):
        return self.global_block().all_parameters()

    def clone(self, for_test=False):
        """Returns a copy; with ``for_test`` the copy has no backward or optimizer ops.

        A test clone of a worker's distributed program evaluates with the servers' current
        parameters: its forward pulls what it needs and sends nothing.
        """
        new = Program()
        new._lineage = self._lineage
        new._random_seed = self._random_seed
        new._paired = self._paired
        new._is_distributed = self._is_distributed
        new._fleet_opt = self._fleet_opt
        new.training_hooks = self.training_hooks
        new._build_strategy = self._build_strategy
        new._is_test = for_test
        src, dst = self.global_block(), new.global_block()
        for name, var in src.vars.items():
            dst.vars[name] = var._copy_to(dst)
        for op in src.ops:
            if for_test and op.attr("op_role") in (BACKWARD, OPTIMIZE, LRSCHED):
                continue
            if for_test and op.attr("op_role") == LOSS and op.type == "fill_constant":
                continue
            new_op = op._copy_to(dst)
            if for_test:
                new_op.attrs["is_test"] = True
            dst.ops.append(new_op)
        if for_test:
            used = {n for op in dst.ops for n in op.input_arg_names + op.output_arg_names}
            for name in [n for n in dst.vars if n.endswith("@GRAD") or "@GRAD@" in n]:
                if name not in used:
                    del dst.vars[name]
        return new

    def to_dict(self):
        """Returns the program as plain JSON-able data (``Program.from_dict`` reverses it).

        Variables keep name, shape, dtype, lod level and flags; parameters also their
        optimizer settings (``trainable``, ``learning_rate``, ``is_sparse``,
        ``is_distributed``, ``entry``) but not their initializer: a saved program runs with saved
        values. Ops keep type, inputs, outputs and attributes.

        Raises:
            ConfigError: an op attribute has a value that cannot be saved (names it).
        """
        variables = []
        for var in self.global_block().vars.values():
            entry = {"name": var.name, "shape": list(var.shape), "dtype": var.dtype,
                     "lod_level": var.lod_level, "persistable": var.persistable,
                     "stop_gradient": var.stop_gradient, "is_data": var.is_data}
            if isinstance(var, Parameter):
                entry.update(parameter=True, trainable=var.trainable, learning_rate=var.learning_rate,
                             is_sparse=var.is_sparse, is_distributed=var.is_distributed)
                if var.entry:
                    entry["entry"] = var.entry
            variables.append(entry)
        ops = [{"type": op.type, "inputs": op.inputs, "outputs": op.outputs,
                "attrs": {k: _encode_attr(v, op.type, k) for k, v in op.attrs.items()}}
               for op in self.global_block().ops]
        return {"format": PROGRAM_FORMAT, "version": PROGRAM_VERSION, "random_seed": self._random_seed,
                "is_test": self._is_test, "vars": variables, "ops": ops}

    @classmethod
    def from_dict(cls, data):
        """Rebuilds a program from ``to_dict``'s data.

        Raises:
            ConfigError: not a fleet program, or a version this fleet cannot read.
        """
        if not isinstance(data, dict) or data.get("format") != PROGRAM_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"not a saved fleet program: format {found!r}, expected {PROGRAM_FORMAT!r}")
        if data.get("version") != PROGRAM_VERSION:
            raise ConfigError(f"saved program version {data.get('version')!r} is not supported; this fleet "
                              f"reads version {PROGRAM_VERSION} (save it again with this fleet)")
        program = cls()
        program._random_seed = int(data.get("random_seed", 0))
        program._is_test = bool(data.get("is_test", False))
        block = program.global_block()
        for entry in data["vars"]:
            common = dict(shape=entry["shape"], dtype=entry["dtype"])
            if entry.get("parameter"):
                var = Parameter(block, entry["name"], trainable=entry["trainable"],
                                learning_rate=entry["learning_rate"], is_sparse=entry["is_sparse"],
                                is_distributed=entry["is_distributed"], entry=entry.get("entry"), **common)
                var.persistable = bool(entry["persistable"])
                var.stop_gradient = bool(entry["stop_gradient"])
            else:
                var = Variable(block, entry["name"], lod_level=entry["lod_level"],
                               persistable=entry["persistable"], stop_gradient=entry["stop_gradient"],
                               is_data=entry["is_data"], **common)
            block.vars[var.name] = var
        for entry in data["ops"]:
            attrs = {k: _decode_attr(v) for k, v in entry["attrs"].items()}
            block.ops.append(Operator(block, entry["type"], entry["inputs"], entry["outputs"], attrs))
        program._bump()
        return program

    @staticmethod
    def parse_from_string(binary_str):
        """Returns the program saved in ``binary_str`` (Paddle's name): the bytes of an
        inference model's ``__model__`` file, or of ``program.desc.serialize_to_string()``.

        Raises:
            DataError: the bytes are not a saved program (damaged file).
            ConfigError: a program format or version this fleet cannot read.
        """
        return deserialize_program(binary_str)

    @property
    def desc(self):
        """A view with Paddle's ``ProgramDesc`` method ``serialize_to_string()``."""
        return ProgramDesc(self)

    def serialize_to_string(self):
        """Returns the program as bytes (the content of ``__model__``)."""
        return serialize_program(self)

    def to_string(self, throw_on_error=False, with_details=False):
        lines = [f"Program (seed={self._random_seed})"]
        lines += [f"  var {v!r}" for v in self.global_block().vars.values()]
        lines += [f"  op  {op!r}" for op in self.global_block().ops]
        return "\n".join(lines)

    def __str__(self):
        return self.to_string()


class ProgramDesc:
    """What ``Program.desc`` returns: the serialization calls Paddle scripts make on it."""

    def __init__(self, program):
        self._program = program

    def serialize_to_string(self):
        """Returns the program as bytes (``Program.parse_from_string`` reverses it)."""
        return serialize_program(self._program)


PROGRAM_FORMAT = "fleet-program"
PROGRAM_VERSION = 1


def _encode_attr(value, op_type, name):
    """An attribute value as JSON data; tuples, dicts and arrays are tagged to come back alike."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return [_encode_attr(v, op_type, name) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_attr(v, op_type, name) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__dict__": {k: _encode_attr(v, op_type, name) for k, v in value.items()}}
    if isinstance(value, np.ndarray):
        return {"__array__": value.tolist(), "dtype": value.dtype.name, "shape": list(value.shape)}
    raise ConfigError(f"op {op_type!r} attribute {name!r} holds a {type(value).__name__} ({value!r}), "
                      f"which cannot be saved; attributes must be numbers, strings, lists, tuples, "
                      f"dicts or numpy arrays")


def _decode_attr(value):
    if isinstance(value, list):
        return [_decode_attr(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_decode_attr(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: _decode_attr(v) for k, v in value["__dict__"].items()}
        if "__array__" in value:
            return np.array(value["__array__"], dtype=value["dtype"]).reshape(value["shape"])
    return value


def serialize_program(program):
    """Returns ``program`` as versioned JSON bytes (``deserialize_program`` reverses it).

    Raises:
        ConfigError: an op attribute cannot be saved.
    """
    return json.dumps(program.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def deserialize_program(data):
    """Returns the Program saved by ``serialize_program``.

    Raises:
        DataError: the bytes are not JSON.
        ConfigError: not a fleet program, or an unsupported version.
    """
    try:
        decoded = json.loads(bytes(data).decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise DataError(f"the saved program is not fleet's JSON program format ({e}): the file is damaged, "
                        f"or was written by Paddle itself (protobuf), which fleet does not read; save the "
                        f"model again with fleet.save_inference_model") from e
    return Program.from_dict(decoded)


_main_program = Program()
_startup_program = Program()
_main_program._paired = _startup_program
_startup_program._paired = _main_program


def default_main_program():
    """Returns the program layers append to (unless ``program_guard`` redirects them)."""
    return _main_program


def default_startup_program():
    """Returns the program holding parameter initializers."""
    return _startup_program


def switch_main_program(program):
    global _main_program
    prev, _main_program = _main_program, program
    return prev


def switch_startup_program(program):
    global _startup_program
    prev, _startup_program = _startup_program, program
    return prev


@contextlib.contextmanager
def program_guard(main_program, startup_program=None):
    """Within the block, layers append to ``main_program`` (and ``startup_program``).

    Raises:
        TypeError: an argument is not a Program.
    """
    if not isinstance(main_program, Program):
        raise TypeError(f"main_program must be a fleet.Program, got {type(main_program).__name__}")
    if startup_program is not None and not isinstance(startup_program, Program):
        raise TypeError(f"startup_program must be a fleet.Program, got {type(startup_program).__name__}")
    prev_main = switch_main_program(main_program)
    prev_startup = switch_startup_program(startup_program) if startup_program is not None else None
    if startup_program is not None:
        main_program._paired = startup_program
        startup_program._paired = main_program
    try:
        yield
    finally:
        switch_main_program(prev_main)
        if startup_program is not None:
            switch_startup_program(prev_startup)


def reset_default_programs():
    """Starts fresh default programs and names (used by tests and repeated builds)."""
    global _main_program, _startup_program
    _main_program, _startup_program = Program(), Program()
    _main_program._paired = _startup_program
    _startup_program._paired = _main_program
    unique_name.reset()
