"""fleet: parameter-server training for large sparse models.

The public API is module level, as in PaddlePaddle Fleet 1.x::

    import fleet
    fleet.init(role_maker)
    fleet.distributed_optimizer(optimizer, strategy).minimize(loss)

Names are resolved lazily so that importing a low layer (``fleet.errors``,
``fleet.kernels``) does not pull in the whole framework, and ``import fleet`` compiles
nothing.
"""
import importlib

# public name -> module that defines it
_EXPORTS = {}

_SUBMODULES = {"layers", "optimizer", "initializer", "errors", "data_generator"}

__all__ = sorted(set(_EXPORTS) | _SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"fleet.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return __all__
