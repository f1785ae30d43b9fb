"""A server's side of checkpoints: reading its state out in chunks, loading its share back.

Checkpoints hold every parameter whole, as local training saves it (Paddle stores them
un-split too), so they load onto any number of servers:

- a dense or ``is_sparse`` parameter ``p``: ``p`` and, per optimizer state entry ``k``
  with one row per parameter row, ``p_k_0`` (the names local training gives them). A
  scalar entry (Adam's beta powers) is ``p_k_0`` (the value of the block holding row
  0) plus, when the parameter was split, ``p_k_0@blocks`` (one value per block, in row
  order) and ``p@block_offsets`` (each block's first row), since blocks that met no
  rows of a sparse update did not step.
- an ``is_distributed`` table ``t``: ``t@ids`` (int64 [n]), ``t@values`` ([n, dim]) and
  ``t_k_0@values`` per row state entry, in server order (each server's rows in creation
  order); scalar state ``t_k_0`` (server 0's) plus ``t_k_0@shards`` (one per server).
  A table saved by local training (``t`` as a dense [rows, dim] array) loads too: row
  ``i`` is id ``i``.

- a table with statistics (an entry or an accessor config): ``t@stats`` (float32 [n, 4]:
  show, click, unseen_days, delta_score, in the order of ``t@ids``); a delta save (mode
  1) also ``t@deleted`` (int64: the ids deleted by shrink since the table's previous
  save). Saves read a table through a snapshot (``SnapshotCursor``), so ids, values,
  every state and the statistics of a server are of one instant.

- a table with an entry (admission): its count-min sketch of the candidates (ids without
  a row) as of the snapshot, in every save mode: ``t@sketch`` (uint8 [depth, width]) when
  saved from one server (or by local training), ``t@sketch@shards`` (uint8 [servers,
  depth, width], in server order) from several. Loading (``load_table_sketch``): a
  server of a save made by as many servers takes its own shard's sketch; any other
  layout gives each table the elementwise maximum of the saved sketches (an id's
  counters on its old server are among them, so its estimate never drops below its
  count); a chain takes the sketch of its last save that has one; a save without one
  leaves the sketch empty.

- the learning-rate step counter: ``@LR_DECAY_COUNTER@`` (int64 [1]; the worker's own, as
  local training saves it) and ``@LR_DECAY_COUNTER@@servers`` (int64 [servers, 1], each
  server's counter, -1 where a server evaluates no schedule).

``load_server_state`` gives each server its blocks' rows (``Block.rows_of``) and its
share of each table (``id % server_num == index``); the per-block or per-server scalar
state is used when the layout is the same as when saved, else the row-0 / server-0 value.
"""
import itertools

import numpy as np

from fleet import schedules
from fleet.errors import ConfigError, DataError
from fleet.transpiler.plan import DISTRIBUTED

SERVER_COUNTERS = schedules.COUNTER + "@servers"

_SCAN_ROWS = 1 << 20  # ids examined per step when selecting a server's share of a table


def state_var(param, key):
    """The saved name of optimizer state ``key`` of ``param`` (as local training names it)."""
    return f"{param}_{key}_0"


def _rule_keys(rule):
    rows = tuple(getattr(rule, "row_state_names", ()))
    scalars = tuple(k for k in rule.state_names if k not in rows)
    return rows, scalars


def _need(reader, name, shape=None, dtype=None):
    """The saved array ``name``, checked against the expected shape and dtype."""
    if name not in reader:
        raise ConfigError(
            f"checkpoint {reader.dirname!r} has no {name!r}, which this server needs; it was saved "
            f"from another model or with another optimizer (it holds {reader.names()[:8]}...)")
    if shape is not None and reader.shape(name) != tuple(shape):
        raise ConfigError(
            f"checkpoint {reader.dirname!r}: {name!r} is saved with shape {list(reader.shape(name))} but "
            f"this program's is {list(shape)}; load a checkpoint of the same model")
    if dtype is not None and reader.dtype(name) != np.dtype(dtype):
        raise ConfigError(
            f"checkpoint {reader.dirname!r}: {name!r} is saved as {reader.dtype(name)} but this "
            f"program's is {np.dtype(dtype)}")
    return reader.get(name)


def _scalar_templates(rule, row_shape):
    state = rule.init_state((1,) + tuple(row_shape))
    return {k: np.asarray(v) for k, v in state.items()}


def _block_state(reader, pplan, block, rule):
    """The state_dict of one block, cut out of the saved whole arrays."""
    full_shape = tuple(pplan.shape)
    state = {"value": block.rows_of(_need(reader, pplan.name, full_shape, np.float32))}
    rows, scalars = _rule_keys(rule)
    templates = _scalar_templates(rule, full_shape[1:])
    for key in rows:
        arr = _need(reader, state_var(pplan.name, key), full_shape, templates[key].dtype)
        state[f"state.{key}"] = block.rows_of(arr)
    for key in scalars:
        name = state_var(pplan.name, key)
        per_block, offsets = name + "@blocks", pplan.name + "@block_offsets"
        want = templates[key]
        if per_block in reader and offsets in reader:
            starts = np.asarray(reader.get(offsets))
            values = _need(reader, per_block, (len(starts),) + want.shape, want.dtype)
            i = int(np.searchsorted(starts, block.row_offset, side="right")) - 1
            state[f"state.{key}"] = np.array(values[max(i, 0)])
        else:
            state[f"state.{key}"] = np.array(_need(reader, name, want.shape, want.dtype))
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


def _share_of(ids, server, servers):
    """Positions of the ids that belong to ``server`` (id % servers), scanning in chunks."""
    picks = []
    for start in range(0, len(ids), _SCAN_ROWS):
        chunk = np.asarray(ids[start:start + _SCAN_ROWS])
        picks.append(np.flatnonzero(np.mod(chunk, servers) == server) + start)
    return np.concatenate(picks) if picks else np.zeros(0, np.int64)


def shard_state(reader, pplan, rule, server, servers, with_stats=False):
    """The state_dict of this server's share of a distributed table (with ``stats`` when
    ``with_stats`` and the save has them)."""
    name, dim = pplan.name, pplan.width
    rows, scalars = _rule_keys(rule)
    templates = _scalar_templates(rule, (dim,))
    if name + "@ids" in reader:
        ids = _need(reader, name + "@ids", None, np.int64)
        if len(reader.shape(name + "@ids")) != 1:
            raise ConfigError(f"checkpoint {reader.dirname!r}: {name + '@ids'!r} must be a vector of ids")
        n = len(ids)
        sel = _share_of(ids, server, servers)
        state = {"ids": np.asarray(ids[sel]),
                 "values": np.asarray(_need(reader, name + "@values", (n, dim), np.float32)[sel])}
        for key in rows:
            arr = _need(reader, state_var(name, key) + "@values", (n, dim), templates[key].dtype)
            state[f"state.{key}"] = np.asarray(arr[sel])
        if with_stats and name + "@stats" in reader:
            state["stats"] = np.asarray(_need(reader, name + "@stats", (n, 4), np.float32)[sel])
    else:  # saved by local training: the whole table, row i is id i
        full = _need(reader, name, None, np.float32)
        if len(full.shape) != 2 or full.shape[1] != dim:
            raise ConfigError(f"checkpoint {reader.dirname!r}: {name!r} is saved with shape "
                              f"{list(full.shape)}; this distributed table has rows of width {dim}")
        ids = np.arange(server, full.shape[0], servers, dtype=np.int64)
        state = {"ids": ids, "values": np.asarray(full[ids])}
        for key in rows:
            arr = _need(reader, state_var(name, key), full.shape, templates[key].dtype)
            state[f"state.{key}"] = np.asarray(arr[ids])
    for key in scalars:
        var = state_var(name, key)
        want = templates[key]
        shards = var + "@shards"
        if shards in reader and reader.shape(shards)[:1] == (servers,):
            state[f"state.{key}"] = np.array(_need(reader, shards, (servers,) + want.shape, want.dtype)[server])
        else:
            state[f"state.{key}"] = np.array(_need(reader, var, want.shape, want.dtype))
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


def saved_sketch(reader, table, server, servers):
    """The admission sketch of ``table`` in the save of ``reader`` for ``server`` of
    ``servers``: its own shard's when the save was made by as many servers, else the
    elementwise maximum of the saved sketches (read one shard at a time); None when the
    save holds none.

    Raises:
        ConfigError: a saved sketch that is not uint8 [(servers,) depth, width].
    """
    one, shards = table + "@sketch", table + "@sketch@shards"
    if shards in reader:
        shape = reader.shape(shards)
        if len(shape) != 3 or reader.dtype(shards) != np.uint8:
            raise ConfigError(f"checkpoint {reader.dirname!r}: {shards!r} is {reader.dtype(shards)}{list(shape)}, "
                              f"not uint8 [servers, depth, width]; it was not written by fleet")
        saved = reader.get(shards)
        if shape[0] == servers:
            return np.array(saved[server])
        merged = np.array(saved[0])
        for i in range(1, shape[0]):
            np.maximum(merged, saved[i], out=merged)
        return merged
    if one in reader:
        shape = reader.shape(one)
        if len(shape) != 2 or reader.dtype(one) != np.uint8:
            raise ConfigError(f"checkpoint {reader.dirname!r}: {one!r} is {reader.dtype(one)}{list(shape)}, "
                              f"not uint8 [depth, width]; it was not written by fleet")
        return np.array(reader.get(one))
    return None


def load_table_sketch(table, reader, name, server, servers, base):
    """Gives ``table`` (a SparseTable) the admission sketch ``saved_sketch`` finds; when the
    save holds none, a base (``base`` true) leaves it empty and a delta keeps the sketch
    the table has (a chain takes the sketch of its last save that has one). A table
    without an entry ignores it.

    Raises:
        ConfigError: the saved sketch has another depth or width than the table's (names both).
    """
    if getattr(table, "sketch_shape", None) is None:
        return
    sketch = saved_sketch(reader, name, server, servers)
    if sketch is not None or base:
        table.load_sketch(sketch, f"checkpoint {reader.dirname!r}")


def load_server_state(ps, reader):
    """Loads values and optimizer state of everything ``ps`` holds from a checkpoint.

    Args:
        ps: a ParameterServer (its tables exist, e.g. built from the saved values).
        reader: a ``fleet.framework.io.VarsReader`` of the checkpoint.

    Raises:
        ConfigError: a variable this server needs is missing, or has another shape or
            dtype (names it and the checkpoint).
        DataError: a file of the checkpoint is damaged (names it).
    """
    servers = len(ps.plan.server_endpoints)
    index = ps.plan.server_endpoints.index(ps.endpoint)
    for name, (pplan, block, table) in ps.blocks.items():
        table.load_state_dict(_block_state(reader, pplan, block, table.rule))
    for name, (pplan, table) in ps.shards.items():
        table.load_state_dict(shard_state(reader, pplan, table.rule, index, servers, _has_stats(table)))
        load_table_sketch(table, reader, name, index, servers, base=True)
    if ps.has_lr_schedule:
        ps.lr_step = _lr_step(reader, index, servers)


def _has_stats(table):
    return bool(getattr(table, "has_statistics", False))


def apply_server_delta(ps, reader):
    """Applies a delta save (mode 1) onto what ``ps`` holds: dense and ``is_sparse``
    blocks are replaced (a delta holds them whole), each distributed table takes this
    server's share of the delta's rows (upserted with their state and statistics) and
    drops its share of the delta's tombstones (``t@deleted``).

    Args:
        ps: a ParameterServer holding the state of the save the delta follows.
        reader: a ``VarsReader`` of the delta.

    Raises:
        ConfigError / DataError: as ``load_server_state``.
    """
    servers = len(ps.plan.server_endpoints)
    index = ps.plan.server_endpoints.index(ps.endpoint)
    for name, (pplan, block, table) in ps.blocks.items():
        table.load_state_dict(_block_state(reader, pplan, block, table.rule))
    for name, (pplan, table) in ps.shards.items():
        state = shard_state(reader, pplan, table.rule, index, servers, _has_stats(table))
        table.apply_delta(state, deleted_share(reader, name, index, servers))
        load_table_sketch(table, reader, name, index, servers, base=False)
    if ps.has_lr_schedule:
        ps.lr_step = _lr_step(reader, index, servers)


def deleted_share(reader, table, server, servers):
    """The ids of ``t@deleted`` (a delta's tombstones) that belong to ``server`` (empty
    when the save has none)."""
    name = table + "@deleted"
    if name not in reader:
        return np.zeros(0, np.int64)
    ids = _need(reader, name, None, np.int64)
    return np.ascontiguousarray(np.asarray(ids)[_share_of(ids, server, servers)])


def _lr_step(reader, index, servers):
    """This server's saved learning-rate counter: its own if the checkpoint was saved
    from as many servers and it counted, else the saved worker's (or local training's)."""
    if SERVER_COUNTERS in reader and reader.shape(SERVER_COUNTERS) == (servers, 1):
        step = int(np.asarray(reader.get(SERVER_COUNTERS))[index, 0])
        if step >= 0:
            return step
    counter = _need(reader, schedules.COUNTER, (1,), np.int64)
    return int(np.asarray(counter)[0])


def initial_values(reader, plan, endpoint):
    """{param: saved whole value} (memory-mapped) of the dense and is_sparse parameters
    ``endpoint`` holds blocks of, checked against the plan's shapes."""
    needed = {p.name: p for p, _ in plan.blocks_on(endpoint) if p.kind != DISTRIBUTED}
    return {name: _need(reader, name, tuple(p.shape), np.float32) for name, p in needed.items()}


# ---------------------------------------------------------------------- reading out
class ShardCursor:
    """Reads one distributed table out in chunks of at most ``rows`` rows.

    It covers the rows the table had when the cursor was made (rows are numbered in
    creation order, so later rows come after them); each chunk is consistent in itself.
    """

    _ids = itertools.count(1)

    def __init__(self, table, rows):
        rows = int(rows)
        if rows < 1:
            raise DataError(f"a table read needs rows >= 1 per chunk; got {rows}")
        self.id = next(self._ids)
        self.table = table
        self.limit = table.size
        self.sent = 0
        self._row_keys = {"ids", "values"} | {f"state.{k}" for k in getattr(table.rule, "row_state_names", ())}
        self._chunks = table.iter_chunks(rows)

    def next_chunk(self):
        """Returns (chunk {name: array}, done)."""
        chunk = next(self._chunks, None)
        if chunk is None:  # the table shrank under us: nothing left to send
            chunk = {}
        remaining = self.limit - self.sent
        n = len(chunk.get("ids", ()))
        if n > remaining:
            chunk = {k: (v[:remaining] if k in self._row_keys else v) for k, v in chunk.items()}
            n = remaining
        self.sent += n
        return chunk, self.sent >= self.limit or not chunk


class SnapshotCursor:
    """Reads one ``TableSnapshot`` out in chunks of at most ``rows`` rows: its rows (ids,
    values, per-row state, statistics), then its tombstones (``deleted``, in slices of
    ``rows``). The first chunk also carries the scalar state as of the snapshot. A table
    with an entry sends its admission sketch of the instant first: ``sketch_shape``
    (int64 [2]: depth, width) with the first chunk, then the flattened counters in
    ``sketch`` slices of at most ``max_bytes`` (``next_chunk``), answers of their own,
    so a sketch larger than a message still goes through.

    Not thread-safe (the server's handler thread uses it).
    """

    def __init__(self, snapshot, rows):
        rows = int(rows)
        if rows < 1:
            raise DataError(f"a table read needs rows >= 1 per chunk; got {rows}")
        self.snapshot = snapshot
        self.total = int(snapshot.total)
        self.deleted = np.ascontiguousarray(snapshot.deleted, dtype=np.int64)
        self.rows = rows
        self.sent = 0
        self.deleted_sent = 0
        self._first = True
        self._rows_done = False  # the snapshot yields at least one chunk, even when empty
        self._chunks = iter(snapshot.chunks(rows))
        self.sketch = None if snapshot.sketch is None else snapshot.sketch.reshape(-1)
        self.sketch_shape = None if snapshot.sketch is None else snapshot.sketch.shape
        self.sketch_sent = 0

    @property
    def done(self):
        return self._rows_done and self.deleted_sent >= len(self.deleted)

    def next_chunk(self, max_bytes=None):
        """Returns (chunk {name: array}, done).

        Args:
            max_bytes: most bytes of the sketch per answer (None: all of it at once).
        """
        chunk = {}
        if self._first:
            chunk.update({f"state.{k}": np.asarray(v) for k, v in self.snapshot.scalars.items()})
            if self.sketch is not None:
                chunk["sketch_shape"] = np.array(self.sketch_shape, dtype=np.int64)
            self._first = False
        if self.sketch is not None and self.sketch_sent < len(self.sketch):
            step = len(self.sketch) if max_bytes is None else max(1, int(max_bytes))
            chunk["sketch"] = self.sketch[self.sketch_sent:self.sketch_sent + step]
            self.sketch_sent += len(chunk["sketch"])
            if self.sketch_sent >= len(self.sketch):
                self.sketch = self.sketch[:0]  # sent: the copy can go
                self.sketch_sent = 0
            return chunk, False
        if not self._rows_done:
            rows = next(self._chunks, None)
            if rows is None:
                raise DataError(f"the snapshot ended after {self.sent} of its {self.total} rows")
            chunk.update(rows)
            self.sent += len(rows["ids"])
            self._rows_done = self.sent >= self.total
        elif self.deleted_sent < len(self.deleted):
            part = self.deleted[self.deleted_sent:self.deleted_sent + self.rows]
            chunk["deleted"] = part
            self.deleted_sent += len(part)
        return chunk, self.done


class SaveSession:
    """The snapshots one worker's save holds open on a server, one per table, all opened
    at the same instant (``open``): read out with ``next_chunk``, then ``commit`` (each
    becomes its table's previous save) or ``close`` (nothing forgotten).

    Args:
        save_id: the save's id (from its manifest); worker: who saves; mode: 0, 1 or 2.
    """

    def __init__(self, save_id, worker, mode, cursors):
        self.save_id = save_id
        self.worker = worker
        self.mode = mode
        self.cursors = cursors  # table -> SnapshotCursor

    @classmethod
    def open(cls, save_id, worker, mode, tables, rows):
        """Opens a snapshot of each of ``tables`` ({name: SparseTable}), read in chunks of
        ``rows[name]`` rows; if one fails the others are closed again.

        Raises:
            ConfigError: a table cannot take a snapshot of this mode (e.g. mode 2 without
                statistics), as the table says.
        """
        cursors = {}
        try:
            for name, table in tables.items():
                # never wait in the server's handler thread: the snapshot open is another save's
                cursors[name] = SnapshotCursor(table.snapshot(mode, timeout=0), rows[name])
        except BaseException:
            for cursor in cursors.values():
                cursor.snapshot.close()
            raise
        return cls(save_id, worker, mode, cursors)

    def next_chunk(self, table, max_bytes=None):
        """Returns (chunk, done, total) of ``table``'s snapshot (``max_bytes``: most bytes
        of its admission sketch per chunk; None: all at once).

        Raises:
            DataError: the save holds no snapshot of ``table``.
        """
        cursor = self.cursors.get(table)
        if cursor is None:
            raise DataError(f"save {self.save_id} of worker {self.worker} holds no snapshot of table {table!r}; "
                            f"it opened {sorted(self.cursors)}")
        chunk, done = cursor.next_chunk(max_bytes)
        return chunk, done, cursor.total

    def unread(self):
        """The tables whose snapshot was not read to its end."""
        return sorted(name for name, cursor in self.cursors.items() if not cursor.done)

    def commit(self):
        """Commits every snapshot (each table forgets the changes and tombstones saved)
        and releases them.

        Raises:
            DataError: a snapshot was not read to its end (nothing is committed then).
        """
        unread = self.unread()
        if unread:
            self.close()
            raise DataError(f"save {self.save_id}: the snapshots of {unread} were not read to their end, so the "
                            f"save cannot be complete; nothing was committed (the next delta keeps every change)")
        try:
            for cursor in self.cursors.values():
                cursor.snapshot.commit()
        finally:
            self.close()

    def close(self):
        """Releases every snapshot without committing (idempotent)."""
        for cursor in self.cursors.values():
            cursor.snapshot.close()
