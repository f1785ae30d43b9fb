"""What a process's request clients put on the wire and took from it, per operation.

Every ``Client`` adds to a ``WireCounters`` (by default the process-wide ``WIRE``): one
request and the byte length of its frames when it is sent, one reply and its frames'
length when it is received. Heartbeats (``Heartbeat``'s own sockets) are not counted.
``fleet.telemetry`` reads ``WIRE.snapshot()`` when a monitor asks.

Cost: a lock and a few integer additions per message; nothing is allocated after an
operation's first message.
"""
import threading

REQUESTS, SENT_BYTES, REPLIES, RECEIVED_BYTES = range(4)


def frames_bytes(frames):
    """Total length in bytes of a message's frames (bytes, uint8 arrays or zmq Frames)."""
    total = 0
    for frame in frames:
        total += len(frame)
    return total


class WireCounters:
    """Requests sent, replies received and their bytes, per operation. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ops = {}  # op -> [requests, bytes sent, replies, bytes received]

    def _row(self, op):
        row = self._ops.get(op)
        if row is None:
            row = self._ops[op] = [0, 0, 0, 0]
        return row

    def sent(self, op, nbytes):
        """Counts one request of ``op`` of ``nbytes`` bytes."""
        with self._lock:
            row = self._row(op)
            row[REQUESTS] += 1
            row[SENT_BYTES] += nbytes

    def received(self, op, nbytes):
        """Counts one reply to ``op`` of ``nbytes`` bytes."""
        with self._lock:
            row = self._row(op)
            row[REPLIES] += 1
            row[RECEIVED_BYTES] += nbytes

    def snapshot(self):
        """{op: {"requests", "sent_bytes", "replies", "received_bytes"}} (a copy)."""
        with self._lock:
            return {op: {"requests": r[REQUESTS], "sent_bytes": r[SENT_BYTES], "replies": r[REPLIES],
                         "received_bytes": r[RECEIVED_BYTES]} for op, r in self._ops.items()}


WIRE = WireCounters()
"""The counters of every Client of this process that was not given its own."""
