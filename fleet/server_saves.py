"""Writing what the servers hold into a save, from a worker (``save_persistables``,
``save_inference_model`` and checkpoints of a parameter-server job).

``write_server_params`` streams every server-held parameter into a ``VarsWriter``:
dense and ``is_sparse`` blocks through ``pull_state`` in chunks, distributed tables
through ``pull_shard`` in chunks, either from the live tables or from the snapshots a save
opened with ``table_snapshots`` (one consistent instant per server; see
``fleet.server.save_ops``). ``write_server_lr_steps`` saves each server's learning-rate
step counter. The layout of the saved variables is ``fleet.server.checkpoint``'s.

Thread-safety: call from one thread of a worker (the communicator's clients are used in
turn).
"""
import contextlib

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework.save_chain import BASE
from fleet.rules import rule_from_op_attrs
from fleet.server.checkpoint import SERVER_COUNTERS, state_var
from fleet.transpiler.plan import DISTRIBUTED


def _row_bytes(arrays_per_row, row_shape, extra=0):
    return int(np.prod(row_shape, dtype=np.int64)) * 4 * arrays_per_row + extra


def _table_row_bytes(pplan):
    """Bytes of one row of a table read from a snapshot: value, every per-row state (a
    snapshot's chunks carry them all), id and statistics."""
    rule = rule_from_op_attrs(pplan.rule_type, pplan.rule_attrs)
    return _row_bytes(1 + len(rule.row_state_names), (pplan.width,), extra=8 + 16)


def _check_base_tables(tables):
    """Mode 2 (base) selects rows by their statistics: every table must keep them.

    Raises:
        ConfigError: a table (or no table at all) without statistics (names them and the fix).
    """
    lacking = [p.name for p in tables if not p.has_statistics]
    if lacking or not tables:
        raise ConfigError(
            f"save_persistables(mode=2) saves the rows passing base_threshold, which needs statistics, but "
            f"{'distributed tables ' + str(lacking) + ' keep' if lacking else 'this job has no distributed table keeping'}"
            f" none: give each table an entry (fleet.CountFilterEntry, ...) or an accessor config "
            f"(strategy.set_sparse_table_config(table_name)), or save with mode=0")


@contextlib.contextmanager
def table_snapshots(comm, save_id, mode, tables, commit):
    """Opens a snapshot of every table of ``tables`` (ParamPlans of distributed tables) on
    every server at once, for the body to read (``write_server_params(snapshots=...)``);
    when the body ends normally (the save's directory written) they are committed if
    ``commit``, else released; when it raises they are released (nothing forgotten: the
    next delta still holds every change).

    Yields:
        {"save": save_id, "mode": mode, "stats": {table: keeps statistics}} (None
        without tables).

    Raises:
        ConfigError: mode 2 and a table without statistics.

    Blocks for a round trip to every server at each end.
    """
    tables = list(tables)
    if mode == BASE:
        _check_base_tables(tables)
    if not tables:
        yield None
        return
    rows = {p.name: comm.shard_rows(p, _table_row_bytes(p)) for p in tables}
    comm.open_snapshots(save_id, mode, rows)
    try:
        yield {"save": save_id, "mode": mode, "stats": {p.name: p.has_statistics for p in tables}}
    except BaseException:
        comm.close_snapshots(save_id, commit=False, quiet=True)
        raise
    comm.close_snapshots(save_id, commit=commit)


def write_server_params(writer, comm, params, with_state=True, snapshots=None):
    """Writes parameters held by the servers into ``writer`` (a ``VarsWriter``), whole,
    chunk by chunk (never the whole of a large table in memory).

    Dense and is_sparse parameters are written as ``p`` and ``p_<key>_0``; distributed
    tables as ``t@ids``, ``t@values``, ``t_<key>_0@values`` and, from snapshots, ``t@stats``
    (tables with statistics), ``t@deleted`` (delta saves) and the admission sketch
    ``t@sketch`` / ``t@sketch@shards`` (tables with an entry) (see
    ``fleet.server.checkpoint`` for the layout and the scalar state).

    Args:
        comm: the worker's Communicator (``pull_param_chunks``, ``pull_shard_chunks``).
        params: the ParamPlans to write.
        with_state: also the optimizer state.
        snapshots: what ``table_snapshots`` yields: read the tables from those snapshots
            (None: read the live tables, each chunk consistent in itself).

    Returns:
        {table: {"rows": n, "dim": d}} for the distributed tables written.
    """
    tables = {}
    for pplan in params:
        rule = rule_from_op_attrs(pplan.rule_type, pplan.rule_attrs)
        row_keys = tuple(rule.row_state_names) if with_state else ()
        scalar_keys = tuple(k for k in rule.state_names if k not in row_keys) if with_state else ()
        if pplan.kind == DISTRIBUTED:
            tables[pplan.name] = _write_table(writer, comm, pplan, row_keys, scalar_keys, snapshots)
        else:
            _write_param(writer, comm, pplan, row_keys, scalar_keys, with_state)
    return tables


def write_server_lr_steps(writer, comm, plan):
    """Writes ``@LR_DECAY_COUNTER@@servers`` (each server's learning-rate counter, -1
    for a server without a schedule) when the servers evaluate a schedule."""
    if plan.mode == "geo" or not plan.has_lr_schedule():
        return
    steps = comm.lr_steps()
    values = [steps[ep] if steps.get(ep) is not None else -1 for ep in plan.server_endpoints]
    writer.add(SERVER_COUNTERS, np.array(values, dtype=np.int64).reshape(-1, 1))


def _write_param(writer, comm, pplan, row_keys, scalar_keys, with_state):
    row_shape = tuple(pplan.shape[1:])
    names = {"value": pplan.name}
    names.update({f"state.{k}": state_var(pplan.name, k) for k in row_keys})
    streams, scalars = {}, {k: [] for k in scalar_keys}
    last_block = None
    for block, _, chunk in comm.pull_param_chunks(pplan, _row_bytes(1 + len(row_keys), row_shape), with_state):
        for key, name in names.items():
            rows = chunk[key]
            rows = rows.reshape((rows.shape[0],) + row_shape)
            if key not in streams:
                streams[key] = writer.open_stream(name, rows.dtype, row_shape)
            streams[key].append(rows)
        if block is not last_block:
            for key in scalar_keys:
                scalars[key].append(np.array(chunk[f"state.{key}"]))
            last_block = block
    for stream in streams.values():
        stream.close()
    for key, values in scalars.items():
        writer.add(state_var(pplan.name, key), values[0])
        if len(values) > 1:
            writer.add(state_var(pplan.name, key) + "@blocks", np.stack(values))
    if scalar_keys and len(pplan.blocks) > 1:
        writer.add(pplan.name + "@block_offsets", np.array([b.row_offset for b in pplan.blocks], np.int64))


def _write_table(writer, comm, pplan, row_keys, scalar_keys, snapshots=None):
    dim = pplan.width
    streams = {"ids": writer.open_stream(pplan.name + "@ids", np.int64, ()),
               "values": writer.open_stream(pplan.name + "@values", np.float32, (dim,))}
    for key in row_keys:
        streams[f"state.{key}"] = writer.open_stream(state_var(pplan.name, key) + "@values", np.float32, (dim,))
    deleted = None
    if snapshots is not None:
        if snapshots["stats"].get(pplan.name):
            streams["stats"] = writer.open_stream(pplan.name + "@stats", np.float32, (4,))
        if snapshots.get("mode", 0) == 1:
            deleted = writer.open_stream(pplan.name + "@deleted", np.int64, ())
    scalars = {k: [] for k in scalar_keys}
    seen = set()
    sketches, sketch, filled = None, None, 0  # the sketch stream; the one being received
    save = None if snapshots is None else snapshots["save"]
    row_bytes = _table_row_bytes(pplan) if save else _row_bytes(1 + len(row_keys), (dim,), extra=8)
    for server, chunk in comm.pull_shard_chunks(pplan, row_bytes, save=save):
        if server not in seen:
            seen.add(server)
            for key in scalar_keys:
                scalars[key].append(np.array(chunk[f"state.{key}"]))
        if "sketch_shape" in chunk:
            shape = tuple(int(x) for x in chunk["sketch_shape"])
            sketch, filled = np.empty(shape, np.uint8), 0
        if "sketch" in chunk:
            part = np.asarray(chunk["sketch"], dtype=np.uint8)
            if sketch is None or filled + len(part) > sketch.size:
                raise DataError(f"server {server} sent admission sketch counters of table {pplan.name!r} beyond "
                                f"the sketch's shape it announced")
            sketch.reshape(-1)[filled:filled + len(part)] = part
            filled += len(part)
            if filled == sketch.size:
                sketches = _write_sketch(writer, pplan.name, sketch, len(comm.endpoints), sketches)
                sketch = None
        if "deleted" in chunk:
            if deleted is None:
                raise DataError(f"server {server} sent tombstones of table {pplan.name!r} in a save of another "
                                f"mode than delta")
            deleted.append(chunk["deleted"])
        if "ids" not in chunk:
            continue
        for key, stream in streams.items():
            stream.append(chunk[key])
    if sketch is not None:
        raise DataError(f"the admission sketch of table {pplan.name!r} ended after {filled} of its {sketch.size} "
                        f"counters")
    for stream in list(streams.values()) + [s for s in (deleted, sketches) if s is not None]:
        stream.close()
    for key, values in scalars.items():
        writer.add(state_var(pplan.name, key), values[0])
        writer.add(state_var(pplan.name, key) + "@shards", np.stack(values))
    return {"rows": streams["ids"].rows, "dim": dim,
            **({"deleted": deleted.rows} if deleted is not None else {})}


def _write_sketch(writer, table, sketch, servers, stream):
    """Writes one server's admission sketch of ``table`` (uint8 [depth, width]): as
    ``t@sketch`` for a job of one server, else appended to ``t@sketch@shards`` ([servers,
    depth, width], server order; ``stream`` is that stream once opened). Returns the stream."""
    sketch = np.ascontiguousarray(sketch, dtype=np.uint8)
    if servers == 1:
        writer.add(table + "@sketch", sketch)
        return None
    if stream is None:
        stream = writer.open_stream(table + "@sketch@shards", np.uint8, sketch.shape)
    stream.append(sketch[None])
    return stream
