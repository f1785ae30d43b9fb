"""A small etcd v3 client over etcd's JSON gateway (HTTP), for the fleetrun rendezvous.

etcd (3.4 and later) answers its v3 API as JSON on its client port: ``POST /v3/kv/range``,
``/v3/kv/put``, ``/v3/kv/deleterange``, ``/v3/kv/txn``, ``/v3/lease/grant``,
``/v3/lease/keepalive``, ``/v3/lease/revoke`` and the streaming ``/v3/watch``, with keys
and values in base64 and 64-bit integers as decimal strings. This module speaks that with
the standard library only (urllib, http.client): the rendezvous needs a handful of calls,
each with a timeout of its own, and the gateway is part of every etcd server, so no gRPC
stack (and its protobuf pins) comes with fleet.

Every call has a timeout; an error is a :class:`fleet.errors.RendezvousError` naming
etcd's endpoint, the operation and the fix. Plain HTTP only (no TLS, no etcd auth).

Thread-safety: an :class:`EtcdClient` holds no connection and may be used from any
number of threads; a :class:`Watch` belongs to the thread that reads it (``close`` may be
called from any thread).
"""
from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import socket
import urllib.error
import urllib.request

from fleet.endpoints import parse_endpoint
from fleet.errors import RendezvousError

DEFAULT_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class KeyValue:
    """One key of etcd as a range or a watch event gives it.

    Attributes:
        key: the key, decoded as UTF-8.
        value: the value, decoded as UTF-8 ("" for a deleted key).
        create_revision: the revision at which the key was created (0 when deleted).
        mod_revision: the revision of its last change.
        lease: the id of the lease it is attached to, 0 for none.
    """

    key: str
    value: str = ""
    create_revision: int = 0
    mod_revision: int = 0
    lease: int = 0


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """A change seen by a :class:`Watch`: ``kind`` is "PUT" or "DELETE"."""

    kind: str
    kv: KeyValue


def _b64(text):
    return base64.b64encode(text.encode()).decode("ascii")


def _unb64(text):
    return base64.b64decode(text or "").decode("utf-8", "replace")


def _key_range(key, prefix):
    """The gateway's {"key"[, "range_end"]} of one key, or of every key under a prefix."""
    body = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(prefix_end(key))
    return body


def prefix_end(prefix):
    """The range end that makes a range or watch cover every key starting with prefix."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return "\0"  # every key (etcd's convention)
    raw[-1] += 1
    return raw.decode("utf-8", "surrogateescape")


def _kv(item):
    return KeyValue(key=_unb64(item.get("key")), value=_unb64(item.get("value")),
                    create_revision=int(item.get("create_revision", 0)),
                    mod_revision=int(item.get("mod_revision", 0)),
                    lease=int(item.get("lease", 0)))


class EtcdClient:
    """Calls of etcd's v3 API at one endpoint, each bounded by a timeout.

    Args:
        endpoint: etcd's client address, "host:port" (its --listen-client-urls).
        timeout: seconds each call may take (connect and answer).

    Raises:
        ConfigError: endpoint is not host:port.
    """

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT_S):
        self.host, self.port = parse_endpoint(endpoint, "--elastic_server")
        self.endpoint = endpoint
        self.timeout = timeout
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._base = f"http://{host}:{self.port}"

    def _call(self, path, body, what, missing_ok=False):
        """POST body as JSON to path; returns the decoded answer (None for HTTP 404 with
        missing_ok: etcd's "not found"). Blocks up to timeout."""
        request = urllib.request.Request(self._base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"},
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as e:
            if missing_ok and e.code == 404:
                return None
            raise RendezvousError(f"etcd at {self.endpoint} refused {what}: HTTP {e.code} "
                                  f"{_error_text(e)}") from e
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            raise self.unreachable(what, e) from e

    def unreachable(self, what, error):
        """The RendezvousError for a call that got no answer (reason from ``error``)."""
        reason = getattr(error, "reason", error)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            why = f"no answer within {self.timeout:g} s"
        elif isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        else:
            why = str(reason) or type(reason).__name__
        return RendezvousError(
            f"etcd at {self.endpoint} did not answer {what} ({why}): check that etcd runs "
            f"there and that --elastic_server (or PADDLE_ELASTIC_SERVER) names its client "
            f"address (etcd --listen-client-urls), reachable from this host")

    # -- keys --------------------------------------------------------------------------
    def range(self, key: str, prefix: bool = False) -> tuple[list[KeyValue], int]:
        """The key, or every key under a prefix (sorted by key).

        Returns:
            (list of KeyValue, the store's revision at the time of reading).

        Raises:
            RendezvousError: etcd did not answer or refused.
        """
        answer = self._call("/v3/kv/range", _key_range(key, prefix), f"a read of {key!r}")
        return ([_kv(item) for item in answer.get("kvs", [])],
                int(answer.get("header", {}).get("revision", 0)))

    def put(self, key: str, value: str, lease: int = 0) -> int:
        """Set key to value (attached to a lease if given); returns the new revision.

        Raises:
            RendezvousError: etcd did not answer or refused (e.g. the lease is gone).
        """
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = self._call("/v3/kv/put", body, f"a write of {key!r}")
        return int(answer.get("header", {}).get("revision", 0))

    def put_if_absent(self, key: str, value: str, lease: int = 0,
                      clear_prefix: str | None = None) -> tuple[bool, KeyValue]:
        """Create key with value (attached to a lease if given) unless it exists (one
        transaction); with ``clear_prefix``, the same transaction deletes every key under
        that prefix when (and only when) it creates the key.

        Returns:
            (True, the new key) if this call created it, else (False, the existing key).

        Raises:
            RendezvousError: etcd did not answer or refused.
        """
        body = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE",
                             "create_revision": "0"}],
                "success": [{"request_put": dict({"key": _b64(key), "value": _b64(value)},
                                                 **({"lease": str(lease)} if lease else {}))}],
                "failure": [{"request_range": {"key": _b64(key)}}]}
        if clear_prefix:
            body["success"].insert(0, {"request_delete_range": _key_range(clear_prefix, True)})
        answer = self._call("/v3/kv/txn", body, f"a create of {key!r}")
        if answer.get("succeeded"):
            revision = int(answer.get("header", {}).get("revision", 0))
            return True, KeyValue(key, value, revision, revision, lease)
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        if not kvs:  # deleted between the compare and the range: cannot happen in one txn
            raise RendezvousError(f"etcd at {self.endpoint} answered a create of {key!r} "
                                  f"with neither success nor the key: {answer}")
        return False, _kv(kvs[0])

    def put_if_unchanged(self, key: str, value: str, mod_revision: int, lease: int = 0) -> bool:
        """Set key to value (attached to a lease if given) only if its last change is still
        ``mod_revision`` (0: only if the key does not exist); one transaction.

        Returns:
            True if this call wrote it, False if the key changed since it was read.

        Raises:
            RendezvousError: etcd did not answer or refused (e.g. the lease is gone).
        """
        body = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "MOD",
                             "mod_revision": str(int(mod_revision))}],
                "success": [{"request_put": dict({"key": _b64(key), "value": _b64(value)},
                                                 **({"lease": str(lease)} if lease else {}))}]}
        return bool(self._call("/v3/kv/txn", body, f"a conditional write of {key!r}").get("succeeded"))

    def delete(self, key: str, prefix: bool = False) -> int:
        """Delete the key (or every key under the prefix); returns how many were deleted.

        Raises:
            RendezvousError: etcd did not answer or refused.
        """
        answer = self._call("/v3/kv/deleterange", _key_range(key, prefix), f"a delete of {key!r}")
        return int(answer.get("deleted", 0))

    # -- leases ------------------------------------------------------------------------
    def grant_lease(self, ttl: int) -> int:
        """A new lease of ttl seconds; returns its id.

        Raises:
            RendezvousError: etcd did not answer or refused.
        """
        answer = self._call("/v3/lease/grant", {"TTL": str(int(ttl))}, f"a lease of {ttl} s")
        if answer.get("error"):
            raise RendezvousError(f"etcd at {self.endpoint} refused a lease of {ttl} s: "
                                  f"{answer['error']}")
        return int(answer["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew a lease once; returns its TTL in seconds, 0 if it has expired (or was revoked).

        Raises:
            RendezvousError: etcd did not answer or refused.
        """
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)},
                            f"a keepalive of lease {lease:x}")
        return int(answer.get("result", {}).get("TTL", 0))

    def revoke_lease(self, lease: int) -> bool:
        """End a lease now: every key attached to it is deleted.

        Returns:
            True, or False if the lease had expired or been revoked already.

        Raises:
            RendezvousError: etcd did not answer or refused.
        """
        return self._call("/v3/lease/revoke", {"ID": str(lease)}, f"a revoke of lease {lease:x}",
                          missing_ok=True) is not None

    # -- watches -----------------------------------------------------------------------
    def watch(self, key: str, prefix: bool = False, start_revision: int = 0) -> "Watch":
        """Start watching the key (or prefix) from start_revision (0: from now).

        Connecting and etcd's confirmation are bounded by the client's timeout; reading
        events is not (see :class:`Watch`).

        Raises:
            RendezvousError: etcd did not answer, refused, or did not confirm the watch.
        """
        request = _key_range(key, prefix)
        if start_revision:
            request["start_revision"] = str(start_revision)
        return Watch(self, json.dumps({"create_request": request}).encode(), key)


class Watch:
    """A stream of changes under a key from etcd's ``/v3/watch``; iterate to get events.

    ``events()`` blocks until etcd sends something and yields :class:`WatchEvent` lists
    with the revision they end at; it returns when the stream ends and raises
    RendezvousError when the connection breaks (etcd stopped, network cut with TCP
    keepalive giving up). Silence is not an error: a quiet key sends nothing, so liveness
    of etcd is told by lease keepalives, not by a watch. ``close()`` (any thread) ends a
    blocked ``events()``.
    """

    def __init__(self, client, body, key):
        self.client = client
        self.key = key
        self._conn = http.client.HTTPConnection(client.host, client.port, timeout=client.timeout)
        self._closed = False
        self._reading = False
        what = f"a watch of {key!r}"
        try:
            self._conn.request("POST", "/v3/watch", body=body,
                               headers={"Content-Type": "application/json"})
            self._answer = self._conn.getresponse()
            if self._answer.status != 200:
                raise RendezvousError(f"etcd at {client.endpoint} refused {what}: HTTP "
                                      f"{self._answer.status} {self._answer.read(500)!r}")
            first = json.loads(self._answer.readline() or b"{}").get("result", {})
            if not first.get("created"):
                raise RendezvousError(f"etcd at {client.endpoint} did not confirm {what}: {first}")
            self.revision = int(first.get("header", {}).get("revision", 0))
            sock = self._conn.sock
            sock.settimeout(None)  # events may be minutes apart; close() unblocks
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        except RendezvousError:
            self.close()
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.close()
            raise client.unreachable(what, e) from e

    def events(self):
        """Yield (list of WatchEvent, revision) as etcd sends them. Blocks between them.

        Raises:
            RendezvousError: the connection broke (not after close()).
        """
        self._reading = True
        try:
            while True:
                try:
                    line = self._answer.readline()
                except (OSError, http.client.HTTPException, ValueError, AttributeError) as e:
                    # AttributeError: http.client reading a response close() shut down
                    if self._closed:
                        return
                    raise self.client.unreachable(f"the watch of {self.key!r}", e) from e
                if not line:
                    if self._closed:
                        return
                    raise RendezvousError(f"etcd at {self.client.endpoint} ended the watch of "
                                          f"{self.key!r} (etcd stopped?)")
                result = json.loads(line).get("result", {})
                revision = int(result.get("header", {}).get("revision", 0))
                batch = [WatchEvent(e.get("type", "PUT"), _kv(e.get("kv", {})))
                         for e in result.get("events", [])]
                if batch:
                    self.revision = revision
                    yield batch, revision
        finally:
            self._reading = False
            if self._closed:
                self._conn.close()

    def close(self):
        """End the watch; a thread blocked in ``events()`` returns. Idempotent."""
        self._closed = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if not self._reading:  # else the reader closes it: http.client is not thread-safe
            self._conn.close()


def _error_text(error):
    try:
        body = json.loads(error.read() or b"{}")
        return body.get("error") or body.get("message") or str(body)
    except (ValueError, OSError):
        return error.reason
