"""Elastic parameter-server jobs: workers that come and go (docs/elastic.md).

An elastic job is one whose processes see ``FLEET_ELASTIC=MIN:MAX`` (``fleetrun --np
MIN:MAX`` sets it; set it yourself for jobs started another way). Then:

- every process sees ``PADDLE_TRAINERS_NUM=MAX`` and worker ids 0..MAX-1 are slots: ids
  0..MIN-1 are expected from the start, the others join when they first talk to the
  servers, and a lost id may be taken again by a replacement (``join``);
- a lost worker (heartbeats stopped, or it reported a failure) is forgotten by the servers
  after FLEET_HEARTBEAT_TIMEOUT_MS instead of failing the job; barriers, merged pushes and
  metric reductions count the live workers only;
- ``fleet.split_files`` gives every worker the whole file list, and ``train_from_dataset``
  over a QueueDataset takes work units (a byte range of a file) from server 0's work
  queue (``fleet.server.work_queue``), acknowledging each once its batches ran and their
  updates were on the servers; a lost worker's unacknowledged units go back to the queue.

Only the async, half-async and GEO strategies can be elastic: sync steps wait for every
worker and the collective and hybrid strategies all-reduce over a fixed group.

Thread-safety: the functions here read the environment and are safe from any thread.
"""
import os

from fleet.envvars import env_int
from fleet.errors import ConfigError

ELASTIC_ENV = "FLEET_ELASTIC"
EXPECTED_ENV = "FLEET_ELASTIC_EXPECTED"
UNIT_BYTES_ENV = "FLEET_ELASTIC_UNIT_BYTES"
# Set to 1 by fleetrun for a worker it admits into a running elastic job (a replacement or an
# added worker): fleet.load_checkpoint then lets it start from the servers' current
# parameters although the job's own checkpoints exist since the servers started fresh.
JOINING_ENV = "FLEET_ELASTIC_JOINING"
DEFAULT_UNIT_BYTES = 4 << 20
ELASTIC_MODES = ("async", "half_async", "geo")


def parse_np(text, what="--np"):
    """Parses ``MIN:MAX`` (or ``N``, meaning N:N).

    Args:
        text: the value. what: how the caller names it in errors (``--np``, FLEET_ELASTIC).

    Returns:
        (min, max), 1 <= min <= max.

    Raises:
        ConfigError: not of that form (names the value and the fix).
    """
    parts = str(text).strip().split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (None, None)
    except ValueError:
        low = high = None
    if low is None or low < 1 or high < low:
        raise ConfigError(f"{what}={text!r} is not MIN:MAX with 1 <= MIN <= MAX (e.g. 2:4: keep the job "
                          f"running while at least 2 workers are alive, admit up to 4)")
    return low, high


def elastic_range(environ=None):
    """(MIN, MAX) of an elastic job, from FLEET_ELASTIC, or None when the job is not elastic.

    Raises:
        ConfigError: a malformed FLEET_ELASTIC.
    """
    value = (os.environ if environ is None else environ).get(ELASTIC_ENV, "").strip()
    if not value:
        return None
    return parse_np(value, ELASTIC_ENV)


def expected_workers(environ=None):
    """The worker ids an elastic job's servers count as training from the start, from
    FLEET_ELASTIC_EXPECTED (a comma list fleetrun sets for a round of an etcd job whose
    slots are not 0..MIN-1), or None (the servers' default: 0..MIN-1).

    Raises:
        ConfigError: a value that is not a comma list of worker ids >= 0.
    """
    value = (os.environ if environ is None else environ).get(EXPECTED_ENV, "").strip()
    if not value:
        return None
    try:
        ids = tuple(int(v) for v in value.split(","))
    except ValueError:
        ids = (-1,)
    if any(i < 0 for i in ids):
        raise ConfigError(f"{EXPECTED_ENV}={value!r} is not a comma list of worker ids >= 0 (e.g. 0,2); fleetrun "
                          "sets it, leave it unset otherwise")
    return ids


def check_elastic_mode(mode, environ=None):
    """Raises when an elastic job uses a strategy that cannot be elastic.

    Raises:
        ConfigError: FLEET_ELASTIC is set and ``mode`` is sync, collective or hybrid (names
            the fix).
    """
    limits = elastic_range(environ)
    if limits is None or mode in ELASTIC_MODES:
        return
    raise ConfigError(
        f"this job is elastic ({ELASTIC_ENV}={limits[0]}:{limits[1]}, from fleetrun --np) but its strategy is "
        f"{mode}, whose steps wait for a fixed set of workers: a lost worker would stop every other one. "
        f"Use an async, half_async or geo strategy for an elastic job, or start it with a fixed "
        f"--worker_num instead of --np")


def unit_bytes():
    """Bytes of data per work unit: FLEET_ELASTIC_UNIT_BYTES (default 4 MiB)."""
    return env_int(UNIT_BYTES_ENV, DEFAULT_UNIT_BYTES, low=1, meaning="bytes per work unit (>= 1)")


class ServerReducer:
    """The reducer of ``fleet.metrics`` in an elastic job: each ``all_reduce`` goes to server
    0 (op ``reduce``), which answers once every live worker sent its array, so workers that
    joined count and lost ones are left out. ``size`` is how many workers the last call
    merged.

    Args:
        comm: the worker's Communicator.

    Thread-safety: one call at a time per worker (``fleet.metrics`` serializes them).
    """

    def __init__(self, comm):
        self.comm = comm
        self.size = "?"

    def all_reduce(self, array, op="sum"):
        """Element-wise ``op`` ("sum", "max", "min") of ``array`` over the live workers;
        blocks until every one of them called it (bounded by FLEET_RPC_TIMEOUT_MS).

        Raises:
            ServerError: the workers reduced arrays of different shapes, or a bad op.
        """
        meta = {"reduce": op}
        if self.comm.elastic_pass is not None:
            meta["pass"] = self.comm.elastic_pass
        reply = self.comm.coordinator_request("reduce", meta, [array])
        self.size = reply.meta.get("workers", "?")
        return reply.arrays[0]
