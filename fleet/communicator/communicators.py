"""The four strategies' communicators (Paddle's Sync, HalfAsync, Async and GeoSgd).

- ``SyncCommunicator``: a step's (thread-averaged) gradients go to every server in one
  ``sync_push``; each server answers once every worker's step is in and applied, with
  the fresh values of its dense blocks. When ``send`` returns, parameters are updated.
- ``HalfAsyncCommunicator``: the same step from the worker's side, but servers apply on
  arrival; the worker then pulls fresh dense parameters.
- ``AsyncCommunicator``: ``send`` puts gradients on per-parameter bounded queues (a full
  queue blocks training: back-pressure); a send thread merges up to
  ``max_merge_var_num`` per parameter (sum for SGD, mean otherwise), sends, and pulls
  dense parameters after each round, or a recv thread pulls after
  ``min_send_grad_num_before_recv`` sends.
- ``GeoCommunicator``: training is local; every ``update_frequency`` steps the worker
  sends (local - last synced) / workers for dense blocks and the sparse rows touched, and
  takes back the servers' values (sparse: the rows changed since its last exchange).
"""
import logging
import queue
import threading
import time

import numpy as np

from fleet.errors import FleetTimeoutError
from fleet.framework.runner import reduce_gradients
from fleet.framework.tensor import SparseRows
from fleet.communicator.base import Communicator
from fleet.transpiler.plan import DENSE, SPARSE

log = logging.getLogger("fleet")


class SyncCommunicator(Communicator):
    mode = "sync"
    requires_thread_barrier = True

    def send(self, grads):
        """Sends the step's gradients; returns when every server applied the step with all
        workers' gradients and this worker holds the updated dense parameters."""
        per_ep = self.split_grads(grads)
        pulls = {}
        for p in self.dense:
            for b in p.blocks:
                pulls.setdefault(b.endpoint, []).append(b.name)
        requests = {ep: ("sync_push", names, arrays, {"pull": pulls.get(ep, [])})
                    for ep, (names, arrays) in per_ep.items()}
        replies = self._all(requests)
        self._count("sends")
        for reply in replies.values():
            self._write_blocks(reply.names, reply.arrays)


class HalfAsyncCommunicator(Communicator):
    mode = "half_async"
    requires_thread_barrier = True

    def send(self, grads):
        """Sends the step's gradients (applied on arrival), then pulls fresh dense
        parameters; blocks until both are done."""
        requests = self._requests("push", self.split_grads(grads))
        if requests:
            self._all(requests)
        self._count("sends")
        self.pull_dense()


def _copy(value):
    if isinstance(value, SparseRows):
        return SparseRows(value.rows.copy(), value.values.copy(), value.height)
    return np.array(value, dtype=np.float32, copy=True)


class AsyncCommunicator(Communicator):
    mode = "async"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        f = self.flags
        self.queue_size = int(f.get("communicator_send_queue_size", 1))
        self.max_merge = int(f.get("communicator_max_merge_var_num", 1))
        self.independent_recv = bool(int(f.get("communicator_independent_recv_thread", 0)))
        self.min_send_before_recv = int(f.get("communicator_min_send_grad_num_before_recv", 1))
        self.sum_merge = bool(int(f.get("communicator_is_sgd_optimizer", 1)))
        self._queues = {}
        self._stop = threading.Event()
        self._error = None
        self._sent_since_recv = 0
        self._cv = threading.Condition()
        self._threads = []
        self.put_timeout = float(f.get("put_timeout_s", 600.0))

    def start(self):
        super().start()
        self._queues = {p.grad: queue.Queue(maxsize=self.queue_size) for p in self.plan.params.values()}
        self._start_threads()

    def _start_threads(self):
        self._stop.clear()
        self._threads = [threading.Thread(target=self._send_loop, name="fleet-send", daemon=True)]
        if self.independent_recv:
            self._threads.append(threading.Thread(target=self._recv_loop, name="fleet-recv", daemon=True))
        for t in self._threads:
            t.start()

    def _stop_threads(self):
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=60)
            if t.is_alive():
                raise FleetTimeoutError(
                    f"the async {t.name} thread did not finish within 60 s: a request to "
                    f"{self.endpoints} is stuck (check the servers' logs)")
        self._threads = []

    def _raise_if_failed(self):
        if self._error is not None:
            raise self._error
        self.check_alive()

    def send(self, grads):
        """Queues copies of the gradients; blocks while a queue is full (back-pressure).

        Raises:
            the error that stopped the send or recv thread, or the job's failure
            (``check_alive``), at the next call after it happened.
        """
        self._raise_if_failed()
        for name, value in grads.items():
            q = self._queues.get(name)
            if q is None or value is None:
                continue
            item = _copy(value)
            deadline = time.monotonic() + self.put_timeout
            while True:
                try:
                    q.put(item, timeout=0.5)
                    break
                except queue.Full:
                    self._raise_if_failed()
                    if time.monotonic() > deadline:
                        raise FleetTimeoutError(
                            f"the send queue of {name!r} stayed full for {self.put_timeout:.0f} s: the "
                            f"servers {self.endpoints} are not taking gradients (check their logs)")
            with self._cv:
                self._cv.notify()

    def _drain(self):
        """One round: pop up to max_merge per parameter, merge, send. Returns items sent."""
        grads = {}
        popped = 0
        for name, q in self._queues.items():
            items = []
            while len(items) < self.max_merge:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            if items:
                popped = max(popped, len(items))
                grads[name] = reduce_gradients(items, average=not self.sum_merge)
        if grads:
            requests = self._requests("push", self.split_grads(grads))
            if requests:
                self._all(requests)
            self._count("sends")
        return popped

    def _send_loop(self):
        try:
            while not self._stop.is_set():
                sent = self._drain()
                if sent:
                    if self.independent_recv:
                        with self._cv:
                            self._sent_since_recv += sent
                            self._cv.notify_all()
                    else:
                        self.pull_dense()
                else:
                    with self._cv:
                        self._cv.wait(0.01)
        except BaseException as e:  # noqa: BLE001 - surfaced to the training threads
            self._error = self._error or e
            log.error("fleet: async send thread failed: %s", e)

    def _recv_loop(self):
        try:
            while not self._stop.is_set():
                with self._cv:
                    if self._sent_since_recv < self.min_send_before_recv:
                        self._cv.wait(0.01)
                        continue
                    self._sent_since_recv = 0
                self.pull_dense()
        except BaseException as e:  # noqa: BLE001 - surfaced to the training threads
            self._error = self._error or e
            log.error("fleet: async recv thread failed: %s", e)

    def flush(self):
        """Sends everything queued and pulls fresh parameters; blocks until done. The send
        thread keeps running afterwards unless the communicator is stopping."""
        if not self._queues:
            return
        self._stop_threads()
        self._raise_if_failed()
        while self._drain():
            pass
        self.pull_dense()
        if self.running and not self._closing:
            self._start_threads()


class GeoCommunicator(Communicator):
    mode = "geo"

    def __init__(self, *args, update_frequency=100, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = int(update_frequency)
        self._steps = 0
        self._touched = {}  # table -> list of row arrays
        self._lock = threading.Lock()
        self._old = {}
        self.tables = [p for p in self.plan.params.values() if p.kind == SPARSE]

    def snapshot(self):
        """Records the values every worker starts from (after init_worker's pull)."""
        for p in self.plan.params.values():
            self._old[p.name] = np.array(self.scope[p.name], dtype=np.float32, copy=True)

    def send(self, grads):
        raise AssertionError("GEO workers update locally; the program calls geo_step")

    def geo_step(self, grads):
        """Counts a local step and records the sparse rows it touched; every k steps
        exchanges deltas with the servers (blocks during the exchange).

        Raises:
            the job's failure (``check_alive``), at the first step after it happened.
        """
        self.check_alive()
        with self._lock:
            for name, value in grads.items():
                if isinstance(value, SparseRows) and len(value.rows):
                    self._touched.setdefault(name, []).append(value.rows.copy())
            self._steps += 1
            if self._steps >= self.k:
                self._exchange()

    def flush(self):
        with self._lock:
            if self._steps:
                self._exchange()

    def _exchange(self):
        workers = self.plan.worker_num
        by_grad = {p.grad: p for p in self.plan.params.values()}
        out = {ep: ([], []) for ep in self.endpoints}
        pulls, changed = {}, {}
        for p in self.plan.params.values():
            local = self.scope[p.name]
            old = self._old[p.name]
            if p.kind == DENSE:
                delta = (local - old) * np.float32(1.0 / workers)
                old += delta
                for b in p.blocks:
                    out[b.endpoint][0].append(b.name)
                    out[b.endpoint][1].append(b.rows_of(delta))
                    pulls.setdefault(b.endpoint, []).append(b.name)
            else:
                for b in p.blocks:
                    changed.setdefault(b.endpoint, []).append(b.name)
        for gname, rows_list in self._touched.items():
            p = by_grad[gname]
            rows = np.unique(np.concatenate(rows_list))
            local, old = self.scope[p.name], self._old[p.name]
            delta = (local[rows] - old[rows]) * np.float32(1.0 / workers)
            old[rows] += delta
            self._route_rows(p, rows, delta, out)
        requests = {ep: ("geo_push", names, arrays, {"pull": pulls.get(ep, []), "pull_changed": changed.get(ep, [])})
                    for ep, (names, arrays) in out.items()}
        replies = self._all(requests)
        for reply in replies.values():
            names, arrays = reply.names, reply.arrays
            i = 0
            while i < len(names):
                name = names[i]
                if name.endswith("@ROWS"):
                    p, _ = self._block_by_name(name[:-5])
                    rows, values = arrays[i], arrays[i + 1]
                    local, old = self.scope[p.name], self._old[p.name]
                    local[rows] += values - old[rows]
                    old[rows] = values
                    i += 2
                    continue
                p, b = self._block_by_name(name)
                local, old = self.scope[p.name], self._old[p.name]
                lv, ov = b.rows_of(local), b.rows_of(old)
                server = arrays[i].reshape(lv.shape)
                lv += server - ov
                ov[...] = server
                i += 1
        self._touched = {}
        self._steps = 0
        self._count("sends")


def make_communicator(mode, plan, worker_id, scope, flags, connect, update_frequency=100, liveness=None):
    """Returns the communicator of ``mode`` ("sync", "async", "half_async", "geo");
    ``liveness`` as for ``Communicator``."""
    if mode == "sync":
        return SyncCommunicator(plan, worker_id, scope, flags, connect, liveness=liveness)
    if mode == "half_async":
        return HalfAsyncCommunicator(plan, worker_id, scope, flags, connect, liveness=liveness)
    if mode == "async":
        return AsyncCommunicator(plan, worker_id, scope, flags, connect, liveness=liveness)
    if mode == "geo":
        return GeoCommunicator(plan, worker_id, scope, flags, connect, update_frequency=update_frequency,
                               liveness=liveness)
    raise TypeError("Training MODE do not supported")
