"""Paddle's ``fluid.core``: the one name fleet scripts take from it, ``EOFException``
(raised by ``exe.run`` when a started non-iterable reader has no batch left). Paddle's C++
core has no other counterpart here (docs/porting.md)."""
from fleet.errors import EOFException

__all__ = ["EOFException"]


def __getattr__(name):
    raise AttributeError(f"fleet.fluid.core has no attribute {name!r}: fleet has no C++ core module; it offers "
                         f"only core.EOFException (fluid.LoDTensor, fluid.CPUPlace and fluid.create_lod_tensor are "
                         f"the tensor and place names it has; docs/porting.md)")
