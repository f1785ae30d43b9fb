"""Optimizer ops: one per parameter, applying a ``fleet.rules`` rule in place; and the
learning-rate ops (``increment`` of the step counter, ``lr_schedule``)."""
import threading

import numpy as np

from fleet.framework.registry import OpDef, register_op
from fleet.framework.tensor import SparseRows
from fleet.rules import rule_from_op_attrs
from fleet import schedules

_COUNTER_LOCK = threading.Lock()  # Hogwild threads share the step counter

# One lock per parameter array: Hogwild threads compute concurrently but update a given
# parameter one at a time. Without it two threads' updates of one parameter interleave
# element by element, and a rule whose state entries must agree can be left with one
# thread's first moment next to the other's second moment: Adam's m1 / sqrt(m2) is then
# unbounded where m2 is near zero (a rarely seen embedding row), and a row jumps to
# |value| ~ 1e4 (seen in 4 of 8 two-thread runs of a 40k-line CTR job with non-lazy Adam).
_PARAM_LOCKS = {}
_PARAM_LOCKS_GUARD = threading.Lock()


def _param_lock(param):
    key = id(param)
    lock = _PARAM_LOCKS.get(key)
    if lock is None:
        with _PARAM_LOCKS_GUARD:
            lock = _PARAM_LOCKS.setdefault(key, threading.Lock())
    return lock


class _OptimizerOp(OpDef):
    """Inputs: Param, Grad, one slot per rule state and optionally LearningRate (a [1]
    variable, e.g. a schedule's); attr learning_rate: the rate itself without a
    LearningRate input, else the parameter's multiplier of it."""

    def __init__(self):
        self._rules = {}

    def rule(self, attrs):
        key = tuple(sorted((k, v) for k, v in attrs.items() if k not in ("learning_rate", "op_role", "is_test")))
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = rule_from_op_attrs(self.type, attrs)
        return rule

    def forward(self, ctx):
        rule = self.rule(ctx.attrs)
        param = ctx.input("Param")
        grad = ctx.input("Grad")
        state = {name: ctx.input(name) for name in rule.state_names}
        lr = ctx.attrs["learning_rate"]
        if ctx.op.inputs.get("LearningRate"):
            lr = float(lr) * float(np.asarray(ctx.input("LearningRate")).reshape(-1)[0])
        with _param_lock(param):
            if isinstance(grad, SparseRows):
                rule.apply_sparse(param, grad.rows, grad.values, state, lr)
            else:
                rule.apply_dense(param, grad, state, lr)


for _type in ("sgd", "momentum", "adagrad", "adam", "ftrl", "rmsprop", "decayed_adagrad", "lamb", "adamax",
              "adadelta"):
    register_op(type(f"{_type.title().replace('_', '')}Op", (_OptimizerOp,), {"type": _type}))


@register_op
class IncrementOp(OpDef):
    """Out = X + step, in place on the [1] counter (Paddle's ``increment``); atomic
    across threads. Attr ``begin`` (fleet's) records the counter's first value."""

    type = "increment"

    def forward(self, ctx):
        x = ctx.input("X")
        with _COUNTER_LOCK:
            if isinstance(x, np.ndarray) and ctx.op.output("Out") == ctx.op.input("X"):
                x += np.asarray(ctx.attrs.get("step", 1.0)).astype(x.dtype)
                out = x
            else:
                out = np.asarray(x) + np.asarray(ctx.attrs.get("step", 1.0)).astype(np.asarray(x).dtype)
        ctx.set_output("Out", out)


@register_op
class LrScheduleOp(OpDef):
    """Out (float32 [1]) = ``schedules.value(spec, Step)``; a LearningRate input (another
    schedule's output) stands for the spec's ``learning_rate``."""

    type = "lr_schedule"

    def forward(self, ctx):
        spec = ctx.attrs["spec"]
        if ctx.op.inputs.get("LearningRate"):
            spec = dict(spec, learning_rate=float(np.asarray(ctx.input("LearningRate")).reshape(-1)[0]))
        step = float(np.asarray(ctx.input("Step")).reshape(-1)[0])
        ctx.set_output("Out", np.full(1, schedules.value(spec, step), dtype=np.float32))
