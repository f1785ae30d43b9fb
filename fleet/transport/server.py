"""The server side of the wire: a ROUTER socket, a serve loop and requests to answer.

Threading: ZeroMQ sockets are not thread-safe, so only the thread running ``serve`` /
``serve_once`` touches the socket. A handler may answer a request at once, or call
``request.defer()`` and answer later from any thread (a sync barrier answers every
waiting worker when the last one arrives): such a reply is queued and the serving thread
is woken through a pipe it polls next to the socket, then sends it.

Liveness: the serving thread itself answers "ping" and "heartbeat" and records when it
last heard from each worker id (``last_heard``). With ``serve(..., threaded=True)`` the
handler runs in a thread of its own, so a handler that takes long (a checkpoint of a big
table, a first-call compilation) does not keep heartbeats waiting: workers only see a
server as dead when its process is.
"""
import collections
import contextlib
import errno
import logging
import os
import queue
import threading
import time

import zmq

from fleet import endpoints
from fleet.errors import ConfigError, FleetError, FleetTimeoutError, TransportError
from fleet.transport import message, settings
from fleet.transport.counters import frames_bytes
from fleet.transport.curve import zap_registry

log = logging.getLogger("fleet.transport")

PING_OP = "ping"
HEARTBEAT_OP = "heartbeat"
_BATCH = 256  # messages handled per wake-up before checking the reply queue and the stop flag
_INBOX_SIZE = 1024  # requests waiting for the handler thread; more wait in ZeroMQ's queues
_FULL_POLL_MS = 5  # how often a serving thread with a full inbox looks for room
_HANDLER_JOIN_S = 60.0
_WARN_EVERY_S = 1.0  # handler failures logged at most this often (all are counted)


def parse_endpoint(endpoint, allow_port_zero=False):
    """Returns (host, port) of "host:port" (`fleet.endpoints` rules; an IPv6 host in brackets).

    Args:
        endpoint: the text.
        allow_port_zero: accept port 0 (bind any free port).

    Raises:
        ConfigError: the text is not host:port with a port in 1..65535 (0..65535 with
            ``allow_port_zero``).
    """
    return endpoints.parse_endpoint(endpoint, "endpoint", ConfigError, allow_port_zero)


class Request(message.Message):
    """A decoded request, with the means to answer it (once).

    ``reply`` / ``reply_error`` may be called from the serving thread (sent at once) or,
    after ``defer()``, from any thread (queued for the serving thread). Arrays are sent
    without a copy: do not modify them after passing them to ``reply``.
    """

    __slots__ = ("_server", "_identity", "_answered", "deferred")

    def __init__(self, server, identity, header, arrays):
        super().__init__(header, arrays)
        self._server = server
        self._identity = identity
        self._answered = False
        self.deferred = False

    @property
    def answered(self):
        """True once ``reply`` or ``reply_error`` was called."""
        return self._answered

    def defer(self):
        """Declares that the handler will answer later (possibly from another thread)."""
        if not self.deferred:
            self.deferred = True
            self._server._count("deferred")

    def reply(self, names=(), arrays=(), meta=None):
        """Answers with arrays and op-specific fields. Thread-safe; never blocks.

        Raises:
            TransportError: already answered, or the arrays/meta are invalid (nothing is sent).
        """
        frames = message.encode(self.op, self.seq, self.worker, names, arrays, meta, ok=True,
                                max_bytes=self._server.max_message_bytes)
        self._send(frames)

    def reply_error(self, text):
        """Answers with an error; the worker raises ``ServerError(endpoint, text)``. Thread-safe."""
        frames = message.encode(self.op, self.seq, self.worker, ok=False, error=str(text))
        if self._answered:
            self._send(frames)  # raises
        self._server._count("error_replies")
        self._send(frames)

    def _send(self, frames):
        if self._answered:
            raise TransportError(f"request {self.seq} ({self.op!r} from worker {self.worker}) was already answered")
        self._answered = True
        self._server._post(self._identity, frames)


class ServerSocket:
    """A bound ROUTER socket that serves requests of ``fleet.transport.Client``s.

    Args:
        endpoint: "host:port" to bind; port 0 picks a free port (see ``endpoint`` after).
            With FLEET_BIND_HOST set (e.g. 0.0.0.0) that address is bound instead of the
            host, and ``endpoint`` keeps the host: the name workers connect to.
        curve: a ``CurveConfig`` to require CURVE authentication, or None (off).
        max_message_bytes: largest request accepted (default FLEET_MAX_MESSAGE_BYTES).

    Raises:
        TransportError: the port is taken (the message names it and the fix) or the host
            is not an address of this machine. Never binds another port instead.
        ConfigError: a bad endpoint or incomplete CURVE keys.
    """

    def __init__(self, endpoint, curve=None, max_message_bytes=None):
        host, port = parse_endpoint(endpoint, allow_port_zero=True)
        self.max_message_bytes = max_message_bytes or settings.max_message_bytes()
        self._stats = collections.Counter()
        self._stats_lock = threading.Lock()
        self._outbox = collections.deque()
        self._serving = None
        self._closed = False
        self._close_lock = threading.Lock()
        self._zap_domain = None
        self._last_heard = {}  # worker id -> time.monotonic() of its last valid message
        self._warn_next = 0.0
        self._warn_held = 0
        # Told to workers in every heartbeat reply: a server process restarted at the same
        # endpoint answers with another instance, so workers see that its state is gone.
        self.instance = os.urandom(8).hex()
        self._heartbeat_meta = {"instance": self.instance}
        bind = settings.bind_host() or host
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        try:
            sock.linger = 0
            # a single frame larger than any valid message is cut off by ZeroMQ itself
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes + message.MAX_HEADER_BYTES)
            if curve is not None:
                self._zap_domain = zap_registry.register(curve.authorized_clients)
                curve.apply_server(sock, self._zap_domain)
            sock.ipv6 = ":" in bind
            sock.bind(f"tcp://{endpoints.join_endpoint(bind, port)}")
        except zmq.ZMQError as e:
            self._release(sock)
            raise _bind_error(bind, port, e) from e
        except BaseException:
            self._release(sock)
            raise
        self._sock = sock
        bound = sock.last_endpoint.decode().rpartition(":")[2]
        self.host, self.port = host, int(bound)
        self.endpoint = endpoints.join_endpoint(host, self.port)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)

    def serve(self, handler, stop_event, poll_ms=100, tick=None, threaded=False):
        """Serves requests until ``stop_event`` (a threading.Event) is set. Blocks.

        Each request is decoded and passed to ``handler(request)``, which answers it with
        ``request.reply`` / ``reply_error`` or defers it (``request.defer()``). A handler
        exception becomes an error reply carrying its message; a malformed message is
        answered with an error and counted; "ping" and "heartbeat" are answered here.
        Nothing a peer sends stops the loop.

        Args:
            handler: callable(Request).
            stop_event: checked at least every ``poll_ms`` milliseconds.
            tick: callable() run about every ``poll_ms`` milliseconds in the thread that
                runs ``handler`` (never at the same time as it), e.g. to check liveness.
            threaded: run ``handler`` and ``tick`` in one thread of their own, fed by a
                bounded queue, while this thread only moves messages and answers pings
                and heartbeats; replies then always go through the reply queue.

        Raises:
            Exception: whatever ``tick`` raised (serving stops and ``stop_event`` is set).
            FleetTimeoutError: (threaded) the handler thread did not stop within 60 s of
                ``stop_event`` (a handler that blocks).
        """
        if not threaded:
            while not stop_event.is_set():
                self.serve_once(handler, poll_ms)
                if tick is not None:
                    tick()
            return
        inbox = queue.Queue(_INBOX_SIZE)
        failure = []
        thread = threading.Thread(target=self._run_handler, args=(handler, inbox, stop_event, tick, poll_ms, failure),
                                  name=f"fleet-handle-{self.port}", daemon=True)

        def has_room():
            return not inbox.full()

        thread.start()
        try:
            while not stop_event.is_set():  # only this thread puts, so room seen is room kept
                self._serve_once(inbox.put_nowait, poll_ms, has_room)
        finally:
            stop_event.set()
            thread.join(_HANDLER_JOIN_S)
        if thread.is_alive():
            raise FleetTimeoutError(
                f"the handler thread of {self.endpoint} did not stop within {_HANDLER_JOIN_S:g} s of being "
                f"asked to: a handler is blocking (handlers must answer or defer, never wait)")
        if failure:
            raise failure[0]

    def _run_handler(self, handler, inbox, stop_event, tick, poll_ms, failure):
        period = poll_ms / 1000.0
        next_tick = time.monotonic()
        try:
            while not stop_event.is_set():
                try:
                    request = inbox.get(timeout=period)
                except queue.Empty:
                    request = None
                if request is not None:
                    try:
                        self.dispatch(handler, request)
                    except Exception as e:  # a bug here must not stop the server; logged, counted, answered
                        self._count("internal_errors")
                        log.exception("unexpected error while handling %r on %s", request.op, self.endpoint)
                        if not request.answered:
                            request.reply_error(f"internal server error ({type(e).__name__}: {e})")
                if tick is not None and time.monotonic() >= next_tick:
                    tick()
                    next_tick = time.monotonic() + period
        except BaseException as e:  # noqa: BLE001 - re-raised by serve() in the serving thread
            failure.append(e)
            stop_event.set()

    def serve_once(self, handler, timeout_ms):
        """Waits up to ``timeout_ms`` for requests or queued replies and handles what is ready.

        Returns:
            the number of requests handled.
        """
        return self._serve_once(lambda request: self.dispatch(handler, request), timeout_ms)

    def _serve_once(self, take, timeout_ms, accepting=None):
        # take(request) gets every decoded request but pings and heartbeats; while
        # accepting() is False nothing is read (requests wait in ZeroMQ's queue).
        self._check_open()
        self._serving = threading.get_ident()
        try:
            if accepting is not None and not accepting():
                ready = dict(self._poller.poll(min(timeout_ms, _FULL_POLL_MS)))
                ready.pop(self._sock, None)
            else:
                ready = dict(self._poller.poll(timeout_ms))
            if self._wake_r in ready:
                self._drain_wake()
            self._flush()
            handled = 0
            while self._sock in ready and handled < _BATCH and (accepting is None or accepting()):
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    self._handle(take, frames)
                except Exception as e:  # a bug here must not stop the server; logged, counted, answered
                    self._count("internal_errors")
                    log.exception("unexpected error while handling a message on %s", self.endpoint)
                    self._answer_internal_error(frames, e)
                handled += 1
            self._flush()
            return handled
        finally:
            self._serving = None

    def stats(self):
        """Returns a dict of counters: received, replies, error_replies, malformed, dropped,
        handler_errors, pings, heartbeats, deferred, send_failures, internal_errors, and
        received_bytes / sent_bytes (the frames of every message received and reply sent,
        routing identity excluded). Thread-safe (a snapshot)."""
        keys = ("received", "replies", "error_replies", "malformed", "dropped", "handler_errors",
                "pings", "heartbeats", "deferred", "send_failures", "internal_errors", "received_bytes",
                "sent_bytes")
        with self._stats_lock:
            snapshot = dict(self._stats)
        return {k: snapshot.get(k, 0) for k in keys}

    def last_heard(self):
        """Returns {worker id: time.monotonic() of its last valid message} (ids >= 0 only).

        Every valid request counts, heartbeats included. Thread-safe (a snapshot).
        """
        return dict(self._last_heard)

    def set_heartbeat_status(self, meta):
        """Sets the op-specific fields of every later heartbeat reply (besides "instance",
        this socket's random id, always sent). Thread-safe.

        Args:
            meta: a dict of msgpack-able values with str keys (not the reserved header
                keys), e.g. ``{"failed": "worker 1 stopped sending heartbeats ..."}``.
        """
        self._heartbeat_meta = {**meta, "instance": self.instance}

    def close(self):
        """Closes the socket (linger 0: queued replies are dropped). Call after serving stopped."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._release(self._sock)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"ServerSocket({self.endpoint!r}{', curve' if self._zap_domain else ''})"

    # ---------------------------------------------------------------------- private

    def _handle(self, take, frames):
        with self._stats_lock:
            self._stats["received"] += 1
            self._stats["received_bytes"] += frames_bytes(frames) - len(frames[0]) if frames else 0
        if len(frames) < 2:
            self._count("dropped")
            return
        identity = frames[0].bytes
        try:
            request = message.decode(frames[1:], self.max_message_bytes)
        except TransportError as e:
            self._count("malformed")
            op, seq, worker = message.salvage(frames[1])
            log.debug("malformed message from %r answered with an error: %s", identity, e)
            self._count("error_replies")
            self._post(identity, message.encode(op, seq, worker, ok=False, error=f"malformed message: {e}"))
            return
        request = Request(self, identity, request.header, request.arrays)
        if request.worker >= 0:
            self._last_heard[request.worker] = time.monotonic()
        if request.op == PING_OP:
            self._count("pings")
            request.reply(meta={"endpoint": self.endpoint})
            return
        if request.op == HEARTBEAT_OP:
            self._count("heartbeats")
            request.reply(meta=self._heartbeat_meta)
            return
        take(request)

    def dispatch(self, handler, request):
        """Runs ``handler(request)`` as ``serve`` does: an exception becomes an error reply
        (counted as a handler error), and a request neither answered nor deferred is
        answered with an error. Thread-safe for distinct requests."""
        try:
            handler(request)
        except Exception as e:  # the server keeps serving; the worker sees the message
            self._count("handler_errors")
            text = str(e) if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            suppressed = self._warning_allowed()
            if suppressed is not None:
                log.warning("handler for %r (request %d from worker %d) failed: %s%s", request.op, request.seq,
                            request.worker, text,
                            f" ({suppressed} more failed since the last report)" if suppressed else "",
                            exc_info=not isinstance(e, FleetError))
            if not request.answered:
                request.reply_error(text)
            return
        if not request.answered and not request.deferred:
            request.reply_error(f"the server's handler returned without answering {request.op!r} (a server bug)")

    def _warning_allowed(self):
        # At most one handler-failure warning per _WARN_EVERY_S: a peer sending bad requests
        # in a loop must not flood the log. Returns how many were held back, or None to hold
        # this one back too (stats() counts them all).
        with self._stats_lock:
            now = time.monotonic()
            if now < self._warn_next:
                self._warn_held += 1
                return None
            held, self._warn_held = self._warn_held, 0
            self._warn_next = now + _WARN_EVERY_S
            return held

    def _answer_internal_error(self, frames, error):
        if len(frames) < 2:
            return
        try:
            op, seq, worker = message.salvage(frames[1])
            text = f"internal server error ({type(error).__name__}: {error})"
            self._send(frames[0].bytes, message.encode(op, seq, worker, ok=False, error=text))
        except Exception:
            log.exception("could not answer a message that failed on %s", self.endpoint)

    def _count(self, key, n=1):
        with self._stats_lock:
            self._stats[key] += n

    def _post(self, identity, frames):
        if self._serving == threading.get_ident():
            self._send(identity, frames)
            return
        with self._close_lock:  # never write to the pipe's fd number after close reused it
            if self._closed:
                self._count("send_failures")
                return
            self._outbox.append((identity, frames))
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already

    def _flush(self):
        while self._outbox:
            identity, frames = self._outbox.popleft()
            self._send(identity, frames)

    def _send(self, identity, frames):
        nbytes = frames_bytes(frames)
        with self._stats_lock:  # before sending, so a peer that got its reply sees it counted
            self._stats["replies"] += 1
            self._stats["sent_bytes"] += nbytes
        try:
            # ROUTER drops a message to a peer that is gone or whose queue is full
            self._sock.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError as e:
            with self._stats_lock:
                self._stats["replies"] -= 1
                self._stats["sent_bytes"] -= nbytes
                self._stats["send_failures"] += 1
            log.warning("could not send a reply from %s: %s", self.endpoint, e)

    def _drain_wake(self):
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _check_open(self):
        if self._closed:
            raise TransportError(f"server socket {self.endpoint} is closed")

    def _release(self, sock):
        sock.close(linger=0)
        if self._zap_domain is not None:
            zap_registry.unregister(self._zap_domain)
            self._zap_domain = None


def _bind_error(host, port, error):
    if error.errno == zmq.EADDRINUSE:
        return TransportError(
            f"cannot bind {host}:{port}: port {port} is already in use. Stop the process holding it "
            f"(e.g. a server left from an earlier run; `ss -ltnp | grep :{port}` shows it) or give this "
            f"server another port (PADDLE_PORT, PADDLE_PSERVERS_IP_PORT_LIST or fleetrun --start_port)"
        )
    if error.errno in (errno.EADDRNOTAVAIL, errno.ENODEV):
        return TransportError(
            f"cannot bind {host}:{port}: {host!r} is not an address of this machine ({error.strerror}); "
            f"set POD_IP / PADDLE_PSERVERS_IP_PORT_LIST to an address of this host, or {settings.BIND_HOST_ENV}=0.0.0.0 "
            f"to bind every interface while advertising the endpoint"
        )
    return TransportError(f"cannot bind {host}:{port}: {error.strerror}")


@contextlib.contextmanager
def serving(server, handler, poll_ms=50, join_timeout=5.0, tick=None, threaded=False):
    """Serves ``server`` with ``handler`` in a daemon thread for the ``with`` block.

    On exit the loop is stopped, its thread joined and the socket closed, whatever the
    block raised. Yields the server. ``tick`` and ``threaded`` are as for ``serve``.

    Raises:
        FleetTimeoutError: the serving thread did not stop within ``join_timeout`` seconds
            (a handler that blocks); the socket is closed anyway.
    """
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(handler, stop, poll_ms, tick, threaded),
                              name=f"fleet-serve-{server.port}", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(join_timeout)
        server.close()
        if thread.is_alive():
            raise FleetTimeoutError(
                f"the serving thread of {server.endpoint} did not stop within {join_timeout} s: "
                f"a handler is blocking (handlers must answer or defer, never wait)")
