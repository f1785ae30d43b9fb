"""append_backward: adds the gradient ops of a loss to its program.

For each forward op on a path from a trainable parameter to the loss, in reverse order, a
grad op ``<type>_grad`` is appended. It sees the forward op's inputs and outputs under
their slots, the output gradients under ``<slot>@GRAD`` and writes the input gradients
under ``<slot>@GRAD``. A variable used by several ops gets one renamed gradient per use
and a ``sum`` op after the last one (Paddle's scheme).
"""
from fleet.errors import ConfigError
from fleet.framework.program import BACKWARD, LOSS, Variable
from fleet.framework.registry import get_op_def


def _grad_name(name):
    return name + "@GRAD"


def append_backward(loss, parameter_list=None, no_grad_set=None):
    """Appends the backward ops of ``loss`` (a scalar variable) to its program.

    Args:
        loss: the Variable to minimise; must have one element per program run.
        parameter_list: names or Parameters to differentiate (default: every trainable one).
        no_grad_set: names or Variables to treat as constants.

    Returns:
        A list of (Parameter, gradient Variable) pairs.

    Raises:
        ConfigError: ``loss`` is not a variable of a program, or it has no path to any
            trainable parameter.
    """
    if not isinstance(loss, Variable):
        raise ConfigError(f"loss must be a fleet Variable, got {type(loss).__name__}")
    block = loss.block
    no_grad = {v.name if isinstance(v, Variable) else v for v in (no_grad_set or ())}
    no_grad |= {n for n, v in block.vars.items() if v.stop_gradient}

    if parameter_list is not None:
        wanted = {p.name if isinstance(p, Variable) else p for p in parameter_list}
    else:
        wanted = {p.name for p in block.all_parameters() if p.trainable}
    params = [block.var(n) for n in block.vars if n in wanted and n not in no_grad]

    fwd_ops = [op for op in block.ops if op.attr("op_role") not in (BACKWARD, "optimize")]
    # Variables that depend on a parameter we differentiate (forward reachability).
    reach = {p.name for p in params}
    for op in fwd_ops:
        if any(n in reach for n in op.input_arg_names):
            reach.update(n for n in op.output_arg_names if n not in no_grad)
    if loss.name not in reach:
        raise ConfigError(
            f"loss {loss.name!r} does not depend on any trainable parameter "
            f"({sorted(wanted)[:5]}...); build the loss from layers with parameters"
        )
    # Ops on a path to the loss (reverse reachability).
    needed = {loss.name}
    path = []
    for op in reversed(fwd_ops):
        if any(n in needed for n in op.output_arg_names) and any(n in reach for n in op.input_arg_names):
            path.append(op)
            needed.update(n for n in op.input_arg_names if n in reach)
    # path is in reverse execution order.

    def wants_grad(name):
        return bool(name) and name in reach and name in needed and name not in no_grad

    # Count gradient contributions per variable to decide renaming + sum.
    contributions = {}
    for op in path:
        for slot in get_op_def(op.type).grad_slots:
            for name in op.input(slot):
                if wants_grad(name):
                    contributions[name] = contributions.get(name, 0) + 1

    loss_grad = _grad_name(loss.name)
    block.create_var(loss_grad, shape=loss.shape, dtype=loss.dtype)
    block.append_op("fill_constant", outputs={"Out": [loss_grad]},
                    attrs={"shape": list(loss.shape) or [1], "value": 1.0, "dtype": loss.dtype,
                           "op_role": LOSS})

    seen = {}
    pending = {}  # var -> renamed grads so far
    available = {loss.name}
    for op in path:
        opdef = get_op_def(op.type)
        inputs = {slot: list(names) for slot, names in op.inputs.items()}
        inputs.update({slot: list(names) for slot, names in op.outputs.items()})
        for slot, names in op.outputs.items():
            inputs[slot + "@GRAD"] = [_grad_name(n) if n in available else "" for n in names]
        outputs = {}
        sums = []
        for slot in opdef.grad_slots:
            names = []
            for name in op.input(slot):
                if not wants_grad(name):
                    names.append("")
                    continue
                total = contributions[name]
                var = block.var(name)
                if total == 1:
                    gname = _grad_name(name)
                else:
                    k = seen.get(name, 0)
                    seen[name] = k + 1
                    gname = f"{_grad_name(name)}@RENAME@{k}"
                    pending.setdefault(name, []).append(gname)
                    if k + 1 == total:
                        sums.append(name)
                block.create_var(gname, shape=var.shape, dtype=var.dtype, lod_level=var.lod_level)
                names.append(gname)
            outputs[slot + "@GRAD"] = names
        if not any(n for names in outputs.values() for n in names):
            continue
        attrs = dict(op.attrs)
        attrs["op_role"] = BACKWARD
        block.append_op(op.type + "_grad", inputs=inputs, outputs=outputs, attrs=attrs)
        for name in sums:
            var = block.var(name)
            block.create_var(_grad_name(name), shape=var.shape, dtype=var.dtype, lod_level=var.lod_level)
            block.append_op("sum", inputs={"X": pending.pop(name)},
                            outputs={"Out": [_grad_name(name)]}, attrs={"op_role": BACKWARD})
        for slot in opdef.grad_slots:  # a gradient is complete once every use contributed
            for name in op.input(slot):
                if wants_grad(name) and seen.get(name, contributions[name]) >= contributions[name]:
                    available.add(name)

    return [(p, block.var(_grad_name(p.name))) for p in params if _grad_name(p.name) in block.vars]


def gradients(targets, inputs, no_grad_set=None):
    """Returns the gradient variables of ``inputs`` for a scalar target (Paddle's helper)."""
    targets = targets if isinstance(targets, (list, tuple)) else [targets]
    inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    if len(targets) != 1:
        raise ConfigError("gradients takes one scalar target")
    append_backward(targets[0], parameter_list=[v.name for v in inputs] + [
        p.name for p in targets[0].block.all_parameters()], no_grad_set=no_grad_set)
    block = targets[0].block
    return [block.vars.get(_grad_name(v.name)) for v in inputs]
