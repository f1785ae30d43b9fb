"""The worker group: collective operations among the workers of a job, over ZeroMQ (and
shared memory between ranks on one host).

``WorkerGroup(endpoints, rank)`` joins the workers listed in ``endpoints`` (every worker's
"host:port", in PADDLE_TRAINER_ENDPOINTS order); this process is ``endpoints[rank]``. It
offers ``barrier``, ``all_reduce`` (sum, mean, max, min), ``all_gather`` (ragged first
dimension allowed), ``broadcast`` and ``all_gather_object``. Every rank must call the
same operations in the same order (a mismatch of kind, op, dtype or shape is detected
and named by every rank).

Sockets: each rank binds one ROUTER at its endpoint and connects one DEALER to every
other rank's ROUTER, so rank ``a`` sends to rank ``b`` on its own DEALER and receives
everything on its ROUTER; ZeroMQ keeps the order of the messages from one rank. Each
group owns a ZeroMQ context, terminated by ``close()``.

Wire: fleet's message format (``fleet.transport.message``): op "group", ``seq`` = the
operation's sequence number (1, 2, ... on every rank; 0 for joining), ``worker`` = the
sender's rank, header fields ``k`` (kind), ``s`` (step), ``c`` (chunk) and, on the first
message of an operation from each rank, ``d`` (its descriptor: kind, op, dtype, shape,
algorithm). Arrays are sent without a copy (numpy buffers handed to ZeroMQ, tracked so no
call returns while ZeroMQ still reads memory the caller owns) and received as views of
the frames. A message of an operation that already ended (a late or duplicate frame) is
dropped and counted; one of a later operation waits in an inbox for it.

Algorithms: arrays of ``ring_min_bytes`` (RING_MIN_BYTES, 512 KiB) or more go round a
ring: reduce-scatter then all-gather, every segment cut into chunks of ``chunk_bytes``
(CHUNK_BYTES, 4 MiB) and each chunk sent on as soon as it is reduced, so the transfer of
one chunk overlaps the reduction of the next (bandwidth-optimal: each rank sends and
receives 2(N-1)/N of the array). Smaller arrays go by a direct exchange (every rank sends
its array to every other: one network latency). ``benchmarks/bench_collective.py``
measures the crossover. A group of 2 ranks uses the ring only from
``TWO_RANK_RING_MIN_BYTES`` (2 MiB) on: there both send the same bytes. Results are
bit-identical on every rank: in the direct exchange every rank sums in rank order; in the
ring each chunk's final value is computed once, on one rank, and then copied to the
others.

Shared memory: when every rank runs on this host (``shared_segment.host_identity()``,
exchanged when joining), the machine is x86-64 Linux (``shared_control.supported()``)
and none sets FLEET_GROUP_SHM=0, ``all_reduce`` of arrays of ``shm_min_bytes``
(SHM_MIN_BYTES, 0: every size) or more goes through memory every rank maps (anonymous
segments, ``shared_segment.SharedSegment``: nothing can be left behind): a control block
rank 0 creates when the group forms (``shared_control.ControlBlock``: every rank's
progress words and descriptor) and a data segment (one slot per rank and the result).
Each rank copies its array into its slot and stores its descriptor and "arrived";
rank r reduces part r of every slot into the result area, in the order of the ZeroMQ
path the group would otherwise take (the ring's, from rank r round, for
``ring_min_bytes`` and more; else rank order, as the direct exchange), so a result has
the same bits whether the ranks share a host or not, and stores "reduced"; each copies
the result out. Arrays of ``shm_pipeline_min_bytes`` (SHM_PIPELINE_MIN_BYTES, 16 MiB)
or more go the same way in rounds of ``shm_round_bytes`` (SHM_ROUND_BYTES, 1 MiB: a
piece of every part) through a few staging buffers per rank that stay in the
processor's caches, each rank copying the next round in while it reduces this one and
copies the last one out (same order of additions, same bits). The ranks wait on each
other's words with futexes, in slices between which they check liveness, so timeouts
(naming the ranks that did not arrive, and the stage), mismatch detection and
``PeerLostError`` work as on the other paths; no ZeroMQ message is sent.
``all_gather`` and ``broadcast`` stay on ZeroMQ.

CURVE: with keys (``CurveConfig``), each ROUTER is a CURVE server and each DEALER a CURVE
client, both with the job's *client* key pair (the one every worker holds); the ROUTER
accepts only the authorized client public keys. A process without the keys never
completes a handshake: the others time out naming it.

Liveness: every socket sends ZeroMQ heartbeats (ZMQ_HEARTBEAT_IVL = FLEET_HEARTBEAT_MS,
ZMQ_HEARTBEAT_TIMEOUT = FLEET_HEARTBEAT_TIMEOUT_MS), answered by ZeroMQ's I/O thread,
so a rank busy computing still counts as alive. A rank whose connection drops (its
process died: at once; it hangs or the network is cut: after the heartbeat timeout)
without having said goodbye (``close()``) is lost: every operation then raises
``PeerLostError`` naming it, also one already waiting.

Threading: one operation at a time; calls from several threads are serialized by a lock.
"""
import collections
import io
import logging
import math
import os
import pickle
import sys
import threading
import time

import numpy as np
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from fleet import endpoints as endpoint_rules
from fleet.envvars import parse_int
from fleet.errors import ConfigError, FleetTimeoutError, PeerLostError, TransportError
from fleet.logs import WaitLog, wait_log_ms
from fleet.transport import message, settings
from fleet.transport.curve import (KEYS_DIR_ENV, CurveConfig, check_curve_available, stop_authenticator,
                                   terminate_context)
from fleet.transport import shared_control
from fleet.transport.shared_control import (ARRIVED, PIECES_CALL, PIECES_COPIED, PIECES_REDUCED, PIECES_WRITTEN,
                                            REDUCED, WRITTEN, WROTE, ControlBlock, encode_desc, word)
from fleet.transport.shared_segment import SharedSegment, aligned, host_identity, shm_enabled

log = logging.getLogger("fleet.transport")

RING_MIN_BYTES = 512 * 1024
"""Arrays of at least this many bytes go round the ring; smaller ones by direct exchange.
Measured by benchmarks/bench_collective.py: on one host (2 cores, loopback) the direct
exchange was faster up to 256 KiB and the ring from 512 KiB-1 MiB on, for 2 to 4 ranks.
Over links slower than the CPU, the ring pays off earlier: lower ``ring_min_bytes``."""
CHUNK_BYTES = 4 << 20
"""Largest piece of a ring segment sent in one message (the unit of pipelining). Every
message costs wake-ups of ZeroMQ's I/O thread, this thread and pyzmq's garbage collector
(zero-copy frames): on one host (2 cores, loopback), where the CPU and not a link is the
limit, 4 MiB chunks took ~25% less CPU time than 1 MiB ones for a 64 MiB all_reduce over
2 processes (benchmarks/bench_collective.py). Larger chunks still save a little there,
but a segment of one chunk leaves a link idle while the next rank reduces it: 4 MiB keeps
two or more chunks per segment for arrays of 8 MiB per rank and more."""
TWO_RANK_RING_MIN_BYTES = 2 << 20
"""RING_MIN_BYTES of a group of 2 ranks. There the ring sends each rank as many bytes as
the direct exchange (half the array, then the other half reduced, vs the whole array
once) but needs two latencies instead of one, each a wake-up of the other process, which
costs most on a busy host. Measured on one host (2 cores, loopback): idle, the direct
exchange took as long as the ring at 1.6 MiB and longer from 4 MiB on (the ring overlaps
the reduction of one chunk with the transfer of the next); in a hybrid CTR-DNN job (a
1.6 MiB all-reduce per step, a server and 2 workers on the 2 cores) it took 1.0-2.5 ms
once both ranks had arrived where the ring took 1.5-5.1 ms (6 interleaved runs)."""
SHM_MIN_BYTES = 0
"""Arrays of at least this many bytes are all-reduced through shared memory when every
rank of the group is on this host (and FLEET_GROUP_SHM is not 0); smaller ones by direct
exchange. 0: every size. It was 256 KiB while shared memory synchronised with two rounds
of ZeroMQ tokens, which the direct exchange's single round beat below about that size;
since the ranks wait on each other in the control block, shared memory is faster at
every size of benchmarks/bench_collective.py's sweep (microseconds per all_reduce, shared
memory vs direct exchange, 2 cores: 1 KiB 30 vs 156 over 2 processes, 121 vs 602 over
4; 64 KiB 32 vs 245, 131 vs 852; 256 KiB 42 vs 272, 165 vs 945). A group of ranks on
several hosts keeps the ZeroMQ paths at every size."""
SHM_PIPELINE_MIN_BYTES = 16 << 20
"""Arrays of at least this many bytes go through shared memory in rounds of
``shm_round_bytes`` (SHM_ROUND_BYTES) through a small staging area that stays in the
processor's caches, instead of whole (``_shm_pipelined_all_reduce``). 4 processes on 2
cores, 64 MiB, median ms per all_reduce in two interleaved runs: 27.8 and 33.1 whole,
18.5 and 18.2 in rounds (2 processes: 12.6 and 13.2 whole, 7.4 and 7.5 in rounds); at
16 MiB 5.6 and 7.2 whole, 5.7 and 4.8 in rounds (2 processes 2.5 and 2.6, 1.6 and 1.7);
at 4 MiB neither was faster in every run."""
SHM_ROUND_BYTES = 1 << 20
"""The bytes of one round of the pipelined shared-memory all_reduce: a piece of every
rank's part, each ``shm_round_bytes / N``. 64 MiB over 4 processes on 2 cores, median ms
in two runs: pieces of 128 KiB 20.1 and 19.8, 256 KiB (1 MiB rounds) 18.0 and 18.0, 512
KiB 19.7 and 21.3, 1 MiB 25.4 and 25.5; over 2 processes pieces of 256 KiB 8.2 and 8.2,
512 KiB (1 MiB rounds) 7.4 and 7.5."""
REDUCE_OPS = ("sum", "mean", "max", "min")
REDUCE_DTYPES = ("float32", "float64", "int32", "int64")
ENDPOINTS_ENV = "PADDLE_TRAINER_ENDPOINTS"
RANK_ENV = "PADDLE_TRAINER_ID"

_WIRE_OP = "group"
_POLL_MS = 100  # longest a wait sleeps before it checks liveness again
_DRAIN = 256  # messages read per wake-up
_DOWN_GRACE_MS = 1000
_REPORT_LINGER_MS = 1000  # how long closing waits for a loss report to leave  # a dropped connection counts as lost once no goodbye came for this long
_COUNTERS = ("operations", "messages_sent", "messages_received", "bytes_sent", "bytes_received", "stale_messages",
             "malformed_messages", "shm_operations")
_SPARES = 2  # ring results kept for reuse: two, so `g = group.all_reduce(g)` in a loop reuses the one before last
_SPARE_MIN_BYTES = 32 << 20  # glibc's largest mmap threshold: malloc maps every larger block afresh
_SHM_SPIN_S = 50e-6
"""How long a shared-memory wait polls (with sched_yield) before it sleeps on the futex.
4 processes on 2 cores, microseconds per all_reduce, three interleaved rounds, futex
only / 50 us / 200 us of polling: 1 MiB 415, 312, 316 / 319, 253, 255 / 324, 251, 262;
4 MiB 1304, 1134, 1163 / 1276, 1173, 1121 / 1079, 1087, 1131 (the same CPU time): a
waker's FUTEX_WAKE of a sleeping rank costs a few tens of microseconds here, while
polling longer only burns time a rank with work could use."""
_PIPELINE_BUFFERS = 4  # staging buffers per rank in the pipelined path: rounds k-1..k+1 in use, one spare
_REDUCE_CHUNK_BYTES = 256 << 10  # the shared-memory reduction's unit: its running value stays in the L2 cache
_UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
_MONITOR_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class WorkerGroup:
    """The workers of a job as one group; this process is ``endpoints[rank]``.

    Construction binds this rank's endpoint, connects to every other rank and waits until
    every rank has joined (bounded by FLEET_CONNECT_TIMEOUT_MS; a wait of more than
    FLEET_WAIT_LOG_MS is logged naming the ranks still missing).

    Args:
        endpoints: every worker's "host:port", the same list in the same order on every
            rank. This rank binds ``endpoints[rank]`` (FLEET_BIND_HOST binds that address
            instead of the host, keeping the port).
        rank: this worker's index in ``endpoints``.
        curve: a ``CurveConfig`` (its client key pair is used; see the module docstring) or
            None (CURVE off; ``CurveConfig.from_env()`` reads the job's keys).
        timeout_ms: default time an operation may take (FLEET_RPC_TIMEOUT_MS, 60000).
        alive_check: None, or a callable that raises the failure that makes waiting for the
            other ranks pointless (a worker of a parameter-server job passes its servers'
            heartbeat check: a lost server fails the job, and the ranks it took down will
            never answer). Called from the waiting thread at every poll (100 ms) of the join
            and of every operation; what it raises ends the wait.

    Attributes:
        rank, size, endpoints: this rank, the number of ranks, every rank's endpoint.
        ring_min_bytes, chunk_bytes, shm_min_bytes, shm_pipeline_min_bytes, shm_round_bytes:
            the algorithm settings (RING_MIN_BYTES, or TWO_RANK_RING_MIN_BYTES in a group of
            2; CHUNK_BYTES; SHM_MIN_BYTES; SHM_PIPELINE_MIN_BYTES; SHM_ROUND_BYTES); every
            rank must use the same values.
        shared_memory: True when every rank runs on this host (x86-64 Linux) and allows shared memory
            (FLEET_GROUP_SHM is not 0 on any): all_reduce then goes through shared memory
            from ``shm_min_bytes`` on, in rounds from ``shm_pipeline_min_bytes`` on.

    Raises:
        ConfigError: a bad endpoint list, rank, timeout or CURVE configuration, or ranks
            that were given different endpoint lists.
        TransportError: this rank's endpoint cannot be bound.
        FleetTimeoutError: some ranks did not join in time (names them and their endpoints).
        whatever ``alive_check`` raises, while joining.
    """

    def __init__(self, endpoints, rank, curve=None, timeout_ms=None, alive_check=None):
        self.endpoints = _check_endpoints(endpoints)
        if alive_check is not None and not callable(alive_check):
            raise ConfigError(f"alive_check={alive_check!r} is not callable; pass a function that raises the "
                              f"failure that makes waiting pointless (e.g. a Heartbeat's check), or None")
        self._alive_check = alive_check
        self.size = len(self.endpoints)
        self.rank = _check_rank(rank, self.size)
        self.timeout_ms = _check_timeout(timeout_ms, "timeout_ms") if timeout_ms is not None \
            else settings.rpc_timeout_ms()
        if curve is not None and not isinstance(curve, CurveConfig):
            raise ConfigError(f"curve={curve!r} is not a fleet.transport.curve.CurveConfig; pass "
                              f"CurveConfig.from_env() or None")
        self.curve = curve
        self.ring_min_bytes = RING_MIN_BYTES if self.size > 2 else TWO_RANK_RING_MIN_BYTES
        self.chunk_bytes = CHUNK_BYTES
        self.shm_min_bytes = SHM_MIN_BYTES
        self.shm_pipeline_min_bytes = SHM_PIPELINE_MIN_BYTES
        self.shm_round_bytes = SHM_ROUND_BYTES
        # None: this rank shares no memory
        self._host = host_identity() if shm_enabled() and shared_control.supported() else None
        self.shared_memory = False  # every rank on this host, each allowing it: set once joined
        self._control = None  # the ControlBlock of the shared-memory all_reduce (rank 0 creates it)
        self._segment = None  # its data segment (rank 0 creates it, larger when an array does not fit)
        self._segment_gen = 0  # the generation of self._segment (ControlBlock.publish_data)
        self._shm_clean = False  # this rank's last shared-memory all_reduce succeeded (its slot may be rewritten)
        self._heartbeat_ms, self._heartbeat_timeout_ms = settings.heartbeat_settings()
        self._max_bytes = settings.max_message_bytes()
        self._lock = threading.RLock()
        self._seq = 0
        self._inbox = {}  # (seq, rank) -> deque of Messages not yet taken
        self._hello = {}  # rank -> its join descriptor
        self._bye = set()  # ranks that closed the group
        self._down = {}  # rank -> time.monotonic() its connection dropped (no goodbye seen then)
        self._auth_failed = {}  # rank -> the handshake failure seen connecting to it
        self._lost = None  # the PeerLostError once a rank is lost: every later call raises it
        self._closed = False
        self._in_operation = False
        self._counters = collections.Counter(dict.fromkeys(_COUNTERS, 0))  # every key now: stats() may copy it
        self._spares = []  # earlier ring results, reused once nothing else references them (_result_buffer)
        self._ctx = None
        self._auth = None
        self._router = None
        self._dealers = {}
        self._monitors = {}
        self._poller = None
        if self.size > 1:
            try:
                self._open()
                self._join(settings.connect_timeout_ms())
            except BaseException:
                self._teardown()
                raise

    @property
    def peers(self):
        """The other ranks, in rank order."""
        return [p for p in range(self.size) if p != self.rank]

    # ------------------------------------------------------------------ operations

    def barrier(self, timeout_ms=None):
        """Returns once every rank has called ``barrier``. Blocks up to the timeout.

        Raises:
            FleetTimeoutError: ranks did not arrive in time (names them).
            PeerLostError: a rank was lost. ConfigError: a rank called another operation.
        """
        with self._operation("barrier", timeout_ms) as op:
            if self.size == 1:
                return
            desc = {"kind": "barrier"}
            for p in self.peers:
                self._send(p, op.seq, "barrier", desc=desc)
            first = self._first_messages(op)
            self._check_descs(op, desc, first, ("kind",))

    def all_reduce(self, array, op="sum", timeout_ms=None):
        """Returns the element-wise reduction of every rank's ``array``. Blocks up to the timeout.

        Args:
            array: a numpy array (float32, float64, int32 or int64); the same shape and
                dtype on every rank. Not modified; it may be changed again once this returns.
            op: "sum", "mean" (the sum divided by the number of ranks; float dtypes only),
                "max" or "min"; the same on every rank.
            timeout_ms: limit for this call (default: the group's).

        Returns:
            a new array of ``array``'s shape and dtype, bit-identical on every rank.

        Raises:
            ConfigError: a bad op or dtype, or ranks passed different ops, shapes or dtypes
                (every rank names every rank's arguments).
            FleetTimeoutError, PeerLostError: as ``barrier``.
        """
        if op not in REDUCE_OPS:
            raise ConfigError(f"all_reduce op={op!r} is not one of {', '.join(REDUCE_OPS)}")
        flat, shape = _flat(array, "all_reduce", REDUCE_DTYPES)
        if op == "mean" and flat.dtype.kind != "f":
            raise ConfigError(f"all_reduce op='mean' of a {flat.dtype.name} array would lose the fraction; "
                              f"reduce with op='sum' and divide, or pass a float array")
        with self._operation("all_reduce", timeout_ms) as call:
            if self.size == 1:
                return flat.copy().reshape(shape)
            if self.shared_memory and flat.nbytes >= max(self.shm_min_bytes, self.shm_pipeline_min_bytes):
                algo, run = "shm pipelined", self._shm_pipelined_all_reduce
            elif self.shared_memory and flat.nbytes >= self.shm_min_bytes:
                algo, run = "shm", self._shm_all_reduce
            elif flat.nbytes >= self.ring_min_bytes:
                algo, run = "ring", self._ring_all_reduce
            else:
                algo, run = "direct", self._direct_all_reduce
            desc = {"kind": "all_reduce", "op": op, "dtype": flat.dtype.name, "shape": list(shape), "algo": algo}
            return run(call, flat, op, desc).reshape(shape)

    def all_gather(self, array, timeout_ms=None):
        """Returns every rank's ``array``, in rank order. Blocks up to the timeout.

        Args:
            array: a numpy array (float32, float64, int32, int64 or uint8, at least one
                dimension); the first dimension may differ between ranks, the dtype and
                the other dimensions must not.
            timeout_ms: limit for this call (default: the group's).

        Returns:
            a list of ``size`` arrays; entry ``rank`` is a copy of ``array``.

        Raises:
            ConfigError: a bad dtype, or ranks disagree on dtype or trailing dimensions.
            FleetTimeoutError, PeerLostError: as ``barrier``.
        """
        flat, shape = _flat(array, "all_gather", tuple(message.DTYPES))
        if not shape:
            raise ConfigError("all_gather of a 0-d array: pass an array with at least one dimension, "
                              "e.g. np.atleast_1d(x)")
        with self._operation("all_gather", timeout_ms) as call:
            return self._all_gather(call, flat, shape, "all_gather")

    def broadcast(self, array, root=0, timeout_ms=None):
        """Returns rank ``root``'s array on every rank. Blocks up to the timeout.

        Args:
            array: on the root, a numpy array (float32, float64, int32, int64 or uint8);
                ignored elsewhere (pass None).
            root: the rank whose array is sent; the same on every rank.
            timeout_ms: limit for this call (default: the group's).

        Returns:
            a new array equal to the root's (shape and dtype included).

        Raises:
            ConfigError: a bad root or dtype, or ranks disagree on the root.
            FleetTimeoutError, PeerLostError: as ``barrier``.
        """
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ConfigError(f"broadcast root={root!r} is not a rank of this group of {self.size}; pass an "
                              f"int in [0, {self.size})")
        root = int(root)
        flat = shape = None
        if self.rank == root:
            if array is None:
                raise ConfigError(f"broadcast: rank {root} is the root but passed None; the root passes the "
                                  f"array to send")
            flat, shape = _flat(array, "broadcast", tuple(message.DTYPES))
        with self._operation("broadcast", timeout_ms) as call:
            if self.size == 1:
                return flat.copy().reshape(shape)
            if self.rank == root:
                return self._broadcast_root(call, flat, shape, root)
            return self._broadcast_receive(call, root)

    def all_gather_object(self, obj, timeout_ms=None):
        """Returns every rank's ``obj``, in rank order. Blocks up to the timeout.

        Args:
            obj: a small object made of builtin types (None, bool, int, float, complex,
                str, bytes, list, tuple, dict, set) and numpy arrays, dtypes and scalars.
                It is pickled; the receivers unpickle only those types.
            timeout_ms: limit for this call (default: the group's).

        Returns:
            a list of ``size`` objects (entry ``rank`` is a copy of ``obj``).

        Raises:
            ConfigError: ``obj`` cannot be pickled or holds another type.
            FleetTimeoutError, PeerLostError: as ``barrier``.
        """
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # pickle raises many types
            raise ConfigError(f"all_gather_object: {type(obj).__name__} object cannot be pickled ({e}); pass "
                              f"builtin types and numpy arrays") from e
        try:
            _loads(data)
        except TransportError as e:
            raise ConfigError(f"all_gather_object: {e}") from None
        flat = np.frombuffer(data, dtype=np.uint8)
        with self._operation("all_gather_object", timeout_ms) as call:
            parts = self._all_gather(call, flat, flat.shape, "all_gather_object")
            return [_loads(part.tobytes()) for part in parts]

    def stats(self):
        """Returns a dict of counters: operations, messages_sent, messages_received,
        bytes_sent, bytes_received (array bytes), stale_messages, malformed_messages.
        Thread-safe (a snapshot)."""
        snapshot = dict(self._counters)
        return {k: snapshot.get(k, 0) for k in _COUNTERS}

    def close(self):
        """Leaves the group. Idempotent.

        Says goodbye to every rank and waits (up to the group's timeout, logged after
        FLEET_WAIT_LOG_MS) until every rank that is still connected has said goodbye too,
        so no rank closes before the others have what it sent them; then closes every
        socket and the context. A rank that closes while another waits for it in an
        operation makes that operation fail naming it.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._ctx is None:
                return
            try:
                if self._lost is None:
                    for p in self.peers:
                        self._send(p, -1, "bye")
                    self._wait_goodbyes()
                else:
                    self._report_loss()
            except Exception as e:  # noqa: BLE001 - closing must always release the sockets
                log.warning("fleet: rank %d of the worker group did not close cleanly: %s", self.rank, e)
            finally:
                self._teardown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else ("lost a rank" if self._lost else "open")
        return f"WorkerGroup(rank={self.rank}, size={self.size}, {state})"

    # ------------------------------------------------------------------ algorithms

    def _direct_all_reduce(self, call, flat, op, desc):
        tracks = [self._send(p, call.seq, "all_reduce", array=flat, desc=desc, track=True) for p in self.peers]
        first = self._first_messages(call)
        self._check_descs(call, desc, first, ("kind", "op", "dtype", "shape", "algo"))
        ufunc = _UFUNCS[op]
        parts = {p: msg.arrays[0] for p, msg in first.items()}
        parts[self.rank] = flat
        out = parts[0].copy()
        for p in range(1, self.size):  # rank order, the same on every rank
            ufunc(out, parts[p], out=out)
        if op == "mean":
            np.divide(out, self.size, out=out)
        self._wait_sent(call, tracks)
        return out

    def _ring_all_reduce(self, call, flat, op, desc):
        n, r = self.size, self.rank
        left, right = (r - 1) % n, (r + 1) % n
        regions = _ring_regions(flat.size, n, flat.itemsize, self.chunk_bytes)
        chunks = len(regions[0])
        for p in self.peers:
            self._send(p, call.seq, "all_reduce", step=-1, desc=desc)
        tracks = [self._send(right, call.seq, "all_reduce", step=0, chunk=c, array=flat[lo:hi], track=True)
                  for c, (lo, hi) in enumerate(regions[r])]
        first = self._first_messages(call)
        self._check_descs(call, desc, first, ("kind", "op", "dtype", "shape", "algo"))
        ufunc = _UFUNCS[op]
        out = self._result_buffer(flat)
        sent_from_out = {}  # (segment, chunk) -> tracker of the send that reads out[region]
        # Reduce-scatter: at step s this rank adds its part to segment (r - s - 1)'s running
        # value, which started on rank (r - s - 1) and went round from there; the last step
        # completes segment r + 1, which is sent on at once as the all-gather's first step.
        for s in range(n - 1):
            segment = (r - s - 1) % n
            for c in range(chunks):
                msg = self._take_step(call, left, s, c)
                lo, hi = regions[segment][c]
                dst = out[lo:hi]
                ufunc(msg.arrays[0], flat[lo:hi], out=dst)
                if s == n - 2 and op == "mean":
                    np.divide(dst, n, out=dst)
                sent_from_out[segment, c] = self._send(right, call.seq, "all_reduce", step=s + 1, chunk=c,
                                                       array=dst, track=True)
                del msg
        # All-gather: at step n - 1 + t the final segment (r - t) arrives; it is passed on
        # (the received frame itself, no copy) unless the right neighbour made it.
        for t in range(n - 1):
            segment = (r - t) % n
            for c in range(chunks):
                msg = self._take_step(call, left, n - 1 + t, c)
                if t < n - 2:
                    self._send(right, call.seq, "all_reduce", step=n + t, chunk=c, array=msg.arrays[0])
                lo, hi = regions[segment][c]
                earlier = sent_from_out.pop((segment, c), None)
                if earlier is not None:
                    self._wait_sent(call, [earlier])
                out[lo:hi] = msg.arrays[0]
                del msg
        self._wait_sent(call, tracks + list(sent_from_out.values()))
        return out

    def _shm_all_reduce(self, call, flat, op, desc):
        """All ranks on this host: each copies its array into its slot of the data
        segment and says so in the control block (``shared_control``); rank r then
        reduces part r of every slot into the result area, in the order of the ZeroMQ path
        the group would take (the ring's from ``ring_min_bytes`` on, else the direct
        exchange's rank order: the same bits on one host as across hosts), into its
        result directly as well, and says so; each copies every other part out as soon as
        its rank has said so. A rank reduces its own part from its array, so it copies
        only the others in. No ZeroMQ message: the ranks wait on each other's
        progress words with futexes, checking liveness and their ZeroMQ inbox (a rank that
        runs another operation sends there) between slices of ``_POLL_MS``.

        Data segment: slot 0, ..., slot N-1, result, each ``aligned(nbytes)``. Rank 0
        creates it (again, larger, when an array does not fit) before it arrives and
        publishes it in the control block; a rank whose mapping is older attaches it once
        every rank has arrived.

        Each rank's record holds the operation number of its last arrival (descriptor
        stored and, if ``WROTE``, its array copied in), late copy-in (``WRITTEN``) and
        reduction (``REDUCED``); a rank waits until the others' word *equals* this call's
        number, so a rank that gave up on this call and went on is never taken for one
        that took part. Why no rank overwrites memory another still reads:
        - a slot of call s is written (a) before arriving only by a rank whose previous
          shared-memory call s0 succeeded on this data segment: it saw every rank's
          REDUCED = s0, so no rank reads slots any more (all ranks run the same calls, so
          there was none between), and slots of s are read only once every rank arrived
          at s; or (b) once every rank arrived at s, hence left every earlier call (one
          operation at a time per rank): by a rank whose last call failed (a timeout, a
          mismatch, a lost rank: it sets nothing more in that call and writes nothing
          until this point), by one that had no data segment or an older one, and by
          every rank after rank 0 made a new one;
        - the result area of s is written only once every rank arrived at s, and a rank
          copies the previous result out (each part after that part's REDUCED, so a
          rank whose call succeeded has seen every rank's REDUCED) before it returns;
        - a data segment rank 0 replaces stays mapped, unchanged, in every rank still
          using it (the kernel frees it with the last mapping)."""
        clean, self._shm_clean = self._shm_clean, False  # stays False if this call fails
        out = self._shm_steps(call, flat, op, desc, clean)
        self._shm_clean = True
        return out

    def _shm_steps(self, call, flat, op, desc, clean):
        n, r, ctl, seq = self.size, self.rank, self._control, word(call.seq)
        slot = aligned(flat.nbytes)
        need = (n + 1) * slot
        lo, hi = flat.size * r // n, flat.size * (r + 1) // n  # part r: reduced here, so not copied in
        self._shm_grow(need, seq)
        wrote = 0
        if (clean and self._segment is not None and self._segment.nbytes >= need
                and self._segment_gen == ctl.generation()):
            self._shm_write(flat, slot, lo, hi)
            wrote = self._segment_gen
        gen = self._shm_arrive(call, desc, wrote, need)
        late = [p for p in range(n) if ctl.get(p, WROTE) != gen]
        if r in late:
            self._shm_write(flat, slot, lo, hi)
            ctl.post(r, WRITTEN, seq)
        if any(p != r for p in late):
            self._shm_wait(call, WRITTEN, [p for p in late if p != r], "copying in")
        out = self._result_buffer(flat)
        self._shm_reduce(flat, op, slot, lo, hi, out)
        ctl.post(r, REDUCED, seq)
        result = self._segment.view(flat.dtype, flat.size, n * slot)
        for j in range(1, n):  # each part as soon as its rank has reduced it: no core idles at a barrier
            p = (r + j) % n
            self._shm_wait(call, REDUCED, [p], "reducing", named=self.peers)
            a, b = flat.size * p // n, flat.size * (p + 1) // n
            out[a:b] = result[a:b]
        self._counters["shm_operations"] += 1
        return out

    def _shm_grow(self, need, seq):
        """Rank 0, before it arrives: makes and publishes a data segment of at least
        ``need`` bytes if the current one is smaller (or there is none)."""
        if self.rank == 0 and (self._segment is None or self._segment.nbytes < need):
            self._replace_segment(SharedSegment.create(need))
            self._segment_gen = seq  # never 0, the generation before any data segment
            self._control.publish_data(self._segment.key, self._segment.nbytes, self._segment_gen)

    def _shm_arrive(self, call, desc, wrote, need):
        """Stores this rank's descriptor, ``wrote`` (WROTE) and "arrived"; waits for every
        rank's arrival; raises the mismatch if their descriptors differ; maps the data
        segment rank 0 published (``_shm_attach``) and returns its generation."""
        ctl, r = self._control, self.rank
        mine = encode_desc(desc)
        ctl.put_desc(r, mine)
        ctl.put(r, WROTE, wrote)
        ctl.post(r, ARRIVED, word(call.seq))
        self._shm_wait(call, ARRIVED, self.peers, "arriving", desc)
        if any(ctl.desc_bytes(p) != mine for p in self.peers):
            self._raise_mismatch(call, {**{p: ctl.desc(p) for p in self.peers}, r: desc})
        return self._shm_attach(call, need)

    def _shm_attach(self, call, need):
        """Once every rank has arrived: maps the data segment rank 0 published if it is
        not this rank's; returns its generation."""
        gen, key, nbytes = self._control.data()
        if gen != self._segment_gen:
            self._replace_segment(None)
            self._replace_segment(SharedSegment.attach(key, nbytes))
            self._segment_gen = gen
        if self._segment.nbytes < need:
            raise TransportError(f"{call.what}: rank 0 published {self._segment.nbytes} bytes of shared memory for "
                                 f"an all_reduce that needs {need}; the ranks run different fleet versions")
        return gen

    def _shm_pipelined_all_reduce(self, call, flat, op, desc):
        """A large array through shared memory in pieces, so what the ranks copy and
        reduce stays in the processor's caches instead of going through RAM three times.

        Part p of the array (the ring's segment p, as in ``_shm_all_reduce``) is cut into
        pieces of ``shm_round_bytes / N``; round k handles piece k of every part. In round k
        each rank copies piece k of every part but its own into staging buffer k % B
        (``_PIPELINE_BUFFERS``) of its staging area and counts it (PIECES_WRITTEN);
        rank r reduces piece k of part r from every rank's buffer (its own from its
        array), in the order of ``_shm_reduce`` (the same bits as the other paths), into
        its result and into result buffer k % B, and counts it (PIECES_REDUCED); every
        rank copies piece k of the other parts out of the result buffer and counts it
        (PIECES_COPIED). A rank copies round k + 1 in, reduces round k and copies round
        k - 1 out in turn, so the ranks overlap and each waits only on rounds the others
        reached before.

        Why no rank overwrites memory another still reads, or takes a count for another
        call's:
        - nothing is written before every rank has arrived at this call, hence left every
          earlier one (a rank whose earlier call failed included: it writes nothing more
          in that call); only then does a rank set its counts to 0 and PIECES_CALL to this
          call (in that order), and a rank counts another's pieces only while its
          PIECES_CALL is this call. (Before arriving would be too early: a rank that left
          the last call may not touch the counts a slower rank still waits on there.)
        - staging buffer b is rewritten for round k (k >= B) only once every rank has
          reduced round k - B (PIECES_REDUCED >= k - B + 1), the last round that read it;
        - result buffer b is rewritten for round k only once every rank has copied round
          k - B out (PIECES_COPIED >= k - B + 1);
        - a rank leaves the call without waiting for the others to copy the last rounds
          out, so its next shared-memory call (pipelined or not) writes only once every
          rank has arrived there (``_shm_clean`` stays False).

        Data segment: staging area 0, ..., staging area N-1, result area, each
        B * N * piece bytes (page-aligned)."""
        self._shm_clean = False  # a later call's early copy-in could hit a result buffer still being read
        n, r, ctl, seq = self.size, self.rank, self._control, word(call.seq)
        item = flat.itemsize
        q = max(1, self.shm_round_bytes // (n * item))  # elements of one piece
        bounds = [flat.size * p // n for p in range(n + 1)]
        rounds = max(1, -(-max(bounds[p + 1] - bounds[p] for p in range(n)) // q))
        buffers = _PIPELINE_BUFFERS
        area = aligned(buffers * n * q * item)
        need = (n + 1) * area
        self._shm_grow(need, seq)
        self._shm_arrive(call, desc, 0, need)
        for which in (PIECES_WRITTEN, PIECES_REDUCED, PIECES_COPIED):
            ctl.post(r, which, 0)
        ctl.post(r, PIECES_CALL, seq)
        staging = [self._segment.view(flat.dtype, buffers * n * q, p * area) for p in range(n)]
        results = self._segment.view(flat.dtype, buffers * n * q, n * area)
        out = self._result_buffer(flat)
        order = self._shm_order(flat)
        peers = self.peers

        def piece(p, k):  # piece k of part p: its bounds in the array and where it sits in a buffer
            a = min(bounds[p] + k * q, bounds[p + 1])
            return a, min(a + q, bounds[p + 1]), (k % buffers * n + p) * q

        def copy_in(k):
            if k >= buffers:
                self._shm_wait(call, PIECES_REDUCED, peers, f"reducing piece {k - buffers + 1} of {rounds}",
                               least=k - buffers + 1)
            own = staging[r]
            for p in range(n):
                a, b, at = piece(p, k)
                if p != r and b > a:
                    own[at:at + b - a] = flat[a:b]
            ctl.post(r, PIECES_WRITTEN, k + 1)

        def reduce(k):
            self._shm_wait(call, PIECES_WRITTEN, peers, f"copying in piece {k + 1} of {rounds}", least=k + 1)
            if k >= buffers:
                self._shm_wait(call, PIECES_COPIED, peers, f"copying out piece {k - buffers + 1} of {rounds}",
                               least=k - buffers + 1)
            a, b, at = piece(r, k)
            if b > a:
                dst = results[at:at + b - a]
                _reduce_into(dst, [flat[a:b] if p == r else staging[p][at:at + b - a] for p in order], op)
                out[a:b] = dst
            ctl.post(r, PIECES_REDUCED, k + 1)

        def copy_out(k):
            self._shm_wait(call, PIECES_REDUCED, peers, f"reducing piece {k + 1} of {rounds}", least=k + 1)
            for p in range(n):
                a, b, at = piece(p, k)
                if p != r and b > a:
                    out[a:b] = results[at:at + b - a]
            ctl.post(r, PIECES_COPIED, k + 1)

        copy_in(0)
        for k in range(rounds):
            if k + 1 < rounds:
                copy_in(k + 1)
            reduce(k)
            if k:
                copy_out(k - 1)
        copy_out(rounds - 1)
        self._counters["shm_operations"] += 1
        return out

    def _shm_reduce(self, flat, op, slot, lo, hi, out):
        """Reduces part [lo, hi) of every rank's slot (this rank's own from ``flat``) into
        the result area and ``out``, ``_REDUCE_CHUNK_BYTES`` at a time so the running
        value stays in the cache (elementwise: the same bits as one pass)."""
        n, r = self.size, self.rank
        parts = [flat[lo:hi] if p == r else self._segment.view(flat.dtype, flat.size, p * slot)[lo:hi]
                 for p in self._shm_order(flat)]
        result = self._segment.view(flat.dtype, flat.size, n * slot)[lo:hi]
        step = max(1, _REDUCE_CHUNK_BYTES // flat.itemsize)
        for a in range(0, hi - lo, step):
            dst = result[a:a + step]
            _reduce_into(dst, [part[a:a + step] for part in parts], op)
            out[lo + a:lo + a + dst.size] = dst

    def _shm_order(self, flat):
        """The ranks in the order this rank adds their part: the order of the path the
        group takes without shared memory, so a job's result does not depend on whether
        its ranks share a host: from this rank round, as the ring completes segment r
        (part r has the ring's segment bounds), or rank order, as the direct exchange."""
        n, r = self.size, self.rank
        return [(r + j) % n for j in range(n)] if flat.nbytes >= self.ring_min_bytes else list(range(n))

    def _shm_wait(self, call, which, ranks, stage, desc=None, named=None, least=None):
        """Waits until word ``which`` of every rank in ``ranks`` holds this call's number
        (given ``least``: a count of this call's pieces of at least ``least``); a timeout
        names those of ``named`` (default: ``ranks``) that are behind.
        Between futex slices: liveness (PeerLostError), ``alive_check``, the wait log, and
        (given this rank's ``desc``) a ZeroMQ message of this call from a rank, which
        runs another operation: both sides then name the mismatch."""
        ctl, seq = self._control, word(call.seq)
        if least is None:
            def behind(group):
                return [p for p in group if ctl.get(p, which) != seq]

            def sleep(p, seconds):
                return ctl.wait(p, which, seq, seconds)
        else:
            def behind(group):
                return [p for p in group if ctl.get(p, PIECES_CALL) != seq or ctl.get(p, which) < least]

            def sleep(p, seconds):  # on the word that must change next
                if (at := ctl.get(p, PIECES_CALL)) != seq:
                    ctl.sleep(p, PIECES_CALL, at, seconds)
                elif (count := ctl.get(p, which)) < least:
                    ctl.sleep(p, which, count, seconds)
                return not behind([p])
        missing = behind(ranks)
        if not missing:
            return
        spin_end = time.monotonic() + _SHM_SPIN_S
        while missing and time.monotonic() < spin_end:  # yields the core: a rank with work gets it
            os.sched_yield()
            missing = behind(missing)
        wait = None
        while missing:
            now = time.monotonic()
            remaining = call.deadline - now
            if remaining <= 0:
                missing = behind(named or missing)
                raise self._call_timeout(call, f"{call.what} (shared memory: {stage})", missing)
            if not sleep(missing[0], min(_POLL_MS / 1000.0, remaining)):
                self._pump(0)
                self._check_peers(call.what, missing)
                if self._alive_check is not None:
                    self._alive_check()
                if desc is not None:
                    self._shm_foreign(call, desc)
                wait = self._call_wait_log(call, wait, now, missing, f"{call.what} (shared memory: {stage})")
            missing = behind(missing)

    def _shm_foreign(self, call, desc):
        """Raises the mismatch if a rank sent a ZeroMQ message of this call (it runs
        another operation), after sending every rank this one's descriptor so a rank
        waiting on ZeroMQ names it too."""
        foreign = {p: queue[0] for p in self.peers if (queue := self._inbox.get((call.seq, p)))}
        if not foreign:
            return
        for p in self.peers:
            self._send(p, call.seq, "all_reduce", step=0, desc=desc)
        seq = word(call.seq)
        descs = {p: self._control.desc(p) if self._control.get(p, ARRIVED) == seq else None for p in self.peers}
        descs.update({p: msg.header.get("d") for p, msg in foreign.items()})
        descs[self.rank] = desc
        self._raise_mismatch(call, descs)

    def _shm_write(self, flat, slot, lo, hi):
        """Copies ``flat`` but its part [lo, hi) (which this rank reduces from ``flat``)
        into this rank's slot."""
        dst = self._segment.view(flat.dtype, flat.size, self.rank * slot)
        dst[:lo] = flat[:lo]
        dst[hi:] = flat[hi:]

    def _replace_segment(self, segment):
        if self._segment is not None:
            self._segment.close()
        self._segment = segment

    def _result_buffer(self, like):
        """Returns an array of ``like``'s size and dtype for a ring result.

        From ``_SPARE_MIN_BYTES`` (32 MiB) on, malloc maps every array afresh, and the
        page faults and the kernel's zeroing of every page cost as much CPU time as the
        reduction itself; so such results are kept (the last ``_SPARES``) and an earlier
        one that nothing outside this group references any more is reused (a caller's
        array, or any view of it, holds a reference: a result still in use is never
        chosen). Smaller arrays come from malloc, which reuses freed memory itself."""
        if like.nbytes < _SPARE_MIN_BYTES:
            return np.empty_like(like)
        for spare in self._spares:  # a list iterator holds no reference to the items
            # references: the list, the loop variable and getrefcount's argument
            if spare.dtype == like.dtype and spare.size == like.size and sys.getrefcount(spare) == 3:
                return spare
        out = np.empty_like(like)
        self._spares = [*self._spares[1 - _SPARES:], out]
        return out

    def _all_gather(self, call, flat, shape, kind):
        if self.size == 1:
            return [flat.copy().reshape(shape)]
        n, r = self.size, self.rank
        left, right = (r - 1) % n, (r + 1) % n
        ring = flat.nbytes >= self.ring_min_bytes
        desc = {"kind": kind, "dtype": flat.dtype.name, "shape": list(shape), "algo": "ring" if ring else "direct"}
        tracks = [self._send(p, call.seq, kind, step=-1, array=None if ring else flat, desc=desc, track=not ring)
                  for p in self.peers]
        if ring:
            tracks += [self._send(right, call.seq, kind, step=0, chunk=c, array=flat[lo:hi], track=True)
                       for c, (lo, hi) in enumerate(_chunk_bounds(flat.size, flat.itemsize, self.chunk_bytes))]
        first = self._first_messages(call)
        descs = {p: msg.header["d"] for p, msg in first.items()}
        descs[r] = desc
        self._check_descs(call, desc, first, ("kind", "dtype", "trailing"),
                          derived={"trailing": lambda d: (len(d["shape"]), d["shape"][1:])})
        out = [None] * n
        out[r] = flat.copy().reshape(shape)
        for p, msg in first.items():
            if descs[p]["algo"] == "direct":
                out[p] = msg.arrays[0].reshape(descs[p]["shape"])
        # Ring: at step t segment (r - 1 - t) arrives, chunk by chunk, and is passed on
        # (unless the right neighbour sent it); direct segments came with the descriptors.
        for t in range(n - 1):
            segment = (r - 1 - t) % n
            seg_desc = descs[segment]
            if seg_desc["algo"] != "ring":
                continue
            dtype = message.DTYPES[seg_desc["dtype"]]
            size = math.prod(seg_desc["shape"])
            buf = np.empty(size, dtype=dtype)
            for c, (lo, hi) in enumerate(_chunk_bounds(size, dtype.itemsize, self.chunk_bytes)):
                msg = self._take_step(call, left, t, c)
                if t < n - 2:
                    self._send(right, call.seq, kind, step=t + 1, chunk=c, array=msg.arrays[0])
                if msg.arrays[0].size != hi - lo:
                    raise TransportError(f"{call.what}: rank {left} sent {msg.arrays[0].size} elements of rank "
                                         f"{segment}'s chunk {c} where {hi - lo} were expected")
                buf[lo:hi] = msg.arrays[0]
                del msg
            out[segment] = buf.reshape(seg_desc["shape"])
        self._wait_sent(call, tracks)
        return out

    def _broadcast_root(self, call, flat, shape, root):
        ring = flat.nbytes >= self.ring_min_bytes
        bounds = _chunk_bounds(flat.size, flat.itemsize, self.chunk_bytes) if ring else [(0, flat.size)]
        desc = {"kind": "broadcast", "root": root, "dtype": flat.dtype.name, "shape": list(shape),
                "algo": "ring" if ring else "direct", "chunks": len(bounds)}
        if ring:
            right = (self.rank + 1) % self.size
            tracks = [self._send(right, call.seq, "broadcast", chunk=c, array=flat[lo:hi],
                                 desc=desc if c == 0 else None, track=True) for c, (lo, hi) in enumerate(bounds)]
        else:
            tracks = [self._send(p, call.seq, "broadcast", array=flat, desc=desc, track=True) for p in self.peers]
        out = flat.copy().reshape(shape)
        self._wait_sent(call, tracks)
        return out

    def _broadcast_receive(self, call, root):
        r, n = self.rank, self.size
        left, right = (r - 1) % n, (r + 1) % n
        src, msg = self._take(call, {root, left})
        desc = msg.header.get("d")
        if not isinstance(desc, dict) or desc.get("kind") != "broadcast" or desc.get("root") != root:
            raise ConfigError(f"{call.what}: the ranks do not agree: rank {src} did "
                              f"{_describe(desc)} while rank {r} did broadcast(root={root}); every rank "
                              f"must call the same operations in the same order (with the same root)")
        dtype = message.DTYPES[desc["dtype"]]
        size = math.prod(desc["shape"])
        if desc["algo"] == "direct":
            return msg.arrays[0].reshape(desc["shape"])
        forward = right != root
        buf = np.empty(size, dtype=dtype)
        bounds = [(size * c // desc["chunks"], size * (c + 1) // desc["chunks"]) for c in range(desc["chunks"])]
        for c, (lo, hi) in enumerate(bounds):
            if c > 0:
                msg = self._take_step(call, left, 0, c)
            if forward:
                self._send(right, call.seq, "broadcast", chunk=c, array=msg.arrays[0],
                           desc=desc if c == 0 else None)
            buf[lo:hi] = msg.arrays[0]
            del msg
        return buf.reshape(desc["shape"])

    # ------------------------------------------------------------------ messages

    def _operation(self, kind, timeout_ms):
        return _Operation(self, kind, timeout_ms)

    def _send(self, dst, seq, kind, step=0, chunk=0, array=None, desc=None, track=False):
        meta = {"k": kind, "s": step, "c": chunk}
        if desc is not None:
            meta["d"] = desc
        names, arrays = (("x",), (array,)) if array is not None else ((), ())
        frames = message.encode(_WIRE_OP, seq, self.rank, names, arrays, meta, max_bytes=self._max_bytes)
        self._counters["messages_sent"] += 1
        if array is not None:
            self._counters["bytes_sent"] += array.nbytes
        # SNDHWM is 0: a send never blocks; zero-copy frames are tracked by the caller
        return self._dealers[dst].send_multipart(frames, copy=False, track=track)

    def _take(self, call, sources):
        """Returns (rank, Message): the next message of operation ``call`` from any of
        ``sources``, in the order each rank sent them. Waits up to the call's deadline."""
        wait = None
        while True:
            for src in sources:
                queue = self._inbox.get((call.seq, src))
                if queue:
                    msg = queue.popleft()
                    if not queue:
                        del self._inbox[call.seq, src]
                    return src, msg
            self._check_peers(call.what, sources)
            if self._alive_check is not None:
                self._alive_check()
            now = time.monotonic()
            remaining = call.deadline - now
            if remaining <= 0:
                raise self._call_timeout(call, call.what, sources)
            wait = self._call_wait_log(call, wait, now, sorted(sources), call.what)
            slice_ms = min(_POLL_MS, max(1, math.ceil(remaining * 1000)))
            self._pump(slice_ms)

    def _take_step(self, call, src, step, chunk):
        _, msg = self._take(call, {src})
        if msg.header.get("s") != step or msg.header.get("c") != chunk:
            raise TransportError(f"{call.what}: rank {src} sent step {msg.header.get('s')} chunk "
                                 f"{msg.header.get('c')} of {msg.header.get('k')!r} where step {step} chunk "
                                 f"{chunk} was expected; the ranks run different fleet versions or settings "
                                 f"(ring_min_bytes, chunk_bytes)")
        return msg

    def _first_messages(self, call):
        waiting = set(self.peers)
        first = {}
        while waiting:
            src, msg = self._take(call, waiting)
            first[src] = msg
            waiting.discard(src)
        return first

    def _check_descs(self, call, desc, first, keys, derived=None):
        derived = derived or {}

        def view(d):
            if not isinstance(d, dict):
                return None
            try:
                return tuple(derived[k](d) if k in derived else d.get(k) for k in keys)
            except (KeyError, TypeError, IndexError):
                return None

        descs = {p: msg.header.get("d") for p, msg in first.items()}
        descs[self.rank] = desc
        mine = view(desc)
        if all(view(d) == mine for d in descs.values()):
            return
        self._raise_mismatch(call, descs)

    def _raise_mismatch(self, call, descs):
        """Raises the ConfigError naming every rank's operation (``descs``: rank -> its
        descriptor, None when unknown)."""
        lines = "; ".join(f"rank {p}: {_describe(descs.get(p))}" for p in range(self.size))
        raise ConfigError(f"{call.what}: the ranks do not agree ({lines}); every rank must call the same "
                          f"operations in the same order with the same op, dtype and shape (all_gather: the "
                          f"same dtype and dimensions after the first)")

    def _wait_sent(self, call, trackers):
        """Waits until ZeroMQ no longer reads the memory of the tracked sends."""
        pending = [t for t in trackers if t is not None and not t.done]
        while pending:
            self._pump(0)  # connection events (liveness) and arrived messages
            self._check_peers(call.what, ())
            remaining = call.deadline - time.monotonic()
            if remaining <= 0:
                right = (self.rank + 1) % self.size
                raise self._call_timeout(call, f"{call.what} (sending)", {right})
            try:  # wakes as soon as ZeroMQ releases the memory, not at the next poll tick
                pending[0].wait(min(remaining, _POLL_MS / 1000.0))
            except zmq.NotDone:
                pass
            pending = [t for t in pending if not t.done]

    def _pump(self, timeout_ms):
        """Waits up to ``timeout_ms`` for a message or a connection event and handles all
        that arrived."""
        ready = dict(self._poller.poll(timeout_ms))
        if self._router in ready:
            for _ in range(_DRAIN):
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._accept(frames)
        for peer, monitor in self._monitors.items():
            if monitor in ready:
                self._read_events(peer, monitor)

    def _accept(self, frames):
        try:
            if len(frames) < 2:
                raise TransportError("a message without a header")
            msg = message.decode(frames[1:], self._max_bytes)
            src, meta = msg.header["worker"], msg.header
            if msg.header["op"] != _WIRE_OP or not 0 <= src < self.size or src == self.rank:
                raise TransportError(f"op {msg.header['op']!r} from rank {src} is not a message of this group")
            if frames[0].bytes != _identity(src):
                raise TransportError(f"a message claiming to come from rank {src} came from another connection")
            kind = meta.get("k")
        except (TransportError, KeyError, TypeError) as e:
            self._counters["malformed_messages"] += 1
            log.warning("fleet: rank %d of the worker group dropped a malformed message: %s", self.rank, e)
            return
        self._counters["messages_received"] += 1
        self._counters["bytes_received"] += sum(a.nbytes for a in msg.arrays)
        if kind == "hello":
            self._hello[src] = meta.get("d")
        elif kind == "bye":
            self._bye.add(src)
            lost = meta.get("lost")
            if (self._lost is None and isinstance(lost, list) and len(lost) == 2 and isinstance(lost[1], str)
                    and isinstance(lost[0], int) and 0 <= lost[0] < self.size and lost[0] != self.rank):
                rank = lost[0]
                self._lost = PeerLostError(rank, self.endpoints[rank], f"{lost[1]} (reported by rank {src})")
                log.error("fleet: rank %d: %s", self.rank, self._lost)
        elif msg.seq < self._seq or (msg.seq == self._seq and not self._in_operation):
            self._counters["stale_messages"] += 1
            log.debug("fleet: rank %d dropped a late message of operation %d from rank %d", self.rank, msg.seq, src)
        else:
            self._inbox.setdefault((msg.seq, src), collections.deque()).append(msg)

    def _read_events(self, peer, monitor):
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_DISCONNECTED:
                if peer in self._hello and peer not in self._bye:
                    self._down.setdefault(peer, time.monotonic())
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._auth_failed.pop(peer, None)
            else:
                self._auth_failed[peer] = {
                    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "it refused this rank's CURVE key",
                    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the handshake failed (CURVE on one side only?)",
                }.get(kind, "the handshake failed (CURVE keys that do not match, or CURVE on one side only?)")

    def _check_peers(self, what, waiting_for):
        if self._lost is not None:
            raise self._fresh_lost()
        now = time.monotonic()
        grace = min(_DOWN_GRACE_MS, self._heartbeat_ms) / 1000.0
        for peer, since in sorted(self._down.items()):
            if peer in self._bye:
                continue
            if now - since >= grace:
                self._lost = PeerLostError(peer, self.endpoints[peer], (
                    f"rank {peer} ({self.endpoints[peer]}) of the worker group is lost: its connection to rank "
                    f"{self.rank} dropped during {what} without a goodbye; it died, was killed, hangs or is "
                    f"unreachable (ZeroMQ heartbeats every {self._heartbeat_ms} ms drop a silent connection after "
                    f"{settings.HEARTBEAT_TIMEOUT_MS_ENV}={self._heartbeat_timeout_ms}). Check that worker's log; "
                    f"the group cannot go on without it: restart the job (from its last checkpoint)"))
                log.error("fleet: rank %d: %s", self.rank, self._lost)
                raise self._fresh_lost()
        for peer in sorted(waiting_for):
            if peer in self._bye:
                raise TransportError(
                    f"rank {peer} ({self.endpoints[peer]}) closed the worker group while rank {self.rank} waits "
                    f"for it in {what}: the ranks did not call the same operations (e.g. one ran out of data "
                    f"first); make every rank call the same operations, or stop every rank at the same step")

    def _report_loss(self):
        """Tells the ranks still there which rank was lost, so each names the rank that
        failed first rather than this one, which leaves now without a regular goodbye."""
        for peer in self.peers:
            if peer == self._lost.rank or peer in self._down:
                continue
            self._dealers[peer].linger = _REPORT_LINGER_MS  # close() waits so long for it to leave
            meta = {"k": "bye", "s": 0, "c": 0, "lost": [self._lost.rank, str(self._lost)]}
            self._dealers[peer].send_multipart(message.encode(_WIRE_OP, -1, self.rank, meta=meta))

    def _fresh_lost(self):
        cls, args = self._lost.__reduce__()[:2]
        return cls(*args)

    def _call_timeout(self, call, what, ranks):
        """The FleetTimeoutError of an operation whose ``ranks`` did not answer in ``what``
        within its timeout."""
        return FleetTimeoutError(self._timeout_text(what, ranks, call.timeout_ms,
                                                    f"{settings.RPC_TIMEOUT_MS_ENV} or timeout_ms="))

    def _call_wait_log(self, call, wait, now, ranks, what):
        """An operation's wait for ``ranks`` in ``what``: its WaitLog (``wait``, None until
        the operation has waited ``call.log_after`` seconds), made when due and ticked.
        Returns it."""
        if wait is None and now - call.started >= call.log_after:
            wait = WaitLog(f"{_ranks_text(ranks, self.endpoints)} in {what}",
                           limit=f"giving up after {call.timeout_ms} ms ({settings.RPC_TIMEOUT_MS_ENV} or timeout_ms=)",
                           logger=log, first_s=call.log_after, started=call.started)
        if wait is not None:
            wait.tick()
        return wait

    def _timeout_text(self, what, ranks, timeout_ms, setting):
        ranks = sorted(ranks)
        text = (f"{_ranks_text(ranks, self.endpoints)} did not answer rank {self.rank} in {what} within "
                f"{timeout_ms} ms; {'it is' if len(ranks) == 1 else 'they are'} not started, stuck, slower than "
                f"that or unreachable (raise the limit with {setting} if only slow)")
        refused = {p: self._auth_failed[p] for p in ranks if p in self._auth_failed}
        if refused:
            text += "; " + "; ".join(f"connecting to rank {p}: {why}" for p, why in sorted(refused.items()))
        if self.curve is None:
            text += (f". If the job uses CURVE ({KEYS_DIR_ENV} or FLEET_CURVE_* variables), this process needs the "
                     f"same keys")
        else:
            text += ". This rank uses CURVE: every worker needs the job's client key pair"
        return text

    # ------------------------------------------------------------------ sockets

    def _open(self):
        self._ctx = zmq.Context()
        host, port = endpoint_rules.parse_endpoint(self.endpoints[self.rank], "endpoint", ConfigError)
        if self.curve is not None:
            check_curve_available()
            if self.curve.client_public is None or self.curve.client_secret is None:
                raise ConfigError(
                    f"CURVE is on ({self.curve.source}) but the client key pair is missing; the worker group "
                    f"authenticates workers with it: set FLEET_CURVE_CLIENT_PUBLIC and FLEET_CURVE_CLIENT_SECRET, "
                    f"or put client.key_secret in {KEYS_DIR_ENV}")
            self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("fleet.transport.zap"))
            self._auth.start()
            self._auth.configure_curve_callback("fleet-group", _Keys(self.curve.authorized_clients))
        router = self._ctx.socket(zmq.ROUTER)
        self._router = router
        self._configure(router)
        router.rcvhwm = 0
        if self.curve is not None:
            router.curve_server = True
            router.curve_publickey = self.curve.client_public
            router.curve_secretkey = self.curve.client_secret
            router.zap_domain = b"fleet-group"
        bind = settings.bind_host() or host
        router.ipv6 = ":" in bind
        try:
            router.bind(f"tcp://{endpoint_rules.join_endpoint(bind, port)}")
        except zmq.ZMQError as e:
            raise TransportError(
                f"rank {self.rank} of the worker group cannot bind {endpoint_rules.join_endpoint(bind, port)} "
                f"(its entry of {ENDPOINTS_ENV}): {e.strerror}. Free that port (`ss -ltnp | grep :{port}` shows "
                f"who holds it), give this worker another endpoint, or set {settings.BIND_HOST_ENV}") from e
        self._poller = zmq.Poller()
        self._poller.register(router, zmq.POLLIN)
        for peer in self.peers:
            dealer = self._ctx.socket(zmq.DEALER)
            self._dealers[peer] = dealer
            self._configure(dealer)
            dealer.sndhwm = 0
            dealer.routing_id = _identity(self.rank)
            if self.curve is not None:
                dealer.curve_serverkey = self.curve.client_public
                dealer.curve_publickey = self.curve.client_public
                dealer.curve_secretkey = self.curve.client_secret
            monitor = dealer.get_monitor_socket(_MONITOR_EVENTS)
            self._monitors[peer] = monitor
            self._poller.register(monitor, zmq.POLLIN)
            dealer.ipv6 = self.endpoints[peer].startswith("[")
            dealer.connect(f"tcp://{self.endpoints[peer]}")

    def _configure(self, sock):
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, self._max_bytes + message.MAX_HEADER_BYTES)
        sock.heartbeat_ivl = self._heartbeat_ms
        sock.heartbeat_timeout = self._heartbeat_timeout_ms
        sock.heartbeat_ttl = min(self._heartbeat_timeout_ms, 6_553_500)

    def _join(self, timeout_ms):
        desc = {"size": self.size, "endpoints": self.endpoints, "host": self._host}
        if self.rank == 0 and self._host is not None:  # the shared-memory all_reduce's, if every rank is here
            self._control = ControlBlock.create(self.size)
            desc["control"] = [*self._control.segment.key, self._control.segment.nbytes]
        for peer in self.peers:
            self._send(peer, 0, "hello", desc=desc)
        started = time.monotonic()
        deadline = started + timeout_ms / 1000.0
        wait = WaitLog(f"the worker group's other ranks to join rank {self.rank}",
                       limit=f"giving up after {timeout_ms / 1000:g} s ({settings.CONNECT_TIMEOUT_MS_ENV})", logger=log)
        while True:
            missing = [p for p in self.peers if p not in self._hello]
            if not missing:
                break
            wait.tick(f"{self.size - 1 - len(missing)} of {self.size - 1} joined; not yet "
                      f"{_ranks_text(missing, self.endpoints)}")
            if self._alive_check is not None:
                self._alive_check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FleetTimeoutError(self._timeout_text("joining the worker group", missing, timeout_ms,
                                                           settings.CONNECT_TIMEOUT_MS_ENV))
            self._pump(min(_POLL_MS, max(1, math.ceil(remaining * 1000))))
        for peer in self.peers:
            theirs = self._hello[peer]
            if not isinstance(theirs, dict) or [theirs.get("size"), theirs.get("endpoints")] != [self.size,
                                                                                                self.endpoints]:
                raise ConfigError(
                    f"rank {peer} of the worker group was started with other endpoints than rank {self.rank}: "
                    f"it has {theirs.get('endpoints') if isinstance(theirs, dict) else theirs!r}, this rank has "
                    f"{self.endpoints}; give every worker the same {ENDPOINTS_ENV}")
        self.shared_memory = self._host is not None and all(self._hello[p].get("host") == self._host
                                                            for p in self.peers)
        if not self.shared_memory and self._control is not None:
            self._control.close()
            self._control = None
        elif self.shared_memory and self.rank != 0:
            control = self._hello[0].get("control")
            if not (isinstance(control, list) and len(control) == 4 and all(isinstance(v, int) for v in control)):
                raise TransportError(f"rank 0 of the worker group described its shared memory as {control!r}, not "
                                     f"[pid, fd, key, bytes]; the ranks run different fleet versions")
            self._control = ControlBlock.attach(control[:3], control[3], self.size)

    def _wait_goodbyes(self):
        started = time.monotonic()
        deadline = started + self.timeout_ms / 1000.0
        grace = min(_DOWN_GRACE_MS, self._heartbeat_ms) / 1000.0
        wait = WaitLog(f"the worker group's other ranks to close (rank {self.rank} closed)",
                       limit=f"closing anyway after {self.timeout_ms} ms ({settings.RPC_TIMEOUT_MS_ENV})", logger=log)
        while True:
            now = time.monotonic()
            missing = [p for p in self.peers if p not in self._bye
                       and not (p in self._down and now - self._down[p] >= grace)]
            if not missing:
                return
            if now >= deadline:
                log.warning("fleet: rank %d closed the worker group without goodbyes from %s within %d ms",
                            self.rank, _ranks_text(missing, self.endpoints), self.timeout_ms)
                return
            wait.tick(f"not yet {_ranks_text(missing, self.endpoints)}")
            self._pump(min(_POLL_MS, max(1, math.ceil((deadline - now) * 1000))))

    def _teardown(self):
        for peer, dealer in self._dealers.items():
            if peer in self._monitors:
                try:
                    dealer.disable_monitor()
                except zmq.ZMQError:
                    pass
        for sock in [*self._monitors.values(), self._router]:
            if sock is not None:
                sock.close(linger=0)
        for sock in self._dealers.values():
            sock.close()  # linger 0 but for a loss report in flight (_report_loss)
        self._monitors, self._dealers, self._router = {}, {}, None
        stopped = True
        who = f"rank {self.rank} of the worker group"
        if self._auth is not None:
            stopped = stop_authenticator(self._auth, who)
            self._auth = None
        if self._ctx is not None:
            if stopped:  # else its thread still holds sockets of the context: term() would wait for it
                terminate_context(self._ctx, who)
            self._ctx = None
        self._inbox.clear()
        self._spares = []
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        if self._control is not None:
            self._control.close()
            self._control = None


class _Operation:
    """The state of one collective call: its sequence number, deadline and name."""

    def __init__(self, group, kind, timeout_ms):
        self.group = group
        self.kind = kind
        self.timeout_ms = _check_timeout(timeout_ms, "timeout_ms") if timeout_ms is not None else group.timeout_ms

    def __enter__(self):
        group = self.group
        group._lock.acquire()
        try:
            if group._closed:
                raise TransportError(f"{self.kind} on rank {group.rank}: the worker group is closed")
            if group._lost is not None:
                raise group._fresh_lost()
            if group.size > 1:
                group._check_peers(self.kind, ())
        except BaseException:
            group._lock.release()
            raise
        group._seq += 1
        group._in_operation = True
        group._counters["operations"] += 1
        self.seq = group._seq
        for key in [k for k in group._inbox if k[0] < self.seq]:
            del group._inbox[key]
        self.what = f"{self.kind} #{self.seq} (rank {group.rank} of {group.size})"
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout_ms / 1000.0
        self.log_after = wait_log_ms() / 1000.0 or math.inf
        return self

    def __exit__(self, *exc):
        group = self.group
        group._in_operation = False
        for key in [k for k in group._inbox if k[0] <= self.seq]:
            del group._inbox[key]
        group._lock.release()


def group_from_env(role_maker=None, timeout_ms=None, alive_check=None):
    """Returns the WorkerGroup of this worker, from a role maker or Paddle's variables.

    Args:
        role_maker: a fleet role maker of a worker (its ``get_trainer_endpoints()`` and
            ``worker_index()``), or None to read PADDLE_TRAINER_ENDPOINTS and
            PADDLE_TRAINER_ID.
        timeout_ms: the group's default operation timeout (FLEET_RPC_TIMEOUT_MS).
        alive_check: as ``WorkerGroup``'s.

    CURVE keys come from the environment (``CurveConfig.from_env()``).

    Raises:
        ConfigError: a variable is missing or malformed (names it and what to set), or the
            role maker is a server's or knows no worker endpoints.
        TransportError, FleetTimeoutError: as ``WorkerGroup``.
    """
    if role_maker is not None:
        if not role_maker.is_worker():
            raise ConfigError(f"{role_maker!r} is a parameter server's role; only workers join the worker group")
        endpoints = role_maker.get_trainer_endpoints()
        rank = role_maker.worker_index()
        if not endpoints:
            raise ConfigError(f"the role maker knows no worker endpoints, which the worker group needs; set "
                              f"{ENDPOINTS_ENV} to every worker's host:port (fleetrun sets it)")
    else:
        text = os.environ.get(ENDPOINTS_ENV, "")
        if not text.strip():
            raise ConfigError(f"{ENDPOINTS_ENV} is not set, but the worker group needs it; set it to every "
                              f"worker's host:port, comma separated, the same on every worker (fleetrun sets it)")
        endpoints = endpoint_rules.parse_endpoint_list(text, ENDPOINTS_ENV, ConfigError)
        rank_text = os.environ.get(RANK_ENV)
        if rank_text is None:
            raise ConfigError(f"{RANK_ENV} is not set, but the worker group needs it; set it to this worker's "
                              f"index in {ENDPOINTS_ENV} (0 to {len(endpoints) - 1})")
        rank = parse_int(RANK_ENV, rank_text, 0, len(endpoints),
                         f"this worker's index in {ENDPOINTS_ENV} (0 to {len(endpoints) - 1})", ConfigError)
    return WorkerGroup(endpoints, rank, curve=CurveConfig.from_env(), timeout_ms=timeout_ms, alive_check=alive_check)


# ---------------------------------------------------------------------- helpers

def _identity(rank):
    return b"fleet-rank-%d" % rank


def _check_endpoints(endpoints):
    if isinstance(endpoints, str) or not hasattr(endpoints, "__iter__"):
        raise ConfigError(f"endpoints={endpoints!r} is not a list of 'host:port' strings; pass every worker's "
                          f"endpoint, e.g. ['10.0.0.1:6170', '10.0.0.2:6170']")
    endpoints = list(endpoints)
    if not endpoints:
        raise ConfigError("endpoints is empty; pass every worker's 'host:port', this one included")
    for endpoint in endpoints:
        endpoint_rules.parse_endpoint(endpoint, "worker endpoint", ConfigError)
    if len(set(endpoints)) != len(endpoints):
        dup = next(e for e in endpoints if endpoints.count(e) > 1)
        raise ConfigError(f"worker endpoint {dup!r} is listed twice in {endpoints}; give every worker its own port")
    return endpoints


def _check_rank(rank, size):
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise ConfigError(f"rank={rank!r} is not an index of the {size} endpoints; pass an int in [0, {size})")
    return int(rank)


def _check_timeout(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r} is not a positive number of milliseconds")
    return int(value)


def _flat(array, what, dtypes):
    if isinstance(array, np.generic):  # a numpy scalar: a 0-d array
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise ConfigError(f"{what}: got a {type(array).__name__}, not a numpy array; pass np.asarray(x)")
    if array.dtype.name not in dtypes or not array.dtype.isnative:
        raise ConfigError(f"{what}: dtype {array.dtype.str} ({array.dtype.name}) is not one of {', '.join(dtypes)} "
                          f"in native byte order; convert with array.astype(np.float32) (or another of those)")
    return np.ascontiguousarray(array).reshape(-1), tuple(int(d) for d in array.shape)


def _reduce_into(dst, parts, op):
    """dst = parts[0] op parts[1] op ... in that order (and / len(parts) for "mean")."""
    ufunc = _UFUNCS[op]
    ufunc(parts[0], parts[1], out=dst)
    for part in parts[2:]:
        ufunc(dst, part, out=dst)
    if op == "mean":
        np.divide(dst, len(parts), out=dst)


def _chunk_bounds(size, itemsize, chunk_bytes):
    count = max(1, math.ceil(size * itemsize / chunk_bytes))
    return [(size * c // count, size * (c + 1) // count) for c in range(count)]


def _ring_regions(size, parts, itemsize, chunk_bytes):
    """regions[k][c] = (lo, hi) of chunk c of segment k; every segment has as many chunks."""
    bounds = [size * k // parts for k in range(parts + 1)]
    longest = max(bounds[k + 1] - bounds[k] for k in range(parts))
    count = max(1, math.ceil(longest * itemsize / chunk_bytes))
    regions = []
    for k in range(parts):
        lo, length = bounds[k], bounds[k + 1] - bounds[k]
        regions.append([(lo + length * c // count, lo + length * (c + 1) // count) for c in range(count)])
    return regions


def _ranks_text(ranks, endpoints):
    ranks = sorted(ranks)
    listed = ", ".join(f"{p} ({endpoints[p]})" for p in ranks)
    return f"rank {listed}" if len(ranks) == 1 else f"ranks {listed}"


def _describe(desc):
    if not isinstance(desc, dict):
        return "an unknown operation"
    kind = desc.get("kind", "?")
    shape = desc.get("shape")
    dims = "[" + ", ".join(map(str, shape)) + "]" if isinstance(shape, list) else ""
    if kind == "all_reduce":
        return f"all_reduce(op={desc.get('op')!r}) of {desc.get('dtype')}{dims} ({desc.get('algo')})"
    if kind in ("all_gather", "all_gather_object"):
        return f"{kind} of {desc.get('dtype')}{dims}"
    if kind == "broadcast":
        return f"broadcast(root={desc.get('root')}) of {desc.get('dtype')}{dims}"
    return str(kind)


class _Keys:
    def __init__(self, keys):
        self.keys = frozenset(keys)

    def callback(self, domain, key):
        return key in self.keys


_SAFE_GLOBALS = {
    ("builtins", name) for name in ("complex", "set", "frozenset", "slice", "range", "bytearray")
} | {
    (module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
    for name in ("scalar", "_reconstruct")
} | {
    (module, "_frombuffer") for module in ("numpy.core.numeric", "numpy._core.numeric")
} | {("numpy", "dtype"), ("numpy", "ndarray"), ("collections", "OrderedDict")}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SAFE_GLOBALS or module == "numpy.dtypes":
            return super().find_class(module, name)
        raise TransportError(f"all_gather_object carries builtin types and numpy arrays only, not "
                             f"{module}.{name}; convert it to those (e.g. a dict of lists)")


def _loads(data):
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except TransportError:
        raise
    except Exception as e:  # a corrupt pickle raises many types
        raise TransportError(f"all_gather_object received data that does not unpickle ({type(e).__name__}: {e})")
