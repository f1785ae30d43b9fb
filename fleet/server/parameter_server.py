"""The state and request handling of one parameter server (no sockets here).

A server holds the blocks the plan gives it (``DenseTable`` each; ``is_sparse`` tables
are row blocks served row by row) and its shard of the ``is_distributed`` table
(``SparseTable``). ``handle(request)`` answers one request; requests that must wait for
other workers (sync steps, barriers) are parked and answered later, from the same thread.

Per mode:
- sync: ``sync_push`` carries a worker's step gradients; when every live worker has sent
  its step, the server averages (sum / contributors), applies the optimizer once, and
  answers each worker with the fresh values of its dense blocks and of the rows its
  next step needs (meta "rows", read as ``pull_sparse`` would read them then).
- async / half-async: ``push`` applies gradients on arrival (DC-ASGD optional), or
  averages a window of ``merge_pushes`` pushes into one update. A hybrid job's servers
  hold only its tables and behave as async ones; its strategy merges one push per worker
  (``merge_async_pushes`` = 0), so the tables take one update per step, as in sync.
- GEO: ``geo_push`` adds deltas and answers with the dense blocks and the sparse rows
  changed since this worker's last GEO exchange.

Learning-rate schedules (a parameter whose optimizer rate is a ``fleet.layers`` schedule)
are evaluated here from this server's own step counter, as Paddle's pserver runs the
schedule's ops: the counter starts at the plan's ``lr_begin - 1`` and steps once per
applied update (sync: once per step of all workers; async / half-async: once per push
applied, or per merged group of ``merge_pushes``); GEO workers evaluate it themselves.
``lr_step`` answers the counter (checkpoints save it). In async mode this differs from
Paddle 1.x's pserver, which runs the schedule's block once at start (``RunAsyncLoop``
runs block 1 only when no gradient is bound to it), so its rate stays at the first value.

Tables with statistics (an entry or a CTR accessor in the plan): a training
``pull_sparse`` goes through ``SparseTable.pull_train`` with the ids' "shows" and "clicks"
the worker sends (checked at this boundary), a test pull creates nothing, and ``shrink``
shrinks each such table and answers the rows deleted.

Saves and loads (``fleet.server.save_ops``, the mixin ``SaveOps``): ``pull_state``,
``open_snapshot`` / ``pull_shard`` / ``close_snapshot`` (one consistent snapshot of every
table of this server per save), ``load`` of a save and its chain of deltas, and
``load_model`` while serving.

Liveness (every mode): a worker that stops sending heartbeats without having sent
``stop`` is lost (``check_liveness`` / ``fail_worker``). Unless the job is elastic, a lost
worker fails the job: its share of the data will not be trained. Parked requests
(sync steps, barriers, exchanges) are answered with an error naming the worker, every
later request but ``stop`` too, and ``status()`` gives the text heartbeat replies carry,
so every worker raises it within a heartbeat; the runtime then ends the server with an
error. A server never waits for a dead worker.

Elastic jobs (``elastic=(MIN, MAX)``, from FLEET_ELASTIC; async, half-async and GEO only):
worker ids are slots 0..MAX-1, ids 0..MIN-1 expected from the start and the others joining
when first heard; a lost worker is forgotten instead of failing the job, its work units go
back to the queue, and barriers, merged pushes and reductions count the live workers
(``fleet.server.work_queue``, which also holds the ops of elastic jobs).

Hostile input: a request from a worker id outside the job, for a block or table this
server does not hold, or with gradients of the wrong shape is answered with an error
before anything is applied (a push is applied whole or not at all).

Thread-safety: one thread calls ``handle``, ``check_liveness`` and ``fail_worker``;
tables are locked anyway.
"""
import logging
import time

import numpy as np

from fleet import schedules
from fleet.endpoints import split_endpoint
from fleet.entries import CtrAccessorConfig, entry_from_attr
from fleet.errors import ConfigError, DataError, FleetError
from fleet.rules import rule_from_op_attrs
from fleet.server.save_ops import SaveOps
from fleet.server.work_queue import ElasticOps
from fleet.tables.dense_table import DenseTable
from fleet.tables.sparse_table import SparseTable
from fleet.transpiler.plan import DISTRIBUTED
from fleet.transport.settings import HEARTBEAT_TIMEOUT_MS_ENV, WORKER_CONNECT_TIMEOUT_MS_ENV

log = logging.getLogger("fleet.server")

# Ops any client may send whatever its worker id (tools and tests read with ids of their own).
_READ_OPS = frozenset(("pull_dense", "pull_sparse", "units_status"))
# Ops that change the parameters: counted in ``updates`` (checkpoint_info reports it).
_UPDATE_OPS = frozenset(("push", "sync_push", "geo_push"))


def _wait(ids):
    return "waits" if len(ids) == 1 else "wait"


def _workers_phrase(ids):
    return ("worker " if len(ids) == 1 else "workers ") + ", ".join(map(str, ids))


class ParameterServer(ElasticOps, SaveOps):
    """What one server holds and how it answers.

    Args:
        endpoint: this server's "host:port".
        plan: the job's DistPlan.
        initial: {param name: full initial array} for the dense and is_sparse params this
            server holds blocks of (the server slices its blocks out of them).
        dc_asgd: compensate async gradients for delay (async mode only).
        merge_pushes: async / half-async: average this many pushes into one update (1:
            each on arrival; 0: as many as workers are still training).
        elastic: (MIN, MAX) for an elastic job (plan.worker_num is MAX), or None.

    Raises:
        ConfigError: dc_asgd together with merge_pushes other than 1; an elastic sync job.
    """

    def __init__(self, endpoint, plan, initial, dc_asgd=False, merge_pushes=1, worker_endpoints=(), elastic=None,
                 expected=None):
        self.endpoint = endpoint
        self.worker_endpoints = tuple(worker_endpoints)  # for messages: where a lost worker ran
        self.plan = plan
        # Hybrid jobs keep only their tables here and push them as async workers do.
        self.mode = "async" if plan.mode == "hybrid" else plan.mode
        self.workers = plan.worker_num
        self.elastic = None if elastic is None else (int(elastic[0]), int(elastic[1]))
        if self.elastic is not None and self.mode not in ("async", "half_async", "geo"):
            raise ConfigError(f"an elastic job (FLEET_ELASTIC={elastic[0]}:{elastic[1]}) cannot train in {self.mode} "
                              f"mode, whose steps wait for a fixed set of workers: use async, half_async or geo, "
                              f"or a fixed --worker_num")
        self.dc_asgd = bool(dc_asgd) and self.mode == "async"
        track = self.workers if self.mode == "geo" else 0
        self.blocks = {}  # block name -> (ParamPlan, Block, DenseTable)
        self.shards = {}  # distributed table name -> (ParamPlan, SparseTable)
        for pplan, block in plan.blocks_on(endpoint):
            rule = rule_from_op_attrs(pplan.rule_type, pplan.rule_attrs)
            if pplan.kind == DISTRIBUTED:
                table = SparseTable(pplan.name, pplan.width, rule, pplan.init_spec,
                                    seed=pplan.seed, track_workers=track, **table_options(pplan))
                self.shards[pplan.name] = (pplan, table)
                continue
            full = initial.get(pplan.name)
            if full is None:
                raise ConfigError(f"server {endpoint}: no initial value for {pplan.name!r}")
            value = block.rows_of(np.asarray(full, dtype=np.float32))
            self.blocks[block.name] = (pplan, block, DenseTable(block.name, value, rule, track_workers=track))
        # Elastic: ids 0..MIN-1 (or ``expected``: a round's slots) are expected from the start;
        # the others join when first heard.
        self.live = set(range(self.workers if self.elastic is None else min(self.elastic[0], self.workers)))
        if self.elastic is not None and expected is not None:
            self.live = {int(w) for w in expected}
        self._pending = {}  # merged async pushes: name -> gradients not applied yet
        self._pending_pushes = 0
        self.merge_pushes = int(merge_pushes) if self.mode in ("async", "half_async") else 1
        if self.merge_pushes != 1 and self.dc_asgd:
            raise ConfigError("enable_dc_asgd compensates each push for its own delay; it cannot be combined "
                              f"with merge_async_pushes={merge_pushes}: set one of them")
        self.stopped = set()
        self.lost = {}  # worker -> why it was lost
        self.failure = None  # why the job cannot go on (the first lost worker), or None
        self.told = set()  # workers that got an error reply carrying the failure
        self._sync = {}  # worker -> (request, names, arrays)
        self._barrier = {}  # worker -> request
        self._exchange = {}  # worker -> (request, blobs)
        self._bak = {}  # (worker, block) -> param copy at the worker's last pull (DC-ASGD)
        self.requests = 0
        self.op_requests = {}  # op -> requests handled (telemetry; written by the handling thread only)
        self.last_seen = {}
        self._cursors = {}  # (worker, table) -> ShardCursor of a table read out without a snapshot
        self._saves = {}  # worker -> SaveSession: the snapshots its save holds open
        self.loaded = {"dirname": None, "save_id": None, "step": None, "epoch": None}
        self.has_lr_schedule = self.mode != "geo" and any(
            p.lr_schedule is not None for p, _ in plan.blocks_on(endpoint))
        self.lr_step = int(getattr(plan, "lr_begin", 0)) - 1  # @LR_DECAY_COUNTER@ of this server
        self.updates = 0  # pushes applied (sync steps count once per worker)
        self.first_stop = None
        self._parked_since = {}  # "sync" / "barrier" / "exchange" -> when its first request was parked
        self._init_elastic()
        self.last_shrink = {}  # table -> rows the last shrink deleted here

    # ------------------------------------------------------------------ helpers
    def warm_up(self):
        """Runs every kernel the workers' pulls and pushes will run here once (GEO: its
        adds and reads of changed rows), on scratch tables of two rows with the same
        rules, so numba loads (or compiles) them now, while the workers start, not on the
        first requests of the first pass (where each worker would wait for it). Changes
        nothing this server holds. Blocks (well under a second with numba's cache filled)."""
        lr, geo = 0.0, self.mode == "geo"
        track = 1 if geo else 0
        for pplan, block, table in self.blocks.values():
            rule = rule_from_op_attrs(pplan.rule_type, pplan.rule_attrs)
            scratch = DenseTable(block.name, np.zeros((2,) + tuple(table.shape[1:]), np.float32), rule,
                                 track_workers=track)
            scratch.push(scratch.pull(), lr)
            if len(table.shape) == 2:
                rows = np.array([1, 0, 1], dtype=np.int64)
                values = scratch.pull_rows(rows)
                scratch.push_rows(rows, values, lr)
                if geo:
                    scratch.add_rows(rows, values)
                    scratch.pull_changed(0)
        for pplan, table in self.shards.values():
            rule = rule_from_op_attrs(pplan.rule_type, pplan.rule_attrs)
            scratch = SparseTable(pplan.name, pplan.width, rule, pplan.init_spec, seed=pplan.seed,
                                  **table_options(pplan))
            ids = np.array([3, 1, 3], dtype=np.int64)
            if pplan.has_statistics:
                values = scratch.pull_train(ids, np.ones(3, np.float32), np.zeros(3, np.float32))
            else:
                values = scratch.pull(ids, create=True)
            scratch.push(ids, values, lr)  # (GEO has no distributed tables)

    def _dense(self, name):
        entry = self.blocks.get(name)
        if entry is None:
            raise DataError(f"server {self.endpoint} holds no block {name!r}; it holds {sorted(self.blocks)[:8]}")
        return entry

    def _shard(self, name):
        entry = self.shards.get(name)
        if entry is None:
            raise DataError(f"server {self.endpoint} holds no distributed table {name!r}")
        return entry

    def finished(self):
        """True once every worker has stopped or was lost (elastic: once a worker stopped
        and none is left training)."""
        if self.elastic is not None:
            return bool(self.stopped) and not (self.live - self.stopped)
        return all(w in self.stopped or w in self.lost for w in range(self.workers))

    def expected_workers(self):
        """The worker ids this server waits for or heard from: every id of the job, or in
        an elastic job the ids expected from the start and those that joined."""
        if self.elastic is None:
            return list(range(self.workers))
        return sorted(self.live | self.stopped | set(self.lost))

    def _park(self, kind, parked, req):
        if not parked:
            self._parked_since[kind] = time.monotonic()
        parked[req.worker] = req

    def parked_counts(self):
        """{"sync", "barrier", "exchange": requests parked now} (for telemetry). Never blocks;
        safe from any thread (reads only the sizes)."""
        return {"sync": len(self._sync), "barrier": len(self._barrier), "exchange": len(self._exchange)}

    def waits(self):
        """What parked requests wait for: a list of (what, since, arrived, missing), one per
        kind of wait that has requests parked ("the sync step", "barrier_worker",
        "the data exchange"), where arrived and missing are sorted worker ids and since is
        the time.monotonic() its first request was parked. Never blocks."""
        out = []
        expected = self.live - self.stopped
        for kind, what, parked in (("sync", "the sync step", self._sync),
                                   ("barrier", "barrier_worker", self._barrier),
                                   ("exchange", "the data exchange", self._exchange)):
            if parked:
                out.append((what, self._parked_since.get(kind, time.monotonic()), sorted(parked),
                            sorted(expected - set(parked))))
        return out

    def status(self):
        """The op-specific fields of heartbeat replies: {"failed": text} once the job failed."""
        return {} if self.failure is None else {"failed": self.failure}

    # ------------------------------------------------------------------ dispatch
    def handle(self, req):
        """Answers (or parks) one request. Raises on a bad request; the caller turns the
        exception into an error reply and keeps serving."""
        self.requests += 1
        self.last_seen[req.worker] = time.monotonic()
        handler = getattr(self, "_op_" + str(req.op), None)
        if handler is None:
            raise DataError(f"unknown op {req.op!r}")
        self.op_requests[req.op] = self.op_requests.get(req.op, 0) + 1  # known ops only: a bounded dict
        if req.op not in _READ_OPS and not 0 <= req.worker < self.workers:
            raise DataError(f"worker id {req.worker} is not a worker of this job (ids 0..{self.workers - 1}); "
                            f"{req.op!r} refused")
        if self.elastic is not None:
            self._elastic_seen(req)
        if self.failure is not None and req.op not in ("stop", "fail"):
            self.told.add(req.worker)
            raise FleetError(self.failure)
        result = handler(req)
        if req.op in _UPDATE_OPS:
            self.updates += 1
        return result

    def _op_ping(self, req):
        req.reply(meta={"blocks": sorted(self.blocks), "shards": sorted(self.shards), "mode": self.mode})

    def _op_pull_dense(self, req):
        names = list(req.meta.get("blocks", ()))
        req.reply(names=names, arrays=self._dense_values(req.worker, names))

    def _dense_values(self, worker, names):
        """The values of the dense blocks ``names`` as ``worker`` pulls them (copies;
        DC-ASGD keeps each as the worker's backup)."""
        out = []
        for name in names:
            _, _, table = self._dense(name)
            value = table.pull()
            if self.dc_asgd:
                self._bak[(worker, name)] = value.copy()
            out.append(value)
        return out

    def _op_pull_sparse(self, req):
        """Rows of an is_sparse block (global row ids) or of the distributed shard (ids).

        A training pull of a table with statistics (an entry or an accessor) carries the
        ids' "shows" and "clicks" (float32, one per id) and goes through the table's
        ``pull_train`` (admission and statistics); a test pull (``is_test``) never creates
        or counts."""
        table_name = req.meta["table"]
        ids = req.arrays[0]
        values = self._rows(table_name, ids, req.meta.get("is_test", False), req.names[1:], req.arrays[1:])
        req.reply(names=[table_name], arrays=[values])

    def _rows(self, table_name, ids, is_test, stat_names=(), stat_arrays=()):
        """The values of rows ``ids`` of an is_sparse block (global row ids) or of the
        distributed shard ``table_name``, as ``pull_sparse`` reads them; a training pull
        of a table with statistics counts the "shows" and "clicks" among ``stat_names``
        (``stat_arrays``).

        Raises:
            DataError: an unknown table, or bad statistics (``_pull_statistics``).
        """
        if table_name in self.shards:
            pplan, table = self._shard(table_name)
            if is_test:
                return table.pull(ids, create=False)
            if pplan.has_statistics:
                shows, clicks = _pull_statistics(stat_names, stat_arrays, table_name, len(ids))
                return table.pull_train(ids, shows, clicks)
            return table.pull(ids, create=True)
        _, block, table = self._dense(table_name)
        return table.pull_rows(ids - block.row_offset)

    def _op_shrink(self, req):
        """Shrinks every table with statistics (decay, age, evict; see
        ``SparseTable.shrink``) and answers {"deleted": {table: rows deleted}}; with
        meta "report" it answers the last shrink's counts instead (the workers that did
        not ask for the shrink learn its result)."""
        if not req.meta.get("report"):
            self._refuse_while_saving("shrink")
            self.last_shrink = {name: int(table.shrink()) for name, (pplan, table) in sorted(self.shards.items())
                                if pplan.has_statistics}
            log.info("server %s: shrink deleted %s", self.endpoint, self.last_shrink)
        req.reply(meta={"deleted": dict(self.last_shrink)})

    def _step_lr(self):
        """One update is about to be applied: the schedule's counter steps."""
        if self.has_lr_schedule:
            self.lr_step += 1

    def _lr(self, pplan):
        """The rate of ``pplan``'s update now: its own, or its schedule's at this server's
        counter times the parameter's multiplier (as the worker's update op computes it)."""
        if pplan.lr_schedule is None:
            return pplan.learning_rate
        return pplan.learning_rate * float(schedules.value(pplan.lr_schedule, self.lr_step))

    def _apply(self, name, grad, worker=None, scale=1.0):
        if name in self.shards:
            pplan, table = self.shards[name]
            rows, values = grad
            if scale != 1.0:
                values = values * np.float32(scale)
            table.push(rows, values, self._lr(pplan))
            return
        pplan, block, table = self._dense(name)
        if isinstance(grad, tuple):
            rows, values = grad
            if scale != 1.0:
                values = values * np.float32(scale)
            table.push_rows(rows - block.row_offset, values, self._lr(pplan))
            return
        grad = np.asarray(grad, dtype=np.float32).reshape(table.shape)
        if scale != 1.0:
            grad = grad * np.float32(scale)
        if self.dc_asgd and worker is not None:
            bak = self._bak.get((worker, name))
            if bak is not None:
                param = table.pull()
                grad = grad + grad * grad * (param - bak)
        table.push(grad, self._lr(pplan))

    def _checked_grads(self, req, end=None):
        """Returns [(name, grad)] of a push (its first ``end`` arrays; default all) once
        every one fits what this server holds.

        Raises:
            DataError: an unknown block or table, or a gradient of the wrong shape (names it).
        """
        out = []
        for name, grad in _grads(req, end):
            if name in self.shards:
                _, table = self.shards[name]
                if not isinstance(grad, tuple):
                    raise DataError(f"distributed table {name!r} takes sparse rows ({name}@ROWS, {name}@VALUES), "
                                    f"not a dense array")
                if grad[1].shape[1] != table.dim:
                    raise DataError(f"distributed table {name!r} has rows of width {table.dim}; got {grad[1].shape[1]}")
            else:
                _, block, table = self._dense(name)
                if isinstance(grad, tuple):
                    rows, values = grad
                    if len(table.shape) != 2 or values.shape[1] != table.shape[1]:
                        raise DataError(f"block {name!r} of shape {table.shape} cannot take rows of width "
                                        f"{values.shape[1]}")
                    if len(rows) and (rows.min() < block.row_offset or rows.max() >= block.row_offset + block.rows):
                        raise DataError(f"block {name!r} holds rows [{block.row_offset}, "
                                        f"{block.row_offset + block.rows}); got rows {rows.min()}..{rows.max()}")
                elif grad.size != int(np.prod(table.shape)):
                    raise DataError(f"block {name!r} has shape {table.shape}; got a gradient of {grad.size} values")
            out.append((name, grad))
        return out

    def _op_push(self, req):
        """Async / half-async: apply every gradient now, or once ``merge_pushes`` of its
        pushes are in (their mean, as one update). With meta "pull" (dense block names)
        the reply holds those blocks' values after this push, as a ``pull_dense`` sent
        right after it would (one request instead of two per step). With meta "rows" (the
        row pulls of the worker's next step, as in ``sync_push``) the reply then holds
        those rows as "k/<table>", read after the dense blocks, as ``pull_sparse``
        requests sent right after it would read them."""
        pulls = list(req.meta.get("pull", ()))
        for name in pulls:
            self._dense(name)
        end, row_pulls = self._row_pulls(req)
        for table, ids, names, arrays in row_pulls:
            self._check_row_pull(table, ids, names, arrays)
        grads = self._checked_grads(req, end)
        if self.merge_pushes == 1:
            self._step_lr()
            for name, grad in grads:
                self._apply(name, grad, worker=req.worker)
        else:
            for name, grad in grads:
                self._pending.setdefault(name, []).append(grad)
            self._pending_pushes += 1
            self._apply_pending()
        names, arrays = pulls, self._dense_values(req.worker, pulls)
        for k, (table, ids, stat_names, stat_arrays) in enumerate(row_pulls):
            names.append(f"{k}/{table}")
            arrays.append(self._rows(table, ids, False, stat_names, stat_arrays))
        req.reply(names=names, arrays=arrays)

    def _merge_window(self):
        """Pushes per update: merge_pushes (0: one per worker still training), scaled down
        in proportion as workers stop (a worker's threads may push separately, so a window
        may hold several pushes of one worker)."""
        training = len(self.live - self.stopped)
        if self.merge_pushes == 0:
            return max(training, 1)
        if self.elastic is not None:  # scaled from MIN workers, never above merge_pushes
            return max(1, min(self.merge_pushes, -(-self.merge_pushes * training // self.elastic[0])))
        return max(1, -(-self.merge_pushes * training // self.workers))

    def _apply_pending(self):
        """Applies the merged pushes as one update once the window of pushes is full: each
        parameter gets the sum of its gradients divided by the pushes (one without rows of
        a table adds zero to it, as in a sync step). The window shrinks as workers stop,
        so the last pushes are never left behind."""
        if not self._pending_pushes or self._pending_pushes < self._merge_window():
            return
        pending, pushes = self._pending, self._pending_pushes
        self._pending, self._pending_pushes = {}, 0
        self._step_lr()
        for name, grads in pending.items():
            self._apply_mean(name, grads, count=pushes)

    def _apply_mean(self, name, grads, count=None):
        """Applies sum(grads) / count (default: their number) as one update."""
        n = count or len(grads)
        if isinstance(grads[0], tuple):
            rows = np.concatenate([g[0] for g in grads])
            values = np.concatenate([g[1] for g in grads])
            self._apply(name, (rows, values), scale=1.0 / n)
        else:
            total = np.array(grads[0], dtype=np.float32, copy=True).reshape(-1)
            for g in grads[1:]:
                total += np.asarray(g, dtype=np.float32).reshape(-1)
            self._apply(name, total, scale=1.0 / n)

    # ------------------------------------------------------------------ sync
    def _op_sync_push(self, req):
        """A worker's step. Meta "pull": dense block names whose values the answer holds,
        read after the step was applied. Meta "rows": [[table, arrays]] row pulls of the
        worker's next step, in order, as ``pull_sparse`` would ask them: after the
        gradients come, per pull k, "k/ids" and (a training pull of a table with
        statistics) "k/shows", "k/clicks"; the answer holds each pull's rows as "k/<table>",
        read after the step was applied (and after the dense blocks), exactly as a
        ``pull_sparse`` sent at the start of the next step would read them."""
        if req.worker in self._sync:
            raise DataError(f"worker {req.worker} sent a second sync step before the first completed")
        for name in req.meta.get("pull", ()):
            self._dense(name)
        end, pulls = self._row_pulls(req)
        for table, ids, names, arrays in pulls:
            self._check_row_pull(table, ids, names, arrays)
        self._checked_grads(req, end)
        req.defer()
        self._park("sync", self._sync, req)
        self._maybe_finish_sync()
        self._check_crossed_waits()

    def _row_pulls(self, req):
        """(the number of gradient arrays, [(table, ids, stat names, stat arrays)]) of a
        sync step's meta "rows" (see ``_op_sync_push``).

        Raises:
            DataError: "rows" or the arrays after the gradients do not match (names them).
        """
        spec = req.meta.get("rows") or ()
        try:
            counts = [(str(table), int(k)) for table, k in spec]
        except (TypeError, ValueError):
            raise DataError(f"sync_push meta 'rows' must be [[table, arrays], ...]; got {spec!r}") from None
        end = len(req.names) - sum(k for _, k in counts)
        if any(k not in (1, 3) for _, k in counts) or end < 0:
            raise DataError(f"sync_push meta 'rows' {spec!r} does not match its {len(req.names)} arrays; each "
                            f"row pull has its ids and optionally shows and clicks")
        pulls, i = [], end
        for k, (table, count) in enumerate(counts):
            names = [n.partition("/")[2] for n in req.names[i:i + count]]
            if any(n != f"{k}/{want}" for n, want in zip(req.names[i:i + count], ("ids", "shows", "clicks"))):
                raise DataError(f"sync_push row pull {k} of table {table!r} has arrays {req.names[i:i + count]}; "
                                f"expected {k}/ids[, {k}/shows, {k}/clicks]")
            pulls.append((table, req.arrays[i], names[1:], req.arrays[i + 1:i + count]))
            i += count
        return end, pulls

    def _check_row_pull(self, table_name, ids, stat_names, stat_arrays):
        """Raises DataError when a sync step's row pull could not be read after the step:
        an unknown table, ids that are not int64 [n] (in an is_sparse block's rows), or
        bad statistics."""
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise DataError(f"a row pull of table {table_name!r} has ids of dtype {ids.dtype} and shape "
                            f"{list(ids.shape)}; expected int64 [n]")
        if table_name in self.shards:
            pplan, _ = self._shard(table_name)
            if pplan.has_statistics:
                _pull_statistics(stat_names, stat_arrays, table_name, len(ids))
            return
        _, block, _ = self._dense(table_name)
        if len(ids) and (ids.min() < block.row_offset or ids.max() >= block.row_offset + block.rows):
            raise DataError(f"block {table_name!r} holds rows [{block.row_offset}, {block.row_offset + block.rows}); "
                            f"a row pull asked for rows {ids.min()}..{ids.max()}")

    def _maybe_finish_sync(self):
        waiting = set(self._sync)
        if not waiting or not (self.live - self.stopped) <= waiting:
            return
        reqs = [self._sync[w] for w in sorted(waiting)]
        self._sync = {}
        try:
            self._finish_sync(reqs)
        except Exception as e:  # noqa: BLE001 - every parked worker must get an answer
            log.exception("server %s: the sync step failed", self.endpoint)
            text = str(e) if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
            for req in reqs:
                if not req.answered:
                    req.reply_error(f"the sync step failed on server {self.endpoint}: {text}")

    def _finish_sync(self, reqs):
        n = len(reqs)
        self._step_lr()
        merged = {}
        parts = [self._row_pulls(req) for req in reqs]
        for req, (end, _) in zip(reqs, parts):
            for name, grad in _grads(req, end):
                merged.setdefault(name, []).append(grad)
        for name, grads in merged.items():  # a worker with no rows of a table adds zero
            self._apply_mean(name, grads, count=n)
        # Every answer is read before any is sent: the workers' row pulls (in worker order)
        # count statistics and create rows, as their pull_sparse requests would after the step.
        answers = []
        for req, (_, pulls) in zip(reqs, parts):
            names = list(req.meta.get("pull", ()))
            arrays = [self._dense(nm)[2].pull() for nm in names]
            for k, (table, ids, stat_names, stat_arrays) in enumerate(pulls):
                names.append(f"{k}/{table}")
                arrays.append(self._rows(table, ids, False, stat_names, stat_arrays))
            answers.append((req, names, arrays))
        for req, names, arrays in answers:
            req.reply(names=names, arrays=arrays)

    # ------------------------------------------------------------------ GEO
    def _op_geo_push(self, req):
        for name in req.meta.get("pull", ()):
            self._dense(name)
        for name, delta in self._checked_grads(req):
            if name in self.shards:
                self.shards[name][1].add(*delta)
            else:
                _, block, table = self._dense(name)
                if isinstance(delta, tuple):
                    table.add_rows(delta[0] - block.row_offset, delta[1])
                else:
                    table.add(np.asarray(delta, dtype=np.float32).reshape(table.shape))
        names, arrays = [], []
        for name in req.meta.get("pull", ()):
            _, _, table = self._dense(name)
            names.append(name)
            arrays.append(table.pull())
        for name in req.meta.get("pull_changed", ()):
            _, block, table = self._dense(name)
            rows, values = table.pull_changed(req.worker)
            names += [name + "@ROWS", name + "@VALUES"]
            arrays += [rows + block.row_offset, values]
        # Elastic: how many workers train now, the divisor of the next deltas.
        req.reply(names=names, arrays=arrays,
                  meta=None if self.elastic is None else {"training": len(self.live - self.stopped)})

    # ------------------------------------------------------------------ coordination
    def _op_barrier(self, req):
        req.defer()
        self._park("barrier", self._barrier, req)
        self._maybe_release_barrier()
        self._check_crossed_waits()

    def _check_crossed_waits(self):
        """Fails the job when every worker still training waits, some in a sync step and the
        others at the barrier: neither can ever complete (the workers ran different numbers
        of sync steps, e.g. unequal shards), so they are told now instead of after
        FLEET_RPC_TIMEOUT_MS."""
        if not self._sync or not self._barrier or self.failure is not None:
            return
        if not (self.live - self.stopped) <= (set(self._sync) | set(self._barrier)):
            return
        self.failure = (
            f"{_workers_phrase(sorted(self._sync))} {_wait(self._sync)} in a sync step while "
            f"{_workers_phrase(sorted(self._barrier))} {_wait(self._barrier)} at fleet.barrier_worker(): "
            "the workers ran "
            "different numbers of sync steps, so neither wait can end. In sync training every worker must "
            "run the same number of steps per pass: give each worker the same number of batches (files "
            "of equal line counts, as many per worker), or end the pass with fleet.stop_worker() instead "
            "of a barrier")
        log.error("server %s: %s", self.endpoint, self.failure)
        for parked in (self._sync, self._barrier):
            for w, r in list(parked.items()):
                if not r.answered:
                    r.reply_error(self.failure)
                self.told.add(w)
            parked.clear()

    def _maybe_release_barrier(self):
        if self.elastic is not None and self._barrier:  # grouped by pass (work_queue)
            self._release_keyed(self._barrier, lambda reqs: [r.reply() for r in reqs])
            return
        if self._barrier and (self.live - self.stopped) <= set(self._barrier):
            reqs, self._barrier = list(self._barrier.values()), {}
            for r in reqs:
                r.reply()

    def _op_all_to_all(self, req):
        """Worker w sends blobs[j] for every worker j; each gets what all sent to it."""
        req.defer()
        self._park("exchange", self._exchange, req)
        self._maybe_release_exchange()

    def _maybe_release_exchange(self):
        if self._exchange and set(self._exchange) >= (self.live - self.stopped):
            reqs, self._exchange = self._exchange, {}
            order = sorted(reqs)
            for j in order:
                blobs = [reqs[w].arrays[j] if j < len(reqs[w].arrays) else np.zeros(0, np.uint8) for w in order]
                reqs[j].reply(names=[f"from{w}" for w in order], arrays=blobs)

    def _op_stop(self, req):
        if not self.stopped:
            self.first_stop = time.monotonic()  # when the wait for the other workers' stop began
        self.stopped.add(req.worker)
        self._close_save(req.worker, "it stopped")
        self._apply_pending()  # fewer workers now fill a window
        req.reply()
        log.info("server %s: worker %d stopped (%d of %d)", self.endpoint, req.worker,
                 len(self.stopped), self.workers)
        # A stopped worker no longer holds back the others.
        self._maybe_finish_sync()
        self._maybe_release_barrier()
        if self.elastic is not None:
            self._membership_changed()

    def _op_fail(self, req):
        """A worker reports that it cannot go on (meta ``reason``: its exception); the job
        fails at once instead of after FLEET_HEARTBEAT_TIMEOUT_MS, naming its error."""
        error = req.meta.get("reason")
        if not isinstance(error, str) or not error:
            raise DataError("fail needs meta 'reason': the text of the worker's error")
        self.fail_worker(req.worker, f"it failed: {error[:2000]}")
        req.reply()

    def fail_worker(self, worker, reason):
        """Marks ``worker`` lost, which fails the job: parked requests and every later one
        but ``stop`` get an error naming it (no step or barrier waits for a dead worker).
        In an elastic job the worker is forgotten instead (``ElasticOps._forget_worker``).
        A worker that stopped or was lost already is left as it is.

        Args:
            worker: the worker id; reason: why, as a clause ("it stopped sending heartbeats ...").
        """
        if worker in self.stopped or worker in self.lost or not 0 <= worker < self.workers:
            return
        self._close_save(worker, "it was lost")  # its snapshots are released, elastic or not
        if self.elastic is not None:
            self._forget_worker(worker, reason)
            return
        self.lost[worker] = reason
        self.live.discard(worker)
        log.error("server %s: worker %d was lost: %s", self.endpoint, worker, reason)
        if self.failure is None:
            self.failure = (f"worker {worker} was lost: {reason}. The job cannot go on without its share of the "
                            f"data: the job is not elastic (fleetrun --np MIN:MAX makes an async, half-async or "
                            f"GEO job go on without it), so every worker stops; restart the job from its last "
                            f"checkpoint")
        for parked in (self._sync, self._barrier, self._exchange):
            for w, r in list(parked.items()):
                if not r.answered:
                    r.reply_error(self.failure)
                self.told.add(w)
            parked.clear()

    def check_liveness(self, last_heard, timeout_s, now=None, since=None, first_contact_s=None):
        """Fails every worker not heard from for longer than ``timeout_s`` (see fail_worker).

        A worker never heard from is not timed out by the heartbeat bound: schedulers start
        processes at different times, and a worker that cannot reach the servers fails by
        itself (FLEET_CONNECT_TIMEOUT_MS). It is failed once ``first_contact_s`` seconds have
        passed since ``since`` (when the server started serving) without a word from it
        (FLEET_WORKER_CONNECT_TIMEOUT_MS): a host whose processes were never started.

        Args:
            last_heard: {worker id: time.monotonic() of its last message} (the socket's).
            timeout_s: silence that makes a worker lost (FLEET_HEARTBEAT_TIMEOUT_MS / 1000).
            now: the current time.monotonic() (default: now).
        """
        now = time.monotonic() if now is None else now
        for worker in (range(self.workers) if self.elastic is None else sorted(self.live - self.stopped)):
            heard = last_heard.get(worker)
            if worker in self.stopped or worker in self.lost:
                continue
            if heard is None:
                if first_contact_s is not None and since is not None and now - since > first_contact_s:
                    self.fail_worker(worker, (
                        f"it never connected: nothing came from it in the {now - since:.0f} s this server "
                        f"has been serving ({WORKER_CONNECT_TIMEOUT_MS_ENV}={round(first_contact_s * 1000)})"
                        f"{self._where(worker, 'started')}; check that every host's processes were started"))
                continue
            silence = now - heard
            if silence > timeout_s:
                self.fail_worker(worker, (
                    f"it stopped sending heartbeats {silence:.1f} s ago ({HEARTBEAT_TIMEOUT_MS_ENV}="
                    f"{round(timeout_s * 1000)}) without calling fleet.stop_worker(); it is probably dead"
                    f"{self._where(worker)} (see its log, workerlog.{worker} under fleetrun)"))

    def _where(self, worker, how="unreachable"):
        """ ", or its host HOST unreachable" when the worker's endpoint is known, else ""."""
        if worker < len(self.worker_endpoints):
            host = split_endpoint(self.worker_endpoints[worker])[0]
            if how == "started":
                return f" (was it started on its host {host}?)"
            return f", or its host {host} unreachable"
        return ""

    def all_told(self, heard_since):
        """True once every worker still in the job has been told of the failure: it got an
        error reply, or the heartbeat reply that carries it (``heard_since`` holds the
        workers heard from after the failure was published)."""
        return all(w in self.stopped or w in self.lost or w in self.told or w in heard_since
                   for w in range(self.workers))

    def _op_lr_step(self, req):
        """This server's learning-rate step counter: meta ``step`` (the value the last
        update used) and ``schedule`` (whether it evaluates a schedule)."""
        req.reply(meta={"step": self.lr_step, "schedule": self.has_lr_schedule})

    def _op_checkpoint_info(self, req):
        """Which checkpoint this server loaded: meta ``dirname``, ``save_id``, ``step``,
        ``epoch`` (all None when it started fresh), and ``updates``: the pushes it has
        applied since it started."""
        req.reply(meta=dict(self.loaded, updates=self.updates))


def table_options(pplan):
    """The SparseTable keyword arguments of a distributed table's entry and accessor
    (none for a plain table, which keeps no statistics)."""
    options = {}
    if pplan.entry is not None:
        options["entry"] = entry_from_attr(pplan.entry)
    if pplan.accessor is not None:
        options["accessor"] = CtrAccessorConfig.from_dict(pplan.accessor)
    return options


def _pull_statistics(names, arrays, table, n):
    """The (shows, clicks) float32 [n] arrays of a training pull of ``table`` from the
    arrays after its ids (None, None when there are none: every id counts one show, no
    click).

    Raises:
        DataError: only one of them, or one that is not float32 [n] of finite values
            >= 0 (names the table).
    """
    got = dict(zip(names, arrays))
    if not got:
        return None, None
    out = []
    for key in ("shows", "clicks"):
        value = got.get(key)
        if value is None:
            raise DataError(f"a training pull of table {table!r} carries {sorted(got)} but not {key!r}; "
                            f"send both shows and clicks (float32, one per id) or neither")
        if value.dtype != np.float32 or value.shape != (n,):
            raise DataError(f"a training pull of table {table!r} has {key} of dtype {value.dtype} and shape "
                            f"{list(value.shape)}; expected float32 [{n}] (one per id)")
        if n and not (np.isfinite(value).all() and value.min() >= 0):
            raise DataError(f"a training pull of table {table!r} has {key} that are negative or not finite; "
                            f"shows and clicks are sums of counts >= 0")
        out.append(value)
    return out[0], out[1]


def _grads(req, end=None):
    """Yields (name, grad) from a push (its first ``end`` arrays; default all): a dense
    array, or (rows, values) for a name sent as the pair "<name>@ROWS", "<name>@VALUES"."""
    names, arrays = req.names[:end], req.arrays[:end]
    i = 0
    while i < len(names):
        name = names[i]
        if name.endswith("@ROWS"):
            if i + 1 >= len(names) or names[i + 1] != name[:-5] + "@VALUES":
                raise DataError(f"sparse gradient {name!r} must be followed by its @VALUES array")
            rows, values = arrays[i], arrays[i + 1]
            if rows.ndim != 1 or values.ndim != 2 or len(rows) != len(values):
                raise DataError(f"sparse gradient {name[:-5]!r}: rows {rows.shape} and values {values.shape} do not match")
            yield name[:-5], (rows.astype(np.int64, copy=False), values)
            i += 2
        else:
            yield name, arrays[i]
            i += 1
