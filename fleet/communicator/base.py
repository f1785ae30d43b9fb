"""The worker side of the wire: routing gradients and parameters to and from servers.

A ``Communicator`` belongs to one worker process. It knows the plan (which server holds
which rows of which parameter), owns one transport client per server, and offers what
the worker's ops and the runtime need: ``prefetch`` (rows of a server-side table for a
batch), ``send`` (a step's gradients, as the strategy wants them), ``pull_dense``
(refresh every dense parameter in the scope), ``barrier_worker``, ``all_to_all`` and
``stop``. Subclasses implement ``send`` per strategy.

Thread-safety: ``prefetch``, ``send`` and ``pull_dense`` may be called from several
training threads; each call takes the client lock of the servers it talks to.

Liveness: given a ``liveness`` object (the worker's heartbeat), every step checks it, so
once a server is lost or the job failed elsewhere the next ``exe.run`` raises that error,
also in GEO steps that do not talk to the servers and in async steps whose sends are done
by a background thread.
"""
import logging
import threading

import numpy as np

from fleet.communicator.api import CommunicatorAPI
from fleet.communicator.statistics import occurrence_statistics, unique_statistics
from fleet.errors import ConfigError, DataError
from fleet.framework.tensor import PrefetchedRows, SparseRows, flat_ids
from fleet.transpiler.plan import DENSE, DISTRIBUTED, SPARSE
from fleet.transport.client import request_all

log = logging.getLogger("fleet")


class Communicator(CommunicatorAPI):
    """Base of the communicators that talk to parameter servers (every method of
    ``CommunicatorAPI`` but ``send``).

    Args:
        plan: the job's DistPlan.
        worker_id: this worker's index.
        scope: the scope holding this worker's dense parameters.
        flags: the strategy's communicator flags (ints).
        connect: callable endpoint -> client (the transport's Client factory).
        liveness: an object whose ``check()`` raises once the job cannot go on (the
            transport's Heartbeat), or None.
    """

    mode = None

    def __init__(self, plan, worker_id, scope, flags, connect, liveness=None):
        self.plan = plan
        self.liveness = liveness
        self.worker_id = int(worker_id)
        self.scope = scope
        self.flags = dict(flags or {})
        self._connect = connect
        self.clients = {}
        self.endpoints = list(plan.server_endpoints)
        self._locks = {ep: threading.Lock() for ep in self.endpoints}
        self._rank = {ep: i for i, ep in enumerate(self.endpoints)}
        self.running = False
        self._closing = False
        self.stats = {"requests": 0, "sends": 0, "pulls": 0, "prefetches": 0}
        self._stats_lock = threading.Lock()
        self.dense = [p for p in plan.params.values() if p.kind == DENSE]
        self.prefetch_inputs = {}
        self.statistics_inputs = {}
        self.who = f"worker {self.worker_id} of {plan.worker_num}"
        self.failure_reported = False
        self.elastic_pass = None  # elastic jobs: the newest work-queue pass this worker opened
        self.training_workers = None  # elastic jobs: workers training, as server 0 last said

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """Connects to every server (the runtime waited for them to answer)."""
        for ep in self.endpoints:
            if ep not in self.clients:
                self.clients[ep] = self._connect(ep)
        self.running = True

    def stop(self):
        """Flushes pending sends, tells every server this worker is done, closes."""
        if not self.running:
            return
        self._closing = True
        try:
            self.flush()
            self._all({ep: ("stop", [], [], None) for ep in self.endpoints})
        finally:
            self.running = False
            self._closing = False
            for client in self.clients.values():
                client.close()
            self.clients.clear()

    def flush(self):
        """Sends whatever is queued (async / GEO); blocks until done."""

    def _count(self, key, n=1):
        with self._stats_lock:
            self.stats[key] += n

    def check_alive(self):
        """Raises the job's failure (a lost server, or a server's report of a lost worker)
        if there is one. Never blocks.

        Raises:
            ServerLostError, ServerError: as the liveness object reports.
        """
        if self.liveness is not None:
            self.liveness.check()

    # ------------------------------------------------------------------ requests
    def _all(self, per_endpoint):
        """Sends one request per endpoint at once and waits for every reply.

        Args:
            per_endpoint: {endpoint: (op, names, arrays, meta)}.

        Returns:
            {endpoint: reply}.
        """
        pending = []
        # Locks are taken in server order: two threads asking overlapping servers in
        # different orders (a prefetch and the async send loop's pull) would deadlock.
        for ep, (op, names, arrays, meta) in sorted(per_endpoint.items(), key=lambda kv: self._rank[kv[0]]):
            lock = self._locks[ep]
            lock.acquire()
            try:
                seq = self.clients[ep].send_request(op, names=names, arrays=arrays, meta=meta)
            except BaseException:
                lock.release()
                for ep2, _, _ in pending:
                    self._locks[ep2].release()
                raise
            pending.append((ep, seq, op))
        self._count("requests", len(pending))
        replies = {}
        error = None
        for ep, seq, op in pending:
            try:
                if error is None:
                    replies[ep] = self.clients[ep].recv_reply(seq)
                else:
                    self.clients[ep].cancel(seq)
            except BaseException as e:  # noqa: BLE001 - the first error is re-raised
                error = error or e
            finally:
                self._locks[ep].release()
        if error is not None:
            raise error
        return replies

    # ------------------------------------------------------------------ routing
    def split_grads(self, grads, scale=1.0):
        """Groups a step's gradients by server.

        Args:
            grads: {grad name: dense array or SparseRows}.

        Returns:
            {endpoint: (names, arrays)}: dense blocks by block name; sparse rows as the
            pair "<block>@ROWS" (global row ids) and "<block>@VALUES", merged first (each
            row once, its values summed in the order they appear, as Paddle's
            communicator merges a sparse gradient before sending it): a batch's ids repeat
            (26 slots of 1,000 CTR-DNN examples hold about 5,000 distinct ids of 26,000),
            so the message and the server's work shrink by as much.
        """
        out = {ep: ([], []) for ep in self.endpoints}
        by_grad = {p.grad: p for p in self.plan.params.values()}
        for gname, value in grads.items():
            pplan = by_grad.get(gname)
            if pplan is None or value is None:
                continue
            if isinstance(value, SparseRows):
                if not value.unique:
                    value = value.merged()
                self._route_rows(pplan, value.rows, value.values, out)
                continue
            arr = np.ascontiguousarray(value, dtype=np.float32)
            for b in pplan.blocks:
                names, arrays = out[b.endpoint]
                names.append(b.name)
                arrays.append(b.rows_of(arr))
        return out

    def _route_rows(self, pplan, rows, values, out, suffix=""):
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if pplan.kind == DISTRIBUTED:
            shard = np.mod(rows, len(self.endpoints))
            for i, ep in enumerate(self.endpoints):
                sel = np.flatnonzero(shard == i)
                if len(sel):
                    names, arrays = out[ep]
                    names += [pplan.name + "@ROWS", pplan.name + "@VALUES"]
                    arrays += [rows[sel], values[sel]]
            return
        which = pplan.block_of_rows(rows)
        for i, b in enumerate(pplan.blocks):
            sel = np.flatnonzero(which == i) if len(pplan.blocks) > 1 else slice(None)
            r = rows[sel]
            if len(r):
                names, arrays = out[b.endpoint]
                names += [b.name + "@ROWS", b.name + "@VALUES"]
                arrays += [r, values[sel]]

    def _requests(self, op, per_endpoint, meta=None):
        return {ep: (op, names, arrays, dict(meta or {}))
                for ep, (names, arrays) in per_endpoint.items() if names or meta}

    # ------------------------------------------------------------------ parameters
    def _dense_blocks(self, params=None):
        """{endpoint: [names of the dense blocks it holds]} of ``params`` (default: all)."""
        per_ep = {}
        for p in self.dense if params is None else params:
            for b in p.blocks:
                per_ep.setdefault(b.endpoint, []).append(b.name)
        return per_ep

    def pull_dense(self, params=None):
        """Refreshes dense parameters in the scope (in place) from the servers; blocks."""
        per_ep = self._dense_blocks(params)
        replies = self._all({ep: ("pull_dense", [], [], {"blocks": names}) for ep, names in per_ep.items()})
        self._count("pulls")
        for ep, reply in replies.items():
            self._write_blocks(reply.names, reply.arrays)

    def push_and_pull_dense(self, per_endpoint, meta=None):
        """Sends a step's ``push`` requests (``split_grads``'s {endpoint: (names, arrays)})
        and refreshes every dense parameter in the scope, as ``push`` followed by
        ``pull_dense`` would, in one round trip: a server that gets a push answers it
        with its dense blocks' values after applying it; the others get a ``pull_dense``
        in the same round. Blocks until every server answered.

        Raises:
            DataError: a server answered without the dense blocks asked for (names it).
        """
        requests = self._requests("push", per_endpoint, meta)
        dense = self._dense_blocks()  # empty when the servers hold no dense block (hybrid)
        for ep, names in dense.items():
            if ep in requests:
                requests[ep][3]["pull"] = names
            else:
                requests[ep] = ("pull_dense", [], [], {"blocks": names})
        replies = self._all(requests)
        if dense:
            self._count("pulls")
        for ep, reply in replies.items():
            asked = dense.get(ep, [])
            if reply.names != asked:
                raise DataError(f"server {ep} answered {requests[ep][0]!r} with blocks {reply.names}, not the "
                                f"dense blocks {asked} asked for; run the same fleet version on every process")
            self._write_blocks(reply.names, reply.arrays)

    def _write_blocks(self, names, arrays):
        for name, value in zip(names, arrays):
            pplan, block = self._block_by_name(name)
            target = self.scope.value(pplan.name)
            if target is None:
                target = np.empty(pplan.shape, dtype=np.float32)
                self.scope[pplan.name] = target
            rows = block.rows_of(target)
            np.copyto(rows, value.reshape(rows.shape))

    def _block_by_name(self, name):
        index = getattr(self, "_block_index", None)
        if index is None:
            index = self._block_index = {b.name: (p, b) for p in self.plan.params.values() for b in p.blocks}
        try:
            return index[name]
        except KeyError:
            raise DataError(f"a server sent block {name!r}, which is not in this worker's plan") from None

    def pull_whole(self, pplan):
        """Returns the whole value of an is_sparse table assembled from its blocks (GEO)."""
        out = np.empty(pplan.shape, dtype=np.float32)
        per_ep = {}
        for b in pplan.blocks:
            per_ep.setdefault(b.endpoint, []).append(b.name)
        for ep, reply in self._all({ep: ("pull_dense", [], [], {"blocks": n}) for ep, n in per_ep.items()}).items():
            for name, value in zip(reply.names, reply.arrays):
                _, b = self._block_by_name(name)
                rows = b.rows_of(out)
                rows[...] = value.reshape(rows.shape)
        return out

    # ------------------------------------------------------------------ checkpoints
    def _message_limit(self):
        return min((c.max_message_bytes for c in self.clients.values()), default=1 << 30)

    def state_budget(self):
        """Most bytes of arrays one checkpoint read asks a server for: a quarter of the
        smallest FLEET_MAX_MESSAGE_BYTES of the clients, at most 64 MiB."""
        return max(1, min(self._message_limit() // 4, 64 << 20))

    def _check_row_fits(self, pplan, row_bytes):
        limit = self._message_limit()
        if row_bytes > limit // 2:
            raise ConfigError(
                f"one row of {pplan.name!r} with its optimizer state is {row_bytes} bytes, too large to read "
                f"within FLEET_MAX_MESSAGE_BYTES={limit}; raise FLEET_MAX_MESSAGE_BYTES on every process")

    def pull_param_chunks(self, pplan, row_bytes, with_state=True, budget=None):
        """Yields (block, first row, {"value": rows, "state.<key>": ...}) for the rows of a
        dense or is_sparse parameter, in row order, with its optimizer state (scalar
        state whole, with each chunk). Blocks of different servers are read in parallel;
        no answer holds more than ``budget`` bytes of arrays (default ``state_budget()``).

        Args:
            row_bytes: bytes of one row of the value and its per-row state.

        Blocks until each chunk arrives (bounded by the client timeout).
        """
        budget = budget or self.state_budget()
        self._check_row_fits(pplan, row_bytes)
        step = max(1, budget // max(int(row_bytes), 1))
        items = [(b, start, min(start + step, b.rows)) for b in pplan.blocks
                 for start in range(0, max(b.rows, 1), step)]
        i = 0
        while i < len(items):
            wave, per_ep, size = [], {}, 0
            while i < len(items) and (not wave or size + (items[i][2] - items[i][1]) * row_bytes <= budget):
                b, start, stop = items[i]
                per_ep.setdefault(b.endpoint, []).append(len(wave))
                wave.append(items[i])
                size += (stop - start) * row_bytes
                i += 1
            requests = {ep: ("pull_state", [], [], {"items": [[wave[k][0].name, wave[k][1], wave[k][2]] for k in ks],
                                                    "state": bool(with_state)})
                        for ep, ks in per_ep.items()}
            replies = self._all(requests)
            got = {}
            for ep, ks in per_ep.items():
                arrays = replies[ep].as_dict()
                for j, k in enumerate(ks):
                    prefix = f"{j}/"
                    got[k] = {name[len(prefix):]: arr for name, arr in arrays.items() if name.startswith(prefix)}
            for k, (b, start, _) in enumerate(wave):
                yield b, start, got[k]

    def shard_rows(self, pplan, row_bytes, budget=None):
        """Rows of ``pplan`` (a distributed table) per chunk of a table read: as many as
        ``budget`` bytes hold (default ``state_budget()``).

        Raises:
            ConfigError: one row does not fit a message (names FLEET_MAX_MESSAGE_BYTES).
        """
        budget = budget or self.state_budget()
        self._check_row_fits(pplan, row_bytes)
        return max(1, budget // max(int(row_bytes), 1))

    def open_snapshots(self, save_id, mode, tables):
        """Asks every server at once to open a snapshot of each of ``tables`` ({name: rows
        per chunk}; its share) for the save ``save_id`` of ``mode`` (0, 1, 2). On any
        error the snapshots opened are closed again (nothing committed).

        Returns:
            {endpoint: {"totals": {table: rows}, "deleted": {table: tombstones},
            "stats": {table: keeps statistics}}}.

        Blocks until every server answered (bounded by the client timeout).
        """
        meta = {"save": save_id, "mode": int(mode), "tables": {n: int(r) for n, r in tables.items()}}
        try:
            replies = self._all({ep: ("open_snapshot", [], [], meta) for ep in self.endpoints})
        except BaseException:
            self.close_snapshots(save_id, commit=False, quiet=True)
            raise
        return {ep: reply.meta for ep, reply in replies.items()}

    def close_snapshots(self, save_id, commit, quiet=False):
        """Ends the save ``save_id`` on every server at once: ``commit`` makes each
        snapshot its table's previous save, else they are released (nothing forgotten).

        Args:
            quiet: log errors instead of raising them (when closing after a failure,
                whose exception is the one to report).

        Raises:
            ServerError / TransportError: a server refused or could not be reached
                (unless ``quiet``).

        Blocks until every server answered (bounded by the client timeout).
        """
        meta = {"save": save_id, "commit": bool(commit)}
        try:
            self._all({ep: ("close_snapshot", [], [], meta) for ep in self.endpoints})
        except Exception as e:  # noqa: BLE001 - re-raised unless closing after another error
            if not quiet:
                raise
            log.warning("fleet: closing the snapshots of save %s failed (%s); servers release them when this "
                        "worker stops or is lost", save_id, e)

    def pull_shard_chunks(self, pplan, row_bytes, budget=None, save=None):
        """Yields (server index, {"ids", "values", "state.<key>", ...}) chunks of every
        server's share of a distributed table, server by server; each server's first
        chunk comes even when its share is empty (it carries the scalar state).

        Args:
            save: the id of a save whose snapshots ``open_snapshots`` opened: read them
                (chunks may also hold ``stats``, first the admission sketch in slices of
                at most ``budget`` bytes, ``sketch_shape`` and ``sketch``, and, last,
                ``deleted`` tombstones).
                None: read the live table (each chunk consistent in itself).

        Blocks until each chunk arrives (bounded by the client timeout).
        """
        rows = self.shard_rows(pplan, row_bytes, budget)
        for index, ep in enumerate(self.endpoints):
            meta = ({"table": pplan.name, "rows": int(rows)} if save is None else
                    {"table": pplan.name, "save": save, "bytes": int(budget or self.state_budget())})
            while True:
                reply = self._all({ep: ("pull_shard", [], [], meta)})[ep]
                yield index, reply.as_dict()
                if reply.meta.get("done"):
                    break
                if save is None:
                    meta = {"table": pplan.name, "cursor": reply.meta["cursor"]}

    def load_model(self, dirname, mode):
        """Asks every server at once to load the save at ``dirname`` (mode 0: it and its
        chain replace what they hold; mode 1: apply that delta). Blocks until every server
        answered (bounded by the client timeout, FLEET_RPC_TIMEOUT_MS).

        Returns:
            {endpoint: {"dirname", "save_id", "step", "epoch"}} of what each now holds.
        """
        meta = {"dirname": dirname, "mode": int(mode)}
        replies = self._all({ep: ("load_model", [], [], meta) for ep in self.endpoints})
        return {ep: reply.meta for ep, reply in replies.items()}

    def checkpoint_info(self):
        """Returns {endpoint: {"dirname", "save_id", "step", "epoch"}}: the checkpoint each
        server loaded (values None for a fresh start). Blocks (bounded)."""
        replies = self._all({ep: ("checkpoint_info", [], [], None) for ep in self.endpoints})
        return {ep: reply.meta for ep, reply in replies.items()}

    def lr_steps(self):
        """Returns {endpoint: step}: each server's learning-rate step counter (None where a
        server evaluates no schedule). Blocks (bounded)."""
        replies = self._all({ep: ("lr_step", [], [], None) for ep in self.endpoints})
        return {ep: (reply.meta["step"] if reply.meta.get("schedule") else None) for ep, reply in replies.items()}

    def prefetch(self, table, ids, is_test=False, shows=None, clicks=None):
        """Pulls the rows of ``table`` that ``ids`` name (blocks until they arrive).

        Args:
            table: the table's parameter name.
            ids: int64 ids of a batch, with repeats.
            is_test: a test lookup: nothing is created or counted.
            shows, clicks: float32 per occurrence of ``ids`` (a ShowClickEntry's inputs),
                or None. A training lookup of a table with statistics sends the sums per
                unique id (shows default to occurrence counts, clicks to 0).

        Returns:
            PrefetchedRows with the sorted unique ids and their values.

        Raises:
            DataError: an id outside an is_sparse table's rows (names table and id).
        """
        pplan = self.plan.params.get(table)
        if not is_test and pplan is not None and pplan.has_statistics:
            uniq, show_sums, click_sums = unique_statistics(ids, shows, clicks)
            return self.pull_rows(table, uniq, is_test, show_sums, click_sums)
        uniq = np.unique(np.asarray(ids, dtype=np.int64))
        return self.pull_rows(table, uniq, is_test)

    def pull_rows(self, table, uniq, is_test=False, shows=None, clicks=None):
        """``prefetch`` of ids that are already sorted and unique (blocks); ``shows`` and
        ``clicks`` (float32, one per id) go with a training pull of a table with
        statistics, split across the servers with the ids."""
        pplan = self.plan.params.get(table)
        if pplan is None:
            raise ConfigError(f"table {table!r} is not in this job's plan")
        width = pplan.width
        values = np.empty((len(uniq), width), dtype=np.float32)
        if pplan.kind == SPARSE and len(uniq) and (uniq[0] < 0 or uniq[-1] >= pplan.rows):
            bad = uniq[0] if uniq[0] < 0 else uniq[-1]
            raise DataError(
                f"embedding {table!r} has {pplan.rows} rows but got id {int(bad)}; ids must be in "
                f"[0, {pplan.rows}): hash them into the table size or enlarge size[0]")
        requests, slots = {}, {}
        for ep, name, names, arrays, meta, sel in self._row_pulls(pplan, uniq, is_test, shows, clicks):
            if ep in requests:  # two blocks of one table on one server
                self._fill(values, sel, self._all({ep: ("pull_sparse", names, arrays, meta)})[ep])
                continue
            requests[ep] = ("pull_sparse", names, arrays, meta)
            slots[ep] = sel
        if requests:
            for ep, reply in self._all(requests).items():
                self._fill(values, slots[ep], reply)
        self._count("prefetches")
        return PrefetchedRows(table, uniq, values, pplan.rows if pplan.kind == SPARSE else 2 ** 63 - 1)

    def _row_pulls(self, pplan, uniq, is_test=False, shows=None, clicks=None):
        """The ``pull_sparse`` requests of the sorted unique ids ``uniq`` of ``pplan``, one
        per server and block (or shard): [(endpoint, server-side table name, names,
        arrays, meta, positions of its ids in ``uniq``)]; a training pull of a table with
        statistics carries each id's ``shows`` and ``clicks``."""
        out = []
        if pplan.kind == DISTRIBUTED:
            with_stats = shows is not None and not is_test
            if with_stats and clicks is None:
                clicks = np.zeros(len(uniq), dtype=np.float32)
            shard = np.mod(uniq, len(self.endpoints))
            for i, ep in enumerate(self.endpoints):
                sel = np.flatnonzero(shard == i)
                if len(sel):
                    names, arrays = ["ids"], [uniq[sel]]
                    if with_stats:
                        names += ["shows", "clicks"]
                        arrays += [np.ascontiguousarray(shows[sel], dtype=np.float32),
                                   np.ascontiguousarray(clicks[sel], dtype=np.float32)]
                    out.append((ep, pplan.name, names, arrays, {"table": pplan.name, "is_test": is_test}, sel))
        else:
            which = pplan.block_of_rows(uniq)
            for i, b in enumerate(pplan.blocks):
                sel = np.flatnonzero(which == i)
                if len(sel):
                    out.append((b.endpoint, b.name, ["ids"], [uniq[sel]], {"table": b.name}, sel))
        return out

    def shrink(self, first):
        """``fleet.shrink()`` on the servers: every server shrinks each of its tables with
        statistics when ``first`` (the first worker asks), else answers the counts of its
        last shrink. Blocks until every server answered (bounded).

        Returns:
            {table: rows deleted, summed over the servers}.
        """
        meta = {} if first else {"report": True}
        replies = self._all({ep: ("shrink", [], [], meta) for ep in self.endpoints})
        total = {}
        for reply in replies.values():
            for name, count in reply.meta.get("deleted", {}).items():
                total[name] = total.get(name, 0) + int(count)
        return total

    @staticmethod
    def _fill(values, sel, reply):
        values[sel] = reply.arrays[0]

    # ------------------------------------------------------------------ steps
    def geo_step(self, grads):
        raise ConfigError(f"geo_step is only for GEO training; this worker runs {self.mode}")

    # ------------------------------------------------------------------ coordination
    def barrier_worker(self, timeout=None):
        """Blocks until every live worker called it (server 0 coordinates).

        Args:
            timeout: seconds (default FLEET_RPC_TIMEOUT_MS); the timeout error names the
                server and the operation.
        """
        ep = self.endpoints[0]
        meta = None if self.elastic_pass is None else {"pass": self.elastic_pass}
        with self._locks[ep]:
            self.clients[ep].request("barrier", meta=meta,
                                     timeout_ms=None if timeout is None else int(timeout * 1000))

    def all_to_all(self, blobs):
        """Sends blobs[j] to worker j; returns what every worker sent to this one."""
        arrays = [np.frombuffer(bytes(b), dtype=np.uint8) for b in blobs]
        reply = self._all({self.endpoints[0]: ("all_to_all", [f"to{j}" for j in range(len(arrays))], arrays, None)})
        return [a.tobytes() for a in reply[self.endpoints[0]].arrays]

    # ------------------------------------------------------------------ elastic jobs
    def join(self):
        """Elastic jobs: tells every server this worker process takes its id (new, or a
        replacement of a lost worker); returns the ids training (server 0's view). Blocks."""
        replies = self._all({ep: ("join", [], [], None) for ep in self.endpoints})
        live = replies[self.endpoints[0]].meta.get("live")
        self.training_workers = len(live) if live else None
        return live

    def coordinator_request(self, op, meta, arrays=()):
        """Sends ``op`` to server 0 (the work queue and reductions of elastic jobs) and
        returns its reply. Blocks (bounded by FLEET_RPC_TIMEOUT_MS); thread-safe."""
        ep = self.endpoints[0]
        arrays = list(arrays)
        return self._all({ep: (op, [f"a{i}" for i in range(len(arrays))], arrays, dict(meta))})[ep]

    def pushes_mark(self):
        """A mark of the updates this worker handed to ``send`` / ``geo_step`` so far (for
        ``pushes_sent``). This base class sends before a step returns: nothing to mark."""
        return None

    def pushes_sent(self, mark):
        """True once every update handed over before ``pushes_mark()`` returned ``mark``
        was applied by the servers (acknowledged). Never blocks."""
        return True

    def set_prefetch_inputs(self, tables, statistics=None):
        """Declares which fed variables hold the ids each table's prefetch reads:
        {table: [data variable names]}, and for tables whose statistics come from inputs
        (a ShowClickEntry) {table: (show name, click name)} (the runtime reads both from
        the program)."""
        self.prefetch_inputs = {t: list(names) for t, names in tables.items()}
        self.statistics_inputs = {t: tuple(names) for t, names in (statistics or {}).items()}

    def batch_statistics(self, table, feed):
        """The (ids per occurrence, shows, clicks) a training prefetch of ``table`` sends
        for a batch's ``feed`` (shows and clicks None without a ShowClickEntry), or None
        when the feed lacks one of its inputs."""
        values = [feed.get(n) for n in self.prefetch_inputs.get(table, ())]
        if not values or any(v is None for v in values):
            return None
        names = self.statistics_inputs.get(table)
        if names is None:
            return flat_ids([getattr(v, "values", v) for v in values]), None, None
        show, click = feed.get(names[0]), feed.get(names[1])
        if show is None or click is None:
            return None
        return occurrence_statistics(values, show, click, names)

    # ------------------------------------------------------------------ TrainingHooks
    def end_pass(self):
        """Sends what is queued (async / GEO) before train_from_dataset returns."""
        self.flush()

    def pass_failed(self, error):
        """Tells every server that this worker failed with ``error``, so the job stops at
        once (the servers fail it naming this worker and its error; the other workers
        hear it within a heartbeat) instead of after FLEET_HEARTBEAT_TIMEOUT_MS. Waits up
        to REPORT_FAILURE_TIMEOUT_MS for the answers; never raises (a server it cannot
        reach learns of the failure from the heartbeats)."""
        self.report_failure(f"{type(error).__name__}: {error}")

    def report_failure(self, text):
        """Tells every server that this worker cannot go on, because of ``text``; once per
        worker, and not when the job already failed (the servers know). Bounded; never
        raises (see ``pass_failed``)."""
        if not self.running or self.failure_reported or getattr(self.liveness, "error", None) is not None:
            return
        self.failure_reported = True
        report_failure(self.clients, text, self.who)


REPORT_FAILURE_TIMEOUT_MS = 5000


def report_failure(clients, text, who):
    """Sends op ``fail`` with ``text`` to every client's server and waits (bounded) for
    the answers; logs instead of raising when a server cannot be told."""
    try:
        request_all([(c, "fail", (), (), {"reason": text}) for c in clients.values()],
                    timeout_ms=REPORT_FAILURE_TIMEOUT_MS)
    except Exception as e:  # noqa: BLE001 - the original error is what the caller raises
        log.warning("fleet: %s could not tell every server of its error (%s); the others learn of it when "
                    "its heartbeats stop", who, e)
