"""Python operators on Variables, as Paddle 1.x patches them onto ``fluid.Variable``:
``x + y``, ``1 - p``, ``0.5 * x``, ``x / 2``, ``-x``, ``x ** 2``, ``x[:, i, :]`` and
``x.astype("float32")`` append the ops a layer would (scale, elementwise_*, pow, slice,
cast) to the variable's own program.

With a Python number the op is ``scale`` (``c - x`` is scale(x, -1, c); ``c / x`` is
``c * x ** -1``); between two Variables it is ``elementwise_<op>`` with axis -1, the
right operand cast to the left one's dtype first when they differ (Paddle's rule).
Comparison operators are not patched: Variables stay hashable and comparable by identity.
"""
import math
import numbers

from fleet.errors import ConfigError
from fleet.framework.program import Variable, default_main_program, program_guard

_INT_MAX = 2 ** 31 - 1


def _number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _in_program(var, build):
    """Runs ``build()`` with the default main program switched to ``var``'s program."""
    if var.block.program is default_main_program():
        return build()
    with program_guard(var.block.program):
        return build()


def _scale(x, scale=1.0, bias=0.0):
    from fleet.layers.nn import scale as scale_layer

    return _in_program(x, lambda: scale_layer(x, scale=float(scale), bias=float(bias)))


def _binary(op_type, reverse=False):
    def method(self, other):
        from fleet.layers import math as math_layers
        from fleet.layers.nn import cast

        if _number(other):
            return _scalar(op_type, self, float(other), reverse)
        if not isinstance(other, Variable):
            return NotImplemented
        x, y = (other, self) if reverse else (self, other)

        def build():
            right = y if y.dtype == x.dtype else cast(y, x.dtype)
            return getattr(math_layers, op_type)(x, right)

        return _in_program(self, build)

    method.__name__ = f"__{'r' if reverse else ''}{op_type.split('_')[1]}__"
    return method


def _scalar(op_type, x, c, reverse):
    from fleet.layers.activation import exp, pow as pow_layer

    kind = op_type.split("_")[1]
    if kind == "add":
        return _scale(x, 1.0, c)
    if kind == "sub":
        return _scale(x, -1.0, c) if reverse else _scale(x, 1.0, -c)
    if kind == "mul":
        return _scale(x, c)
    if kind == "div":
        if reverse:
            return _scale(_in_program(x, lambda: pow_layer(x, -1.0)), c)
        if c == 0:
            raise ConfigError(f"{x.name!r} / 0: division by a zero constant")
        return _scale(x, 1.0 / c)
    if reverse:  # c ** x = exp(x * ln c)
        if c <= 0:
            raise ConfigError(f"{c} ** {x.name!r}: the base of a Variable exponent must be > 0")
        return _in_program(x, lambda: exp(_scale(x, math.log(c))))
    return _in_program(x, lambda: pow_layer(x, c))


def _neg(self):
    return _scale(self, -1.0)


def _astype(self, dtype):
    from fleet.layers.nn import cast

    return _in_program(self, lambda: cast(self, dtype))


def _getitem(self, item):
    """x[i, a:b, ...]: a ``slice`` op; int indices drop their dim (Paddle's decrease_axis)."""
    from fleet.layers.shapes import _slice

    items = item if isinstance(item, tuple) else (item,)
    if sum(i is Ellipsis for i in items) > 1:
        raise ConfigError(f"indexing {self.name!r} with {item!r}: at most one '...'")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + (slice(None),) * (len(self.shape) - len(items) + 1) + items[at + 1:]
    if len(items) > len(self.shape):
        raise ConfigError(f"indexing {self.name!r} {list(self.shape)} with {len(items)} indices; it has "
                          f"{len(self.shape)} dims")
    axes, starts, ends, decrease = [], [], [], []
    for axis, index in enumerate(items):
        if isinstance(index, slice):
            if index.step not in (None, 1):
                raise ConfigError(f"indexing a Variable with a step ({index!r} on {self.name!r}) is not "
                                  f"supported; slice with step 1")
            if index.start is None and index.stop is None:
                continue
            start, stop = index.start or 0, _INT_MAX if index.stop is None else index.stop
        elif isinstance(index, numbers.Integral) and not isinstance(index, bool):
            start, stop = int(index), int(index) + 1 if index != -1 else _INT_MAX
            decrease.append(axis)
        else:
            raise ConfigError(f"indexing {self.name!r} with {index!r}: use ints and slices")
        axes.append(axis)
        starts.append(int(start))
        ends.append(int(stop))
    if not axes:
        return self
    return _in_program(self, lambda: _slice(self, axes, starts, ends, decrease))


def _iter(self):
    raise TypeError(f"a Variable ({self.name!r}) is not iterable; index it (x[i]) or split it with "
                    f"layers.split")


def monkey_patch_variable():
    """Adds the operators to ``fleet.framework.Variable`` (idempotent)."""
    for op_type in ("elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div",
                    "elementwise_pow"):
        kind = op_type.split("_")[1]
        names = ["truediv", "div"] if kind == "div" else [kind]
        for name in names:
            setattr(Variable, f"__{name}__", _binary(op_type))
            setattr(Variable, f"__r{name}__", _binary(op_type, reverse=True))
    Variable.__neg__ = _neg
    Variable.__getitem__ = _getitem
    Variable.__iter__ = _iter  # or Python would iterate through __getitem__ forever
    Variable.astype = _astype


monkey_patch_variable()
