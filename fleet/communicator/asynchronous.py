"""The async strategy's communicator (Paddle's Async).

- ``AsyncCommunicator``: ``send`` puts gradients on per-parameter bounded queues (a full
  queue blocks training: back-pressure); a send thread merges up to
  ``max_merge_var_num`` steps per parameter (sum for SGD, mean otherwise; with fewer
  queued it waits, as Paddle's, up to ``send_wait_times`` periods of 10 ms for each
  further step, so the steps of a worker's threads meet in one push), sends, and pulls
  dense parameters after each round (the push's reply carries them: one round trip), or
  a recv thread pulls after ``min_send_grad_num_before_recv`` sends. Pipelined with
  bounded staleness: a training thread's step t+1 starts only once its step t-1 was sent
  and the dense parameters pulled after it, and the sparse rows of its next batch are
  pulled in the background during the current step, after its previous step was sent;
  so each step computes on parameters that hold every one of this thread's updates but
  the last (at most one batch of its own staleness) while the network work overlaps the
  computation. Threads in lock step (the hybrid strategy, or a Reduce build strategy)
  are pipelined the same way per step: ``prepare_step`` pulls the rows of every batch of
  the next step at once (one request per server and table), after the previous step was
  sent.
"""
import collections
import concurrent.futures
import logging
import queue
import threading
import time

import numpy as np

from fleet.communicator.api import register
from fleet.communicator.base import Communicator
from fleet.communicator.statistics import unique_statistics
from fleet.errors import FleetTimeoutError
from fleet.framework.runner import reduce_gradients
from fleet.framework.tensor import SparseRows
from fleet.logs import WaitLog

AHEAD_KEPT = 4  # pulls ahead kept per training thread and table
STEP = "step"  # the key of pulls ahead for lock-step threads (with the table)
SEND_WAIT_PERIOD_S = 0.01  # one of Paddle's communicator_send_wait_times periods

log = logging.getLogger("fleet")


def _servers(endpoints):
    return ("server " if len(endpoints) == 1 else "servers ") + ", ".join(endpoints)


def _copy(value):
    """A private copy of a gradient for the send queue; sparse rows merged (duplicates
    summed, as ``split_grads`` would before sending), which also copies them."""
    if isinstance(value, SparseRows):
        if value.unique:
            return SparseRows(value.rows.copy(), value.values.copy(), value.height, unique=True)
        return value.merged()
    return np.array(value, dtype=np.float32, copy=True)


class _Ahead:
    """A background pull of the rows one training thread's next batch needs: ``ids`` as
    the prefetch op will flatten them, the future of their PrefetchedRows (for a
    lock-step batch, those of its whole step: a superset), and the step it was prepared
    for (lock step; else None)."""

    __slots__ = ("ids", "future", "step")

    def __init__(self, ids, future, step=None):
        self.ids = ids
        self.future = future
        self.step = step


def _joined(parts):
    """Per-occurrence statistics of a step's batches joined (None when the table has none)."""
    return None if any(p is None for p in parts) else np.concatenate(parts)


@register("async")
class AsyncCommunicator(Communicator):
    mode = "async"
    prefetch_ahead = True
    # Every server gets a push each round, also one without rows for it, so servers that
    # merge one push per worker (the hybrid strategy's) count every worker's step.
    push_to_every_server = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        f = self.flags
        self.queue_size = int(f.get("communicator_send_queue_size", 1))
        self.max_merge = int(f.get("communicator_max_merge_var_num", 1))
        self.independent_recv = bool(int(f.get("communicator_independent_recv_thread", 0)))
        self.min_send_before_recv = int(f.get("communicator_min_send_grad_num_before_recv", 1))
        self.sum_merge = bool(int(f.get("communicator_is_sgd_optimizer", 1)))
        self.send_wait_times = int(f.get("communicator_send_wait_times", 5))
        self._senders = set()  # threads that sent a step this pass and are still training
        self._queues = {}
        self._stop = threading.Event()
        self._error = None
        self._sent_since_recv = 0
        self._cv = threading.Condition()
        self._threads = []
        self.put_timeout = float(f.get("put_timeout_s", 600.0))
        self._tls = threading.local()  # per training thread: the last send's round
        self._ahead = {}  # (thread id, table) -> deque of _Ahead, oldest first
        self._ahead_lock = threading.Lock()
        self._steps_prepared = 0
        self._pool = None
        self.stats["prefetches_ahead_used"] = 0
        # staleness (telemetry): steps handed to send() and steps whose round was sent
        self.stats["steps_queued"] = 0
        self.stats["steps_sent"] = 0

    def start(self):
        super().start()
        self._queues = {p.grad: queue.Queue(maxsize=self.queue_size) for p in self.plan.params.values()}
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="fleet-prefetch")
        self._start_threads()

    def stop(self):
        try:
            super().stop()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    # ------------------------------------------------------------------ pipelining
    def _wait_round(self, done, what):
        """Waits for a send round (an Event), bounded, raising the job's failure."""
        started = time.monotonic()
        deadline = started + self.put_timeout
        wait = None
        while not done.wait(0.5):
            self._raise_if_failed()
            if wait is None:
                wait = WaitLog(f"the send thread to send this thread's previous step to {_servers(self.endpoints)}",
                               limit=f"giving up after {self.put_timeout:.0f} s", logger=log, started=started)
            wait.tick()
            if time.monotonic() > deadline:
                raise FleetTimeoutError(
                    f"{what}: the previous step's gradients were not sent within {self.put_timeout:.0f} s; "
                    f"the servers {self.endpoints} are not answering (check their logs)")

    def prepare_batch(self, feed):
        """Pulls the rows of the calling thread's next batch in the background, once this
        thread's last step was sent. Never blocks."""
        if not self.prefetch_inputs or self._pool is None:
            return
        me = threading.get_ident()
        last = getattr(self._tls, "last", None)
        for table in self.prefetch_inputs:
            batch = self.batch_statistics(table, feed)
            if batch is None:
                continue
            ids = batch[0]
            future = self._pool.submit(self._pull_after, last, table, *batch)
            with self._ahead_lock:
                # The trainer prepares batch t+1 before it runs batch t, so a thread has up
                # to two pulls ahead in flight: the prefetch op takes them in order.
                jobs = self._ahead.setdefault((me, table), collections.deque())
                jobs.append(_Ahead(ids, future))
                while len(jobs) > AHEAD_KEPT:  # batches prepared and never run (a failed pass)
                    jobs.popleft()

    def prepare_step(self, feeds):
        """Pulls the rows of every batch of the lock-step threads' next step in the
        background, one pull per table for the whole step, once the calling thread's last
        step (the previous one) was sent. Never blocks."""
        if not self.prefetch_inputs or self._pool is None:
            return
        last = getattr(self._tls, "last", None)
        with self._ahead_lock:
            self._steps_prepared += 1
            step = self._steps_prepared
        for table in self.prefetch_inputs:
            parts = [b for b in (self.batch_statistics(table, feed) for feed in feeds) if b is not None]
            if not parts:
                continue
            batches = [ids for ids, _, _ in parts]
            future = self._pool.submit(self._pull_after, last, table, np.concatenate(batches),
                                       _joined([s for _, s, _ in parts]), _joined([c for _, _, c in parts]))
            with self._ahead_lock:
                jobs = self._ahead.setdefault((STEP, table), collections.deque())
                jobs.extend(_Ahead(ids, future, step) for ids in batches)
                while jobs[0].step < step - 1:  # steps prepared and never run (a failed pass)
                    jobs.popleft()

    def _pull_after(self, last, table, ids, shows=None, clicks=None):
        # Sorting (and summing statistics) here keeps it off the training thread.
        pplan = self.plan.params.get(table)
        if pplan is not None and pplan.has_statistics:
            uniq, shows, clicks = unique_statistics(ids, shows, clicks)
        else:
            uniq, shows, clicks = np.unique(ids), None, None
        if last is not None:
            self._wait_round(last, f"prefetching rows of {table!r}")
        return self.pull_rows(table, uniq, False, shows, clicks)

    def prefetch(self, table, ids, is_test=False, shows=None, clicks=None):
        """The rows of ``ids``: those pulled ahead for this thread's batch when they are
        the same ids (their statistics went with that pull), else pulled now (blocks)."""
        ahead = None
        if not is_test:
            with self._ahead_lock:
                jobs = self._ahead.get((threading.get_ident(), table))
                for i, job in enumerate(jobs or ()):
                    if np.array_equal(ids, job.ids):
                        ahead = job
                        for _ in range(i + 1):  # this one and any older, unused pulls
                            jobs.popleft()
                        break
                if ahead is None:  # a batch of a lock-step step: any thread may run it
                    jobs = self._ahead.get((STEP, table))
                    for i, job in enumerate(jobs or ()):
                        if np.array_equal(ids, job.ids):
                            ahead = job
                            del jobs[i]
                            break
        if ahead is not None:
            self._count("prefetches_ahead_used")
            return ahead.future.result()
        return super().prefetch(table, ids, is_test, shows, clicks)

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
        last = getattr(self._tls, "last", None)
        if last is not None:  # bounded staleness: this thread's previous step is sent
            self._wait_round(last, "sending a step")
        done = self._tls.last = threading.Event()
        with self._cv:
            self._senders.add(threading.get_ident())
        self._count("steps_queued")
        items = [(self._queues[name], name, (_copy(value), done)) for name, value in grads.items()
                 if value is not None and name in self._queues]
        if not items:
            self._finish_steps((done,))
            return
        with self._cv:
            # The whole step at once when every queue has room: the send thread takes
            # items under this lock, so it never sends part of a step in one round and
            # the rest in the next (two pushes and two dense pulls for one step).
            if all(q.maxsize <= 0 or q.qsize() < q.maxsize for q, _, _ in items):
                for q, _, item in items:
                    q.put_nowait(item)
                self._cv.notify()
                return
        for q, name, item in items:  # some queue is full: one by one, blocking (back-pressure)
            started = time.monotonic()
            deadline = started + self.put_timeout
            wait = None
            while True:
                try:
                    q.put(item, timeout=0.5)
                    break
                except queue.Full:
                    self._raise_if_failed()
                    if wait is None:
                        wait = WaitLog(f"room in the send queue of {name!r} (full: the send thread is waiting "
                                       f"for {_servers(self.endpoints)})", logger=log, started=started,
                                       limit=f"giving up after {self.put_timeout:.0f} s")
                    wait.tick()
                    if time.monotonic() > deadline:
                        raise FleetTimeoutError(
                            f"the send queue of {name!r} stayed full for {self.put_timeout:.0f} s: the "
                            f"servers {self.endpoints} are not taking gradients (check their logs)")
            with self._cv:
                self._cv.notify()

    def _steps_to_merge(self):
        """How many queued steps the next round merges: up to max_merge. With fewer queued,
        waits for more as Paddle's send thread does: up to send_wait_times periods of 10 ms
        for each further step (the count restarts when one arrives)."""
        lead = max(self._queues.values(), key=lambda q: q.qsize(), default=None)
        if lead is None:
            return 0
        with self._cv:  # only threads that send can add a step: one sender never waits
            target = min(self.max_merge, max(1, len(self._senders)))
        have, waits = lead.qsize(), 0
        while 0 < have < target and waits < self.send_wait_times and not self._stop.is_set():
            time.sleep(SEND_WAIT_PERIOD_S)
            now = lead.qsize()
            waits = 0 if now > have else waits + 1
            have = now
        return min(have, self.max_merge)

    def begin_pass(self, threads):
        with self._cv:
            self._senders = set()
        super().begin_pass(threads)

    def thread_finished(self):
        with self._cv:
            self._senders.discard(threading.get_ident())
        super().thread_finished()

    def _drain(self, wait=True, pull=False):
        """One round: pop up to max_merge steps per parameter (waiting for them as
        ``_steps_to_merge`` says when ``wait``), merge, send; with ``pull``, also refresh
        the dense parameters in the same round trip (``push_and_pull_dense``) when
        anything was sent.

        Returns:
            (items sent, the rounds' Events of the steps they came from).
        """
        grads = {}
        popped = 0
        done = set()
        steps = self._steps_to_merge() if wait and self.max_merge > 1 else self.max_merge
        taken = {}
        with self._cv:  # whole steps: see send()
            for name, q in self._queues.items():
                items = []
                while len(items) < max(steps, 1):
                    try:
                        items.append(q.get_nowait())
                    except queue.Empty:
                        break
                if items:
                    taken[name] = items
        for name, items in taken.items():
            popped = max(popped, len(items))
            done.update(ev for _, ev in items)
            grads[name] = self._merged([g for g, _ in items])
        if grads:
            per_ep = self.split_grads(grads)
            meta = {"steps": popped} if self.push_to_every_server else None
            if pull:
                self.push_and_pull_dense(per_ep, meta)
            else:
                requests = self._requests("push", per_ep, meta)
                if requests:
                    self._all(requests)
            self._count("sends")
        return popped, done

    def _merged(self, values):
        """One round's gradient of a parameter from its queued steps' (private copies,
        see ``send``): a single step is sent as it is."""
        if len(values) == 1:
            return values[0]
        return reduce_gradients(values, average=not self.sum_merge)

    def _finish_steps(self, events):
        """Marks the steps of ``events`` sent (their training threads may go on) and counts
        each once (a step split over two rounds is set twice)."""
        newly = 0
        for ev in events:
            if not ev.is_set():
                ev.set()
                newly += 1
        if newly:
            self._count("steps_sent", newly)

    def send_queue_depths(self):
        """{gradient: steps waiting in its send queue} (telemetry). Never blocks."""
        return {name: q.qsize() for name, q in list(self._queues.items())}

    def steps_in_flight(self):
        """Steps handed to ``send`` whose gradients were not sent yet: this worker's
        staleness in steps (telemetry). Never blocks."""
        with self._stats_lock:
            return self.stats["steps_queued"] - self.stats["steps_sent"]

    def pushes_mark(self):
        """The steps queued so far: they are sent in queue order, so once as many were
        sent every step queued before the mark was pushed (``pushes_sent``)."""
        with self._stats_lock:
            return self.stats["steps_queued"]

    def pushes_sent(self, mark):
        with self._stats_lock:
            return mark is None or self.stats["steps_sent"] >= mark

    def _send_loop(self):
        try:
            while not self._stop.is_set():
                # without a recv thread each round pulls the dense parameters after its push
                sent, done = self._drain(pull=not self.independent_recv)
                if sent:
                    if self.independent_recv:
                        with self._cv:
                            self._sent_since_recv += sent
                            self._cv.notify_all()
                    self._finish_steps(done)
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
        done = set()
        while True:
            sent, events = self._drain(wait=False)
            done |= events
            if not sent:
                break
        self.pull_dense()
        self._finish_steps(done)
        if self.running and not self._closing:
            self._start_threads()
