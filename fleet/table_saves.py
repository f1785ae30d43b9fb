"""Saving and loading the sparse tables of local training, as a parameter-server job
saves its distributed tables (same names, so the saves load into each other).

A local table ``t`` (``fleet.local_tables.local_tables()``: {name: SparseTable}) is saved from
a snapshot as ``t@ids``, ``t@values``, ``t_<key>_0@values`` per row state, ``t_<key>_0``
per scalar state, ``t@stats`` when it keeps statistics, ``t@sketch`` (its admission
sketch as of the snapshot) when it has an entry, and ``t@deleted`` in a delta save (see
``fleet.server.checkpoint`` for the layout). Loading a chain loads the base into each
table, then applies every delta in order; the sketch is the last one the chain holds (the
elementwise maximum of the servers' sketches for a save of a distributed job).

Thread-safety: call from the thread that trains (the tables themselves are locked).
"""
import contextlib
import types

import numpy as np

from fleet.errors import ConfigError
from fleet.framework import io as fio
from fleet.framework.save_chain import BASE, DELTA
from fleet.server.checkpoint import deleted_share, load_table_sketch, shard_state, state_var

_CHUNK_ROWS = 1 << 16


def program_tables(program):
    """{name: SparseTable} of ``program``'s local tables (``fleet.local_tables``: its
    distributed tables with an entry or accessor), created (empty) if no lookup made them
    yet, so that a save holds every table and a load has every table to fill."""
    from fleet.local_tables import local_tables

    return local_tables(program)


def table_var_names(tables):
    """The program variables a save takes from the local tables instead of the scope:
    each table and its optimizer state (``t``, ``t_<key>_0``)."""
    names = set(tables)
    for name, table in tables.items():
        names.update(state_var(name, key) for key in table.rule.state_names)
    return names


@contextlib.contextmanager
def open_local_snapshots(tables, mode, commit):
    """Opens a snapshot of each table of ``tables`` ({name: SparseTable}) in ``mode``;
    when the body ends normally (the directory written) they are committed if ``commit``
    and released; when it raises they are released only (nothing forgotten).

    Yields:
        {name: (table, TableSnapshot)}.

    Raises:
        ConfigError: mode 2 and a table without statistics (or no table).
    """
    lacking = sorted(name for name, t in tables.items() if not t.has_statistics)
    if mode == BASE and (lacking or not tables):
        raise ConfigError(
            f"save_persistables(mode=2) saves the rows passing base_threshold, which needs statistics, but "
            f"{'tables ' + str(lacking) + ' keep' if lacking else 'local training has no sparse table keeping'} "
            f"none: give each table an entry (fleet.CountFilterEntry, ...) or an accessor config "
            f"(strategy.set_sparse_table_config(table_name)), or save with mode=0")
    snaps = {}
    try:
        for name, table in tables.items():
            snaps[name] = (table, table.snapshot(mode))
        yield snaps
    except BaseException:
        for _, snap in snaps.values():
            snap.close()
        raise
    try:
        if commit:
            for _, snap in snaps.values():
                snap.commit()
    finally:
        for _, snap in snaps.values():
            snap.close()


def write_local_tables(writer, snapshots, mode):
    """Writes each snapshot of ``snapshots`` (from ``open_local_snapshots``, of save mode
    ``mode``) into ``writer`` chunk by chunk.

    Returns:
        {table: {"rows": n, "dim": d[, "deleted": m]}} for the manifest.
    """
    out = {}
    for name, (table, snap) in sorted(snapshots.items()):
        row_keys = tuple(getattr(table.rule, "row_state_names", ()))
        streams = {"ids": writer.open_stream(name + "@ids", np.int64, ()),
                   "values": writer.open_stream(name + "@values", np.float32, (table.dim,))}
        for key in row_keys:
            streams[f"state.{key}"] = writer.open_stream(state_var(name, key) + "@values", np.float32,
                                                         (table.dim,))
        if getattr(table, "has_statistics", False):
            streams["stats"] = writer.open_stream(name + "@stats", np.float32, (4,))
        for chunk in snap.chunks(_CHUNK_ROWS):
            if len(chunk["ids"]):
                for key, stream in streams.items():
                    stream.append(chunk[key])
        for stream in streams.values():
            stream.close()
        for key, value in snap.scalars.items():
            writer.add(state_var(name, key), np.asarray(value))
        if snap.sketch is not None:
            writer.add(name + "@sketch", snap.sketch)
        out[name] = {"rows": streams["ids"].rows, "dim": table.dim}
        if mode == DELTA:
            writer.add(name + "@deleted", np.ascontiguousarray(snap.deleted, dtype=np.int64))
            out[name]["deleted"] = len(snap.deleted)
    return out


def load_local_tables(chain, tables):
    """Loads the chain of saves ``chain`` (directories, base first: ``resolve_chain``)
    into ``tables`` ({name: SparseTable}): the base's rows, optimizer state and
    statistics, then each delta's rows upserted and its tombstones deleted.

    Returns:
        The table names loaded.

    Raises:
        ConfigError: a table is not in the save, or has another width (names it).
        DataError: a damaged file.
    """
    for i, dirname in enumerate(chain):
        reader = fio.VarsReader(dirname)
        if i == 0:
            for name, table in tables.items():
                table.load_state_dict(_state(reader, name, table))
                load_table_sketch(table, reader, name, 0, 1, base=True)
        else:
            apply_local_delta(reader, tables)
    return sorted(tables)


def apply_local_delta(reader, tables):
    """Applies the delta save of ``reader`` (a ``VarsReader``) onto ``tables``: its rows
    upserted with their state and statistics, its tombstones deleted.

    Raises:
        ConfigError: a table is not in the save, or has another width (names it).
    """
    for name, table in tables.items():
        table.apply_delta(_state(reader, name, table), deleted_share(reader, name, 0, 1))
        load_table_sketch(table, reader, name, 0, 1, base=False)


def _state(reader, name, table):
    pplan = types.SimpleNamespace(name=name, width=table.dim)
    return shard_state(reader, pplan, table.rule, 0, 1, table.has_statistics)
