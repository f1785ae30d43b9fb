"""A server's sparse table: int64 id -> float32 row of width ``dim``, created on first use.

Rows live in one float32 [capacity, dim] array indexed by row number (the hash index of
``fleet.kernels.hashtable`` maps ids to rows); per-row optimizer state lives in parallel
arrays indexed by the same row, scalar state (Adam's beta powers) beside them.

Growth never stalls the table: once past a few MiB every per-row array is a
``ReservedArray`` (address space for as many rows as the machine could hold, memory
taken only as rows are written), so new rows are appended in place and never copied,
and the hash index grows its slot array incrementally (see ``HashIndex``). No call pays
work proportional to the table's size, only to its own batch.

A new row's initial value depends only on (seed, id), so a run gives the same table
whatever order ids arrive in, and whatever path its growth took.

Memory per row (SGD, dim 10): 40 bytes of values + 8 of id + 15-23 of hash slots between
growths, up to 36 while the index holds a second slot array; a table growing to 100M rows
stays under 8 GiB throughout.

With an entry (``fleet.entries``) or a CTR accessor config the table also keeps
statistics per row (show, click, unseen_days, delta_score: 16 bytes) and, with an
entry, admits new ids only through ``pull_train`` (``fleet.tables.statistics``);
``snapshot`` gives point-in-time copies for saves while training goes on
(``fleet.tables.snapshot``).
"""
import threading

import numpy as np

from fleet.entries import DEFAULT_SKETCH_WIDTH, AdmissionFilter, CtrAccessorConfig
from fleet.errors import ConfigError, DataError
from fleet.kernels import sparse
from fleet.kernels.hashtable import HashIndex, fill_rows, init_rows, take_rows
from fleet.kernels.reserved_array import ReservedArray
from fleet.kernels.row_stats import STAT_COLUMNS, rows_unique
from fleet.rules import unique_rows_update
from fleet.tables.changes import ChangeTracker
from fleet.tables.snapshot import SnapshotMixin
from fleet.tables.statistics import StatisticsMixin
from fleet.tables.table_state import as_ids, check_shape, need, parse_initializer, split_state

__all__ = ["SparseTable", "parse_initializer"]


class SparseTable(StatisticsMixin, SnapshotMixin):
    """An int64-keyed embedding table with lazily created rows and optimizer state.

    Thread-safe: every method takes the table's lock; the numba kernels inside release
    the GIL, so different tables update in parallel. No method blocks on anything but
    that lock, except that ``snapshot``, ``shrink``, ``load_state_dict`` and
    ``apply_delta`` first wait (bounded) for an open snapshot to close.

    Args:
        name: the table's parameter name (used in messages).
        dim: row width.
        rule: optimizer rule (``fleet.rules``: ``state_names``, ``init_state``,
            ``apply_sparse``).
        initializer: initial value spec, see ``parse_initializer``.
        seed: seed of the initial values (row value = f(seed, id)).
        track_workers: keep, for workers 0 .. n-1, the rows changed since each one's last
            ``pull_changed`` (GEO); 0 disables.
        capacity: rows to allocate room for up front.
        entry: a ``fleet.entries`` entry (CountFilterEntry, ProbabilityEntry,
            ShowClickEntry) or None: rows are then created only by admitted ``pull_train``
            lookups, and pushes to ids without a row are dropped.
        accessor: ``CtrAccessorConfig`` (or a dict for ``CtrAccessorConfig.from_dict``) or
            None. With an entry or an accessor the table keeps statistics per row
            (``has_statistics``); an entry alone uses the default config.
        sketch_width: counters per row of the admission sketch (with an entry).

    Raises:
        ConfigError: bad dim, initializer, rule state, entry or accessor.
    """

    def __init__(self, name, dim, rule, initializer, seed=0, track_workers=0, capacity=1024,
                 entry=None, accessor=None, sketch_width=DEFAULT_SKETCH_WIDTH):
        if int(dim) < 1:
            raise ConfigError(f"sparse table {name!r}: dim must be >= 1; got {dim}")
        self.name = name
        self.dim = int(dim)
        self.rule = rule
        self.initializer = tuple(initializer)
        self.seed = int(seed)
        if not -(1 << 63) <= self.seed < (1 << 64):
            raise ConfigError(f"sparse table {name!r}: seed {seed} does not fit in 64 bits")
        # the kernel takes the seed's 64 bits as a signed int64
        self._seed64 = self.seed - (1 << 64) if self.seed >= (1 << 63) else self.seed
        self._init = parse_initializer(initializer)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a snapshot closes
        capacity = max(int(capacity), 16)
        if isinstance(accessor, dict):
            accessor = CtrAccessorConfig.from_dict(accessor)
        if accessor is not None and not isinstance(accessor, CtrAccessorConfig):
            raise ConfigError(f"sparse table {name!r}: accessor {accessor!r} is not a CtrAccessorConfig or dict")
        self.entry = entry
        self.has_statistics = entry is not None or accessor is not None
        self.accessor = (accessor or CtrAccessorConfig()) if self.has_statistics else None
        self._admission = None if entry is None else AdmissionFilter(entry, self.seed, self.accessor,
                                                                      width=sketch_width)
        # delta-save bookkeeping, started by the first snapshot (or load): see fleet.tables.snapshot
        self._snapshot = None      # the open TableSnapshot
        self._delta = None         # ChangeTracker(1): rows changed since the last committed save
        self._deleted = None       # DeletedIds: ids deleted since then
        self._all_changed = True   # no committed save yet, or a shrink since: a delta holds every row
        self._row_template, self._scalar_state = split_state(rule, self.dim, name)
        # non-lazy Adam decays every row's moments at every push (see fleet.rules.AdamRule)
        self._rule_writes_every_row = getattr(rule, "lazy_mode", None) is False
        self._apply_unique = unique_rows_update(rule) if self.has_statistics else None
        self._changes = ChangeTracker(track_workers, capacity) if track_workers else None
        self._make_storage(HashIndex(capacity), capacity)

    @property
    def size(self):
        """Number of rows in the table."""
        return self._index.size

    def __len__(self):
        return self._index.size

    # ------------------------------------------------------------------------- reads

    def pull(self, ids, create=True, out=None):
        """Returns float32 [n, dim]: the row of each id.

        Args:
            ids: int64 [n] (repeats allowed).
            create: create missing rows with their initial value (training); with False,
                missing ids read as zero rows and nothing is created (Paddle's is_test).
                A table with an entry never creates rows here (see ``pull_train``).
            out: optional float32 [n, dim] C-contiguous output.
        """
        ids = as_ids(ids, self.name)
        if out is None:
            out = np.empty((len(ids), self.dim), dtype=np.float32)
        elif out.shape != (len(ids), self.dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise DataError(f"sparse table {self.name!r}: out must be float32 C-contiguous {(len(ids), self.dim)}")
        with self._lock:
            rows = self._rows(ids) if create and self._admission is None else self._index.lookup(ids)
            take_rows(self._values, rows, out)
        return out

    def contains(self, ids):
        """Returns a bool [n] array: which ids have a row. Creates nothing."""
        ids = as_ids(ids, self.name)
        with self._lock:
            return self._index.lookup(ids) >= 0

    def pull_changed(self, worker):
        """Returns (ids int64 [m], values float32 [m, dim]) of rows changed since ``worker``'s last call.

        Rows are changed by ``push`` and ``add`` from any worker; creation alone does
        not count. Rows come in order of first change.

        Raises:
            ConfigError: change tracking is off or ``worker`` is out of range.
        """
        with self._lock:
            if self._changes is None:
                raise ConfigError(
                    f"sparse table {self.name!r} does not track changed rows; create it with track_workers=N"
                )
            rows = self._changes.take(worker)
            values = np.empty((len(rows), self.dim), dtype=np.float32)
            take_rows(self._values, rows, values)
            return self._index.row_ids[rows], values

    # ------------------------------------------------------------------------ writes

    def push(self, ids, grads, lr):
        """Applies the optimizer rule to the rows of ``ids`` with gradient rows ``grads``.

        Missing rows are created first; with an entry, ids without a row are dropped
        instead. Duplicate ids are merged by the rule (summed).

        Args:
            ids: int64 [n]; grads: float32 [n, dim]; lr: learning rate (float).

        Raises:
            DataError: grads is not [len(ids), dim].
        """
        ids = as_ids(ids, self.name)
        grads = self._rows_arg(grads, len(ids), "grads")
        with self._lock:
            rows, grads = self._rows_to_write(ids, grads)
            self._before_write(rows, every_row=self._rule_writes_every_row)
            size = self._index.size
            state = self._state_view(size)
            apply = self.rule.apply_sparse
            if self._apply_unique is not None and rows_unique(self._unique_bits.array, rows):
                apply = self._apply_unique  # no merge needed
            apply(self._values[:size], rows, grads, state, float(lr))
            self._keep_scalars(state)
            self._mark(rows)
            if self._rule_writes_every_row and self._delta is not None:
                self._all_changed = True  # every row's moments decayed: the next delta holds every row

    def push_rows(self, sparse_rows, lr):
        """``push`` of a SparseRows-like object whose ``rows`` are ids and ``values`` gradients."""
        self.push(sparse_rows.rows, sparse_rows.values, lr)

    def add(self, ids, deltas):
        """Adds ``deltas`` to the rows of ``ids`` (GEO); repeats accumulate; missing rows are created
        (with an entry: dropped).

        Raises:
            DataError: deltas is not [len(ids), dim].
        """
        ids = as_ids(ids, self.name)
        deltas = self._rows_arg(deltas, len(ids), "deltas")
        with self._lock:
            rows, deltas = self._rows_to_write(ids, deltas)
            self._before_write(rows)
            sparse.scatter_add(self._values, rows, deltas)
            self._mark(rows)

    # ------------------------------------------------------------------- save / load

    def state_dict(self):
        """Returns copies of every array: ``ids`` [n], ``values`` [n, dim], ``state.<name>``
        (and ``stats`` [n, 4] with statistics).

        Rows are in creation order; per-row state has one row per id, scalar state its own
        shape. ``load_state_dict`` of the result rebuilds a bit-identical table.
        """
        with self._lock:
            return self._chunk(0, self._index.size)

    def iter_chunks(self, chunk_rows=1 << 16):
        """Yields ``state_dict``-shaped dicts over consecutive row ranges (for streaming saves).

        Each chunk is copied under the lock, so it is consistent in itself; rows created
        while iterating are included. For one consistent snapshot use ``state_dict``.
        """
        chunk_rows = int(chunk_rows)
        if chunk_rows < 1:
            raise ConfigError(f"sparse table {self.name!r}: chunk_rows must be >= 1; got {chunk_rows}")
        start, first = 0, True
        while True:
            with self._lock:
                size = self._index.size
                if start >= size and not first:
                    return
                stop = min(start + chunk_rows, size)
                chunk = self._chunk(start, stop)
            first = False
            yield chunk
            start = stop

    def load_state_dict(self, state):
        """Replaces the table's content with ``state`` (as ``state_dict`` returns).

        ``ids`` may be any unique subset of ids (e.g. one server's share after a
        re-split); rows get numbers in the given order. ``stats`` [n, 4] is optional
        (zeros without it). Pending changed rows are cleared and the loaded content
        counts as the previous save of the next delta. Waits (bounded) for an open snapshot.

        Raises:
            ConfigError: a key is missing, an id repeats, or a shape or dtype does not fit;
                ``stats`` given to a table without statistics.
            FleetTimeoutError: an open snapshot did not close in time.
        """
        ids, values, rows_in, stats = self._checked_rows(state)
        n = len(ids)
        scalars_in = {}
        for key, arr0 in self._scalar_state.items():
            arr = need(state, f"state.{key}", self.name)
            check_shape(arr, arr0.shape, arr0.dtype, f"state.{key}", self.name)
            scalars_in[key] = arr
        with self._lock:
            self._wait_for_snapshot("load_state_dict", None)
            index = HashIndex()
            index.load_ids(ids)
            self._make_storage(index, max(n, 16))
            self._values[:n] = values
            for key, arr in rows_in.items():
                self._row_state[key][:n] = arr
            for key, arr in scalars_in.items():
                self._scalar_state[key] = np.array(arr, copy=True)
            if self.has_statistics:
                self._stats[:n] = 0.0 if stats is None else stats
            if self._changes is not None:
                self._changes.clear()
                self._changes.ensure_rows(max(n, 16))
            self._start_delta_tracking(reset=True)

    def _checked_rows(self, state):
        """(ids, values, {row state: array}, stats or None) of a state_dict-shaped ``state``,
        each checked against this table's width and dtypes."""
        ids = as_ids(need(state, "ids", self.name), self.name)
        n = len(ids)
        values = need(state, "values", self.name)
        check_shape(values, (n, self.dim), np.float32, "values", self.name)
        rows_in = {}
        for key, row in self._row_template.items():
            rows_in[key] = need(state, f"state.{key}", self.name)
            check_shape(rows_in[key], (n, self.dim), row.dtype, f"state.{key}", self.name)
        return ids, values, rows_in, self._stats_arg(state, n)

    @property
    def sketch_shape(self):
        """(depth, width) of the admission sketch, or None for a table without an entry."""
        return None if self._admission is None else (self._admission.depth, self._admission.width)

    def sketch(self):
        """Returns a uint8 [depth, width] copy of the admission sketch (None without an entry).
        Thread-safe."""
        with self._lock:
            return None if self._admission is None else self._admission.state_dict()["sketch"]

    def load_sketch(self, sketch, source="the save"):
        """Replaces the admission sketch's counters by ``sketch`` (uint8 [depth, width]; None:
        all zeros, as a fresh table). A table without an entry ignores it. Thread-safe.

        Args:
            source: what the sketch comes from, for the error message.

        Raises:
            ConfigError: the sketch has another shape or dtype than this table's (names
                both and the fix).
        """
        if self._admission is None:
            return
        want = (self._admission.depth, self._admission.width)
        if sketch is not None:
            sketch = np.asarray(sketch)
            if sketch.dtype != np.uint8 or sketch.shape != want:
                raise ConfigError(
                    f"sparse table {self.name!r}: the admission sketch of {source} is {sketch.dtype}"
                    f"{list(sketch.shape)} (depth, width), but this table's is uint8{list(want)}; build the "
                    f"table with the width it was saved with (sketch_width={sketch.shape[-1]}), or load "
                    f"without the sketch (candidates' counts start from zero)")
        with self._lock:
            if sketch is None:
                self._admission.load_state_dict({"sketch": np.zeros(want, np.uint8)})
            else:
                self._admission.load_state_dict({"sketch": sketch})

    # ----------------------------------------------------------------------- memory

    def memory_bytes(self):
        """Bytes the table occupies: rows in use (values, per-row state, statistics), the index,
        the admission sketch, tracking and an open snapshot's preserved rows.

        Capacity past ``size`` is not counted: it is never written, so the OS does not back
        it with memory (within a reservation, whole pages of the rows in use are counted).
        While the index grows, its old or next slot array is counted as well.
        """
        with self._lock:
            size = self._index.size
            total = self._value_store.memory_bytes(size) + self._index.memory_bytes()
            total += sum(store.memory_bytes(size) for store in self._state_stores.values())
            total += sum(a.nbytes for a in self._scalar_state.values())
            if self._changes is not None:
                total += self._changes.memory_bytes()
            return total + self._extra_memory_bytes(size)

    def bytes_per_row(self):
        """``memory_bytes() / size`` (0.0 for an empty table)."""
        size = self.size
        return self.memory_bytes() / size if size else 0.0

    def __repr__(self):
        extra = "" if self.entry is None else f", entry={self.entry._to_attr()!r}"
        extra += "" if self.accessor is None else ", statistics"
        return (f"SparseTable({self.name!r}, dim={self.dim}, rows={self.size}, "
                f"rule={type(self.rule).__name__}, initializer={self.initializer!r}, seed={self.seed}{extra})")

    # ---------------------------------------------------------------------- private

    def _rows(self, ids):
        """Rows of ``ids``, creating and initializing missing ones. Caller holds the lock."""
        before = self._index.size
        rows, created = self._index.lookup_or_insert(ids)
        if created:
            after = self._index.size
            self._ensure_capacity(after, before)
            kind, a, b = self._init
            init_rows(self._values, self._index.row_ids, before, after, kind, a, b, self._seed64)
            for key, row in self._row_template.items():
                fill_rows(self._row_state[key], before, after, row)
            if self.has_statistics:
                fill_rows(self._stats, before, after, _ZERO_STATS)
            if self._delta is not None:
                self._mark_delta(np.arange(before, after, dtype=np.int64))
        return rows

    def _rows_to_write(self, ids, rows_arg):
        """(rows, rows_arg) of a push or add: missing rows created, or with an entry dropped."""
        if self._admission is None:
            return self._rows(ids), rows_arg
        rows = self._index.lookup(ids)
        found = rows >= 0
        if found.all():
            return rows, rows_arg
        return rows[found], rows_arg[found]

    def _before_write(self, rows, every_row=False):
        """Lets an open snapshot keep the old content of ``rows`` (or of every row) before they change."""
        if self._snapshot is not None:
            if every_row:
                self._snapshot._preserve_all()
            else:
                self._snapshot._preserve(rows)

    def _mark(self, rows):
        """Marks ``rows`` changed for GEO workers and for the next delta save."""
        if self._changes is not None:
            self._changes.mark(rows)
        if self._delta is not None:
            self._mark_delta(rows)

    def _make_storage(self, index, capacity):
        """Takes ``index`` and fresh per-row arrays with room for ``capacity`` rows."""
        self._index = index
        self._value_store = ReservedArray((self.dim,), np.float32, capacity)
        self._state_stores = {key: ReservedArray((self.dim,), row.dtype, capacity)
                              for key, row in self._row_template.items()}
        self._values = self._value_store.array
        self._row_state = {key: store.array for key, store in self._state_stores.items()}
        self._stats_store = ReservedArray((STAT_COLUMNS,), np.float32, capacity) if self.has_statistics else None
        self._stats = None if self._stats_store is None else self._stats_store.array
        # tables with statistics (pushes of unique ids, as pull_train's) skip the merge when rows are unique
        self._unique_bits = ReservedArray((), np.uint8, capacity // 8 + 1, zeroed=True) if self.has_statistics else None

    def _ensure_capacity(self, rows, size):
        """Makes room for ``rows`` rows, keeping the first ``size`` (those initialized).

        Within a reservation this is free: rows are written in place.
        """
        self._values = self._value_store.ensure(rows, size)
        for key, store in self._state_stores.items():
            self._row_state[key] = store.ensure(rows, size)
        if self._stats_store is not None:
            self._stats = self._stats_store.ensure(rows, size)
            self._unique_bits.ensure(rows // 8 + 1, size // 8 + 1)
        if self._changes is not None:
            self._changes.ensure_rows(rows)
        if self._delta is not None:
            self._delta.ensure_rows(rows)

    def _state_view(self, size):
        state = {key: arr[:size] for key, arr in self._row_state.items()}
        state.update(self._scalar_state)
        return state

    def _keep_scalars(self, state):
        # a rule updates scalar state in place; keep whatever it left, should it rebind
        for key in self._scalar_state:
            self._scalar_state[key] = state[key]

    def _chunk(self, start, stop):
        out = {"ids": self._index.row_ids[start:stop].copy(), "values": self._values[start:stop].copy()}
        for key, arr in self._row_state.items():
            out[f"state.{key}"] = arr[start:stop].copy()
        for key, arr in self._scalar_state.items():
            out[f"state.{key}"] = np.array(arr, copy=True)
        if self.has_statistics:
            out["stats"] = self._stats[start:stop].copy()
        return out

    def _rows_arg(self, values, n, what):
        values = np.ascontiguousarray(values, dtype=np.float32)
        if values.shape != (n, self.dim):
            raise DataError(
                f"sparse table {self.name!r}: {what} has shape {values.shape}, expected {(n, self.dim)} "
                f"(one row of width {self.dim} per id)"
            )
        return values



_ZERO_STATS = np.zeros(STAT_COLUMNS, dtype=np.float32)
