"""Paddle 1.x's ``fluid`` names, for porting scripts with one changed import::

    import fleet.fluid as fluid          # was: import paddle.fluid as fluid

Every name here is the fleet object that does the job of Paddle's: ``fluid.layers`` is
``fleet.layers``, ``fluid.optimizer`` is ``fleet.optimizer``, ``fluid.Executor`` is
``fleet.Executor``, and so on. docs/porting.md lists each supported name and every known
difference. Names are resolved on first use (PEP 562), so ``import fleet.fluid`` is cheap;
``from fleet.fluid import layers`` and ``import fleet.fluid.layers`` give the same module.

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
    "io": "fleet.fluid.io",
    "compiler": "fleet.framework.compiler",
    "unique_name": "fleet.fluid.unique_name",
    "transpiler": "fleet.fluid.transpiler",
    "input": "fleet.fluid.input",
    "data_feeder": "fleet.fluid.data_feeder",
    "dataset": "fleet.dataset",
    "backward": "fleet.framework.backward",
    "core": "fleet.fluid.core",
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
    "create_lod_tensor": ("fleet.fluid.data_feeder", "create_lod_tensor"),
    "DataFeeder": ("fleet.fluid.data_feeder", "DataFeeder"),
    "CPUPlace": ("fleet.framework.place", "CPUPlace"),
    "CUDAPlace": ("fleet.fluid.device", "CUDAPlace"),
    "CUDAPinnedPlace": ("fleet.fluid.device", "CUDAPinnedPlace"),
    "cpu_places": ("fleet.fluid.device", "cpu_places"),
    "cuda_places": ("fleet.fluid.device", "cuda_places"),
    "is_compiled_with_cuda": ("fleet.fluid.device", "is_compiled_with_cuda"),
    "ParamAttr": ("fleet.param_attr", "ParamAttr"),
    "append_backward": ("fleet.framework.backward", "append_backward"),
    "gradients": ("fleet.framework.backward", "gradients"),
    "DatasetFactory": ("fleet.dataset", "DatasetFactory"),
    "data": ("fleet.fluid.input", "data"),
    "embedding": ("fleet.fluid.input", "embedding"),
    "one_hot": ("fleet.fluid.input", "one_hot"),
    "CompiledProgram": ("fleet.framework.compiler", "CompiledProgram"),
    "ParallelExecutor": ("fleet.framework.compiler", "ParallelExecutor"),
    "BuildStrategy": ("strategies", "BuildStrategy"),
    "ExecutionStrategy": ("strategies", "ExecutionStrategy"),
    "DistributeTranspiler": ("fleet.fluid.transpiler", "DistributeTranspiler"),
    "DistributeTranspilerConfig": ("strategies", "DistributeTranspilerConfig"),
    "memory_optimize": ("fleet.fluid.memory", "memory_optimize"),
    "release_memory": ("fleet.fluid.memory", "release_memory"),
}

# names scripts reach for that fleet answers elsewhere: name -> where to look instead
_ELSEWHERE = {
    "incubate": "the incubate Fleet API is fleet's own packages: `import fleet` (the fleet "
                "singleton), `import role_makers as role_maker`, `from strategies import "
                "StrategyFactory`, `from fleet import data_generator`",
}

__all__ = sorted(set(_SUBMODULES) | set(_NAMES))


def __getattr__(name):
    importlib.import_module("fleet.local_tables")  # serves tables with entries in local training
    module = _SUBMODULES.get(name)
    if module is not None:
        return importlib.import_module(module)
    target = _NAMES.get(name)
    if target is not None:
        return getattr(importlib.import_module(target[0]), target[1])
    hint = _ELSEWHERE.get(name)
    if hint is not None:
        raise AttributeError(f"fleet.fluid has no attribute {name!r}: {hint} (docs/porting.md, "
                             f"'Import map')")
    raise AttributeError(
        f"fleet.fluid has no attribute {name!r}: fleet does not provide Paddle's fluid.{name} "
        f"(docs/porting.md lists the import map, every supported name and what to use instead)")


def __dir__():
    return __all__
