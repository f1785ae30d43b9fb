"""fleet: parameter-server training for large sparse models.

The public API is module level, as in PaddlePaddle Fleet 1.x::

    import fleet
    fleet.init(role_maker)
    fleet.distributed_optimizer(optimizer, strategy).minimize(loss)
    if fleet.is_server(): fleet.init_server(); fleet.run_server()
    elif fleet.is_worker(): fleet.init_worker(); ...; fleet.stop_worker()

Names are resolved lazily (PEP 562) so that importing a low layer (``fleet.errors``,
``fleet.kernels``) does not pull in the whole framework, and ``import fleet`` compiles
nothing. ``fleet.main_program`` / ``fleet.startup_program`` always show the programs of
the latest ``minimize``.
"""
import importlib

# methods of the Fleet singleton exposed as module functions
_FLEET_METHODS = (
    "init", "is_worker", "is_server", "is_first_worker", "is_local", "worker_index", "worker_num",
    "server_index", "server_num", "worker_endpoints", "server_endpoints", "split_files",
    "barrier_worker", "distributed_optimizer", "init_worker", "init_server", "run_server",
    "stop_worker", "save_persistables", "load_persistables", "save_inference_model",
    "load_inference_model", "shrink", "load_model",
)
_FLEET_ATTRS = ("main_program", "startup_program")
# Private calls of the fleet object that the package hands on too, so the package can stand
# where Paddle scripts pass their fleet object (``dataset.global_shuffle(fleet)``).
_FLEET_PRIVATE = ("_all_to_all",)

# public name -> module that defines it
_EXPORTS = {
    "Executor": "fleet.framework.executor",
    "Program": "fleet.framework.program",
    "Variable": "fleet.framework.program",
    "Parameter": "fleet.framework.program",
    "default_main_program": "fleet.framework.program",
    "default_startup_program": "fleet.framework.program",
    "program_guard": "fleet.framework.program",
    "global_scope": "fleet.framework.scope",
    "scope_guard": "fleet.framework.scope",
    "Scope": "fleet.framework.scope",
    "LoDTensor": "fleet.framework.tensor",
    "SparseRows": "fleet.framework.tensor",
    "FetchHandler": "fleet.framework.trainer",
    "append_backward": "fleet.framework.backward",
    "ParamAttr": "fleet.param_attr",
    "CPUPlace": "fleet.framework.place",
    "DatasetFactory": "fleet.dataset",
    "CheckpointConfig": "fleet.checkpoint",
    "latest_checkpoint": "fleet.checkpoint",
    "save_checkpoint": "fleet.checkpoint",
    "load_checkpoint": "fleet.checkpoint",
    "Fleet": "fleet.base",
    "DistributedOptimizer": "fleet.base",
    "CollectiveStrategy": "strategies.collective",
    "HybridStrategy": "strategies.collective",
    "CountFilterEntry": "fleet.entries",
    "ProbabilityEntry": "fleet.entries",
    "ShowClickEntry": "fleet.entries",
    "util": "fleet.fleet_util",
    "FleetUtil": "fleet.fleet_util",
}

_SUBMODULES = {"layers", "optimizer", "initializer", "errors", "data_generator", "framework",
               "kernels", "dataset", "regularizer", "metrics", "entries"}

__all__ = sorted(set(_EXPORTS) | _SUBMODULES | set(_FLEET_METHODS) | set(_FLEET_ATTRS))


def _singleton():
    return importlib.import_module("fleet.base").fleet


# The submodules a script builds and runs models with. Resolving them, or any name of the
# API above, imports fleet.local_tables, whose rewriter serves tables with an entry or
# accessor in local training. Other names (fleet.errors, fleet.endpoints, ...: what lower
# layers import as ``from fleet import x``) stay light.
_MODEL_SUBMODULES = {"layers", "optimizer", "framework", "dataset", "entries"}


def __getattr__(name):
    if name in _FLEET_METHODS or name in _FLEET_ATTRS or name in _EXPORTS or name in _MODEL_SUBMODULES:
        importlib.import_module("fleet.local_tables")
    if name in _FLEET_METHODS or name in _FLEET_ATTRS or name in _FLEET_PRIVATE:
        return getattr(_singleton(), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"fleet.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return __all__
