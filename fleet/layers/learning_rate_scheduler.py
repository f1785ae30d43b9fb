"""Learning-rate schedules (Paddle's ``fluid.layers.learning_rate_scheduler``): each
returns a float32 [1] Variable an optimizer takes as ``learning_rate``.

Every schedule reads the global step counter ``@LR_DECAY_COUNTER@`` (int64 [1],
persistable, so checkpoints keep it): the startup program sets it to ``begin - 1``
(``begin`` is 0, or 1 when noam_decay creates it) and an ``increment`` op at the start
of the main program adds 1 per run, so the first step reads ``begin``. Schedule ops run
once per update (with the optimizer ops: one per batch also when threads split a
batch), test clones drop them, and under distributed training each server evaluates the
same schedule from its own counter (see ``fleet.server.parameter_server``).
The formulas are ``fleet.schedules``.
"""
from fleet import schedules
from fleet.errors import ConfigError
from fleet.framework import unique_name
from fleet.framework.program import LRSCHED, Operator, Variable
from fleet.initializer import Constant
from fleet.layers.helper import default_startup_program, main_block


def _step_counter(begin):
    """The ``@LR_DECAY_COUNTER@`` variable, created (with its increment op) on first use."""
    block = main_block()
    counter = block.vars.get(schedules.COUNTER)
    if counter is not None:
        return counter
    counter = block.create_var(schedules.COUNTER, shape=(1,), dtype="int64", persistable=True,
                               stop_gradient=True)
    startup = default_startup_program().global_block()
    if schedules.COUNTER not in startup.vars:
        Constant(begin - 1)(counter, startup)
    op = Operator(block, "increment", {"X": [counter.name]}, {"Out": [counter.name]},
                  {"step": 1.0, "begin": int(begin), "op_role": LRSCHED})
    block._insert_op(0, op)
    return counter


def _schedule(kind, begin=0, **args):
    lr = args.get("learning_rate")
    inputs = {"Step": [_step_counter(begin).name]}
    if isinstance(lr, Variable):
        if lr.shape not in ((1,), (-1,), ()) and list(lr.shape) != [1]:
            raise ConfigError(f"{kind}: learning_rate {lr.name!r} must be a [1] variable; it is {list(lr.shape)}")
        inputs["LearningRate"] = [lr.name]
        args["learning_rate"] = 0.0  # checked as a number; the op reads the variable
    spec = schedules.make_spec(kind, **args)
    if "LearningRate" in inputs:
        spec["learning_rate"] = None
    block = main_block()
    out = block.create_var(unique_name.generate(kind), shape=(1,), dtype="float32", persistable=True,
                           stop_gradient=True)
    # a global variable (as Paddle's create_global_var): every thread's scope sees the
    # rate the schedule op writes, from the startup program on
    Constant(0.0)(out, default_startup_program().global_block())
    block.append_op("lr_schedule", inputs=inputs, outputs={"Out": [out.name]},
                    attrs={"spec": spec, "op_role": LRSCHED})
    return out


def exponential_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``learning_rate * decay_rate ** (step / decay_steps)`` (the exponent floored with
    ``staircase``).

    Args:
        learning_rate: float or a schedule's Variable. decay_steps: positive number.
        decay_rate: float. staircase: bool.

    Returns:
        The learning-rate Variable (float32 [1]).

    Raises:
        ConfigError: a bad argument (named).
    """
    return _schedule("exponential_decay", learning_rate=learning_rate, decay_steps=decay_steps,
                     decay_rate=decay_rate, staircase=bool(staircase))


def natural_exp_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``learning_rate * exp(-decay_rate * step / decay_steps)`` (floored with staircase).
    Arguments, return value and errors as ``exponential_decay``."""
    return _schedule("natural_exp_decay", learning_rate=learning_rate, decay_steps=decay_steps,
                     decay_rate=decay_rate, staircase=bool(staircase))


def inverse_time_decay(learning_rate, decay_steps, decay_rate, staircase=False):
    """``learning_rate / (1 + decay_rate * step / decay_steps)`` (floored with staircase).
    Arguments, return value and errors as ``exponential_decay``."""
    return _schedule("inverse_time_decay", learning_rate=learning_rate, decay_steps=decay_steps,
                     decay_rate=decay_rate, staircase=bool(staircase))


def polynomial_decay(learning_rate, decay_steps, end_learning_rate=0.0001, power=1.0, cycle=False):
    """``(learning_rate - end) * (1 - step / decay_steps) ** power + end``, the step held at
    ``decay_steps``; with ``cycle`` the period grows to ``decay_steps * ceil(step /
    decay_steps)`` instead.

    Returns:
        The learning-rate Variable. Raises: ConfigError on a bad argument.
    """
    return _schedule("polynomial_decay", learning_rate=learning_rate, decay_steps=decay_steps,
                     end_learning_rate=float(end_learning_rate), power=float(power), cycle=bool(cycle))


def piecewise_decay(boundaries, values):
    """``values[i]`` for the first ``boundaries[i]`` above the step, else ``values[-1]``.

    Returns:
        The learning-rate Variable.

    Raises:
        ConfigError: ``len(values) - len(boundaries)`` is not 1.
    """
    return _schedule("piecewise_decay", boundaries=list(boundaries), values=list(values))


def noam_decay(d_model, warmup_steps, learning_rate=1.0):
    """``learning_rate * d_model ** -0.5 * min(step ** -0.5, warmup_steps ** -1.5 * step)``;
    its counter begins at 1 (when noam_decay creates it).

    Returns:
        The learning-rate Variable. Raises: ConfigError on a bad argument.
    """
    return _schedule("noam_decay", begin=1, d_model=d_model, warmup_steps=warmup_steps,
                     learning_rate=learning_rate)


def cosine_decay(learning_rate, step_each_epoch, epochs):
    """``learning_rate * 0.5 * (cos(floor(step / step_each_epoch) * pi / epochs) + 1)``.

    Returns:
        The learning-rate Variable. Raises: ConfigError on a bad argument.
    """
    return _schedule("cosine_decay", learning_rate=learning_rate, step_each_epoch=step_each_epoch,
                     epochs=epochs)


def linear_lr_warmup(learning_rate, warmup_steps, start_lr, end_lr):
    """``start_lr + (end_lr - start_lr) * step / warmup_steps`` while the step is below
    ``warmup_steps``, then ``learning_rate`` (a float or another schedule's Variable).

    Returns:
        The learning-rate Variable. Raises: ConfigError on a bad argument.
    """
    return _schedule("linear_lr_warmup", learning_rate=learning_rate, warmup_steps=warmup_steps,
                     start_lr=float(start_lr), end_lr=float(end_lr))


__all__ = ["exponential_decay", "natural_exp_decay", "inverse_time_decay", "polynomial_decay",
           "piecewise_decay", "noam_decay", "cosine_decay", "linear_lr_warmup"]
