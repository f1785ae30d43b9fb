"""The op registry: op type -> ``OpDef`` (shape inference, forward, backward).

Layers above the framework register their own ops here (the transpiler's send and
prefetch ops) with ``register_op``.
"""
from fleet.errors import ConfigError
from fleet.framework.lod import DENSE, check as check_lod

_OPS = {}


class OpDef:
    """What an op type computes.

    Subclasses set ``type`` and implement ``forward``; differentiable ops implement
    ``backward`` and list in ``grad_slots`` the input slots that receive gradients.

    ``forward(ctx)`` reads inputs with ``ctx.input(slot)`` and writes outputs with
    ``ctx.set_output(slot, value)``. ``backward(ctx)`` runs as the op's grad op: it reads
    the forward inputs and outputs the same way, the output gradients with
    ``ctx.input(slot + "@GRAD")`` (None when no gradient flows) and writes input gradients
    with ``ctx.set_output(slot + "@GRAD", value)`` (skipped where not wanted).

    ``lod`` says what the op does with lod_level=1 inputs (``fleet.framework.lod``: DENSE
    refuses them at build time, ROWWISE works on their values row by row and passes the
    LoD to the ``lod_outputs`` slots, SEQUENCE reads LoDTensors itself).
    """

    type = None
    grad_slots = ()
    lod = DENSE
    lod_outputs = ("Out",)
    joins_single_ids = False  # ROWWISE: per-example inputs may join one-id sequences (lod.check)

    def infer_shape(self, op, block):
        """Sets the shapes and dtypes of the op's outputs at build time (optional)."""

    def infer_lod(self, op, block):
        """Checks lod_level=1 inputs against ``lod`` and sets the outputs' lod levels.

        Raises:
            ConfigError: an input the op cannot take (names the layer and the fix).
        """
        check_lod(self, op, block)

    def check_rowwise(self, op, block, seqs):
        """ROWWISE ops: refuses (raises ConfigError) attribute values that would mix the
        rows of different examples, e.g. concat along axis 0. ``seqs``: the lod_level=1
        input variables."""

    def lod_outputs_of(self, op):
        """The output slots that carry the LoD of a ROWWISE op's inputs."""
        return self.lod_outputs

    def forward(self, ctx):
        raise NotImplementedError(f"op {self.type} has no forward")

    def backward(self, ctx):
        raise ConfigError(f"op {self.type!r} is not differentiable; mark its inputs stop_gradient")


def register_op(cls):
    """Class decorator: registers an OpDef subclass under ``cls.type``."""
    if not cls.type:
        raise ConfigError(f"{cls.__name__} has no op type")
    _OPS[cls.type] = cls()
    return cls


def get_op_def(op_type):
    """Returns the OpDef of ``op_type`` (the ``*_grad`` type maps to its forward op's def).

    Raises:
        ConfigError: the op type is unknown.
    """
    _ensure_builtin_ops()
    opdef = _OPS.get(op_type)
    if opdef is None and op_type.endswith("_grad"):
        opdef = _OPS.get(op_type[: -len("_grad")])
    if opdef is None:
        raise ConfigError(f"op type {op_type!r} is not registered; known: {sorted(_OPS)}")
    return opdef


def has_op(op_type):
    _ensure_builtin_ops()
    return op_type in _OPS


_loaded = False


def _ensure_builtin_ops():
    global _loaded
    if not _loaded:
        _loaded = True
        import fleet.framework.ops  # noqa: F401  (registers the built-in ops)
