"""MPISymetricRoleMaker with a fake communicator: rank layout, endpoints, exchanges and
errors. Each fake rank runs in a thread of this process and exchanges messages through
an in-memory mailbox with mpi4py's ``isend`` / ``improbe`` semantics (messages from one
rank with one tag arrive in order). Real mpirun jobs are in tests/integration/test_mpi.py.
"""
import ast
import collections
import pathlib
import pickle
import socket
import sys
import threading

import numpy as np
import pytest

from fleet.errors import FleetTimeoutError, RoleError
from role_makers import MPIRoleMaker, MPISymetricRoleMaker, Role, RoleMakerBase
from role_makers import mpi_role_maker
from role_makers.mpi_role_maker import choose_address, interface_address


class FakeWorld:
    """The mailboxes of ``size`` fake ranks."""

    def __init__(self, size):
        self.size = size
        self.lock = threading.Lock()
        self.boxes = collections.defaultdict(collections.deque)  # (source, dest, tag) -> messages

    def comm(self, rank):
        return FakeComm(self, rank)


class _Sent:
    def test(self):
        return True, None


class _Message:
    def __init__(self, data):
        self.data = data

    def recv(self):
        return pickle.loads(self.data)


class FakeComm:
    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.world.size

    def isend(self, obj, dest, tag):
        with self.world.lock:
            self.world.boxes[(self.rank, dest, tag)].append(pickle.dumps(obj))
        return _Sent()

    def improbe(self, source, tag):
        with self.world.lock:
            box = self.world.boxes[(source, self.rank, tag)]
            return _Message(box.popleft()) if box else None


def run_ranks(size, action, ranks=None, timeout=2.0, **kwargs):
    """Runs action(role_maker) on fake ranks (all, or ``ranks``) in threads.

    Returns:
        list: per rank, what action returned or the exception it raised.
    """
    world = FakeWorld(size)
    ranks = list(range(size)) if ranks is None else ranks
    makers = {r: MPISymetricRoleMaker(comm=world.comm(r), timeout=timeout, **kwargs) for r in ranks}
    results = {}

    def run(rank):
        try:
            results[rank] = action(makers[rank])
        except Exception as e:  # handed to the test
            results[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
        assert not t.is_alive(), "a fake rank did not finish"
    return [results[r] for r in ranks]


def generated(role_maker):
    role_maker.generate_role()
    return role_maker


@pytest.mark.parametrize("size", [2, 4, 6])
def test_even_ranks_are_servers_and_odd_ranks_workers_with_paddles_indices(size):
    makers = run_ranks(size, generated)
    n = size // 2
    endpoints = [m.get_pserver_endpoints() for m in makers]
    assert all(e == endpoints[0] for e in endpoints)
    assert all(m.get_trainer_endpoints() == makers[0].get_trainer_endpoints() for m in makers)
    for rank, m in enumerate(makers):
        assert isinstance(m, RoleMakerBase) and not m.is_local()
        assert (m.is_server(), m.is_worker()) == (rank % 2 == 0, rank % 2 == 1)
        assert m._role == (Role.SERVER if rank % 2 == 0 else Role.WORKER)
        assert m.worker_index() == m.server_index() == m.role_id() == rank // 2
        assert (m.worker_num(), m.server_num()) == (n, n)
        assert m.is_first_worker() == (rank == 1)
        own = m.get_pserver_endpoints() if m.is_server() else m.get_trainer_endpoints()
        assert own[rank // 2] == m._ips[rank] + ":" + own[rank // 2].rpartition(":")[2]
    everything = makers[0].get_pserver_endpoints() + makers[0].get_trainer_endpoints()
    assert len(set(everything)) == size  # one port per rank
    assert all(e.startswith("127.0.0.1:") for e in everything)  # every rank on this host


def _consecutive_free_ports(count):
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"found no {count} consecutive free ports on 127.0.0.1")


def test_a_base_port_gives_server_i_base_plus_i_and_worker_i_base_plus_n_plus_i(monkeypatch):
    base = _consecutive_free_ports(4)
    monkeypatch.setenv("FLEET_MPI_BASE_PORT", str(base))
    makers = run_ranks(4, generated)
    assert makers[0].get_pserver_endpoints() == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    assert makers[3].get_trainer_endpoints() == [f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 3}"]


def test_a_taken_base_port_is_a_role_error_naming_the_port():
    base = _consecutive_free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base))
        taken.listen()
        results = run_ranks(2, generated, timeout=0.5, base_port=base)
    assert isinstance(results[1], FleetTimeoutError)  # rank 0 left the exchange of endpoints
    assert isinstance(results[0], RoleError)
    assert str(results[0]).startswith(f"rank 0 (server 0) cannot use port {base} on 127.0.0.1 (base port {base} + 0)")
    assert "choose another base port (FLEET_MPI_BASE_PORT or base_port=)" in str(results[0])


@pytest.mark.parametrize("value", ["0", "65536", "x", "-5"])
def test_a_bad_base_port_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("FLEET_MPI_BASE_PORT", value)
    error, = run_ranks(2, generated, ranks=[0])
    assert isinstance(error, RoleError)
    assert str(error).startswith(f"FLEET_MPI_BASE_PORT={value!r} is not a port in 1..65535")


def test_a_base_port_without_room_for_every_rank_is_refused():
    with pytest.raises(RoleError, match=r"base port 65534 leaves no room for the 4 ports of 2 servers and 2 "
                                        r"workers \(the last would be 65537\); choose a base port of at most 65532"):
        MPISymetricRoleMaker(comm=FakeWorld(4).comm(0), base_port=65534).generate_role()


@pytest.mark.parametrize("size", [1, 3])
def test_an_odd_number_of_ranks_names_the_size_and_the_fix(size):
    with pytest.raises(RoleError) as e:
        MPISymetricRoleMaker(comm=FakeWorld(size).comm(0)).generate_role()
    message = str(e.value)
    assert message.startswith("MPISymetricRoleMaker needs an even number of MPI ranks (they alternate server, "
                              f"worker), but the communicator has {size}")
    assert message.endswith("start N servers and N workers with mpirun -np 2N, e.g. mpirun -np 4 python train.py")
    assert ("this process was not started by mpirun" in message) == (size == 1)


def test_missing_mpi4py_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import fails as if it were not installed
    with pytest.raises(ImportError) as e:
        MPISymetricRoleMaker().generate_role()
    assert "MPI role makers need mpi4py, which could not be imported" in str(e.value)
    assert "pip install fleet[mpi]" in str(e.value)


def test_mpi4py_is_imported_only_inside_functions():
    source = pathlib.Path(mpi_role_maker.__file__).read_text()
    tree = ast.parse(source)
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top_level for a in n.names} | {n.module for n in top_level if isinstance(n, ast.ImportFrom)}
    assert not any(name and name.startswith("mpi4py") for name in names)
    assert "from mpi4py import MPI" in source


def test_a_rank_that_never_arrives_is_named_with_its_role():
    results = run_ranks(4, generated, ranks=[0, 1, 2], timeout=0.3)
    for rank, error in zip([0, 1, 2], results):
        assert isinstance(error, FleetTimeoutError), error
        text = str(error)
        assert text.startswith(f"rank {rank} ({'server' if rank % 2 == 0 else 'worker'} {rank // 2}) waited 0 s for the "
                               "MPI ranks to reach the exchange of network interfaces: rank 3 (worker 1) did not arrive "
                               "(3 of 4 arrived)")
        assert text.endswith("Allow more time with MPISymetricRoleMaker(timeout=seconds)")


def test_timeout_must_be_positive():
    for bad in (0, -1, "5", True):
        with pytest.raises(RoleError, match="is not a positive number of seconds"):
            MPISymetricRoleMaker(comm=FakeWorld(2).comm(0), timeout=bad)


def test_barriers_and_gathers_take_only_their_own_kind():
    def action(m):
        m.generate_role()
        m._barrier_all()
        m._barrier_worker()
        m._barrier_server()
        return m._all_gather(m._rank * 10), m._worker_gather(f"w{m.worker_index()}"), m.all_gather("x")

    results = run_ranks(4, action)
    for rank, (everyone, workers, xs) in enumerate(results):
        assert everyone == [0, 10, 20, 30] and xs == ["x"] * 4
        assert workers == (["w0", "w1"] if rank % 2 else None)


def test_all_reduce_worker_sums_over_workers_in_place_and_leaves_servers_alone():
    def action(m):
        m.generate_role()
        out = np.full(3, -1.0)
        m.all_reduce_worker(np.arange(3.0) + m._rank, out, mode="sum")
        maxed = np.zeros(3)
        m._all_reduce(np.arange(3.0) * m._rank, maxed, mode="max")
        return out, maxed

    results = run_ranks(4, action)
    for rank, (out, maxed) in enumerate(results):
        if rank % 2:  # ranks 1 and 3: [1,2,3] + [3,4,5]
            np.testing.assert_array_equal(out, [4.0, 6.0, 8.0])
            np.testing.assert_array_equal(maxed, [0.0, 3.0, 6.0])
        else:
            np.testing.assert_array_equal(out, [-1.0, -1.0, -1.0])


def test_all_reduce_worker_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode: prod; use 'sum', 'min' or 'max'"):
        MPISymetricRoleMaker(comm=FakeWorld(2).comm(1)).all_reduce_worker([1], np.zeros(1), mode="prod")


def test_the_base_class_decides_no_role_like_paddles():
    with pytest.raises(NotImplementedError):
        MPIRoleMaker(comm=FakeWorld(2).comm(0)).generate_role()


# ---------------------------------------------------------------- which address is advertised
ETH = ("eth0", "10.1.2.1", 24, False)
LO = ("lo", "127.0.0.1", 8, True)
DOCKER = ("docker0", "172.17.0.1", 16, False)


def test_ranks_on_one_host_advertise_loopback():
    hosts = [("hostA", [LO, ETH])] * 4
    assert choose_address(2, hosts) == ("127.0.0.1", "every rank runs on this host")


def test_ranks_on_two_hosts_advertise_the_interface_on_the_other_hosts_subnet():
    other = ("hostB", [LO, DOCKER, ("eth0", "10.1.2.2", 24, False)])
    hosts = [("hostA", [LO, DOCKER, ("ib0", "192.168.7.1", 24, False), ETH]), other]
    # docker0 holds the same 172.17.0.1 on both hosts: it reaches nobody and is not chosen
    assert choose_address(0, hosts) == ("10.1.2.1", "interface eth0 (10.1.2.0/24) reaches 1 of the 1 other hosts directly")


def test_the_interface_reaching_most_hosts_wins():
    hosts = [("A", [LO, ("eth0", "10.0.0.1", 24, False), ("eth1", "10.0.1.1", 24, False)]),
             ("B", [LO, ("eth0", "10.0.0.2", 24, False), ("eth1", "10.0.1.2", 24, False)]),
             ("C", [LO, ("eth1", "10.0.1.3", 24, False)])]
    assert choose_address(0, hosts)[0] == "10.0.1.1"


def test_a_named_interface_that_is_missing_lists_those_there():
    with pytest.raises(RoleError) as e:
        interface_address("ib7", [LO, ETH])
    assert str(e.value).startswith("network interface 'ib7' (the interface argument or PADDLE_NIC) is not up with an "
                                   "IPv4 address on ")
    assert "interfaces up with IPv4 here: lo (127.0.0.1), eth0 (10.1.2.1)" in str(e.value)


def test_paddle_nic_names_the_interface(monkeypatch):
    monkeypatch.setenv("PADDLE_NIC", "lo")
    makers = run_ranks(2, generated)
    assert makers[0]._ip_reason == "interface lo (named by PADDLE_NIC)"
    assert makers[0].get_pserver_endpoints()[0].startswith("127.0.0.1:")


def test_list_interfaces_finds_loopback():
    assert ("lo", "127.0.0.1", 8, True) in mpi_role_maker.list_interfaces()
