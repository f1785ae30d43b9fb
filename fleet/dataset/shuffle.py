"""Shuffles of in-memory examples: local permutation and the exchange between workers.

The fleet object passed by the user (or the ``fleet`` package, which stands for it) offers ``worker_num()``, ``worker_index()`` and
``_all_to_all(blobs) -> blobs`` (blobs[j] goes to worker j; returns what each worker
sent here, in worker order; blocks until every worker called it, with a timeout).
"""
import struct

import numpy as np

from fleet.dataset.block import ExampleBlock
from fleet.errors import ConfigError

_COUNT = struct.Struct("<q")


def _check_fleet(fleet, what):
    """``fleet`` once checked: fleet's object, or the ``fleet`` package (a script's ``import
    fleet``, for Paddle's ``from ... import fleet``), which hands these calls to it."""
    for name in ("worker_num", "worker_index", "_all_to_all"):
        if not callable(getattr(fleet, name, None)):
            raise ConfigError(
                f"{what}(fleet=...) needs the fleet object (it has worker_num, worker_index and "
                f"an all-to-all exchange); {fleet!r} has no {name}()")
    return fleet


def shuffle_locally(block, rng):
    """A uniformly random permutation of ``block``'s examples (new, writable arrays)."""
    return block.take(rng.permutation(block.n))


def shuffle_globally(block, fleet, rng):
    """Sends each example to a uniformly random worker; returns what this worker received.

    Every worker must call this at the same time with its own block (a collective
    call). The examples received are permuted, so each worker ends with a random
    share of the union in random order; the union over workers is exactly the union
    of the blocks given.

    Args:
        block: this worker's ExampleBlock. fleet: see the module docstring.
        rng: numpy Generator; give each worker its own stream.

    Returns:
        ExampleBlock.

    Blocks until every worker has called it; the exchange's timeout applies.

    Raises:
        ConfigError: ``fleet`` lacks the methods the exchange needs.
        FleetTimeoutError (from the fleet): a worker did not take part in time.
    """
    fleet = _check_fleet(fleet, "global_shuffle")
    workers = int(fleet.worker_num())
    destination = rng.integers(0, workers, size=block.n)
    order = np.argsort(destination, kind="stable")
    bounds = np.zeros(workers + 1, dtype=np.int64)
    np.cumsum(np.bincount(destination, minlength=workers), out=bounds[1:])
    grouped = block.take(order)
    blobs = [grouped.slice(int(bounds[j]), int(bounds[j + 1])).to_bytes() for j in range(workers)]
    received = [ExampleBlock.from_bytes(b) for b in fleet._all_to_all(blobs)]
    received = [b for b in received if b.n] or received[:1]
    return shuffle_locally(ExampleBlock.concat(received), rng)


def sum_over_workers(count, fleet, what):
    """The sum of ``count`` over all workers (a collective call, like an allreduce).

    Raises:
        ConfigError: ``fleet`` lacks the methods the exchange needs.
    """
    fleet = _check_fleet(fleet, what)
    blob = _COUNT.pack(int(count))
    return sum(_COUNT.unpack(b)[0] for b in fleet._all_to_all([blob] * int(fleet.worker_num())))
