"""Paddle 1.x's ``fluid`` names, for porting scripts with one changed import::

    import fleet.fluid as fluid          # was: import paddle.fluid as fluid

Every name here is the fleet object that does the job of Paddle's: ``fluid.layers`` is
``fleet.layers``, ``fluid.optimizer`` is ``fleet.optimizer``, ``fluid.Executor`` is
``fleet.Executor``, and so on. docs/porting.md lists each supported name and every known
difference. Names are resolved on first use (PEP 562), so ``import fleet.fluid`` is cheap.

The incubate names of Paddle's Fleet API come from fleet's own packages::

    from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
        -> import fleet
    from paddle.fluid.incubate.fleet.base import role_maker
        -> import role_makers as role_maker
    from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import StrategyFactory
        -> from strategies import StrategyFactory
"""
import importlib

# fluid submodule name -> fleet module
_SUBMODULES = {
    "layers": "fleet.layers",
    "optimizer": "fleet.optimizer",
    "initializer": "fleet.initializer",
    "param_attr": "fleet.param_attr",
    "regularizer": "fleet.regularizer",
}

# fluid attribute -> (fleet module, attribute there)
_NAMES = {
    "Executor": ("fleet.framework.executor", "Executor"),
    "Program": ("fleet.framework.program", "Program"),
    "Variable": ("fleet.framework.program", "Variable"),
    "Parameter": ("fleet.framework.program", "Parameter"),
    "program_guard": ("fleet.framework.program", "program_guard"),
    "default_main_program": ("fleet.framework.program", "default_main_program"),
    "default_startup_program": ("fleet.framework.program", "default_startup_program"),
    "global_scope": ("fleet.framework.scope", "global_scope"),
    "scope_guard": ("fleet.framework.scope", "scope_guard"),
    "Scope": ("fleet.framework.scope", "Scope"),
    "LoDTensor": ("fleet.framework.tensor", "LoDTensor"),
    "CPUPlace": ("fleet.framework.place", "CPUPlace"),
    "ParamAttr": ("fleet.param_attr", "ParamAttr"),
    "append_backward": ("fleet.framework.backward", "append_backward"),
    "DatasetFactory": ("fleet.dataset", "DatasetFactory"),
    "data": ("fleet.layers", "data"),
    "DistributeTranspilerConfig": ("strategies", "DistributeTranspilerConfig"),
    "BuildStrategy": ("strategies", "BuildStrategy"),
    "ExecutionStrategy": ("strategies", "ExecutionStrategy"),
}

__all__ = sorted(set(_SUBMODULES) | set(_NAMES))


def __getattr__(name):
    module = _SUBMODULES.get(name)
    if module is not None:
        return importlib.import_module(module)
    target = _NAMES.get(name)
    if target is None:
        raise AttributeError(
            f"fleet.fluid has no attribute {name!r}: fleet does not provide Paddle's "
            f"fluid.{name} (docs/porting.md lists what is supported and what to use instead)")
    return getattr(importlib.import_module(target[0]), target[1])


def __dir__():
    return __all__
