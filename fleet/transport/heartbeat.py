"""A worker's heartbeats: every server of the job is pinged, and silence is an error.

A ``Heartbeat`` runs one daemon thread with a DEALER of its own per server (apart from
the request clients, so a heartbeat never waits behind a long request). Every
FLEET_HEARTBEAT_MS it sends each server a "heartbeat"; the servers answer from their
serving thread and note when they last heard from this worker, which is how a server
learns that a worker died. A server that has not answered for FLEET_HEARTBEAT_TIMEOUT_MS
is lost: ``check()`` raises ``ServerLostError`` naming it from then on; so is a server
whose replies come from another process than before (it was restarted at the same
endpoint and lost what it held). A heartbeat reply may also carry ``failed`` (a server's
account of why the job cannot go on, e.g. a lost worker); ``check()`` then raises
``ServerError(endpoint, that text)``.

The first failure seen is the one reported, in every thread that checks. Clients given
the Heartbeat as ``liveness`` check it while they wait, so every blocked call of the
worker ends within about FLEET_HEARTBEAT_TIMEOUT_MS of a server's death.
"""
import logging
import threading
import time

import zmq

from fleet.errors import ServerError, ServerLostError, TransportError
from fleet.transport import message, settings
from fleet.transport.client import connect_dealer
from fleet.transport.server import HEARTBEAT_OP, parse_endpoint

log = logging.getLogger("fleet.transport")

_MAX_CHECK_MS = 100


class Heartbeat:
    """Heartbeats from worker ``worker_id`` to every server in ``endpoints``.

    Args:
        endpoints: "host:port" of every server of the job.
        worker_id: this worker's id, sent in every heartbeat.
        curve: a ``CurveConfig`` (the same as the request clients') or None.
        interval_ms, timeout_ms: default FLEET_HEARTBEAT_MS and FLEET_HEARTBEAT_TIMEOUT_MS.

    Attributes:
        check_ms: how often a waiting Client calls ``check()`` (at most 100 ms).

    Thread-safety: ``check``, ``error`` and ``stop`` may be called from any thread.

    Raises:
        ConfigError: a bad endpoint or heartbeat setting.
    """

    def __init__(self, endpoints, worker_id, curve=None, interval_ms=None, timeout_ms=None):
        for endpoint in endpoints:
            parse_endpoint(endpoint)
        default_interval, default_timeout = settings.heartbeat_settings()
        self.endpoints = list(dict.fromkeys(endpoints))
        self.worker_id = int(worker_id)
        self.curve = curve
        self.interval_ms = int(interval_ms or default_interval)
        self.timeout_ms = int(timeout_ms or default_timeout)
        self.check_ms = max(1, min(_MAX_CHECK_MS, self.interval_ms))
        self._error = None
        self._stop = threading.Event()
        self._thread = None
        self._last_reply = {}
        self._instances = {}  # endpoint -> the server instance that answered first

    @property
    def error(self):
        """The first failure seen (ServerLostError or ServerError), or None."""
        return self._error

    def check(self):
        """Raises the first failure seen, as a fresh exception; returns None if there is none.
        Never blocks.

        Raises:
            ServerLostError: a server stopped answering heartbeats (names it and for how long).
            ServerError: a server reported that the job failed (e.g. a worker was lost).
        """
        error = self._error
        if error is not None:
            cls, args = error.__reduce__()[:2]
            raise cls(*args)

    def start(self):
        """Starts the heartbeat thread (connects every socket first); a failure seen by an
        earlier run is forgotten. Not re-entrant.

        Raises:
            ConfigError, TransportError: a socket cannot be made (e.g. CURVE keys missing).
        """
        if self._thread is not None:
            raise TransportError("the heartbeat of worker %d is already running" % self.worker_id)
        socks = {}
        try:
            for endpoint in self.endpoints:
                socks[endpoint] = connect_dealer(endpoint, self.curve, settings.max_message_bytes())
        except BaseException:
            for sock in socks.values():
                sock.close(linger=0)
            raise
        now = time.monotonic()
        self._last_reply = dict.fromkeys(self.endpoints, now)
        self._instances = {}
        self._error = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(socks,), name=f"fleet-heartbeat-{self.worker_id}",
                                        daemon=True)
        self._thread.start()

    def stop(self):
        """Stops the thread and closes its sockets; blocks up to about one interval. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(self.interval_ms / 1000.0 + 5.0)

    def last_replies(self):
        """Returns {endpoint: seconds since its last heartbeat reply} (a snapshot)."""
        now = time.monotonic()
        return {ep: now - t for ep, t in dict(self._last_reply).items()}

    def __repr__(self):
        return (f"Heartbeat(worker={self.worker_id}, servers={len(self.endpoints)}, "
                f"every {self.interval_ms} ms, timeout {self.timeout_ms} ms)")

    # ------------------------------------------------------------------------ private

    def _run(self, socks):
        by_socket = {sock: ep for ep, sock in socks.items()}
        poller = zmq.Poller()
        for sock in socks.values():
            poller.register(sock, zmq.POLLIN)
        interval = self.interval_ms / 1000.0
        next_beat = time.monotonic()
        seq = 0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_beat:
                    seq += 1
                    frames = message.encode(HEARTBEAT_OP, seq, self.worker_id)
                    for sock in socks.values():
                        try:
                            sock.send_multipart(frames, zmq.NOBLOCK)
                        except zmq.Again:
                            pass  # the queue to a server that does not read is full: silence counts
                    next_beat = now + interval
                wait_ms = max(1, int((next_beat - time.monotonic()) * 1000))
                for sock, _ in poller.poll(min(wait_ms, self.check_ms)):
                    self._receive(sock, by_socket[sock])
                self._find_silent()
        except Exception as e:  # noqa: BLE001 - a broken heartbeat must fail the job loudly
            log.exception("fleet: the heartbeat thread of worker %d failed", self.worker_id)
            if self._error is None:
                self._error = TransportError(f"the heartbeat thread of worker {self.worker_id} failed "
                                             f"({type(e).__name__}: {e}); liveness is no longer known")
        finally:
            for sock in socks.values():
                sock.close(linger=0)

    def _receive(self, sock, endpoint):
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = message.decode(frames, reply=True)
            except TransportError as e:
                log.warning("fleet: malformed heartbeat reply from server %s: %s", endpoint, e)
                continue
            if not reply.header.get("ok"):
                log.warning("fleet: server %s refused a heartbeat: %s", endpoint, reply.header.get("error"))
                continue
            instance = self._instances.setdefault(endpoint, reply.header.get("instance"))
            if instance != reply.header.get("instance"):
                self._fail(ServerLostError(endpoint, (
                    f"server {endpoint} was restarted: another process answers there now, without what the "
                    f"job had trained; restart the job from its last checkpoint")))
                continue
            self._last_reply[endpoint] = time.monotonic()
            failed = reply.header.get("failed")
            if isinstance(failed, str):
                self._fail(ServerError(endpoint, failed))

    def _fail(self, error):
        if self._error is None:
            self._error = error
            log.error("fleet: worker %d: %s", self.worker_id, error)

    def _find_silent(self):
        if self._error is not None:
            return
        now = time.monotonic()
        for endpoint, last in self._last_reply.items():
            silence = now - last
            if silence * 1000 > self.timeout_ms:
                self._fail(ServerLostError(endpoint, (
                    f"server {endpoint} stopped answering heartbeats: none for {silence:.1f} s "
                    f"({settings.HEARTBEAT_TIMEOUT_MS_ENV}={self.timeout_ms}); it is dead, stuck or unreachable. "
                    f"Check that it is running and its log (serverlog.N under fleetrun); if it is only slow to "
                    f"answer, raise {settings.HEARTBEAT_TIMEOUT_MS_ENV} on every process")))
                return
