"""Communicators and a failed job: a training thread blocked on a full async queue, a GEO
step that talks to no server and a prefetch all raise the failure instead of hanging."""
import contextlib
import threading
import time

import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.communicator import make_communicator
from fleet.errors import ServerLostError
from fleet.transpiler.plan import build_plan
from fleet.transport import Client, Heartbeat, ServerSocket, serving
from strategies import DistributedStrategyFactory

TIMEOUT_MS = 400


def _plan(mode, endpoint):
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        e = layers.sequence_pool(layers.embedding(ids, size=[50, 2], is_sparse=True, param_attr="t"), "sum")
        out = layers.fc(layers.concat([e, x], axis=1), 2, param_attr="w", bias_attr=False)
        optimizer.SGD(0.1).minimize(layers.mean(out))
    strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
                "async": DistributedStrategyFactory.create_async_strategy,
                "half_async": DistributedStrategyFactory.create_half_async_strategy,
                "geo": lambda: DistributedStrategyFactory.create_geo_strategy(4)}[mode]()
    return build_plan(main, strategy, [endpoint], 1)


class Failed:
    """A liveness object of a job that has failed already."""

    check_ms = 100

    def check(self):
        raise ServerLostError("127.0.0.1:9", "server 127.0.0.1:9 stopped answering heartbeats: none for 15.0 s")


def park_pushes(request):
    """A server that takes pulls but never answers a push (it is about to die)."""
    if request.op == "pull_dense":
        request.reply(request.meta["blocks"], [np.zeros((6, 2), np.float32)])
    else:
        request.defer()


def test_a_training_thread_blocked_on_a_full_async_queue_raises_the_lost_server():
    with contextlib.ExitStack() as server_stack, contextlib.ExitStack() as stack:
        server = server_stack.enter_context(serving(ServerSocket("127.0.0.1:0"), park_pushes, poll_ms=20))
        endpoint = server.endpoint
        beat = Heartbeat([endpoint], 0, interval_ms=50, timeout_ms=TIMEOUT_MS)
        beat.start()
        stack.callback(beat.stop)
        plan = _plan("async", endpoint)
        flags = {"communicator_send_queue_size": 1, "communicator_max_merge_var_num": 1, "put_timeout_s": 60}
        comm = make_communicator("async", plan, 0, fw.Scope(), flags,
                                 connect=lambda ep: Client(ep, 0, liveness=beat), liveness=beat)
        comm.start()
        grads = {plan.params["w"].grad: np.ones((6, 2), np.float32)}
        threading.Timer(0.3, server_stack.close).start()  # the server dies with a push parked
        start = time.monotonic()
        with pytest.raises(ServerLostError) as error:
            while time.monotonic() - start < 30:
                comm.send(grads)  # the queue fills: this blocks until the failure is known
        assert error.value.endpoint == endpoint
        assert time.monotonic() - start < 0.3 + TIMEOUT_MS / 1000 + 2
        with pytest.raises(ServerLostError):  # stopping says so too, and does not hang
            comm.stop()


def test_a_geo_step_raises_the_failure_though_it_sends_nothing():
    plan = _plan("geo", "127.0.0.1:9")
    comm = make_communicator("geo", plan, 0, fw.Scope(), {}, connect=lambda ep: Client(ep, 0), liveness=Failed())
    with pytest.raises(ServerLostError, match="server 127.0.0.1:9 stopped answering heartbeats"):
        comm.geo_step({})
    assert comm._steps == 0


def test_a_prefetch_of_a_failed_job_raises_before_sending():
    plan = _plan("async", "127.0.0.1:9")
    failed = Failed()
    comm = make_communicator("async", plan, 0, fw.Scope(), {}, connect=lambda ep: Client(ep, 0, liveness=failed),
                             liveness=failed)
    comm.clients = {ep: comm._connect(ep) for ep in comm.endpoints}  # connected, nothing started
    comm.running = True
    try:
        start = time.monotonic()
        with pytest.raises(ServerLostError):
            comm.prefetch("t", np.array([1, 2, 3]))
        assert time.monotonic() - start < 1.0
    finally:
        for client in comm.clients.values():
            client.close()
