"""Roles of processes started by ``mpirun``: `MPIRoleMaker` and `MPISymetricRoleMaker`.

Under ``mpirun -np 2N python train.py`` every rank runs the same script;
``fleet.init(MPISymetricRoleMaker())`` makes the even ranks parameter servers and the odd
ranks workers (Paddle 1.x's layout): rank ``r`` is server ``r // 2`` when ``r`` is even,
worker ``r // 2`` when it is odd, so there are N servers and N workers and, with mpirun's
default placement of consecutive ranks on one host, every host holds as many servers as
workers. The ranks then exchange their endpoints through MPI: nothing else needs to be
configured.

mpi4py is an optional dependency (``pip install fleet[mpi]``), imported only when a role
is generated, so ``role_makers`` imports without it.

**The address each rank advertises** (``get_local_ip()``), in this order:

1. the IPv4 address of the network interface named by the ``interface`` argument or by
   ``PADDLE_NIC`` (Paddle's name for it, e.g. ``eth0``);
2. ``127.0.0.1`` when every rank runs on this host (the same network stack: same boot id
   and network namespace);
3. otherwise the address of this host's interface whose subnet holds addresses of the
   most other hosts of the job (the one that reaches them directly);
4. otherwise (hosts in different subnets) the source address the kernel's routing table
   picks towards another host's address.

So ranks on different hosts never advertise a loopback address. Interfaces are read with
Linux's ``SIOCGIF*`` ioctls (one IPv4 address per interface).

**Ports.** Each rank chooses its own port on its own host: ``base_port`` (argument) or
``FLEET_MPI_BASE_PORT`` gives server ``i`` port ``base + i`` and worker ``i`` port
``base + N + i`` (checked free when chosen); without it the rank binds port 0 and keeps
that socket open until every rank has chosen, so ranks of one host never get the same
port. The port is released before the server binds it again in ``fleet.run_server()``;
in that gap another program of the host could take it (the server's bind then fails
naming the port): give a base port where that matters (or where firewalls need fixed
ports).

**Waits.** Every exchange between ranks (the endpoint exchange, `_barrier_all`,
`_barrier_worker`, `_barrier_server`, `_all_gather`, `_worker_gather`,
`all_reduce_worker`) uses only non-blocking point-to-point messages, polled, so it is
bounded by ``timeout`` (60 s by default): a rank that does not arrive in time makes the
others raise ``FleetTimeoutError`` naming the missing ranks and their roles. A wait
longer than ``FLEET_WAIT_LOG_MS`` logs whom it waits for. Each exchange sends one message
from every rank of the group to every other, so it costs N^2 small messages: meant for
start-up and occasional synchronisation, not for every training step (``fleet``'s own
``barrier_worker()`` goes through the servers). A rank that dies is also seen by
``mpirun``, which then ends the whole job.

Thread-safety: as for every role maker, generate the role once from the main thread; the
exchanges are for one thread at a time.
"""
import errno
import fcntl
import ipaddress
import logging
import os
import socket
import struct
import time

import numpy as np

from fleet.errors import FleetTimeoutError, RoleError
from fleet.logs import WaitLog
from role_makers.base import Role, RoleMakerBase

BASE_PORT_ENV = "FLEET_MPI_BASE_PORT"
NIC_ENV = "PADDLE_NIC"
DEFAULT_TIMEOUT_S = 60.0
INSTALL_HINT = ("pip install fleet[mpi] (or pip install 'mpi4py>=3.1'); mpi4py needs an MPI library, e.g. "
                "Debian's: apt-get install openmpi-bin")

# Message tags of the three groups an exchange can span (all ranks, workers, servers).
_TAG_ALL, _TAG_WORKERS, _TAG_SERVERS = 31701, 31702, 31703
_SIOCGIFFLAGS, _SIOCGIFADDR, _SIOCGIFNETMASK = 0x8913, 0x8915, 0x891B
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8
_LOOPBACK = "127.0.0.1"

_logger = logging.getLogger("fleet")


def _import_mpi():
    """Returns mpi4py's MPI module (initializes MPI on first import).

    Raises:
        ImportError: mpi4py is not installed or cannot load an MPI library; says how to
            install it.
    """
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"MPI role makers need mpi4py, which could not be imported ({e}): {INSTALL_HINT}") from e
    return MPI


def _ifreq(sock, request, name):
    return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))


def list_interfaces():
    """The IPv4 interfaces of this host (of this process's network namespace) that are up.

    Returns:
        list[tuple[str, str, int, bool]]: (name, address, prefix length, is loopback), in
        the kernel's interface order.
    """
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                flags = struct.unpack("H", _ifreq(sock, _SIOCGIFFLAGS, name)[16:18])[0]
                address = socket.inet_ntoa(_ifreq(sock, _SIOCGIFADDR, name)[20:24])
                mask = socket.inet_ntoa(_ifreq(sock, _SIOCGIFNETMASK, name)[20:24])
            except OSError as e:
                if e.errno in (errno.EADDRNOTAVAIL, errno.ENODEV):  # no IPv4 address / gone
                    continue
                raise
            if flags & _IFF_UP:
                prefix = ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen
                found.append((name, address, prefix, bool(flags & _IFF_LOOPBACK)))
    return found


def host_identity():
    """What tells whether two ranks share a network stack: the boot id of the kernel and
    the inode of the network namespace (hostname and addresses where /proc lacks them)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/netns:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        addresses = sorted(a for _, a, _, loop in list_interfaces() if not loop)
        return f"{socket.gethostname()}/{','.join(addresses)}"


def interface_address(name, interfaces):
    """The IPv4 address of interface ``name``.

    Raises:
        RoleError: no such interface is up with an IPv4 address; names those there are.
    """
    for iface, address, _, _ in interfaces:
        if iface == name:
            return address
    there = ", ".join(f"{i} ({a})" for i, a, _, _ in interfaces) or "none"
    raise RoleError(f"network interface {name!r} (the interface argument or {NIC_ENV}) is not up with an IPv4 "
                    f"address on {socket.gethostname()}; interfaces up with IPv4 here: {there}. Name one of "
                    f"them, or unset {NIC_ENV} to let the role maker choose")


def choose_address(me, hosts):
    """The address rank ``me`` advertises when no interface is named (see the module
    docstring, steps 2-4).

    Args:
        me: this rank's index in ``hosts``.
        hosts: for every rank, ``(host identity, interfaces)`` as from `host_identity`
            and `list_interfaces`.

    Returns:
        tuple[str, str]: (address, why it was chosen).

    Raises:
        RoleError: other hosts exist but none of their addresses is reachable from an
            address of this host.
    """
    my_host, my_ifaces = hosts[me]
    others = {}
    for host, ifaces in hosts:
        if host != my_host:
            others[host] = ifaces
    if not others:
        return _LOOPBACK, "every rank runs on this host"
    mine = {a for _, a, _, _ in my_ifaces}
    best, best_reach = None, 0
    for name, address, prefix, loopback in my_ifaces:
        if loopback:
            continue
        subnet = ipaddress.IPv4Network(f"{address}/{prefix}", strict=False)
        reach = sum(any(a not in mine and ipaddress.IPv4Address(a) in subnet for _, a, _, loop in ifaces if not loop)
                    for ifaces in others.values())
        if reach > best_reach:
            best, best_reach = (name, address, subnet), reach
    if best is not None:
        name, address, subnet = best
        return address, (f"interface {name} ({subnet}) reaches {best_reach} of the {len(others)} other hosts "
                         "directly")
    candidates = [a for ifaces in others.values() for _, a, _, loop in ifaces if not loop and a not in mine]
    for target in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((target, 9))  # a UDP connect only asks for a route; nothing is sent
            except OSError:
                continue
            source = probe.getsockname()[0]
        if source in mine and not ipaddress.IPv4Address(source).is_loopback:
            return source, f"the kernel routes to {target} from it"
    theirs = sorted(set(candidates))
    raise RoleError(f"cannot tell which address of {socket.gethostname()} (addresses {sorted(mine)}) the other "
                    f"hosts of the MPI job reach: none of their addresses {theirs} is in a subnet or route of "
                    f"this host; name the interface to use with {NIC_ENV}=<name> or MPISymetricRoleMaker("
                    "interface=...)")


def _parse_base_port(value, source):
    text = str(value).strip()
    port = int(text) if text.isascii() and text.isdigit() else -1
    if not 1 <= port <= 65535:
        raise RoleError(f"{source}={value!r} is not a port in 1..65535; set it to the first port of the job's "
                        f"endpoints (server i listens on base + i), or unset it to use free ports")
    return port


class MPIRoleMaker(RoleMakerBase):
    """Base of role makers that learn the job's layout through MPI (mpi4py).

    Holds the communicator and the MPI exchanges (`_all_gather`, `_barrier_all`,
    `_get_ips`, ...). Like Paddle's, it does not decide roles itself: use
    `MPISymetricRoleMaker`, or subclass it and implement ``generate_role()``.

    Args:
        comm: the communicator of the job's ranks; default ``MPI.COMM_WORLD`` (imported
            when first needed). Anything with mpi4py's ``Get_rank``, ``Get_size``,
            ``isend`` and ``improbe`` works (tests pass a fake one).
        timeout: seconds an exchange between ranks waits for the others before raising
            ``FleetTimeoutError`` naming the ranks missing (> 0).
        interface: name of the network interface whose IPv4 address this rank advertises
            (default: ``PADDLE_NIC``, else chosen as the module docstring says).

    Raises:
        RoleError: ``timeout`` is not a positive number.
    """

    def __init__(self, comm=None, timeout=DEFAULT_TIMEOUT_S, interface=None):
        super().__init__()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise RoleError(f"timeout={timeout!r} is not a positive number of seconds; give how long an exchange "
                            f"between MPI ranks may wait for the others (default {DEFAULT_TIMEOUT_S:g})")
        self._comm = comm
        self._timeout = float(timeout)
        self._interface = interface
        self._rank = None
        self._size = None
        self._ips = None
        self._ip = None
        self._ip_reason = None
        self._hosts = None

    # ------------------------------------------------------------- MPI basics
    def _world(self):
        if self._comm is None:
            self._comm = _import_mpi().COMM_WORLD
        return self._comm

    def _get_rank(self):
        """Returns: this process's rank in the communicator."""
        self._rank = self._world().Get_rank()
        return self._rank

    def _get_size(self):
        """Returns: the number of ranks in the communicator."""
        self._size = self._world().Get_size()
        return self._size

    def _finalize(self):
        """Finalizes MPI (mpi4py also does it at exit); nothing after it may use MPI."""
        MPI = _import_mpi()
        if not MPI.Is_finalized():
            MPI.Finalize()

    def _describe_rank(self, rank):
        """How messages name a rank (subclasses add its role)."""
        return f"rank {rank}"

    def _exchange(self, obj, ranks, tag, what):
        """Sends ``obj`` to every other rank of ``ranks`` and receives theirs, with
        non-blocking messages polled until ``timeout``.

        Returns:
            list: the objects of ``ranks``, in the order of ``ranks``.

        Raises:
            FleetTimeoutError: some ranks did not send within ``timeout``; names them.
        """
        comm = self._world()
        me = self._get_rank()
        others = [r for r in ranks if r != me]
        got = {me: obj}
        sends = [comm.isend(obj, dest=r, tag=tag) for r in others]
        started = time.monotonic()
        log = WaitLog(f"MPI ranks to reach {what}", f"giving up after {self._timeout:g} s (the role maker's timeout)")
        pause = 0.0002
        while True:
            for r in others:
                if r not in got:
                    message = comm.improbe(source=r, tag=tag)
                    if message is not None:
                        got[r] = message.recv()
            sends = [s for s in sends if not s.test()[0]]
            if len(got) == len(ranks) and not sends:
                return [got[r] for r in ranks]
            missing = [r for r in others if r not in got]
            waited = time.monotonic() - started
            if waited > self._timeout:
                if not missing:
                    missing_text = "ranks " + ", ".join(map(str, others)) + " did not take this rank's message"
                else:
                    missing_text = ", ".join(self._describe_rank(r) for r in missing) + " did not arrive"
                raise FleetTimeoutError(
                    f"{self._describe_rank(me)} waited {waited:.0f} s for the MPI ranks to reach {what}: "
                    f"{missing_text} ({len(got)} of {len(ranks)} arrived); they are slow to start, stuck or "
                    f"failed (see their output). Allow more time with {type(self).__name__}(timeout=seconds)")
            if missing:
                log.tick(f"{len(got)} of {len(ranks)} arrived; not yet " + ", ".join(
                    self._describe_rank(r) for r in missing[:8]) + (" ..." if len(missing) > 8 else ""))
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _all_ranks(self):
        return list(range(self._get_size()))

    def _all_gather(self, obj):
        """Every rank's ``obj``, in rank order (every rank must call it).

        Raises:
            FleetTimeoutError: a rank did not call it within ``timeout``.
        """
        return self._exchange(obj, self._all_ranks(), _TAG_ALL, "_all_gather")

    def _barrier_all(self):
        """Returns once every rank called it.

        Raises:
            FleetTimeoutError: a rank did not call it within ``timeout``; names it.
        """
        self._exchange(None, self._all_ranks(), _TAG_ALL, "_barrier_all")

    # ------------------------------------------------------------- addresses
    def get_local_ip(self):
        """The IPv4 address this rank advertises (the module docstring says how it is
        chosen). Paddle's takes the address the hostname resolves to; that can be
        127.0.1.1 or an address other hosts cannot reach, so fleet does not.

        Raises:
            RoleError: the named interface has no IPv4 address, or no address of this
                host reaches the other hosts.
            FleetTimeoutError: a rank did not take part in the exchange in time.
        """
        if self._ip is None:
            interfaces = list_interfaces()
            name = self._interface or os.environ.get(NIC_ENV, "").strip()
            # every rank takes part in the exchange, so that no rank waits for another
            self._hosts = self._exchange((host_identity(), interfaces), self._all_ranks(), _TAG_ALL,
                                         "the exchange of network interfaces")
            if name:
                self._ip = interface_address(name, interfaces)
                self._ip_reason = f"interface {name} (named by " + (
                    "the interface argument)" if self._interface else f"{NIC_ENV})")
            else:
                self._ip, self._ip_reason = choose_address(self._get_rank(), self._hosts)
        return self._ip

    def _get_ips(self):
        """Returns: every rank's advertised address (`get_local_ip`), in rank order."""
        if self._ips is None:
            self._ips = self._all_gather(self.get_local_ip())
        return self._ips


class MPISymetricRoleMaker(MPIRoleMaker):
    """Under ``mpirun -np 2N``: even ranks are servers, odd ranks workers (Paddle 1.x's
    layout and spelling).

    Rank ``r`` is server ``r // 2`` (even ``r``) or worker ``r // 2`` (odd ``r``);
    ``worker_num() == server_num() == N``. Generating the role exchanges every rank's
    address and port through MPI, so every rank must construct it and call
    ``fleet.init`` (or ``generate_role()``) at about the same time; the server endpoints
    are ``address:port`` of the even ranks in rank order, the worker endpoints those of
    the odd ranks. Servers then run ``fleet.init_server(); fleet.run_server()``, which
    returns once every worker called ``fleet.stop_worker()``, and every rank exits.

    Args:
        comm: see `MPIRoleMaker`.
        timeout: see `MPIRoleMaker`.
        interface: see `MPIRoleMaker`.
        base_port: first port of the job (server i listens on ``base_port + i``, worker i
            gets ``base_port + N + i``); default ``FLEET_MPI_BASE_PORT``, else a free port
            chosen by each rank.

    Raises:
        RoleError: a bad ``timeout`` or ``base_port``.
    """

    def __init__(self, comm=None, timeout=DEFAULT_TIMEOUT_S, interface=None, base_port=None):
        super().__init__(comm=comm, timeout=timeout, interface=interface)
        self._base_port = None if base_port is None else _parse_base_port(base_port, "base_port")
        self._node_type = None  # Paddle's: 0 server, 1 worker
        self._proc_per_node = 2

    def _describe_rank(self, rank):
        kind = "server" if rank % self._proc_per_node == 0 else "worker"
        return f"rank {rank} ({kind} {rank // self._proc_per_node})"

    def generate_role(self):
        """Decides this rank's role and exchanges every rank's endpoint; later calls do
        nothing. Every rank of the communicator must call it.

        Raises:
            ImportError: mpi4py is missing (says how to install it).
            RoleError: the number of ranks is odd (names it and the fix), a bad
                ``FLEET_MPI_BASE_PORT``, a taken port, or no usable address.
            FleetTimeoutError: a rank did not take part within ``timeout``; names it.
        """
        if self._role_is_generated:
            return
        size, rank = self._get_size(), self._get_rank()
        if size % 2 != 0 or size == 0:
            hint = (" (1 rank: this process was not started by mpirun, or mpi4py uses another MPI library than "
                    "mpirun)" if size == 1 else "")
            raise RoleError(f"MPISymetricRoleMaker needs an even number of MPI ranks (they alternate server, "
                            f"worker), but the communicator has {size}{hint}; start N servers and N workers with "
                            "mpirun -np 2N, e.g. mpirun -np 4 python train.py")
        n = size // 2
        self._node_type = 0 if rank % 2 == 0 else 1
        index = rank // 2
        base_port = self._base_port
        if base_port is None and os.environ.get(BASE_PORT_ENV, "").strip():
            base_port = _parse_base_port(os.environ[BASE_PORT_ENV], BASE_PORT_ENV)
        if base_port is not None and base_port + size - 1 > 65535:
            raise RoleError(f"base port {base_port} leaves no room for the {size} ports of {n} servers and {n} "
                            f"workers (the last would be {base_port + size - 1}); choose a base port of at most "
                            f"{65536 - size}")
        address = self.get_local_ip()
        held = None
        try:
            if base_port is None:
                held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.bind((address, 0))  # held until every rank has chosen: no two ranks of a host share it
                port = held.getsockname()[1]
            else:
                port = base_port + index + (n if self._node_type == 1 else 0)
                self._check_port_free(address, port, base_port)
            endpoints = self._exchange(f"{address}:{port}", self._all_ranks(), _TAG_ALL,
                                       "the exchange of endpoints")
        finally:
            if held is not None:
                held.close()
        self._ips = [e.rpartition(":")[0] for e in endpoints]
        self._server_endpoints = endpoints[0::2]
        self._worker_endpoints = endpoints[1::2]
        self._role = Role.SERVER if self._node_type == 0 else Role.WORKER
        self._current_id = index
        self._worker_num = n
        self._is_local = False
        self._role_is_generated = True
        _logger.info("MPISymetricRoleMaker: rank %d of %d is %s %d at %s (address: %s)", rank, size,
                     "server" if self._node_type == 0 else "worker", index, endpoints[rank], self._ip_reason)

    def _check_port_free(self, address, port, base_port):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, port))
            except OSError as e:
                raise RoleError(
                    f"{self._describe_rank(self._rank)} cannot use port {port} on {address} (base port "
                    f"{base_port} + {port - base_port}): {e.strerror}; choose another base port "
                    f"({BASE_PORT_ENV} or base_port=), or unset it to use free ports") from e

    # ------------------------------------------------------------- groups
    def _group(self):
        """(ranks, tag) of this rank's kind: every worker rank or every server rank."""
        self._generated()
        size = self._get_size()
        return list(range(self._node_type, size, self._proc_per_node)), (
            _TAG_WORKERS if self._node_type == 1 else _TAG_SERVERS)

    def _barrier_worker(self):
        """On a worker: returns once every worker called it. On a server: does nothing.

        Raises:
            FleetTimeoutError: a worker did not call it within ``timeout``; names it.
        """
        if self.is_worker():
            ranks, tag = self._group()
            self._exchange(None, ranks, tag, "_barrier_worker")

    def _barrier_server(self):
        """On a server: returns once every server called it. On a worker: does nothing.

        Raises:
            FleetTimeoutError: a server did not call it within ``timeout``; names it.
        """
        if self.is_server():
            ranks, tag = self._group()
            self._exchange(None, ranks, tag, "_barrier_server")

    def _worker_gather(self, obj):
        """On a worker: every worker's ``obj`` in worker order. On a server: None.

        Raises:
            FleetTimeoutError: a worker did not call it within ``timeout``; names it.
        """
        if not self.is_worker():
            return None
        ranks, tag = self._group()
        return self._exchange(obj, ranks, tag, "_worker_gather")

    def all_gather(self, input):
        """Every rank's ``input``, in rank order (servers and workers alike)."""
        self._generated()
        return self._all_gather(input)

    def barrier_all(self):
        """Returns once every rank (servers and workers) called it."""
        self._generated()
        self._barrier_all()

    def barrier_worker(self):
        """Returns once every worker called it; on a server it logs a warning and returns
        (Paddle prints one)."""
        if self.is_worker():
            self._barrier_worker()
        else:
            _logger.warning("MPISymetricRoleMaker.barrier_worker called on a server: only workers take part; "
                            "nothing was waited for")

    def all_reduce_worker(self, input, output, mode="sum"):
        """Reduces a one-dimensional array over the workers into ``output``, in place.

        Args:
            input: this worker's values (array-like, one dimension).
            output: a numpy array of the same length that receives the result.
            mode: "sum", "min" or "max".

        Raises:
            ValueError: an unknown ``mode`` (Paddle's message), or arrays of different
                lengths on the workers.
            TypeError: ``output`` is not a numpy array.
        """
        reducers = {"sum": np.sum, "min": np.min, "max": np.max}
        if mode not in reducers:
            raise ValueError(f"unknown mode: {mode}; use 'sum', 'min' or 'max'")
        if not self.is_worker():
            _logger.warning("MPISymetricRoleMaker.all_reduce_worker called on a server: only workers take part; "
                            "output was left as it was")
            return
        if not isinstance(output, np.ndarray):
            raise TypeError(f"output must be a numpy array to receive the result in place, got {type(output).__name__}")
        ranks, tag = self._group()
        values = self._exchange(np.asarray(input).reshape(-1), ranks, tag, "all_reduce_worker")
        lengths = sorted({len(v) for v in values})
        if len(lengths) > 1:
            raise ValueError(f"all_reduce_worker got arrays of lengths {lengths} from the workers; every worker "
                             "must give the same length")
        output[...] = reducers[mode](np.stack(values), axis=0).reshape(output.shape)

    def _all_reduce(self, input, output, mode="sum"):
        """Paddle's name of `all_reduce_worker`."""
        self.all_reduce_worker(input, output, mode)
