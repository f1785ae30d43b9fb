"""The worker side of the wire: one DEALER per (worker, server) pair.

A request carries a sequence number and its reply echoes it; replies to requests that
timed out are recognised and dropped. ``send_request`` + ``recv_reply`` pipeline
requests, so one thread can keep several servers busy (``request_all``).

Threading: a Client is meant for one thread at a time. Its methods take the client's
lock, so concurrent use is safe but serialized (a thread waiting for a reply holds the
lock until the reply or the timeout). Use one Client per thread for parallel traffic.

Liveness: a Client given a ``liveness`` object (a ``fleet.transport.Heartbeat``) calls
its ``check()`` before each request and, while it waits for a reply, at least every
``liveness.check_ms`` milliseconds, so a wait on a server that died, or on a job that
failed elsewhere, ends with that error instead of running into the reply timeout.
"""
import logging
import math
import threading
import time

import zmq

from fleet.errors import FleetTimeoutError, ServerError, TransportError
from fleet.logs import WaitLog, wait_log_ms
from fleet.transport import message, settings
from fleet.transport.counters import WIRE, frames_bytes
from fleet.transport.curve import KEYS_DIR_ENV
from fleet.transport.server import PING_OP, parse_endpoint

log = logging.getLogger("fleet.transport")

Reply = message.Message
"""A decoded reply: ``header``, ``arrays``, ``reply[name]``, ``reply.meta``."""


class Client:
    """A connection from worker ``worker_id`` to the server at ``endpoint``.

    Connecting never blocks: ZeroMQ connects (and reconnects) in the background, and a
    request made before the server is up is delivered when it comes up.

    Args:
        endpoint: "host:port" of the server.
        worker_id: this worker's id (int), sent in every header.
        curve: a ``CurveConfig`` to authenticate with, or None (CURVE off).
        timeout_ms: default reply timeout (default FLEET_RPC_TIMEOUT_MS).
        max_message_bytes: largest request sent (default FLEET_MAX_MESSAGE_BYTES).
        liveness: an object with ``check()`` (raises when the job cannot go on) and
            ``check_ms``, or None.
        counters: the ``WireCounters`` that count this client's requests, replies and
            their bytes (default: the process-wide ``fleet.transport.counters.WIRE``).

    Raises:
        ConfigError: a bad endpoint or incomplete CURVE keys.
    """

    def __init__(self, endpoint, worker_id, curve=None, timeout_ms=None, max_message_bytes=None, liveness=None,
                 counters=None):
        parse_endpoint(endpoint)
        self.endpoint = endpoint
        self.worker_id = int(worker_id)
        self.curve = curve
        self.timeout_ms = int(timeout_ms or settings.rpc_timeout_ms())
        self.max_message_bytes = max_message_bytes or settings.max_message_bytes()
        self.liveness = liveness
        self.counters = WIRE if counters is None else counters
        self._wait_first_s = wait_log_ms() / 1000.0
        self._lock = threading.RLock()
        self._seq = 0
        self._pending = {}  # seq -> op, for requests whose reply is still wanted
        self._arrived = {}  # seq -> Message that arrived before it was asked for
        self.stale_replies = 0
        self._sock = None
        self._connect()

    # ------------------------------------------------------------------------ requests

    def request(self, op, names=(), arrays=(), meta=None, timeout_ms=None):
        """Sends a request and waits for its reply. Blocks up to the timeout.

        Args:
            op: operation name; names, arrays: the arrays to send (unique names; dtypes
                float32, int64, uint8, float64, int32; C-contiguous; sent without a copy, so
                do not modify them before this returns); meta: op-specific header fields.
            timeout_ms: reply timeout (default: the client's).

        Returns:
            the Reply (``reply[name]`` is an array, ``reply.meta`` the op-specific fields).

        Raises:
            ServerError: the server answered with an error (endpoint and its message).
            FleetTimeoutError: no reply in time (names the endpoint, the op and the limit).
            ServerLostError: (with liveness) a server of the job stopped answering heartbeats.
            TransportError: invalid arguments or a malformed reply.
        """
        with self._lock:
            seq = self.send_request(op, names, arrays, meta, timeout_ms)
            return self.recv_reply(seq, timeout_ms)

    def send_request(self, op, names=(), arrays=(), meta=None, timeout_ms=None):
        """Queues a request and returns its sequence number without waiting for the reply.

        The arrays are sent without a copy: do not modify them before ``recv_reply``
        returns. Blocks only if ZeroMQ's send queue is full (up to the timeout).

        Raises:
            FleetTimeoutError: the send queue stayed full (the server is not reading).
            TransportError: invalid arguments, or the client is closed.
            ServerError, ServerLostError: (with liveness) the job has failed already.
        """
        with self._lock:
            self._check_open()
            if self.liveness is not None:
                self.liveness.check()
            seq = self._seq + 1
            frames = message.encode(op, seq, self.worker_id, names, arrays, meta,
                                    max_bytes=self.max_message_bytes)
            timeout = self._timeout(timeout_ms)
            self._sock.sndtimeo = timeout
            try:
                self._sock.send_multipart(frames, copy=False)
            except zmq.Again:
                raise FleetTimeoutError(
                    f"could not send {op!r} to server {self.endpoint} within {timeout} ms: its queue is full "
                    f"(the server is not reading); check the server is alive"
                ) from None
            self._seq = seq
            self._pending[seq] = op
            self.counters.sent(op, frames_bytes(frames))
            return seq

    def recv_reply(self, seq, timeout_ms=None):
        """Waits for the reply to request ``seq``. Blocks up to the timeout.

        Replies to other pending requests that arrive meanwhile are kept for their own
        ``recv_reply``; replies to requests nobody waits for any more are dropped.

        Raises:
            ServerError, FleetTimeoutError, TransportError: as ``request``.
        """
        with self._lock:
            self._check_open()
            op = self._pending.get(seq)
            if op is None:
                raise TransportError(f"no request {seq} is pending on the client of {self.endpoint}")
            timeout = self._timeout(timeout_ms)
            started = time.monotonic()
            deadline = started + timeout / 1000.0
            wait = None  # made once the reply is late, so a quick reply costs nothing
            while seq not in self._arrived:
                remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
                slice_ms = remaining_ms
                if self.liveness is not None:
                    slice_ms = min(slice_ms, self.liveness.check_ms)
                due_s = self._wait_first_s if wait is None else wait.next_due_s()
                if due_s:
                    slice_ms = min(slice_ms, max(1, math.ceil(due_s * 1000)))
                if self._sock.poll(slice_ms, zmq.POLLIN):  # poll(0) still sees a queued reply
                    self._receive_one()
                    continue
                if slice_ms >= remaining_ms:
                    del self._pending[seq]
                    self._reset_if_idle()
                    raise FleetTimeoutError(self._timeout_message(op, seq, timeout))
                if self.liveness is not None:
                    self._check_liveness(seq)
                if wait is None:
                    wait = WaitLog(f"server {self.endpoint} to answer {op!r} (request {seq} of worker "
                                   f"{self.worker_id})", limit=f"giving up after {timeout} ms "
                                   f"({settings.RPC_TIMEOUT_MS_ENV} or timeout_ms=)",
                                   logger=log, first_s=self._wait_first_s, started=started)
                wait.tick()
            del self._pending[seq]
            reply = self._arrived.pop(seq)
            if not reply.header["ok"]:
                raise ServerError(self.endpoint, reply.header["error"])
            return reply

    def cancel(self, seq):
        """Stops waiting for request ``seq``: its reply, if it comes, is dropped."""
        with self._lock:
            self._pending.pop(seq, None)
            self._arrived.pop(seq, None)

    def ping(self, timeout_ms=None):
        """Returns True if the server answers a ping within the timeout, else False."""
        try:
            self.request(PING_OP, timeout_ms=timeout_ms)
            return True
        except FleetTimeoutError:
            return False

    def close(self):
        """Closes the socket (linger 0: unsent requests are dropped). Idempotent."""
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
            self._pending.clear()
            self._arrived.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Client({self.endpoint!r}, worker={self.worker_id})"

    # ------------------------------------------------------------------------ private

    def _connect(self):
        self._sock = connect_dealer(self.endpoint, self.curve, self.max_message_bytes)

    def _receive_one(self):
        frames = self._sock.recv_multipart(copy=False)
        try:
            reply = message.decode(frames, reply=True)
        except TransportError as e:
            raise TransportError(f"server {self.endpoint} sent a malformed reply: {e}") from e
        seq = reply.header["seq"]
        # counted under the op this client sent (a late reply under "stale"), never a name the peer chose
        self.counters.received(self._pending.get(seq, "stale"), frames_bytes(frames))
        if seq in self._pending:
            self._arrived[seq] = reply
        else:
            self.stale_replies += 1

    def _check_liveness(self, seq):
        try:
            self.liveness.check()
        except BaseException:
            self._pending.pop(seq, None)  # a reply that still comes is dropped as stale
            raise

    def _reset_if_idle(self):
        # After a timeout with nothing else in flight, start over on a fresh socket so an
        # undelivered request is not sent later when the server comes back.
        if not self._pending:
            self._sock.close(linger=0)
            self._sock = None
            self._arrived.clear()
            self._connect()

    def _timeout(self, timeout_ms):
        return int(self.timeout_ms if timeout_ms is None else timeout_ms)

    def _timeout_message(self, op, seq, timeout):
        text = (f"server {self.endpoint} did not answer {op!r} (request {seq} of worker {self.worker_id}) "
                f"within {timeout} ms; it may be down, unreachable or stuck. Raise the limit with "
                f"{settings.RPC_TIMEOUT_MS_ENV} (or timeout_ms=) if it is only slow.")
        if self.curve is None:
            text += (f" If the servers use CURVE authentication ({KEYS_DIR_ENV} or FLEET_CURVE_* variables), "
                     f"this process needs the same keys.")
        else:
            text += (" This client uses CURVE: check that the server authorizes this client's public key and "
                     "that this client has the server's public key.")
        return text

    def _check_open(self):
        if self._sock is None:
            raise TransportError(f"the client of {self.endpoint} is closed")


def connect_dealer(endpoint, curve, max_message_bytes):
    """Returns a new DEALER socket connected (in the background) to ``endpoint``.

    Linger 0; frames over ``max_message_bytes`` plus the header limit are cut off by
    ZeroMQ; CURVE applied when ``curve`` is a CurveConfig.
    """
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + message.MAX_HEADER_BYTES)
        if curve is not None:
            curve.apply_client(sock)
        sock.ipv6 = endpoint.startswith("[")
        sock.connect(f"tcp://{endpoint}")
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def request_all(requests, timeout_ms=None):
    """Sends one request to each of several servers at once and waits for every reply.

    Args:
        requests: iterable of (client, op, names, arrays, meta) tuples (names, arrays
            and meta may be left out); distinct clients run in parallel.
        timeout_ms: overall limit (default: each client's own).

    Returns:
        the replies, in the order of ``requests``.

    Raises:
        FleetTimeoutError: some servers did not answer; the message names all of them.
        ServerError: a server answered with an error (the first one, after all replies
            were collected, so no reply is left behind).
    """
    calls = [tuple(r) + ((), (), None)[len(r) - 2:] for r in requests]
    seqs = []
    try:
        for client, op, names, arrays, meta in calls:
            seqs.append(client.send_request(op, names, arrays, meta, timeout_ms))
    except BaseException:
        for (client, *_), seq in zip(calls, seqs):
            client.cancel(seq)
        raise
    start = time.monotonic()
    replies, timeouts, first_error = [], [], None
    for (client, op, *_), seq in zip(calls, seqs):
        limit = client._timeout(timeout_ms)
        left = max(0, int(limit - (time.monotonic() - start) * 1000))
        try:
            replies.append(client.recv_reply(seq, left))
        except FleetTimeoutError:
            timeouts.append(f"{client.endpoint} ({op!r})")
            replies.append(None)
        except (ServerError, TransportError) as e:
            first_error = first_error or e
            replies.append(None)
    if timeouts:
        raise FleetTimeoutError(
            f"servers {', '.join(timeouts)} did not answer within "
            f"{f'{timeout_ms} ms' if timeout_ms is not None else 'their timeout'}"
            f"{'; the others did' if len(timeouts) < len(calls) else ''}. Check those servers are alive, "
            f"or raise {settings.RPC_TIMEOUT_MS_ENV}"
        )
    if first_error is not None:
        raise first_error
    return replies


def wait_for_servers(endpoints, timeout_ms=None, worker_id=-1, curve=None, retry_ms=1000):
    """Pings every endpoint until each has answered once. Blocks up to the timeout.

    Args:
        endpoints: "host:port" strings.
        timeout_ms: overall limit (default FLEET_CONNECT_TIMEOUT_MS).
        worker_id: sent in the pings; curve: CURVE keys or None.
        retry_ms: how long one ping waits before it is sent again.

    Raises:
        FleetTimeoutError: names the endpoints that never answered and how to wait longer.
    """
    timeout = int(timeout_ms or settings.connect_timeout_ms())
    deadline = time.monotonic() + timeout / 1000.0
    clients = {ep: Client(ep, worker_id, curve=curve, timeout_ms=retry_ms) for ep in dict.fromkeys(endpoints)}
    for client in clients.values():
        client._wait_first_s = 0  # one ping's wait is not logged: the whole wait below is
    wait = WaitLog(f"{'server' if len(clients) == 1 else 'servers'} {', '.join(clients)}",
                   limit=f"giving up after {timeout / 1000:g} s ({settings.CONNECT_TIMEOUT_MS_ENV})", logger=log)
    try:
        waiting = dict(clients)
        while waiting:
            if len(waiting) < len(clients):
                wait.tick(f"{len(clients) - len(waiting)} of {len(clients)} answered; not yet {', '.join(waiting)}")
            else:
                wait.tick(f"none of {len(clients)} answered yet" if len(clients) > 1 else "no answer yet")
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            # Servers that answered are pinged on every round too: a server counts a worker's
            # pings as its heartbeats, and one that heard a ping and then nothing for
            # FLEET_HEARTBEAT_TIMEOUT_MS (this worker waiting for a server that starts
            # later, as after a restart on another host) would declare this worker lost.
            per_ping = max(1, min(retry_ms, settings.heartbeat_ms(), left_ms))
            seqs = {}
            for ep, client in clients.items():
                try:
                    seqs[ep] = client.send_request(PING_OP, timeout_ms=per_ping)
                except FleetTimeoutError:
                    # no connection took the ping (a server not up yet, or one whose CURVE
                    # handshake fails): not answered this round, as a ping without a reply
                    pass
            round_end = time.monotonic() + per_ping / 1000.0
            for ep, client in clients.items():
                if ep not in seqs:
                    continue
                left = max(1, min(int((round_end - time.monotonic()) * 1000), int((deadline - time.monotonic()) * 1000)))
                try:
                    client.recv_reply(seqs[ep], left)
                    waiting.pop(ep, None)
                except FleetTimeoutError:
                    pass
        if waiting:
            hint = (f" If the servers use CURVE ({KEYS_DIR_ENV} / FLEET_CURVE_*), this process needs the keys too."
                    if curve is None else " Check this process's CURVE keys match the servers'.")
            raise FleetTimeoutError(
                f"servers {sorted(waiting)} did not answer within {timeout} ms"
                f"{' (the others did)' if len(waiting) < len(clients) else ''}. Check they are started and "
                f"reachable from here, or wait longer with {settings.CONNECT_TIMEOUT_MS_ENV}.{hint}"
            )
    finally:
        for client in clients.values():
            client.close()
