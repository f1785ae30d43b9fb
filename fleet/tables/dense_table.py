"""A server's dense block: a float32 array with its optimizer state.

Besides whole-block pull / push / add, a 2-D block (rows of an ``is_sparse`` embedding
routed by row range) takes row-wise operations: ``pull_rows``, ``push_rows`` (the rule's
sparse update), ``add_rows`` (GEO deltas) and, with change tracking, ``pull_changed``.
"""
import threading

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.kernels import sparse
from fleet.kernels.hashtable import take_rows
from fleet.tables.changes import ChangeTracker


class DenseTable:
    """A block of a dense parameter and its optimizer state.

    Thread-safe: every method takes the table's lock (numba kernels and numpy release
    the GIL inside). No method blocks on anything but that lock.

    Args:
        name: the block's name (used in messages).
        value: the initial value; copied into a C-contiguous float32 array the table owns.
        rule: optimizer rule (``state_names``, ``init_state``, ``apply_dense``, ``apply_sparse``).
        track_workers: keep, for workers 0 .. n-1, the rows changed since each one's last
            ``pull_changed`` (GEO on row blocks); 0 disables. A whole-block update marks every row.

    Raises:
        ConfigError: the rule's state is incomplete.
    """

    def __init__(self, name, value, rule, track_workers=0):
        self.name = name
        self.rule = rule
        self._value = np.array(value, dtype=np.float32, order="C", copy=True)
        self._state = {key: np.ascontiguousarray(arr) for key, arr in rule.init_state(self._value.shape).items()}
        missing = [key for key in rule.state_names if key not in self._state]
        if missing:
            raise ConfigError(f"dense table {name!r}: rule {rule!r} init_state() lacks {missing}")
        self._lock = threading.Lock()
        self._rows = self._value.shape[0] if self._value.ndim else 1
        self._changes = ChangeTracker(track_workers, self._rows) if track_workers else None

    @property
    def shape(self):
        return self._value.shape

    # ------------------------------------------------------------------ whole block

    def pull(self, out=None):
        """Returns a copy of the block (into ``out`` if given, float32 of the same shape)."""
        with self._lock:
            if out is None:
                return self._value.copy()
            if out.shape != self._value.shape or out.dtype != np.float32:
                raise DataError(f"dense table {self.name!r}: out must be float32 {self._value.shape}")
            np.copyto(out, self._value)
            return out

    def push(self, grad, lr):
        """Applies the optimizer rule with the dense gradient ``grad`` (same shape as the block).

        Raises:
            DataError: grad has another shape.
        """
        grad = self._like_value(grad, "grad")
        with self._lock:
            self.rule.apply_dense(self._value, grad, self._state, float(lr))
            self._mark_all()

    def add(self, delta):
        """Adds ``delta`` (same shape as the block) to the value (GEO).

        Raises:
            DataError: delta has another shape.
        """
        delta = self._like_value(delta, "delta")
        with self._lock:
            np.add(self._value, delta, out=self._value)
            self._mark_all()

    # ---------------------------------------------------------------------- rows

    def pull_rows(self, rows):
        """Returns float32 [n, width]: rows of a 2-D block (block-relative indices, repeats allowed).

        Raises:
            DataError: the block is not 2-D or a row is out of range.
        """
        rows = self._row_indices(rows)
        out = np.empty((len(rows), self._value.shape[1]), dtype=np.float32)
        with self._lock:
            take_rows(self._value, rows, out)
        return out

    def push_rows(self, rows, grads, lr):
        """Applies the rule's sparse update to ``rows`` (repeats are merged by the rule).

        Raises:
            DataError: bad rows, or grads is not [len(rows), width].
        """
        rows = self._row_indices(rows)
        grads = self._row_values(grads, len(rows), "grads")
        with self._lock:
            self.rule.apply_sparse(self._value, rows, grads, self._state, float(lr))
            if self._changes is not None:
                self._changes.mark(rows)

    def add_rows(self, rows, deltas):
        """Adds ``deltas[i]`` to row ``rows[i]`` (GEO); repeats accumulate.

        Raises:
            DataError: bad rows, or deltas is not [len(rows), width].
        """
        rows = self._row_indices(rows)
        deltas = self._row_values(deltas, len(rows), "deltas")
        with self._lock:
            sparse.scatter_add(self._value, rows, deltas)
            if self._changes is not None:
                self._changes.mark(rows)

    def pull_changed(self, worker):
        """Returns (rows int64 [m], values float32 [m, width]) changed since ``worker``'s last call.

        Raises:
            ConfigError: change tracking is off or ``worker`` is out of range.
            DataError: the block is not 2-D.
        """
        self._need_2d()
        with self._lock:
            if self._changes is None:
                raise ConfigError(
                    f"dense table {self.name!r} does not track changed rows; create it with track_workers=N"
                )
            rows = self._changes.take(worker)
            values = np.empty((len(rows), self._value.shape[1]), dtype=np.float32)
            take_rows(self._value, rows, values)
            return rows, values

    # ------------------------------------------------------------------ save / load

    def state_dict(self):
        """Returns copies: ``value`` and ``state.<name>`` for each optimizer state entry."""
        with self._lock:
            out = {"value": self._value.copy()}
            out.update({f"state.{key}": np.array(arr, copy=True) for key, arr in self._state.items()})
            return out

    def state_rows(self, start, stop, with_state=True):
        """Returns copies of rows [start, stop) of the value (``value``) and of each
        per-row optimizer state (``state.<name>``), and whole copies of the scalar state:
        one chunk of ``state_dict``, so a large block is read in pieces.

        Raises:
            DataError: the range is not within [0, rows).
        """
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self._rows:
            raise DataError(f"dense table {self.name!r}: rows [{start}, {stop}) are not within [0, {self._rows})")
        with self._lock:
            out = {"value": self._value.reshape(self._rows, -1)[start:stop].reshape(
                (stop - start,) + self._value.shape[1:]).copy()}
            if with_state:
                row_keys = self.row_state_names()
                for key, arr in self._state.items():
                    if key in row_keys:
                        out[f"state.{key}"] = arr[start:stop].copy()
                    else:
                        out[f"state.{key}"] = np.array(arr, copy=True)
            return out

    def row_state_names(self):
        """The optimizer state entries with one row per row of the block (the others are
        small scalar arrays, e.g. Adam's beta powers)."""
        names = getattr(self.rule, "row_state_names", None)
        if names is None:
            names = [k for k, arr in self._state.items() if arr.shape == self._value.shape]
        return tuple(names)

    def load_state_dict(self, state):
        """Replaces value and optimizer state with ``state`` (as ``state_dict`` returns).

        Raises:
            ConfigError: a key is missing or an array has another shape or dtype.
        """
        wanted = {"value": self._value}
        wanted.update({f"state.{key}": arr for key, arr in self._state.items()})
        for key, current in wanted.items():
            if key not in state:
                raise ConfigError(
                    f"dense table {self.name!r}: the state to load has no {key!r}; keys are {sorted(state)}"
                )
            arr = np.asarray(state[key])
            if arr.shape != current.shape or arr.dtype != current.dtype:
                raise ConfigError(
                    f"dense table {self.name!r}: {key!r} to load is {arr.dtype}{list(arr.shape)}, "
                    f"expected {current.dtype}{list(current.shape)}"
                )
        with self._lock:
            for key, current in wanted.items():
                np.copyto(current, state[key])
            if self._changes is not None:
                self._changes.clear()

    def memory_bytes(self):
        """Bytes held by the value, the optimizer state and change tracking."""
        total = self._value.nbytes + sum(a.nbytes for a in self._state.values())
        return total + (self._changes.memory_bytes() if self._changes is not None else 0)

    def __repr__(self):
        return f"DenseTable({self.name!r}, shape={self._value.shape}, rule={type(self.rule).__name__})"

    # -------------------------------------------------------------------- private

    def _mark_all(self):
        if self._changes is not None:
            self._changes.mark_range(0, self._rows)

    def _like_value(self, arr, what):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.shape != self._value.shape:
            if arr.size == self._value.size and arr.ndim <= 1:
                return arr.reshape(self._value.shape)
            raise DataError(
                f"dense table {self.name!r}: {what} has shape {arr.shape}, expected {self._value.shape}"
            )
        return arr

    def _need_2d(self):
        if self._value.ndim != 2:
            raise DataError(
                f"dense table {self.name!r} has shape {self._value.shape}; row operations need a 2-D block"
            )

    def _row_indices(self, rows):
        self._need_2d()
        rows = np.asarray(rows)
        if rows.size and not np.issubdtype(rows.dtype, np.integer):
            raise DataError(f"dense table {self.name!r}: rows must be integers; got dtype {rows.dtype}")
        rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if len(rows):
            lo, hi = int(rows.min()), int(rows.max())
            if lo < 0 or hi >= self._rows:
                bad = lo if lo < 0 else hi
                raise DataError(
                    f"dense table {self.name!r}: row {bad} is outside [0, {self._rows}); "
                    f"send block-relative row indices"
                )
        return rows

    def _row_values(self, values, n, what):
        values = np.ascontiguousarray(values, dtype=np.float32)
        width = self._value.shape[1]
        if values.shape != (n, width):
            raise DataError(
                f"dense table {self.name!r}: {what} has shape {values.shape}, expected {(n, width)}"
            )
        return values
