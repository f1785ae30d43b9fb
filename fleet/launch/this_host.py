"""Which processes of a job run on this host: its addresses, and the endpoints that name it.

The same fleetrun command runs on every host of a job; each starts the roles whose endpoint
host is one of its own addresses. This host's addresses are those of its network interfaces
(all of them, or of one interface with ``--nic``), or the address ``--host`` / ``POD_IP``
gives (for an address the host is known by but does not carry, behind NAT or a Kubernetes
Service). Names in endpoints are resolved; loopback endpoints are every host's own.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import socket

import psutil

from fleet.endpoints import split_endpoint
from fleet.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Placement:
    """The roles of a job that run here.

    Attributes:
        servers: global indexes of the servers to start here.
        workers: global indexes of the workers to start here.
        whole_job: True when every endpoint is this host's (one-host job: nothing changes).
        addresses: this host's addresses that were matched against, for messages.
        how: how they were found, e.g. "from its interfaces" or "from --host".
        bind_any: server indexes whose endpoint address is not on an interface here (a
            --host or POD_IP address): they bind the wildcard address and advertise theirs.
        bind_any_workers: the same for the workers started here (a worker binds its endpoint
            for the workers' group: collective and hybrid training, global metrics).
        name: the endpoint host(s) of the processes that run here, e.g. "10.0.0.2".
    """

    servers: tuple[int, ...]
    workers: tuple[int, ...]
    whole_job: bool
    addresses: tuple[str, ...]
    how: str
    bind_any: tuple[int, ...] = ()
    name: str = ""
    bind_any_workers: tuple[int, ...] = ()


def interface_addresses(nic=None):
    """IP addresses of this host's interfaces (IPv6 link-local ones without their scope).

    Args:
        nic: an interface name, or None for every interface.

    Returns:
        set[str]: the addresses.

    Raises:
        ConfigError: ``nic`` names no interface, or one without an IP address; the message
            lists the interfaces there are and their addresses.
    """
    table = {}
    for name, entries in psutil.net_if_addrs().items():
        table[name] = [e.address.split("%")[0] for e in entries
                       if e.family in (socket.AF_INET, socket.AF_INET6)]
    if nic is None:
        return {a for addrs in table.values() for a in addrs}
    if not table.get(nic):
        listed = "; ".join(f"{n}: {', '.join(a) or 'no address'}" for n, a in sorted(table.items()))
        what = "has no IP address" if nic in table else "is not an interface of this host"
        raise ConfigError(f"--nic {nic!r} {what}; interfaces here: {listed}. Give the interface "
                          "of the cluster network (PADDLE_NIC sets the default)")
    return set(table[nic])


def resolve(host):
    """The IP addresses a host name or address stands for (empty if it does not resolve)."""
    try:
        return {info[4][0].split("%")[0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError):
        return set()


def is_loopback(host):
    """True for 127.0.0.0/8, ::1 and names that resolve only to them (localhost)."""
    addresses = resolve(host)
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def place(servers, workers, host=None, host_source="--host", nic=None):
    """Decide which of a job's processes run on this host.

    Args:
        servers: every server endpoint of the job, in index order.
        workers: every worker endpoint of the job, in index order.
        host: the address (or name) this host is known by, from --host or POD_IP; None to
            use its interfaces' addresses.
        host_source: where ``host`` came from, for messages ("--host" or "POD_IP").
        nic: use only this interface's addresses (--nic / PADDLE_NIC).

    Returns:
        Placement.

    Raises:
        ConfigError: no endpoint is this host's; a host does not resolve; or a loopback
            endpoint is part of a job that spans several hosts (other hosts cannot reach it).
    """
    if host is not None:
        mine = resolve(host) | {host}
        how = f"from {host_source}"
    else:
        mine = interface_addresses(nic)
        how = f"of interface {nic}" if nic else "from its interfaces"
    interfaces = interface_addresses()
    cache = {}

    def endpoint_host(endpoint):
        return split_endpoint(endpoint)[0]

    def addresses_of(name):
        if name not in cache:
            cache[name] = resolve(name)
            if not cache[name]:
                raise ConfigError(f"endpoint host {name!r} does not resolve to an address on this "
                                  "host; give an IP address or a name this host can resolve")
        return cache[name]

    def is_mine(endpoint):
        name = endpoint_host(endpoint)
        if is_loopback(name):
            return True
        return name in mine or bool(addresses_of(name) & mine)

    local_servers = tuple(i for i, e in enumerate(servers) if is_mine(e))
    local_workers = tuple(i for i, e in enumerate(workers) if is_mine(e))
    shown = tuple(sorted(a for a in mine if not ipaddress.ip_address(a.split("%")[0]).is_link_local))
    if len(local_servers) == len(servers) and len(local_workers) == len(workers):
        return Placement(local_servers, local_workers, True, shown, how)
    if not local_servers and not local_workers:
        hosts = sorted({endpoint_host(e) for e in (*servers, *workers)})
        raise ConfigError(
            f"this host (addresses {', '.join(shown) or 'none'}, {how}) runs none of the job's "
            f"processes: the endpoints name {', '.join(hosts)}. Run fleetrun on those hosts, or "
            "give --host ADDR (or --nic NAME) if this host is one of them under another address")
    loopback = [e for e in (*servers, *workers) if is_loopback(endpoint_host(e))]
    if loopback:
        raise ConfigError(
            f"endpoint {loopback[0]} is a loopback address, but the job spans several hosts "
            "(some endpoints are not this host's): other hosts cannot reach it. Give every "
            "process an address of its host on the cluster network")
    def not_on_an_interface(endpoints, indexes):
        return tuple(i for i in indexes if not (addresses_of(endpoint_host(endpoints[i])) & interfaces))

    named = sorted({endpoint_host(servers[i]) for i in local_servers}
                   | {endpoint_host(workers[i]) for i in local_workers})
    return Placement(local_servers, local_workers, False, shown, how,
                     not_on_an_interface(servers, local_servers), ", ".join(named),
                     not_on_an_interface(workers, local_workers))
