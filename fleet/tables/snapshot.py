"""Point-in-time snapshots of a sparse table for saves, taken while training goes on.

``SparseTable.snapshot(mode)`` returns a ``TableSnapshot``: the rows, optimizer state
and statistics of one instant (the call), read in chunks while pushes keep landing.
Copy-on-write: opening a snapshot copies no row (it records the row count, scalar
state and the delta bookkeeping, and copies the admission sketch of a table with an
entry: depth x width bytes, 16 MiB by default, so a save holds the candidates' counts of
the same instant); the table's lock is then held per chunk read and per push, never for
a copy of the rows. A write to a row the snapshot will read but has not read
yet first copies that row's old value, states and statistics aside (``_PreservedRows``),
and the snapshot reads the copy. Rows created after the instant are not in it. So every
row of a snapshot is the row of that instant, and values, every state and statistics
cover the same ids.

Modes (Paddle's save modes): 0 every row; 1 delta: the rows changed (created, pushed,
added, statistics updated) since the table's previous committed snapshot, plus
``deleted``, the ids deleted (shrink) since then; 2 base: rows with score >=
base_threshold and unseen_days <= delta_keep_days. Before the first committed snapshot,
after a shrink (which changes every row's statistics) and once more than a quarter of a
large table changed (``DELTA_LIST_ROWS``), a delta holds every row.
Modes 1 and 2 write delta_score as 0, the value ``commit`` leaves in the table (Paddle
resets it after such a save), so a base followed by its deltas reloads the table exactly.

One snapshot per table is open at a time; ``snapshot``, ``shrink``, ``load_state_dict``
and ``apply_delta`` wait (bounded) for it to close.
"""
import itertools
import time

import numpy as np

from fleet.errors import ConfigError, FleetTimeoutError
from fleet.kernels.hashtable import HashIndex
from fleet.kernels.reserved_array import ReservedArray
from fleet.kernels.row_stats import DELTA_SCORE, STAT_COLUMNS, base_rows
from fleet.tables.changes import ChangeTracker, DeletedIds
from fleet.tables.table_state import as_ids, check_shape

SNAPSHOT_WAIT_SECONDS = 600.0
"""How long shrink, load and a second snapshot wait for an open snapshot to close."""
DELTA_LIST_ROWS = 1 << 20
"""Past this many changed rows and a quarter of the table, the changed-row list (8 bytes per
row) is dropped and the next delta holds every row: it would be a large share anyway."""
_COMMIT_ROWS = 1 << 20
_serial = itertools.count(1)


class SnapshotMixin:
    """``snapshot`` and ``apply_delta`` of ``SparseTable`` (which see)."""

    def snapshot(self, mode=0, timeout=None):
        """Returns a point-in-time ``TableSnapshot`` of the table (see this module). Thread-safe.

        Blocks only while another snapshot of this table is open (bounded), and for mode 2
        while it selects the base rows (one pass, the lock held per chunk).

        Args:
            mode: 0 every row, 1 delta, 2 base (needs statistics).
            timeout: seconds to wait for an open snapshot (None: ``SNAPSHOT_WAIT_SECONDS``).

        Raises:
            ConfigError: a mode other than 0, 1, 2; mode 2 without statistics.
            FleetTimeoutError: the open snapshot did not close in time.
        """
        if mode not in (0, 1, 2):
            raise ConfigError(f"sparse table {self.name!r}: snapshot mode {mode!r} is not 0 (all), 1 (delta) "
                              f"or 2 (base)")
        if mode == 2:
            self._need_statistics("base snapshot (mode 2)")
        with self._lock:
            self._wait_for_snapshot(f"snapshot(mode={mode})", timeout)
            self._start_delta_tracking(reset=False)
            snap = TableSnapshot(self, mode)
            self._snapshot = snap
        if mode == 2:
            try:
                snap._select_base_rows()
            except BaseException:
                snap.close()
                raise
        return snap

    def apply_delta(self, state, deleted=None):
        """Applies a delta save: deletes the ``deleted`` ids, then upserts the rows of ``state``.

        ``state`` is shaped like ``state_dict()`` ("ids", "values", "state.<k>" per row,
        optional "stats" and scalar "state.<k>" that replace the table's). Ids may be any
        subset (one server's share). The result counts as the previous save of the next
        delta. Waits (bounded) for an open snapshot. Thread-safe.

        Raises:
            ConfigError: a key is missing or a shape or dtype does not fit.
            FleetTimeoutError: an open snapshot did not close in time.
        """
        ids, values, rows_in, stats = self._checked_rows(state)
        n = len(ids)
        scalars_in = {key: np.asarray(state[f"state.{key}"]) for key in self._scalar_state if f"state.{key}" in state}
        for key, arr in scalars_in.items():
            check_shape(arr, self._scalar_state[key].shape, self._scalar_state[key].dtype, f"state.{key}", self.name)
        deleted = as_ids(np.empty(0, np.int64) if deleted is None else deleted, self.name)
        with self._lock:
            self._wait_for_snapshot("apply_delta", None)
            rows = self._index.lookup(deleted)
            rows = rows[rows >= 0]
            if len(rows):
                keep = np.ones(self._index.size, dtype=np.bool_)
                keep[rows] = False
                self._compact(keep, record=False)
            if n:
                rows = self._rows(ids)
                self._values[rows] = values
                for key, arr in rows_in.items():
                    self._row_state[key][rows] = arr
                if stats is not None:
                    self._stats[rows] = stats
            for key, arr in scalars_in.items():
                self._scalar_state[key] = np.array(arr, copy=True)
            if self._changes is not None:
                self._changes.clear()
            self._start_delta_tracking(reset=True)

    # ---------------------------------------------------------------------- private

    def _start_delta_tracking(self, reset):
        """Starts tracking rows changed since the last save (reset: the table is a save now)."""
        if reset or self._delta is None:
            self._delta = ChangeTracker(1, max(self._index.size, 16))
            self._deleted = DeletedIds()
        if reset:
            self._all_changed = False

    def _mark_delta(self, rows):
        """Marks ``rows`` changed for the next delta (caller holds the lock; tracking is on)."""
        self._delta.mark(rows)
        if len(self._delta.pending(0)) > max(DELTA_LIST_ROWS, self._index.size >> 2):
            self._delta = ChangeTracker(1, max(self._index.size, 16))
            self._all_changed = True

    def _wait_for_snapshot(self, what, timeout):
        """Waits until no snapshot is open. Caller holds the lock (released while waiting)."""
        if self._snapshot is None:
            return
        limit = SNAPSHOT_WAIT_SECONDS if timeout is None else float(timeout)
        if not self._idle.wait_for(lambda: self._snapshot is None, timeout=limit):
            raise FleetTimeoutError(
                f"sparse table {self.name!r}: {what} waited {limit:g} s for {self._snapshot!r} to close; "
                f"whoever took it must call commit() or close() on it"
            )

    def _extra_memory_bytes(self, size):
        """memory_bytes() beyond values, states, index and GEO tracking. Caller holds the lock."""
        total = 0
        if self._stats_store is not None:
            total += self._stats_store.memory_bytes(size) + self._unique_bits.memory_bytes(size // 8 + 1)
        if self._admission is not None:
            total += self._admission.memory_bytes()
        if self._delta is not None:
            total += self._delta.memory_bytes() + self._deleted.memory_bytes()
        if self._snapshot is not None:
            total += self._snapshot._memory_bytes()
        return total


class TableSnapshot:
    """A point-in-time copy of one sparse table, read in chunks (see ``fleet.tables.snapshot``).

    Thread-safe (each call takes the table's lock briefly); meant for one reader. Use as
    a context manager, or call ``commit()`` after a save succeeded and ``close()`` in
    any case (``close`` after ``commit`` does nothing).

    Attributes:
        mode: 0, 1 or 2. total: rows ``chunks`` yields. scalars: {state key: array} of
        the instant. deleted: int64 ids deleted since the previous save (mode 1; else empty).
        sketch: uint8 [depth, width] copy of the admission sketch of the instant (every
        mode), or None for a table without an entry.
    """

    def __init__(self, table, mode):
        # the caller holds the table's lock
        self.table, self.mode = table, mode
        self.serial = next(_serial)
        self.opened = time.time()
        self._n0 = table._index.size
        self.scalars = {key: np.array(arr, copy=True) for key, arr in table._scalar_state.items()}
        # the admission sketch of the instant (a copy: depth x width bytes, 16 MiB by default)
        self.sketch = table._admission.state_dict()["sketch"] if table._admission is not None else None
        # hand the delta bookkeeping over: the table tracks changes after this instant afresh
        self._changed, table._delta = table._delta, ChangeTracker(1, max(self._n0, 16))
        self._all, table._all_changed = table._all_changed, False
        self._tombstones = table._deleted.take()
        self.deleted = self._tombstones if mode == 1 else np.empty(0, dtype=np.int64)
        self._rows = None  # sorted rows to read (None: rows 0 .. n0-1)
        if mode == 1 and not self._all:
            self._rows = np.sort(self._changed.pending(0))
        self.total = self._n0 if self._rows is None else len(self._rows)
        self._cursor = 0   # rows below it are read: later writes to them need no copy
        self._read = 0     # rows yielded so far
        self._done = False
        self._all_preserved = False  # every row still to read is preserved already
        self._reading = False
        self._status = "open"
        self._preserved = _PreservedRows(table)

    def chunks(self, rows=1 << 16):
        """Yields dicts {"ids", "values", "state.<k>" per-row states, "stats" (with statistics)}.

        Rows come in row order, ``rows`` at a time; at least one (possibly empty) chunk.
        One pass per snapshot.

        Raises:
            ConfigError: rows < 1, the snapshot is closed, or chunks() was already called.
        """
        rows = int(rows)
        if rows < 1:
            raise ConfigError(f"{self!r}: chunks(rows={rows}) needs rows >= 1")
        table = self.table
        with table._lock:
            self._check_open("chunks")
            if self._reading:
                raise ConfigError(f"{self!r}: chunks() was already called; a snapshot is read once")
            self._reading = True
        while True:
            with table._lock:
                self._check_open("chunks")
                start, stop = self._read, min(self._read + rows, self.total)
                if self._rows is None:
                    chunk = self._copy_rows(np.arange(start, stop, dtype=np.int64), slice(start, stop))
                    self._cursor = stop
                else:
                    sel = self._rows[start:stop]
                    chunk = self._copy_rows(sel, sel)
                    self._cursor = self._rows[stop] if stop < self.total else self._n0
                self._read = stop
                if stop >= self.total:
                    self._done = True
                    self._preserved = _PreservedRows(table)  # nothing more to preserve: free the copies
            if self.mode in (1, 2) and "stats" in chunk:
                chunk["stats"][:, DELTA_SCORE] = 0.0  # as commit() leaves it
            yield chunk
            if self._done:
                return

    def commit(self):
        """Makes this snapshot the table's previous save, and closes it.

        Forgets the changed rows and tombstones as of the snapshot's instant (changes
        made since stay for the next delta); for modes 1 and 2 sets delta_score of the
        rows saved to 0 (Paddle's update after save).

        Raises:
            ConfigError: the snapshot is closed, or not every chunk was read.
        """
        table = self.table
        with table._lock:
            self._check_open("commit")
            if not self._done:
                raise ConfigError(f"{self!r}: commit() before every chunk was read; read chunks() to the end first")
        if self.mode in (1, 2) and table.has_statistics:
            for start in range(0, self.total, _COMMIT_ROWS):
                stop = min(start + _COMMIT_ROWS, self.total)
                with table._lock:
                    if self._rows is None:
                        table._stats[start:stop, DELTA_SCORE] = 0.0
                    else:
                        table._stats[self._rows[start:stop], DELTA_SCORE] = 0.0
        with table._lock:
            self._release("committed")

    def close(self):
        """Releases the snapshot; without a commit the table forgets nothing. Idempotent."""
        table = self.table
        with table._lock:
            if self._status != "open":
                return
            if self._all:
                table._all_changed = True
            else:
                table._mark_delta(self._changed.pending(0))
            table._deleted.append(self._tombstones)
            self._release("closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        opened = time.strftime("%H:%M:%S", time.localtime(self.opened))
        return (f"TableSnapshot #{self.serial} of table {self.table.name!r} (mode {self.mode}, opened {opened}, "
                f"{self._read} of {self.total} rows read, {self._status})")

    # ---------------------------------------------------------------------- private

    def _check_open(self, what):
        if self._status != "open":
            raise ConfigError(f"{self!r}: {what}() on a snapshot that is {self._status}; take a new snapshot")

    def _release(self, status):
        # the caller holds the table's lock
        self._status = status
        self.sketch = None
        self._preserved = None
        self._changed = None
        if self.table._snapshot is self:
            self.table._snapshot = None
            self.table._idle.notify_all()

    def _preserve(self, rows):
        """Copies aside the rows among ``rows`` the snapshot has yet to read. Caller holds the lock."""
        if self._done or self._all_preserved or not len(rows):
            return
        rows = rows[(rows >= self._cursor) & (rows < self._n0)]
        if self._rows is not None and len(rows):
            at = np.minimum(np.searchsorted(self._rows, rows), max(len(self._rows) - 1, 0))
            rows = rows[self._rows[at] == rows] if len(self._rows) else rows[:0]
        if len(rows):
            self._preserved.keep(np.ascontiguousarray(rows))

    def _preserve_all(self):
        """Copies aside every row the snapshot has yet to read (for a push that writes every row), once."""
        if self._done or self._all_preserved:
            return
        rows = np.arange(self._cursor, self._n0, dtype=np.int64) if self._rows is None else self._rows[self._read:]
        if len(rows):
            self._preserved.keep(np.ascontiguousarray(rows))
        self._all_preserved = True

    def _copy_rows(self, rows, index):
        """The chunk of ``rows`` (``index``: a slice or the same rows) as of the instant. Caller holds the lock."""
        table = self.table
        chunk = {"ids": table._index.row_ids[index].copy(), "values": table._values[index].copy()}
        for key, arr in table._row_state.items():
            chunk[f"state.{key}"] = arr[index].copy()
        if table.has_statistics:
            chunk["stats"] = table._stats[index].copy()
        self._preserved.overlay(rows, chunk)
        return chunk

    def _select_base_rows(self):
        """Mode 2: the rows passing the base rule as of the instant (one pass, lock per chunk)."""
        table, a = self.table, self.table.accessor
        selected = []
        for start in range(0, self._n0, _COMMIT_ROWS):
            stop = min(start + _COMMIT_ROWS, self._n0)
            with table._lock:
                self._check_open("snapshot")
                rows = np.arange(start, stop, dtype=np.int64)
                stats = table._stats[start:stop].copy()
                self._preserved.overlay(rows, {"stats": stats})
            out = np.empty(stop - start, dtype=np.int64)
            count = base_rows(stats, 0, stop - start, a.nonclk_coeff, a.click_coeff, a.base_threshold,
                              a.delta_keep_days, out)
            selected.append(out[:count] + start)
        with table._lock:
            self._rows = np.concatenate(selected) if selected else np.empty(0, dtype=np.int64)
            self.total = len(self._rows)

    def _memory_bytes(self):
        total = self._tombstones.nbytes + (0 if self._preserved is None else self._preserved.memory_bytes())
        if self.sketch is not None:
            total += self.sketch.nbytes
        if self._rows is not None:
            total += self._rows.nbytes
        if self._changed is not None:
            total += self._changed.memory_bytes()
        return total


class _PreservedRows:
    """Old content of rows written while a snapshot is open and before it read them.

    Not thread-safe (called under the table's lock). A hash index maps row -> slot;
    values, states and statistics of the slots grow in ``ReservedArray`` s.
    """

    def __init__(self, table):
        self._table = table
        self._index = HashIndex(16)
        self._values = ReservedArray((table.dim,), np.float32, 16)
        self._states = {key: ReservedArray((table.dim,), row.dtype, 16) for key, row in table._row_template.items()}
        self._stats = ReservedArray((STAT_COLUMNS,), np.float32, 16) if table.has_statistics else None

    def keep(self, rows):
        """Copies the current content of ``rows`` not kept yet."""
        before = self._index.size
        self._index.lookup_or_insert(rows)
        after = self._index.size
        if after == before:
            return
        new = self._index.ids[before:after]
        table = self._table
        self._values.ensure(after, before)[before:after] = table._values[new]
        for key, store in self._states.items():
            store.ensure(after, before)[before:after] = table._row_state[key][new]
        if self._stats is not None:
            self._stats.ensure(after, before)[before:after] = table._stats[new]

    def overlay(self, rows, chunk):
        """Replaces, in ``chunk`` (arrays aligned with ``rows``), the rows kept here by their old content."""
        if self._index.size == 0 or not len(rows):
            return
        slots = self._index.lookup(rows)
        at = np.flatnonzero(slots >= 0)
        if not len(at):
            return
        slots = slots[at]
        if "values" in chunk:
            chunk["values"][at] = self._values.array[slots]
            for key, store in self._states.items():
                chunk[f"state.{key}"][at] = store.array[slots]
        if self._stats is not None and "stats" in chunk:
            chunk["stats"][at] = self._stats.array[slots]

    def memory_bytes(self):
        size = self._index.size
        total = self._index.memory_bytes() + self._values.memory_bytes(size)
        total += sum(store.memory_bytes(size) for store in self._states.values())
        return total + (0 if self._stats is None else self._stats.memory_bytes(size))
