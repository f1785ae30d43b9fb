"""The geo strategy's communicator (Paddle's Geo).

- ``GeoCommunicator``: training is local; every ``update_frequency`` steps the worker
  sends (local - last synced) / workers for dense blocks and the sparse rows touched, and
  takes back the servers' values (sparse: the rows changed since its last exchange). The
  first exchanges come sooner, after 1, 2, 4, ... steps, doubling up to
  ``update_frequency``: workers drift apart fastest at the start, and a pass shorter than
  ``update_frequency`` would otherwise average models trained apart (it is logged).
  In an elastic job "workers" is how many train now (server 0 says so at every exchange),
  not the MAX worker slots.

  The exchange does not stop training: the step that reaches it works out the deltas
  (and counts them as exchanged) and hands the requests to a background thread; the
  first step after the servers' replies arrived applies them (local += server - last
  synced, so the steps trained meanwhile are kept and go out with the next exchange). At
  most one exchange is in flight: a step that reaches the next one first waits for it.
  ``flush`` (end of a pass, saves, ``stop``) waits for it and exchanges what is left.
"""
import concurrent.futures
import logging
import threading

import numpy as np

from fleet.communicator.api import register
from fleet.communicator.base import Communicator
from fleet.framework.tensor import SparseRows
from fleet.transpiler.plan import DENSE, SPARSE

log = logging.getLogger("fleet")


@register("geo")
class GeoCommunicator(Communicator):
    mode = "geo"

    def __init__(self, *args, update_frequency=100, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = int(update_frequency)
        self.interval = 1  # steps until the next exchange: doubles up to k
        self._steps = 0
        self._pass_steps = 0
        self._warned_short_pass = False
        self._touched = {}  # table -> list of row arrays
        self._lock = threading.Lock()
        self._pool = None  # the background exchange's thread (start .. stop)
        self._in_flight = None  # the future of the exchange being sent, or None
        self._submitted = 0  # exchanges handed over (sent, or being sent)
        self._old = {}
        self.tables = [p for p in self.plan.params.values() if p.kind == SPARSE]

    def snapshot(self):
        """Records the values every worker starts from (after init_worker's pull)."""
        for p in self.plan.params.values():
            self._old[p.name] = np.array(self.scope[p.name], dtype=np.float32, copy=True)

    def start(self):
        super().start()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fleet-geo")

    def stop(self):
        try:
            super().stop()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def send(self, grads):
        raise AssertionError("GEO workers update locally; the program calls geo_step")

    def geo_step(self, grads):
        """Counts a local step and records the sparse rows it touched; applies the
        servers' replies to the last exchange once they are in; every k steps starts an
        exchange of deltas with the servers (in the background; waits only for the one
        still in flight, if any).

        Raises:
            the job's failure (``check_alive``), at the first step after it happened; an
            exchange's error (e.g. ServerLostError), at the first step after it failed.
        """
        self.check_alive()
        with self._lock:
            for name, value in grads.items():
                if isinstance(value, SparseRows) and len(value.rows):
                    self._touched.setdefault(name, []).append(value.rows.copy())
            self._steps += 1
            self._pass_steps += 1
            self._collect(wait=False)
            if self._steps >= self.interval:
                self._exchange()
                self.interval = min(self.k, 2 * self.interval)

    def steps_since_exchange(self):
        """Local steps not yet exchanged with the servers: this worker's staleness in
        steps (telemetry). Never blocks."""
        return self._steps

    def pushes_mark(self):
        """(exchanges handed over so far, local steps not yet in one): the steps before
        the mark are on the servers once those exchanges and, if there were such steps,
        the next one have been answered (``pushes_sent``)."""
        with self._lock:
            return self._submitted, self._steps

    def pushes_sent(self, mark):
        if mark is None:
            return True
        submitted, steps = mark
        with self._stats_lock:
            return self.stats["sends"] >= submitted + (1 if steps else 0)

    def flush(self):
        """Waits for the exchange in flight and exchanges the steps since (blocks)."""
        with self._lock:
            self._collect(wait=True)
            if self._steps:
                self._exchange()
                self._collect(wait=True)

    def begin_pass(self, threads):
        with self._lock:
            self._pass_steps = 0

    def end_pass(self):
        """Exchanges what is left; logs once when the pass was shorter than update_frequency."""
        with self._lock:
            steps = self._pass_steps
        if 0 < steps < self.k and not self._warned_short_pass:
            self._warned_short_pass = True
            log.warning(
                "fleet: GEO worker %d ran %d steps this pass, fewer than update_frequency=%d: it exchanged with "
                "the servers only during the first steps (after 1, 2, 4, ... steps) and at the end of the pass, so "
                "the workers trained apart in between; set update_frequency to at most %d (a quarter of a pass) "
                "to average them regularly", self.worker_id, steps, self.k, max(1, steps // 4))
        super().end_pass()

    def _exchange(self):
        """Works out and counts this exchange's deltas, then sends them: in the
        background once started (``_collect`` applies the replies), else here."""
        self._collect(wait=True)  # one exchange in flight at most: its replies move `old`
        requests = self._requests()
        self._touched = {}
        self._steps = 0
        self._submitted += 1
        if self._pool is None:
            self._apply(self._send(requests))
        else:
            self._in_flight = self._pool.submit(self._send, requests)

    def _send(self, requests):
        replies = self._all(requests)
        self._count("sends")  # on the servers now (pushes_sent)
        return replies

    def _collect(self, wait):
        """Applies the replies of the exchange in flight once they are in (``wait``:
        waits for them; bounded by the requests' own timeout); raises its error."""
        future = self._in_flight
        if future is None or (not wait and not future.done()):
            return
        self._in_flight = None
        self._apply(future.result())

    def _requests(self):
        # Elastic jobs: the workers training now (server 0's last answer), not the MAX slots.
        workers = self.training_workers or self.plan.worker_num
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
        return {ep: ("geo_push", names, arrays, {"pull": pulls.get(ep, []), "pull_changed": changed.get(ep, [])})
                for ep, (names, arrays) in out.items()}

    def _apply(self, replies):
        """Takes the servers' values in: local += server - last synced (the steps trained
        since the deltas were worked out stay), last synced = server."""
        training = replies[self.endpoints[0]].meta.get("training")
        if training:
            self.training_workers = int(training)
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
