"""Learning-rate schedules as pure functions of the step counter (Paddle's
``fluid.layers.learning_rate_scheduler`` formulas).

A schedule is a plain dict ``spec`` (JSON-able, so it travels in op attributes and in
the distributed plan): ``{"kind": name, ...arguments}``; its ``learning_rate`` may itself
be a spec (``linear_lr_warmup`` over another schedule). ``value(spec, step)`` gives the
rate at ``step`` as float32. The ``lr_schedule`` op evaluates it on workers and in local
training; servers evaluate the same spec from their own counter.

Paddle's step counter ``@LR_DECAY_COUNTER@`` starts at ``begin - 1`` and is incremented
before the schedule reads it, so the first step sees ``begin``: 0, or 1 for noam_decay.
"""
import math

import numpy as np

from fleet.errors import ConfigError

COUNTER = "@LR_DECAY_COUNTER@"

_ARGS = {
    "exponential_decay": ("learning_rate", "decay_steps", "decay_rate", "staircase"),
    "natural_exp_decay": ("learning_rate", "decay_steps", "decay_rate", "staircase"),
    "inverse_time_decay": ("learning_rate", "decay_steps", "decay_rate", "staircase"),
    "polynomial_decay": ("learning_rate", "decay_steps", "end_learning_rate", "power", "cycle"),
    "piecewise_decay": ("boundaries", "values"),
    "noam_decay": ("d_model", "warmup_steps", "learning_rate"),
    "cosine_decay": ("learning_rate", "step_each_epoch", "epochs"),
    "linear_lr_warmup": ("learning_rate", "warmup_steps", "start_lr", "end_lr"),
}
KINDS = tuple(_ARGS)


def _base(spec, step):
    lr = spec["learning_rate"]
    return value(lr, step) if isinstance(lr, dict) else float(lr)


def _div(spec, step):
    div = step / float(spec["decay_steps"])
    return math.floor(div) if spec["staircase"] else div


def _polynomial(spec, step):
    steps = float(spec["decay_steps"])
    if spec["cycle"]:
        steps *= max(math.ceil(step / steps), 1.0)  # step 0 uses one period, as Paddle
    else:
        step = min(step, steps)
    end = float(spec["end_learning_rate"])
    return (_base(spec, step) - end) * (1.0 - step / steps) ** float(spec["power"]) + end


def _piecewise(spec, step):
    for boundary, rate in zip(spec["boundaries"], spec["values"]):
        if step < boundary:
            return float(rate)
    return float(spec["values"][-1])


def _noam(spec, step):
    a = step ** -0.5 if step > 0 else math.inf
    b = float(spec["warmup_steps"]) ** -1.5 * step
    return _base(spec, step) * float(spec["d_model"]) ** -0.5 * min(a, b)


def _warmup(spec, step):
    warm = float(spec["warmup_steps"])
    if step < warm:
        start, end = float(spec["start_lr"]), float(spec["end_lr"])
        return start + (end - start) * (step / warm)
    return _base(spec, step)


_FORMULAS = {
    "exponential_decay": lambda s, t: _base(s, t) * float(s["decay_rate"]) ** _div(s, t),
    "natural_exp_decay": lambda s, t: _base(s, t) * math.exp(-float(s["decay_rate"]) * _div(s, t)),
    "inverse_time_decay": lambda s, t: _base(s, t) / (1.0 + float(s["decay_rate"]) * _div(s, t)),
    "polynomial_decay": _polynomial,
    "piecewise_decay": _piecewise,
    "noam_decay": _noam,
    "cosine_decay": lambda s, t: _base(s, t) * 0.5 * (
        math.cos(math.floor(t / float(s["step_each_epoch"])) * math.pi / float(s["epochs"])) + 1.0),
    "linear_lr_warmup": _warmup,
}


def value(spec, step):
    """The learning rate of schedule ``spec`` at counter value ``step``, as np.float32.

    Raises:
        ConfigError: ``spec`` is not a schedule (names it).
    """
    formula = _FORMULAS.get(spec.get("kind")) if isinstance(spec, dict) else None
    if formula is None:
        raise ConfigError(f"{spec!r} is not a learning-rate schedule; kinds are {list(KINDS)}")
    return np.float32(formula(spec, float(step)))


def make_spec(kind, **args):
    """Returns the spec of schedule ``kind`` after checking its arguments.

    Raises:
        ConfigError: an unknown kind, a missing argument or a bad value (names it).
    """
    if kind not in _ARGS:
        raise ConfigError(f"unknown learning-rate schedule {kind!r}; kinds are {list(KINDS)}")
    missing = [a for a in _ARGS[kind] if a not in args]
    if missing:
        raise ConfigError(f"{kind} needs {missing}")
    for name in ("decay_steps", "step_each_epoch", "epochs", "warmup_steps", "d_model"):
        if name in args and (isinstance(args[name], bool) or not isinstance(args[name], (int, float))
                             or args[name] <= 0):
            raise ConfigError(f"{kind}: {name}={args[name]!r} must be a positive number")
    if kind == "piecewise_decay":
        if len(args["values"]) - len(args["boundaries"]) != 1:
            raise ConfigError(f"piecewise_decay: len(values) - len(boundaries) should be 1; got "
                              f"{len(args['values'])} values and {len(args['boundaries'])} boundaries")
        args = dict(args, boundaries=[float(b) for b in args["boundaries"]], values=[float(v) for v in args["values"]])
    lr = args.get("learning_rate")
    if lr is not None and not isinstance(lr, dict) and (isinstance(lr, bool) or not isinstance(lr, (int, float))):
        raise ConfigError(f"{kind}: learning_rate={lr!r} must be a float or a schedule's Variable")
    return dict(args, kind=kind)
