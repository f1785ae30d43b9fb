"""Where the ranks of lost hosts go: one rule for every launcher that heals a multi-host job.

A job keeps its totals when a host is lost: the same servers (so the checkpoint's shards
load unchanged) and the same workers (so each worker resumes its own place in its data).
The lost host's ranks move to the hosts that remain:

- every surviving host keeps the ranks it had;
- each lost server goes to the surviving host with the fewest servers among those that
  already ran servers (the hosts the user chose for servers: big memory), or, if none
  did, to the surviving host with the fewest processes;
- each lost worker goes to the surviving host with the fewest workers among those that
  already ran workers, or, if none did, to the surviving host with the fewest processes;
- ties go to the host that comes first in the job's order.

The result depends only on its inputs, so hosts that compute it apart agree.

Thread-safety: pure functions.
"""
from __future__ import annotations

import dataclasses

from fleet.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Share:
    """The ranks one host runs.

    Attributes:
        servers: the job's server indexes on this host, ascending.
        workers: the job's worker indexes on this host, ascending.
    """

    servers: tuple[int, ...] = ()
    workers: tuple[int, ...] = ()

    @property
    def size(self):
        """How many processes the host runs."""
        return len(self.servers) + len(self.workers)


@dataclasses.dataclass(frozen=True)
class Move:
    """One rank that changes host: ``role`` ("server" or "worker") ``index`` from
    ``source`` (lost) to ``target``."""

    role: str
    index: int
    source: str
    target: str

    def describe(self):
        """E.g. "server 1 from 10.0.0.2 to 10.0.0.1"."""
        return f"{self.role} {self.index} from {self.source} to {self.target}"


def reassign(shares, lost):
    """Place the ranks of the lost hosts on the surviving ones (the module's rule).

    Args:
        shares: host -> Share for every host of the job, in the job's order (a dict or a
            list of pairs); every rank on exactly one host.
        lost: the hosts that are gone (names as in ``shares``).

    Returns:
        (dict host -> Share over the surviving hosts in the job's order, list of Move in
        the order servers then workers, each by index).

    Raises:
        ConfigError: a lost host is not in the job, or every host is lost.
    """
    order = list(shares.items() if isinstance(shares, dict) else shares)
    hosts = [host for host, _ in order]
    unknown = sorted(set(lost) - set(hosts))
    if unknown:
        raise ConfigError(f"lost host(s) {', '.join(unknown)} are not in the job (its hosts: "
                          f"{', '.join(hosts)})")
    survivors = [(host, share) for host, share in order if host not in lost]
    if not survivors:
        raise ConfigError(f"every host of the job is lost ({', '.join(hosts)}): no host is left "
                          "to run its servers and workers; start the job again on hosts that run")
    servers = {host: list(share.servers) for host, share in survivors}
    workers = {host: list(share.workers) for host, share in survivors}
    moves = []
    for role, placed in (("server", servers), ("worker", workers)):
        lost_ranks = sorted((index, host) for host, share in order if host in lost
                            for index in getattr(share, role + "s"))
        ran_role = [host for host, share in survivors if getattr(share, role + "s")]
        candidates = ran_role or [host for host, _ in survivors]
        for index, source in lost_ranks:
            target = min(candidates, key=lambda h: (len(placed[h]) if ran_role else
                                                    len(servers[h]) + len(workers[h]),
                                                    hosts.index(h)))
            placed[target].append(index)
            moves.append(Move(role, index, source, target))
    result = {host: Share(tuple(sorted(servers[host])), tuple(sorted(workers[host])))
              for host, _ in survivors}
    return result, moves

