"""The state and request handling of one parameter server (no sockets here).

A server holds the blocks the plan gives it (``DenseTable`` each; ``is_sparse`` tables
are row blocks served row by row) and its shard of the ``is_distributed`` table
(``SparseTable``). ``handle(request)`` answers one request; requests that must wait for
other workers (sync steps, barriers) are parked and answered later, from the same thread.

Per mode:
- sync: ``sync_push`` carries a worker's step gradients; when every live worker has sent
  its step, the server averages (sum / contributors), applies the optimizer once, and
  answers each worker with the fresh values of its dense blocks.
- async / half-async: ``push`` applies gradients on arrival (DC-ASGD optional).
- GEO: ``geo_push`` adds deltas and answers with the dense blocks and the sparse rows
  changed since this worker's last GEO exchange.

Checkpoints (``fleet.server.checkpoint``): ``pull_state`` answers rows of blocks with
their optimizer state, ``pull_shard`` reads a distributed table out chunk by chunk, and
``load`` restores a server's share of a checkpoint saved whole.

Thread-safety: one thread calls ``handle``; tables are locked anyway.
"""
import logging
import os
import time

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.optimizer.rules import rule_from_op_attrs
from fleet.server.checkpoint import ShardCursor, load_server_state
from fleet.tables.dense_table import DenseTable
from fleet.tables.sparse_table import SparseTable
from fleet.transpiler.plan import DISTRIBUTED

log = logging.getLogger("fleet.server")


class ParameterServer:
    """What one server holds and how it answers.

    Args:
        endpoint: this server's "host:port".
        plan: the job's DistPlan.
        initial: {param name: full initial array} for the dense and is_sparse params this
            server holds blocks of (the server slices its blocks out of them).
        dc_asgd: compensate async gradients for delay (async mode only).
    """

    def __init__(self, endpoint, plan, initial, dc_asgd=False):
        self.endpoint = endpoint
        self.plan = plan
        self.mode = plan.mode
        self.workers = plan.worker_num
        self.dc_asgd = bool(dc_asgd) and self.mode == "async"
        track = self.workers if self.mode == "geo" else 0
        self.blocks = {}  # block name -> (ParamPlan, Block, DenseTable)
        self.shards = {}  # distributed table name -> (ParamPlan, SparseTable)
        for pplan, block in plan.blocks_on(endpoint):
            rule = rule_from_op_attrs(pplan.rule_type, pplan.rule_attrs)
            if pplan.kind == DISTRIBUTED:
                table = SparseTable(pplan.name, pplan.width, rule, pplan.init_spec,
                                    seed=pplan.seed, track_workers=track)
                self.shards[pplan.name] = (pplan, table)
                continue
            full = initial.get(pplan.name)
            if full is None:
                raise ConfigError(f"server {endpoint}: no initial value for {pplan.name!r}")
            value = block.rows_of(np.asarray(full, dtype=np.float32))
            self.blocks[block.name] = (pplan, block, DenseTable(block.name, value, rule, track_workers=track))
        self.live = set(range(self.workers))
        self.stopped = set()
        self._sync = {}  # worker -> (request, names, arrays)
        self._barrier = {}  # worker -> request
        self._exchange = {}  # worker -> (request, blobs)
        self._bak = {}  # (worker, block) -> param copy at the worker's last pull (DC-ASGD)
        self.requests = 0
        self.last_seen = {}
        self._cursors = {}  # (worker, table) -> ShardCursor of a table read out for saving
        self.loaded = {"dirname": None, "save_id": None, "step": None, "epoch": None}

    # ------------------------------------------------------------------ helpers
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
        """True once every worker has stopped."""
        return len(self.stopped) >= self.workers

    # ------------------------------------------------------------------ dispatch
    def handle(self, req):
        """Answers (or parks) one request. Raises on a bad request; the caller turns the
        exception into an error reply and keeps serving."""
        self.requests += 1
        self.last_seen[req.worker] = time.monotonic()
        handler = getattr(self, "_op_" + str(req.op), None)
        if handler is None:
            raise DataError(f"unknown op {req.op!r}")
        return handler(req)

    def _op_ping(self, req):
        req.reply(meta={"blocks": sorted(self.blocks), "shards": sorted(self.shards), "mode": self.mode})

    def _op_pull_dense(self, req):
        names = list(req.meta.get("blocks", ()))
        out = []
        for name in names:
            _, _, table = self._dense(name)
            value = table.pull()
            if self.dc_asgd:
                self._bak[(req.worker, name)] = value.copy()
            out.append(value)
        req.reply(names=names, arrays=out)

    def _op_pull_sparse(self, req):
        """Rows of an is_sparse block (global row ids) or of the distributed shard (ids)."""
        table_name = req.meta["table"]
        ids = req.arrays[0]
        if table_name in self.shards:
            _, table = self._shard(table_name)
            values = table.pull(ids, create=not req.meta.get("is_test", False))
        else:
            _, block, table = self._dense(table_name)
            values = table.pull_rows(ids - block.row_offset)
        req.reply(names=[table_name], arrays=[values])

    def _apply(self, name, grad, worker=None, scale=1.0):
        if name in self.shards:
            pplan, table = self.shards[name]
            rows, values = grad
            if scale != 1.0:
                values = values * np.float32(scale)
            table.push(rows, values, pplan.learning_rate)
            return
        pplan, block, table = self._dense(name)
        if isinstance(grad, tuple):
            rows, values = grad
            if scale != 1.0:
                values = values * np.float32(scale)
            table.push_rows(rows - block.row_offset, values, pplan.learning_rate)
            return
        grad = np.asarray(grad, dtype=np.float32).reshape(table.shape)
        if scale != 1.0:
            grad = grad * np.float32(scale)
        if self.dc_asgd and worker is not None:
            bak = self._bak.get((worker, name))
            if bak is not None:
                param = table.pull()
                grad = grad + grad * grad * (param - bak)
        table.push(grad, pplan.learning_rate)

    def _op_push(self, req):
        """Async / half-async: apply every gradient now."""
        for name, grad in _grads(req):
            self._apply(name, grad, worker=req.worker)
        req.reply()

    # ------------------------------------------------------------------ sync
    def _op_sync_push(self, req):
        if req.worker in self._sync:
            raise DataError(f"worker {req.worker} sent a second sync step before the first completed")
        req.defer()
        self._sync[req.worker] = req
        self._maybe_finish_sync()

    def _maybe_finish_sync(self):
        waiting = set(self._sync)
        if not waiting or not (self.live - self.stopped) <= waiting:
            return
        reqs = [self._sync[w] for w in sorted(waiting)]
        self._sync = {}
        n = len(reqs)
        merged = {}
        for req in reqs:
            for name, grad in _grads(req):
                merged.setdefault(name, []).append(grad)
        for name, grads in merged.items():
            if isinstance(grads[0], tuple):
                rows = np.concatenate([g[0] for g in grads])
                values = np.concatenate([g[1] for g in grads])
                self._apply(name, (rows, values), scale=1.0 / n)
            else:
                total = np.array(grads[0], dtype=np.float32, copy=True)
                for g in grads[1:]:
                    total += g
                self._apply(name, total, scale=1.0 / n)
        for req in reqs:
            names = list(req.meta.get("pull", ()))
            req.reply(names=names, arrays=[self._dense(nm)[2].pull() for nm in names])

    # ------------------------------------------------------------------ GEO
    def _op_geo_push(self, req):
        for name, delta in _grads(req):
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
        req.reply(names=names, arrays=arrays)

    # ------------------------------------------------------------------ coordination
    def _op_barrier(self, req):
        req.defer()
        self._barrier[req.worker] = req
        self._maybe_release_barrier()

    def _maybe_release_barrier(self):
        if self._barrier and (self.live - self.stopped) <= set(self._barrier):
            reqs, self._barrier = list(self._barrier.values()), {}
            for r in reqs:
                r.reply()

    def _op_all_to_all(self, req):
        """Worker w sends blobs[j] for every worker j; each gets what all sent to it."""
        req.defer()
        self._exchange[req.worker] = req
        if set(self._exchange) >= (self.live - self.stopped):
            reqs, self._exchange = self._exchange, {}
            order = sorted(reqs)
            for j in order:
                blobs = [reqs[w].arrays[j] if j < len(reqs[w].arrays) else np.zeros(0, np.uint8) for w in order]
                reqs[j].reply(names=[f"from{w}" for w in order], arrays=blobs)

    def _op_stop(self, req):
        self.stopped.add(req.worker)
        req.reply()
        log.info("server %s: worker %d stopped (%d of %d)", self.endpoint, req.worker,
                 len(self.stopped), self.workers)
        # A stopped worker no longer holds back the others.
        self._maybe_finish_sync()
        self._maybe_release_barrier()

    def fail_worker(self, worker, reason):
        """Marks ``worker`` dead: parked requests get an error naming it (sync never waits
        for a dead worker)."""
        self.live.discard(worker)
        message = f"worker {worker} is gone ({reason}); stopping this step"
        for parked in (self._sync, self._barrier, self._exchange):
            for r in list(parked.values()):
                r.reply_error(message)
            parked.clear()

    # ------------------------------------------------------------------ save / load
    def state(self):
        """Returns {block or table name: state_dict} of everything this server holds."""
        out = {name: entry[2].state_dict() for name, entry in self.blocks.items()}
        out.update({name: entry[1].state_dict() for name, entry in self.shards.items()})
        return out

    def load(self, reader):
        """Loads values and optimizer state of every block and table from a checkpoint
        (a ``fleet.framework.io.VarsReader``); see ``fleet.server.checkpoint``."""
        load_server_state(self, reader)
        extra = reader.extra
        self.loaded = {"dirname": os.path.abspath(reader.dirname), "save_id": extra.get("save_id"),
                       "step": extra.get("step"), "epoch": extra.get("epoch")}

    def _op_pull_state(self, req):
        """Rows of blocks with their optimizer state, for saving: meta ``items`` is a list
        of [block name, first row, end row]; meta ``state`` false leaves the state out.
        Array ``"<i>/value"`` and ``"<i>/state.<key>"`` answer item i."""
        items = req.meta.get("items")
        if not isinstance(items, list):
            raise DataError("pull_state needs meta 'items': a list of [block name, first row, end row]")
        with_state = bool(req.meta.get("state", True))
        names, arrays = [], []
        for i, item in enumerate(items):
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in item[1:])):
                raise DataError(f"pull_state item {item!r} is not [block name, first row, end row]")
            _, _, table = self._dense(item[0])
            for key, arr in table.state_rows(item[1], item[2], with_state).items():
                names.append(f"{i}/{key}")
                arrays.append(arr)
        req.reply(names=names, arrays=arrays)

    def _op_pull_shard(self, req):
        """The next chunk of this server's share of a distributed table, for saving.

        Meta: ``table``, ``rows`` (most rows per chunk) and ``cursor`` (absent to start a
        read; then the ``cursor`` of the previous answer). The answer holds ``ids``,
        ``values`` and ``state.<key>`` arrays and meta ``cursor``, ``done``, ``total``.
        A new read by the same worker of the same table drops an unfinished one.
        """
        name = req.meta.get("table")
        _, table = self._shard(name)
        key = (req.worker, name)
        cursor_id = req.meta.get("cursor")
        if cursor_id is None:
            rows = req.meta.get("rows")
            if not isinstance(rows, int) or isinstance(rows, bool):
                raise DataError(f"pull_shard needs meta 'rows' (an int >= 1); got {rows!r}")
            self._cursors[key] = ShardCursor(table, rows)
        cursor = self._cursors.get(key)
        if cursor is None or (cursor_id is not None and cursor.id != cursor_id):
            raise DataError(f"no read of table {name!r} by worker {req.worker} is in progress "
                            f"(cursor {cursor_id!r}); start again without a cursor")
        chunk, done = cursor.next_chunk()
        if done:
            del self._cursors[key]
        req.reply(names=list(chunk), arrays=list(chunk.values()),
                  meta={"cursor": cursor.id, "done": done, "total": cursor.limit})

    def _op_checkpoint_info(self, req):
        """Which checkpoint this server loaded: meta ``dirname``, ``save_id``, ``step``,
        ``epoch`` (all None when it started fresh)."""
        req.reply(meta=dict(self.loaded))


def _grads(req):
    """Yields (name, grad) from a push: a dense array, or (rows, values) for a name sent as
    the pair "<name>@ROWS", "<name>@VALUES"."""
    names, arrays = req.names, req.arrays
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
