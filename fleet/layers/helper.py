"""What every layer needs: the current programs, parameters and output variables."""
from fleet.errors import ConfigError
from fleet.framework.program import (default_main_program, default_startup_program,
                                     unique_name, Variable)
from fleet.initializer import Constant, Xavier
from fleet.param_attr import ParamAttr


def main_block():
    return default_main_program().global_block()


def create_parameter(layer_name, attr, shape, dtype="float32", default_initializer=None,
                     suffix="w", is_bias=False, **flags):
    """Creates a parameter in the main program and its initializer in the startup program.

    A parameter whose name already exists is shared (same shape required); its
    initializer is added once.
    """
    attr = ParamAttr.to_attr(attr)
    name = attr.name or unique_name.generate(f"{layer_name}.{suffix}")
    init = attr.initializer or default_initializer or (Constant(0.0) if is_bias else Xavier())
    if any(d <= 0 for d in shape):
        raise ConfigError(f"parameter {name!r} shape {list(shape)} must have positive dims")
    param = main_block().create_parameter(
        name, shape, dtype, initializer=init, trainable=attr.trainable,
        learning_rate=attr.learning_rate, **flags)
    if attr.regularizer is not None:
        param.regularizer = attr.regularizer
    for key, value in flags.items():  # a shared table is sparse if any use says so
        if value and not getattr(param, key):
            setattr(param, key, value)
    startup = default_startup_program().global_block()
    if name not in startup.vars:
        init(param, startup)
    return param


def layer_name(kind, name=None):
    """The name a layer gives its parameters and outputs (Paddle's LayerHelper): ``name``
    when given (``fc(..., name="tower")`` makes "tower.w_0"), else "<kind>_<n>"."""
    return name if name else unique_name.generate(kind)


def create_tmp(prefix, shape, dtype="float32", lod_level=0, stop_gradient=False):
    return main_block().create_var(name=unique_name.generate(f"{prefix}.tmp"), shape=shape,
                                   dtype=dtype, lod_level=lod_level, stop_gradient=stop_gradient)


def check_var(value, arg, layer):
    if not isinstance(value, Variable):
        raise ConfigError(f"{layer}: {arg} must be a fleet Variable (from fleet.layers), got {type(value).__name__}")
    return value


def append_op(type, inputs, outputs, attrs=None):
    to_names = lambda d: {k: [v.name if isinstance(v, Variable) else v for v in (vs if isinstance(vs, (list, tuple)) else [vs])]
                          for k, vs in d.items() if vs is not None}
    return main_block().append_op(type, inputs=to_names(inputs), outputs=to_names(outputs), attrs=attrs or {})
