"""The sync strategy's communicator (Paddle's Sync).

- ``SyncCommunicator``: a step's (thread-averaged) gradients go to every server in one
  ``sync_push``; each server answers once every worker's step is in and applied, with
  the fresh values of its dense blocks. When ``send`` returns, parameters are updated.

  One round trip per step: the trainer hands the next step's batches over before the
  current step runs (``prepare_batch`` / ``prepare_step``), so the ``sync_push`` also
  asks each server for the rows of its tables those batches need, one pull per batch
  and table, as the prefetch op would ask them (with their statistics). The server reads
  them after applying the step, exactly as a ``pull_sparse`` at the start of the next
  step would, and the next step's prefetch op takes them without a request. The last
  step of a pass asks for none; a batch whose rows were not pulled this way (the first
  of a pass, a test program's) is pulled as before.
"""
import threading

import numpy as np

from fleet.communicator.api import register
from fleet.communicator.base import Communicator
from fleet.communicator.statistics import unique_statistics
from fleet.errors import DataError
from fleet.framework.tensor import PrefetchedRows
from fleet.transpiler.plan import SPARSE


class _RowPull:
    """The rows of ``table`` one batch of the next step needs: ``ids`` as the prefetch op
    flattens them, the sorted unique ``uniq`` and their statistics (None without), and
    once the step's answer came, ``rows`` (PrefetchedRows)."""

    __slots__ = ("table", "ids", "uniq", "shows", "clicks", "rows")

    def __init__(self, table, ids, uniq, shows, clicks):
        self.table, self.ids, self.uniq, self.shows, self.clicks = table, ids, uniq, shows, clicks
        self.rows = None


class RowsWithStep:
    """The hooks of a communicator whose step's request also asks for the rows of the
    next step's batches (sync and half-async; see ``send``): ``prepare_batch`` /
    ``prepare_step`` name them, ``send`` attaches them (``_attach_rows``) and publishes
    the answered rows (``_publish_rows``), the prefetch op takes them."""

    prefetch_ahead = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._next = {}  # training thread -> [_RowPull] of its next step, for its next send
        self._ready = {}  # table -> [_RowPull] answered with the last step, for the prefetch op
        self._rows_lock = threading.Lock()
        self.stats["prefetches_ahead_used"] = 0

    # ------------------------------------------------------------------ TrainingHooks
    def begin_pass(self, threads):
        self._forget_rows()
        super().begin_pass(threads)

    def end_pass(self):
        """Forgets rows asked for and not used (a pass that failed, or ran no send)."""
        self._forget_rows()
        super().end_pass()

    def _forget_rows(self):
        with self._rows_lock:
            self._next.clear()
            self._ready.clear()

    def prepare_batch(self, feed):
        """The calling thread's next batch: its rows come with this thread's next send."""
        self._prepare([feed])

    def prepare_step(self, feeds):
        """The lock-step threads' next step: its batches' rows come with the next send."""
        self._prepare(feeds)

    def _prepare(self, feeds):
        if not self.prefetch_inputs:
            return
        pulls = []
        for feed in feeds:
            for table in self.prefetch_inputs:
                pplan = self.plan.params.get(table)
                batch = self.batch_statistics(table, feed)
                if pplan is None or batch is None:
                    continue
                ids, shows, clicks = batch
                if pplan.has_statistics:
                    uniq, shows, clicks = unique_statistics(ids, shows, clicks)
                else:
                    uniq, shows, clicks = np.unique(np.asarray(ids, dtype=np.int64)), None, None
                if pplan.kind == SPARSE and len(uniq) and (uniq[0] < 0 or uniq[-1] >= pplan.rows):
                    continue  # the prefetch op pulls it itself and reports the bad id
                pulls.append(_RowPull(table, ids, uniq, shows, clicks))
        with self._rows_lock:
            self._next[threading.get_ident()] = pulls

    def prefetch(self, table, ids, is_test=False, shows=None, clicks=None):
        """The rows of ``ids``: those the last step's answer brought for this batch (the
        same ids; their statistics went with that pull), else pulled now (blocks)."""
        if not is_test:
            with self._rows_lock:
                ready = self._ready.get(table, ())
                for i, pull in enumerate(ready):
                    if np.array_equal(ids, pull.ids):
                        del ready[i]
                        self._count("prefetches_ahead_used")
                        return pull.rows
        return super().prefetch(table, ids, is_test, shows, clicks)

    def _rows_for_send(self):
        """The row pulls the calling thread prepared for the step it sends now; forgets
        the last step's rows (they were for this step's prefetch ops only)."""
        with self._rows_lock:
            self._ready = {}
            return self._next.pop(threading.get_ident(), [])

    def _attach_rows(self, requests, pulls, ops):
        """Adds each pull of ``pulls`` to ``requests`` ({endpoint: (op, names, arrays,
        meta)}, lists changed in place) as meta "rows" and arrays "k/ids"[, "k/shows",
        "k/clicks"], when every server it needs gets a request whose op is in ``ops``
        (else the prefetch op pulls it as before).

        Returns:
            (the pulls attached, {endpoint: [reply names of its rows]},
            {endpoint: [(pull, positions of its ids)]}).
        """
        attached, asked, parts = [], {}, {}
        for pull in pulls:
            pplan = self.plan.params[pull.table]
            routes = self._row_pulls(pplan, pull.uniq, False, pull.shows, pull.clicks)
            if any(ep not in requests or requests[ep][0] not in ops for ep, *_ in routes):
                continue
            pull.rows = PrefetchedRows(pull.table, pull.uniq, np.empty((len(pull.uniq), pplan.width), np.float32),
                                       pplan.rows if pplan.kind == SPARSE else 2 ** 63 - 1)
            for ep, name, pnames, parrays, _, sel in routes:
                _, names, arrays, meta = requests[ep]
                spec = meta.setdefault("rows", [])
                k = len(spec)
                spec.append([name, len(parrays)])
                names += [f"{k}/{n}" for n in pnames]
                arrays += parrays
                asked.setdefault(ep, []).append(f"{k}/{name}")
                parts.setdefault(ep, []).append((pull, sel))
            attached.append(pull)
        return attached, asked, parts

    @staticmethod
    def _take_rows(ep, arrays, parts):
        """Writes a server's answered rows (``arrays``, in the order asked) into their pulls.

        Raises:
            DataError: rows of the wrong shape (names the server).
        """
        for (pull, sel), values in zip(parts.get(ep, ()), arrays):
            width = pull.rows.values.shape[1]
            if values.shape != (len(sel), width):
                raise DataError(f"server {ep} answered the rows of {pull.table!r} with shape {list(values.shape)}; "
                                f"expected {[len(sel), width]}")
            pull.rows.values[sel] = values

    def _take_replies(self, replies, dense, rows, parts, pulls, what):
        """Writes each server's answer of a step (its dense blocks, then the rows asked for)
        and hands the rows to the next step's prefetch ops. ``what[ep]`` names the request
        in the error.

        Raises:
            DataError: an answer without the dense blocks and rows asked for (names the server).
        """
        for ep, reply in replies.items():
            asked = dense.get(ep, []) + rows.get(ep, [])
            if list(reply.names) != asked:
                raise DataError(f"server {ep} answered {what[ep]} with {list(reply.names)}, not the dense blocks "
                                f"and rows {asked} asked for; run the same fleet version on every process")
            n = len(dense.get(ep, []))
            self._write_blocks(reply.names[:n], reply.arrays[:n])
            self._take_rows(ep, reply.arrays[n:], parts)
        self._publish_rows(pulls)

    def _publish_rows(self, pulls):
        """The answered ``pulls`` are for the next step's prefetch ops."""
        ready = {}
        for pull in pulls:
            ready.setdefault(pull.table, []).append(pull)
        with self._rows_lock:
            self._ready = ready


@register("sync")
class SyncCommunicator(RowsWithStep, Communicator):
    mode = "sync"
    requires_thread_barrier = True

    def send(self, grads):
        """Sends the step's gradients; returns when every server applied the step with all
        workers' gradients and this worker holds the updated dense parameters (and the
        rows of the next step's batches that ``prepare_batch`` / ``prepare_step`` named).

        Raises:
            DataError: a server answered without the dense blocks or rows asked for
                (names the server).
        """
        pulls = self._rows_for_send()
        dense = self._dense_blocks()
        requests = {ep: ("sync_push", list(names), list(arrays), {"pull": dense.get(ep, [])})
                    for ep, (names, arrays) in self.split_grads(grads).items()}
        pulls, rows, parts = self._attach_rows(requests, pulls, ("sync_push",))
        replies = self._all(requests)
        self._count("sends")
        self._take_replies(replies, dense, rows, parts, pulls, dict.fromkeys(replies, "a sync step"))
