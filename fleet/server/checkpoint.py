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


def _shard_state(reader, pplan, rule, server, servers):
    """The state_dict of this server's share of a distributed table."""
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
        table.load_state_dict(_shard_state(reader, pplan, table.rule, index, servers))
    if ps.has_lr_schedule:
        ps.lr_step = _lr_step(reader, index, servers)


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
