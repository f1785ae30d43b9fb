"""fleetrun --hosts --max_restarts: a host lost before a restart leaves the job, its ranks stay.

Before each restart the dispatcher of `fleet.launch.hosts` runs its preflight again on
every host still in the job. A host that fails it (no answer, ssh refused, fleet gone, ...)
is dropped for the rest of the job, and the job keeps its totals: the same servers (so the
checkpoint's shards load unchanged) and the same workers (so each worker resumes its own
place in its data). This module computes the job after the drop:

- who runs what: `fleet.launch.replacement.reassign` (the one rule for every launcher);
- the endpoints: every rank that stays keeps its endpoint; each moved rank gets the next
  port of its new host after every port that host's ranks use (servers moved first, then
  workers, each by index), so a host's ports stay one block from --start_port up.

The whole job's endpoint lists are rebuilt from that, and every host's fleetrun is started
with the new lists (each picks its own ranks by its address).

Thread-safety: pure functions.
"""
from __future__ import annotations

import dataclasses

from fleet.endpoints import join_endpoint, parse_endpoint
from fleet.launch.replacement import Share, reassign


@dataclasses.dataclass(frozen=True)
class JobLayout:
    """Where every rank of a --hosts job runs and at which endpoint.

    Attributes:
        shares: host name -> Share, over the hosts still in the job, in the job's order.
        servers: every server endpoint "addr:port", by index.
        workers: every worker endpoint "addr:port", by index.
    """

    shares: dict
    servers: tuple[str, ...]
    workers: tuple[str, ...]


def first_shares(names, counts):
    """Each host's ranks in a job's first attempt: global indexes go host by host.

    Args:
        names: the hosts' names, in the job's order.
        counts: (servers, workers) per host, in the same order.

    Returns:
        dict name -> Share (the order of `fleet.launch.hostfile.plan_endpoints`' endpoints).
    """
    shares, s, w = {}, 0, 0
    for name, (servers, workers) in zip(names, counts):
        shares[name] = Share(tuple(range(s, s + servers)), tuple(range(w, w + workers)))
        s, w = s + servers, w + workers
    return shares


def drop_hosts(layout, lost, addresses, start_port):
    """The layout after the hosts ``lost`` left the job: their ranks placed by `reassign`.

    Args:
        layout: the JobLayout before.
        lost: names of the hosts that are gone (each in ``layout.shares``).
        addresses: host name -> endpoint address, for every host of ``layout``.
        start_port: the first port of each host (a host that ran nothing yet starts there).

    Returns:
        (JobLayout after, list of (Move, new endpoint)), the moves servers first, then
        workers, each by index.

    Raises:
        ConfigError: a lost host is not in the job, or every host is lost (the message
            names them).
    """
    shares, moves = reassign(layout.shares, set(lost))
    endpoints = {"server": list(layout.servers), "worker": list(layout.workers)}
    used = {name: {_port(endpoints[role][i]) for role in ("server", "worker")
                   for i in getattr(share, role + "s")}
            for name, share in layout.shares.items() if name in shares}
    placed = []
    for move in moves:
        taken = used[move.target]
        port = max(taken) + 1 if taken else start_port
        taken.add(port)
        endpoint = join_endpoint(addresses[move.target], port)
        endpoints[move.role][move.index] = endpoint
        placed.append((move, endpoint))
    return JobLayout(shares, tuple(endpoints["server"]), tuple(endpoints["worker"])), placed


def describe_moves(placed):
    """One phrase per move: "server 1 moves from 10.0.0.2 to 10.0.0.1 (10.0.0.1:6172)"."""
    return [f"{m.role} {m.index} moves from {m.source} to {m.target} ({endpoint})" for m, endpoint in placed]


def indexes_text(indexes):
    """"none", "3", "3-5" or "0,2,5-6": a host's server or worker indexes for messages."""
    runs = []
    for i in sorted(indexes):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    if not runs:
        return "none"
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _port(endpoint):
    return parse_endpoint(endpoint)[1]


__all__ = ["JobLayout", "describe_moves", "drop_hosts", "first_shares", "indexes_text"]
