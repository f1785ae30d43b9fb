"""Paddle's ``fluid.unique_name``: the names layers give their parameters and outputs
("fc_0.w_0", "tmp_3"), one counter per prefix, shared with ``fleet.layers``.

Thread-safety: ``generate`` is; ``guard`` and ``switch`` change the process-wide
counters, so use them while building programs from one thread.
"""
import contextlib

from fleet.framework.program import unique_name as _names


def generate(key):
    """Returns a new unique name "<key>_<n>" (n counts per key from 0)."""
    return _names.generate(key)


class UniqueNameGenerator:
    """A set of counters with a name prefix (Paddle's ``unique_name.UniqueNameGenerator``)."""

    def __init__(self, prefix=None):
        self.prefix = "" if prefix is None else str(prefix)
        self.ids = {}


def switch(new_generator=None):
    """Makes ``new_generator`` (default: a fresh one) the generator in use and returns the
    one it replaces."""
    if new_generator is None:
        new_generator = UniqueNameGenerator()
    if not isinstance(new_generator, UniqueNameGenerator):
        raise TypeError(f"new_generator must be a UniqueNameGenerator, got {type(new_generator).__name__}")
    counters, prefix = _names.swap(new_generator.ids, new_generator.prefix)
    old = UniqueNameGenerator(prefix)
    old.ids = counters
    return old


@contextlib.contextmanager
def guard(new_generator=None):
    """Within the block, names come from fresh counters (so two programs built in two
    guards get the same names), prefixed with ``new_generator`` when it is a str.

    Args:
        new_generator: None, a str prefix, or a UniqueNameGenerator.
    """
    if isinstance(new_generator, (str, bytes)):
        new_generator = UniqueNameGenerator(new_generator.decode() if isinstance(new_generator, bytes)
                                            else new_generator)
    old = switch(new_generator)
    try:
        yield
    finally:
        switch(old)
