"""Closing what CURVE needs never waits without bound: the ZAP authenticator thread and
the ZeroMQ context each get fleet.transport.curve.STOP_TIMEOUT_S (pyzmq's own
ThreadAuthenticator.stop() and Context.term() wait forever)."""
import logging
import threading
import time

import pytest
import zmq
from zmq.auth.thread import ThreadAuthenticator

from fleet.transport.curve import stop_authenticator, terminate_context


def test_a_running_authenticator_stops_and_closes_its_sockets():
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    thread = auth.thread
    assert thread.is_alive()
    assert stop_authenticator(auth, "rank 0 of the worker group", timeout_s=5) is True
    assert not thread.is_alive() and auth.thread is None and auth.pipe is None and auth.zap_socket is None
    assert terminate_context(ctx, "rank 0 of the worker group", timeout_s=5) is True  # no socket left open


class _StuckAuth:
    """An authenticator whose thread never reads its pipe."""

    def __init__(self, ctx):
        self.release = threading.Event()
        self.thread = threading.Thread(target=self.release.wait, daemon=True)
        self.thread.start()
        self.pipe = ctx.socket(zmq.PAIR)
        self.pipe.linger = 0
        self.pipe.bind("inproc://stuck-auth")
        self.peer = ctx.socket(zmq.PAIR)
        self.peer.linger = 0
        self.peer.connect("inproc://stuck-auth")
        self.zap_socket = None


def _gives_up(caplog, call):
    """call()'s result, checking it returned after its 0.3 s bound and well before 3 s."""
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fleet.transport"):
        result = call()
    assert 0.25 < time.monotonic() - started < 3
    return result


def test_a_stuck_authenticator_is_left_behind_with_a_warning_naming_the_owner(caplog):
    ctx = zmq.Context()
    auth = _StuckAuth(ctx)
    try:
        assert _gives_up(caplog, lambda: stop_authenticator(auth, "rank 2 of the worker group", timeout_s=0.3)) is False
        assert "rank 2 of the worker group: the CURVE authenticator thread did not stop within 0.3 s" in caplog.text
        assert auth.pipe is not None  # left open: its thread may still use it
    finally:
        auth.release.set()
        auth.thread.join(5)
        for sock in (auth.pipe, auth.peer):
            sock.close(linger=0)
        ctx.term()


def test_a_context_with_an_open_socket_is_left_to_the_process_with_a_warning(caplog):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        assert _gives_up(caplog, lambda: terminate_context(ctx, "rank 1 of the worker group", timeout_s=0.3)) is False
        assert "rank 1 of the worker group: its ZeroMQ context did not terminate within 0.3 s" in caplog.text
    finally:
        sock.close(linger=0)  # the pending term() in its daemon thread then returns


@pytest.mark.parametrize("alive", [True, False])
def test_an_authenticator_whose_thread_ended_is_closed_without_waiting(alive):
    ctx = zmq.Context()
    auth = ThreadAuthenticator(ctx)
    auth.start()
    if not alive:  # its thread ended by itself (TERMINATE received elsewhere)
        auth.pipe.send(b"TERMINATE")
        auth.thread.join(5)
    assert stop_authenticator(auth, "servers", timeout_s=5) is True
    assert auth.pipe is None and auth.zap_socket is None
    assert terminate_context(ctx, "servers", timeout_s=5) is True
