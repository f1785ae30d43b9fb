"""GEO's exchange runs in the background: the step that reaches it does not wait for the
servers; the first step after their replies arrived applies them, keeping the steps
trained meanwhile (local += server - last synced); a step reaching the next exchange
waits for the one in flight; pushes_sent counts an exchange only once answered; an
exchange's error comes out of the next step; flush waits and exchanges the rest."""
import concurrent.futures
import threading
import types

import numpy as np
import pytest

import fleet.framework as fw
from fleet.communicator.geo import GeoCommunicator
from fleet.errors import ServerLostError
from test_communicator_liveness import _plan

EP = "127.0.0.1:9"
LIMIT_S = 10


class FakeServers:
    """The servers' side of ``_all``: dense blocks summed with every delta pushed, plus
    ``others`` (another worker's deltas) on every exchange; each exchange waits for
    ``gate`` unless it is set."""

    def __init__(self, comm, others=0.5):
        self.comm = comm
        self.others = others
        self.values = {}
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0
        self.error = None

    def __call__(self, requests):
        self.calls += 1
        assert self.gate.wait(LIMIT_S)
        if self.error is not None:
            raise self.error
        op, names, arrays, meta = requests[EP]
        assert op == "geo_push"
        for name, delta in zip(names, arrays):
            value = self.values.setdefault(name, np.zeros_like(delta))
            value += delta + np.float32(self.others)
        reply = types.SimpleNamespace(names=list(meta["pull"]), arrays=[self.values[n].copy() for n in meta["pull"]],
                                      meta={})
        return {EP: reply}


@pytest.fixture
def geo():
    scope = fw.Scope()
    comm = GeoCommunicator(_plan("geo", EP), 0, scope, {}, connect=None, update_frequency=4)
    for p in comm.plan.params.values():
        scope[p.name] = np.zeros(p.shape, np.float32)
    comm.snapshot()
    servers = FakeServers(comm)
    comm._all = servers
    comm._pool = concurrent.futures.ThreadPoolExecutor(1)  # what start() makes, without connecting
    yield comm, scope, servers
    servers.gate.set()
    comm._pool.shutdown(wait=True)


def test_the_step_reaching_an_exchange_does_not_wait_and_a_later_step_applies_the_replies(geo):
    comm, scope, servers = geo
    w = scope["w"]
    w += 1  # a step's local update
    servers.gate.clear()
    comm.geo_step({})  # step 1: the first exchange goes out; the servers do not answer yet
    assert servers.calls == 1 or comm._in_flight is not None
    w += 1  # the next step trains meanwhile
    comm.geo_step({})
    np.testing.assert_array_equal(w, 2.0)  # nothing applied: no reply yet
    mark = comm.pushes_mark()
    assert mark == (1, 1) and not comm.pushes_sent(mark)
    servers.gate.set()
    comm._in_flight.result(LIMIT_S)
    assert not comm.pushes_sent(mark)  # the step after the exchange is not on the servers yet
    assert comm.pushes_sent((1, 0))
    comm.geo_step({})  # step 3 applies: the servers hold 1 (this worker's delta) + 0.5 (the others')
    # local = 2 + (1.5 - 1): the servers' news on top of this worker's progress since
    np.testing.assert_array_equal(w, 2.5)
    # and starts exchange 2 (after 2 more steps) with the progress since exchange 1: 2.5 - 1.5
    comm.flush()
    assert servers.calls == 2
    np.testing.assert_array_equal(servers.values[comm.plan.params["w"].blocks[0].name], 3.0)
    np.testing.assert_array_equal(w, 3.0)


def test_a_step_reaching_the_next_exchange_waits_for_the_one_in_flight(geo):
    comm, scope, servers = geo
    servers.gate.clear()
    comm.geo_step({})  # exchange 1 in flight
    comm.geo_step({})
    release = threading.Timer(0.3, servers.gate.set)
    release.start()
    comm.geo_step({})  # step 3 reaches exchange 2 (after 1, 2 steps): waits for exchange 1 first
    release.join()
    assert comm.stats["sends"] >= 1  # exchange 1 answered, its reply applied (the others' 0.5)
    np.testing.assert_array_equal(comm._old["w"], 0.5)
    comm._in_flight.result(LIMIT_S)
    assert servers.calls == 2
    comm.flush()
    assert comm._in_flight is None and comm.stats["sends"] == 2
    assert comm.pushes_sent(comm.pushes_mark())


def test_an_exchange_s_error_is_raised_by_the_next_step(geo):
    comm, scope, servers = geo
    servers.error = ServerLostError(EP, f"server {EP} stopped answering heartbeats: none for 15.0 s")
    comm.geo_step({})  # the exchange fails in the background
    concurrent.futures.wait([comm._in_flight], LIMIT_S)
    with pytest.raises(ServerLostError, match="stopped answering heartbeats"):
        comm.geo_step({})


def test_flush_waits_for_the_exchange_in_flight_and_sends_the_steps_since(geo):
    comm, scope, servers = geo
    w = scope["w"]
    w += 1
    comm.geo_step({})  # exchange 1 (1 step)
    w += 1
    comm.geo_step({})  # 1 step not exchanged yet
    comm.flush()
    assert servers.calls == 2 and comm._in_flight is None and comm.steps_since_exchange() == 0
    # exchange 1: servers 1 + 0.5; exchange 2 pushes this worker's 1 since: servers 3.0
    np.testing.assert_array_equal(comm._old["w"], 3.0)
    np.testing.assert_array_equal(w, 3.0)
