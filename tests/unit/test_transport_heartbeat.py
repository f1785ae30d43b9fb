"""Heartbeats on 127.0.0.1: a live server keeps a worker going, a dead or silent one is
named within the timeout (also to a client blocked on a reply), a server's failure report
reaches the worker, and a threaded server answers heartbeats while its handler is busy."""
import contextlib
import threading
import time

import numpy as np
import pytest

from fleet.errors import ConfigError, FleetTimeoutError, ServerError, ServerLostError, TransportError
from fleet.transport import Client, Heartbeat, ServerSocket, serving as serve_with
from fleet.transport import server as server_module
from fleet.transport import settings

INTERVAL_MS, TIMEOUT_MS = 50, 400


def handler(request):
    """"echo" answers at once; "park" is deferred and never answered (a sync step
    waiting for a worker that never comes); "sleep" blocks the handler for meta seconds."""
    if request.op == "echo":
        request.reply(request.names, request.arrays)
    elif request.op == "park":
        request.defer()
    elif request.op == "sleep":
        time.sleep(request.meta["seconds"])
        request.reply(meta={"slept": True})
    else:
        raise ValueError(f"unknown op {request.op!r}")


@contextlib.contextmanager
def serving(threaded=False, **kw):
    server = ServerSocket("127.0.0.1:0")
    with serve_with(server, handler, poll_ms=20, threaded=threaded, **kw):
        yield server


@contextlib.contextmanager
def heartbeat_of(*endpoints, worker=3):
    beat = Heartbeat(endpoints, worker, interval_ms=INTERVAL_MS, timeout_ms=TIMEOUT_MS)
    beat.start()
    try:
        yield beat
    finally:
        beat.stop()


def wait_for_error(beat, limit):
    start = time.monotonic()
    while beat.error is None:
        assert time.monotonic() - start < limit, f"no failure seen within {limit} s"
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_live_server_answers_every_heartbeat_and_hears_the_worker():
    with serving() as server, heartbeat_of(server.endpoint) as beat:
        time.sleep(0.6)
        beat.check()  # no failure
        assert beat.error is None
        assert server.stats()["heartbeats"] >= 6
        assert time.monotonic() - server.last_heard()[3] < 0.2
        assert beat.last_replies()[server.endpoint] < 0.2


def test_a_server_that_stops_answering_is_named_within_the_timeout():
    server = ServerSocket("127.0.0.1:0")
    endpoint = server.endpoint
    beat = Heartbeat([endpoint], 3, interval_ms=INTERVAL_MS, timeout_ms=TIMEOUT_MS)
    try:
        with serve_with(server, handler, poll_ms=20):
            beat.start()
            time.sleep(0.2)
            assert beat.error is None
        waited = wait_for_error(beat, 5)  # the socket is closed: heartbeats go unanswered
    finally:
        beat.stop()
    assert (TIMEOUT_MS - 2 * INTERVAL_MS) / 1000 <= waited < TIMEOUT_MS / 1000 + 2
    with pytest.raises(ServerLostError) as error:
        beat.check()
    assert isinstance(error.value, FleetTimeoutError) and error.value.endpoint == endpoint
    assert str(error.value).startswith(f"server {endpoint} stopped answering heartbeats: none for 0.")
    assert f"(FLEET_HEARTBEAT_TIMEOUT_MS={TIMEOUT_MS}); it is dead, stuck or unreachable" in str(error.value)


def test_one_silent_server_of_two_fails_the_worker_and_is_the_one_named():
    with serving() as alive, contextlib.ExitStack() as doomed_stack:
        doomed = doomed_stack.enter_context(serving())
        with heartbeat_of(alive.endpoint, doomed.endpoint) as beat:
            time.sleep(0.1)
            doomed_stack.close()  # stops serving and closes the socket: silence
            wait_for_error(beat, 5)
            assert beat.error.endpoint == doomed.endpoint
            assert beat.last_replies()[alive.endpoint] < 0.2


def test_a_client_blocked_on_a_reply_raises_when_the_server_goes_silent_not_at_its_timeout():
    with contextlib.ExitStack() as server_stack, contextlib.ExitStack() as stack:
        server = server_stack.enter_context(serving())
        beat = stack.enter_context(heartbeat_of(server.endpoint))
        client = stack.enter_context(Client(server.endpoint, 3, timeout_ms=60_000, liveness=beat))
        outcome = {}

        def wait_parked():
            start = time.monotonic()
            try:
                client.request("park")
            except Exception as e:  # noqa: BLE001 - inspected below
                outcome["error"] = e
            outcome["seconds"] = time.monotonic() - start

        waiter = threading.Thread(target=wait_parked)
        waiter.start()
        time.sleep(0.2)
        server_stack.close()  # the parked request will never be answered
        waiter.join(10)
        assert not waiter.is_alive()
        assert isinstance(outcome["error"], ServerLostError)
        assert outcome["error"].endpoint == server.endpoint
        assert outcome["seconds"] < TIMEOUT_MS / 1000 + 2
        with pytest.raises(ServerLostError):  # nothing more is sent once the job failed
            client.send_request("echo")


def test_a_failure_a_server_reports_in_its_heartbeat_replies_is_raised_by_waiting_clients():
    text = "worker 1 was lost: it stopped sending heartbeats 2.0 s ago"
    with serving() as server, heartbeat_of(server.endpoint) as beat:
        with Client(server.endpoint, 3, timeout_ms=60_000, liveness=beat) as client:
            seq = client.send_request("park")
            server.set_heartbeat_status({"failed": text})
            start = time.monotonic()
            with pytest.raises(ServerError) as error:
                client.recv_reply(seq)
            assert time.monotonic() - start < 1.0
            assert error.value.endpoint == server.endpoint and error.value.message == text
            assert str(error.value) == f"server {server.endpoint} failed: {text}"


def test_a_threaded_server_answers_heartbeats_while_its_handler_is_busy_longer_than_the_timeout():
    with serving(threaded=True, join_timeout=10) as server, heartbeat_of(server.endpoint) as beat:
        with Client(server.endpoint, 3, timeout_ms=10_000, liveness=beat) as client:
            reply = client.request("sleep", meta={"seconds": 3 * TIMEOUT_MS / 1000})
        assert reply.meta == {"slept": True}
        assert beat.error is None
        assert server.stats()["heartbeats"] >= 10


def test_a_threaded_server_serves_handler_errors_and_ticks_in_the_handler_thread():
    ticks = []

    def tick():
        ticks.append(threading.current_thread().name)

    with serving(threaded=True, tick=tick) as server, Client(server.endpoint, 0, timeout_ms=5000) as client:
        echoed = client.request("echo", ["x"], [np.arange(3, dtype=np.int64)])
        with pytest.raises(ServerError, match="unknown op 'nope'"):
            client.request("nope")
        time.sleep(0.1)
    assert echoed["x"].tolist() == [0, 1, 2]
    assert ticks and set(ticks) == {f"fleet-handle-{server.port}"}
    assert server.stats()["handler_errors"] == 1


def test_a_tick_that_raises_stops_serving_and_its_error_comes_out_of_serve():
    server = ServerSocket("127.0.0.1:0")
    stop = threading.Event()

    def tick():
        raise RuntimeError("liveness check broke")

    try:
        with pytest.raises(RuntimeError, match="liveness check broke"):
            server.serve(handler, stop, poll_ms=10, tick=tick, threaded=True)
        assert stop.is_set()
    finally:
        server.close()


def test_a_full_handler_queue_holds_requests_back_without_losing_any(monkeypatch):
    monkeypatch.setattr(server_module, "_INBOX_SIZE", 2)
    release = threading.Event()

    def gated(request):
        release.wait(10)
        request.reply(meta={"echo": request.seq})

    server = ServerSocket("127.0.0.1:0")
    with serve_with(server, gated, poll_ms=20, threaded=True, join_timeout=10):
        with Client(server.endpoint, 0, timeout_ms=10_000) as client:
            seqs = [client.send_request("gate") for _ in range(20)]
            time.sleep(0.2)
            assert server.stats()["received"] < 20  # the rest wait in ZeroMQ's queue
            release.set()
            assert [client.recv_reply(s).meta["echo"] for s in seqs] == seqs


def test_heartbeat_settings_are_checked_together(monkeypatch):
    monkeypatch.setenv("FLEET_HEARTBEAT_MS", "200")
    monkeypatch.setenv("FLEET_HEARTBEAT_TIMEOUT_MS", "2000")
    assert settings.heartbeat_settings() == (200, 2000)
    monkeypatch.setenv("FLEET_HEARTBEAT_TIMEOUT_MS", "300")
    with pytest.raises(ConfigError) as error:
        settings.heartbeat_settings()
    assert str(error.value) == (
        "FLEET_HEARTBEAT_TIMEOUT_MS=300 is shorter than two heartbeats of FLEET_HEARTBEAT_MS=200: one late "
        "heartbeat would count as a dead peer; make the timeout at least 400 (the defaults are 1000 and 15000)")
    monkeypatch.setenv("FLEET_HEARTBEAT_MS", "soon")
    with pytest.raises(ConfigError, match="FLEET_HEARTBEAT_MS='soon' is not an integer >= 1; set FLEET_HEARTBEAT_MS to the "
                       "milliseconds between heartbeats, or unset it to use the default 1000"):
        Heartbeat(["127.0.0.1:1"], 0)
    monkeypatch.delenv("FLEET_HEARTBEAT_MS")
    monkeypatch.delenv("FLEET_HEARTBEAT_TIMEOUT_MS")
    assert settings.heartbeat_settings() == (1000, 15000)


def test_a_wait_on_a_live_server_ends_when_another_server_of_the_job_dies():
    # e.g. a barrier on server 0 while server 1 dies: the job cannot go on, so the wait ends
    with serving() as alive, contextlib.ExitStack() as doomed_stack:
        doomed = doomed_stack.enter_context(serving())
        with heartbeat_of(alive.endpoint, doomed.endpoint) as beat, \
                Client(alive.endpoint, 3, timeout_ms=60_000, liveness=beat) as client:
            seq = client.send_request("park")
            threading.Timer(0.2, doomed_stack.close).start()
            start = time.monotonic()
            with pytest.raises(ServerLostError) as error:
                client.recv_reply(seq)
            assert error.value.endpoint == doomed.endpoint
            assert time.monotonic() - start < 0.2 + TIMEOUT_MS / 1000 + 2


def _rebind(endpoint, within_s=5.0):
    """A new ServerSocket on the port a closed one held: ZeroMQ releases a port in its I/O
    thread after close returns, so the first bind attempts may find it still taken."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return ServerSocket(endpoint)
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_server_restarted_at_the_same_endpoint_counts_as_lost():
    first = ServerSocket("127.0.0.1:0")
    endpoint = first.endpoint
    with heartbeat_of(endpoint) as beat:
        with serve_with(first, handler, poll_ms=20):
            time.sleep(0.2)
            assert beat.error is None
        with serve_with(_rebind(endpoint), handler, poll_ms=20) as second:
            wait_for_error(beat, 3)
            assert second.stats()["heartbeats"] >= 1  # it answered: not silence, another instance
        assert isinstance(beat.error, ServerLostError) and beat.error.endpoint == endpoint
        assert str(beat.error) == (f"server {endpoint} was restarted: another process answers there now, "
                                   f"without what the job had trained; restart the job from its last checkpoint")
