"""The save and load ops of a parameter server: checkpoints, snapshots, load_model.

``SaveOps`` is the mixin of ``ParameterServer`` (``fleet.server.parameter_server``) that
holds what a server does for saves and loads (``fleet.server.checkpoint`` has the formats):

- ``pull_state`` answers rows of dense blocks with their optimizer state;
- a save of distributed tables sends ``open_snapshot`` (one point-in-time snapshot of every
  table of this server, opened in one handler call, so at the same instant), reads each with
  ``pull_shard`` chunk by chunk, and ends with ``close_snapshot`` (``commit`` true once the
  save's directory is written: each table forgets the changes and tombstones it saved; false,
  or a worker lost or stopped first: the snapshots are released and nothing is forgotten);
  ``pull_shard`` without a save reads a live table chunk by chunk;
- ``load`` restores this server's share of a save, then applies each delta of its chain;
  ``load_model`` does that while the server serves (Paddle 2.x's ``fleet.load_model``).

The mixin uses the server's ``blocks``, ``shards``, ``endpoint``, ``_dense``, ``_shard``,
and keeps ``_saves`` (worker -> open SaveSession), ``_cursors`` and ``loaded``.

Thread-safety: one thread (the server's handler) calls everything here.
"""
import logging
import os

from fleet.errors import DataError
from fleet.framework import io as fio
from fleet.framework.save_chain import check_next_delta, resolve_chain
from fleet.server.checkpoint import SaveSession, ShardCursor, apply_server_delta, load_server_state

log = logging.getLogger("fleet.server")


class SaveOps:
    """The save and load half of ``ParameterServer`` (see the module docstring)."""

    def state(self):
        """Returns {block or table name: state_dict} of everything this server holds."""
        out = {name: entry[2].state_dict() for name, entry in self.blocks.items()}
        out.update({name: entry[1].state_dict() for name, entry in self.shards.items()})
        return out

    def load(self, reader, deltas=()):
        """Loads values and optimizer state of every block and table from a checkpoint
        (a ``fleet.framework.io.VarsReader``), then applies each delta save of ``deltas``
        (readers, in chain order); see ``fleet.server.checkpoint``."""
        load_server_state(self, reader)
        for delta in deltas:
            apply_server_delta(self, delta)
            reader = delta
        self._loaded_from(reader)

    def load_delta(self, reader):
        """Applies the delta save of ``reader`` onto what this server holds (its link is
        the caller's to check: ``check_next_delta``)."""
        apply_server_delta(self, reader)
        self._loaded_from(reader)

    def _loaded_from(self, reader):
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

    def _op_open_snapshot(self, req):
        """Opens a snapshot of each distributed table of meta ``tables`` ({name: most rows
        per chunk}) for the save meta ``save`` (its id) of meta ``mode`` (0 all rows, 1
        delta, 2 base). A save of this worker still open is closed first, without commit.
        Answers meta ``totals`` ({table: rows}), ``deleted`` ({table: tombstones}) and
        ``stats`` ({table: whether it keeps statistics}).
        """
        save_id, mode, tables = req.meta.get("save"), req.meta.get("mode"), req.meta.get("tables")
        if not isinstance(save_id, str) or not save_id:
            raise DataError(f"open_snapshot needs meta 'save' (the save's id); got {save_id!r}")
        if mode not in (0, 1, 2) or isinstance(mode, bool):
            raise DataError(f"open_snapshot meta 'mode' must be 0, 1 or 2; got {mode!r}")
        if not isinstance(tables, dict) or not all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in tables.values()):
            raise DataError(f"open_snapshot needs meta 'tables': {{table name: rows per chunk >= 1}}; got {tables!r}")
        chosen = {name: self._shard(name)[1] for name in tables}
        self._close_save(req.worker, "it began another save")
        session = SaveSession.open(save_id, req.worker, mode, chosen, tables)
        self._saves[req.worker] = session
        req.reply(meta={"totals": {n: c.total for n, c in session.cursors.items()},
                        "deleted": {n: len(c.deleted) for n, c in session.cursors.items()},
                        "stats": {n: bool(getattr(t, "has_statistics", False)) for n, t in chosen.items()}})

    def _op_close_snapshot(self, req):
        """Ends the save meta ``save`` of this worker: with meta ``commit`` true every
        snapshot is committed (its rows and tombstones become the tables' previous save;
        refused unless every snapshot was read to its end), else released. Closing a
        save that is not open (already closed, e.g. when it failed) is a no-op; committing
        one is an error."""
        save_id, commit = req.meta.get("save"), bool(req.meta.get("commit", False))
        session = self._saves.get(req.worker)
        if session is None or session.save_id != save_id:
            if commit:
                raise DataError(f"save {save_id!r} of worker {req.worker} has no snapshots open on this server "
                                f"(closed when the worker began another save, stopped or was lost); nothing "
                                f"was committed, so the next delta keeps every change")
            req.reply(meta={"committed": False})
            return
        del self._saves[req.worker]
        if commit:
            session.commit()
        else:
            session.close()
        req.reply(meta={"committed": commit})

    def _refuse_while_saving(self, what):
        """Tables wait for open snapshots; this thread must not, or the save holding them
        could never be read to its end.

        Raises:
            DataError: a save is open (names it and its worker).
        """
        if self._saves:
            worker, session = next(iter(self._saves.items()))
            raise DataError(f"{what} refused: save {session.save_id} of worker {worker} holds snapshots of this "
                            f"server's tables; {what} after that save has ended (save and {what} from the same "
                            f"worker, or separate them with fleet.barrier_worker())")

    def _op_load_model(self, req):
        """Loads a save into this server's blocks and tables while it serves (Paddle 2.x's
        ``fleet.load_model``): meta ``dirname`` (a directory every server can read) and
        ``mode``: 0 the save (a delta: its chain, base first) replaces what the server
        holds; 1 the delta at ``dirname`` is applied onto it, which must follow the save
        this server loaded last. Answers meta as ``checkpoint_info``.

        Raises:
            ConfigError: a link of the chain is missing or out of order, or a mode-1 load
                of a save that is not the next delta (names both saves).
        """
        dirname, mode = req.meta.get("dirname"), req.meta.get("mode")
        if not isinstance(dirname, str) or not dirname or mode not in (0, 1) or isinstance(mode, bool):
            raise DataError(f"load_model needs meta 'dirname' (a str) and 'mode' (0 or 1); got {dirname!r}, {mode!r}")
        self._refuse_while_saving("load_model")
        if mode == 0:
            dirs = resolve_chain(dirname)
            self.load(fio.VarsReader(dirs[0]), [fio.VarsReader(d) for d in dirs[1:]])
        else:
            reader = fio.VarsReader(dirname)
            check_next_delta(reader, self.loaded, f"server {self.endpoint}")
            self.load_delta(reader)
        log.info("server %s: loaded %s (mode %d)", self.endpoint, dirname, mode)
        req.reply(meta=dict(self.loaded))

    def _close_save(self, worker, why):
        session = self._saves.pop(worker, None)
        if session is not None:
            log.info("server %s: the snapshots of save %s of worker %d are closed without commit: %s",
                     self.endpoint, session.save_id, worker, why)
            session.close()

    def _op_pull_shard(self, req):
        """The next chunk of this server's share of a distributed table, for saving.

        With meta ``save`` (a save opened by ``open_snapshot``): meta ``table``; the next
        chunk of that table's snapshot, whose first chunk also carries the scalar state,
        whose first chunks carry a table's admission sketch (``sketch_shape``, then
        ``sketch`` slices of at most meta ``bytes``, when given) and whose last chunks
        carry the tombstones (``deleted``). Without it (a read of
        the live table, each chunk consistent in itself): meta ``rows`` (most rows per
        chunk) and ``cursor`` (absent to start a read; then the ``cursor`` of the previous
        answer); a new read by the same worker of the same table drops an unfinished one.
        The answer holds ``ids``, ``values``, ``state.<key>`` (and ``stats``) arrays and
        meta ``cursor``, ``done``, ``total``.
        """
        name = req.meta.get("table")
        _, table = self._shard(name)
        if "save" in req.meta:
            session = self._saves.get(req.worker)
            if session is None or session.save_id != req.meta["save"]:
                raise DataError(f"save {req.meta['save']!r} of worker {req.worker} has no snapshots open on "
                                f"this server; open them with open_snapshot first")
            max_bytes = req.meta.get("bytes")
            if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
                                          or max_bytes < 1):
                raise DataError(f"pull_shard meta 'bytes' must be an int >= 1 (most bytes of the admission "
                                f"sketch per answer); got {max_bytes!r}")
            chunk, done, total = session.next_chunk(name, max_bytes)
            req.reply(names=list(chunk), arrays=list(chunk.values()),
                      meta={"cursor": None, "done": done, "total": total})
            return
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
