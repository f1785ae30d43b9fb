"""Per-worker sets of rows changed since that worker last asked (GEO's "changed rows").

Paddle's AsyncSparseParamUpdateRecorder: every update of a row marks it for every
worker; ``take(worker)`` hands the worker its marked rows and clears them. Storage is a
bitmap (1 bit per row) and a list of pending rows per worker, so a mark or a take costs
O(rows touched), never a sweep over the table. Both grow in place (``ReservedArray``),
so a table's growth never copies them.
"""
import numpy as np

from fleet.errors import ConfigError
from fleet.kernels.hashtable import clear_marks, mark_rows
from fleet.kernels.reserved_array import ReservedArray


class ChangeTracker:
    """Rows changed since each worker's last ``take``.

    Not thread-safe: the owning table calls it under its lock.

    Args:
        workers: number of workers tracked (ids 0 .. workers-1).
        rows: rows to make room for (grows with ``ensure_rows``).
    """

    def __init__(self, workers, rows=0):
        if int(workers) < 1:
            raise ConfigError(f"a change tracker needs at least 1 worker; got workers={workers}")
        self.workers = int(workers)
        self._rows = 0
        self._bits = [ReservedArray((), np.uint8, zeroed=True) for _ in range(self.workers)]
        self._pending = [ReservedArray((), np.int64, 16) for _ in range(self.workers)]
        self._counts = [0] * self.workers
        self._most = [0] * self.workers  # the most rows each pending list ever held (pages touched)
        self.ensure_rows(rows)

    def ensure_rows(self, rows):
        """Makes the bitmaps cover rows 0 .. rows-1 (in place once they are large)."""
        if rows <= self._rows:
            return
        nbytes = (int(rows) + 7) // 8
        for bits in self._bits:
            bits.ensure(nbytes, (self._rows + 7) // 8)
        self._rows = int(rows)

    def mark(self, rows):
        """Marks int64 ``rows`` (each in range, repeats allowed) as changed for every worker."""
        if not len(rows):
            return
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        for w in range(self.workers):
            count = self._counts[w]
            pending = self._pending[w].ensure(min(count + len(rows), self._rows), count)
            self._counts[w] = mark_rows(self._bits[w].array, pending, count, rows)
            self._most[w] = max(self._most[w], self._counts[w])

    def mark_range(self, start, stop):
        """Marks rows start .. stop-1."""
        self.mark(np.arange(start, stop, dtype=np.int64))

    def take(self, worker):
        """Returns int64 rows changed since ``worker``'s last take (order of first change), clearing them.

        Raises:
            ConfigError: ``worker`` is not in 0 .. workers-1.
        """
        if not isinstance(worker, (int, np.integer)) or not 0 <= worker < self.workers:
            raise ConfigError(
                f"worker {worker!r} is not tracked; changed rows are kept for workers 0..{self.workers - 1}"
            )
        count = self._counts[worker]
        rows = self._pending[worker].array[:count].copy()
        clear_marks(self._bits[worker].array, rows)
        self._counts[worker] = 0
        return rows

    def clear(self):
        """Forgets every pending change (e.g. after loading a checkpoint)."""
        for w in range(self.workers):
            # the set bits are exactly the pending rows: clear those, not a whole bitmap
            clear_marks(self._bits[w].array, self._pending[w].array[: self._counts[w]])
            self._counts[w] = 0

    def pending(self, worker):
        """Returns a view of ``worker``'s pending rows (order of first change); valid until the next call."""
        return self._pending[worker].array[: self._counts[worker]]

    def remap(self, new_of_old):
        """Renumbers every pending row r as ``new_of_old[r]`` (dropping rows mapped to -1).

        For a table whose rows were compacted; the order of first change is kept.
        """
        for w in range(self.workers):
            old = self.pending(w).copy()
            clear_marks(self._bits[w].array, old)
            new = new_of_old[old]
            new = np.ascontiguousarray(new[new >= 0])
            self._counts[w] = mark_rows(self._bits[w].array, self._pending[w].array, 0, new)

    def memory_bytes(self):
        """Bytes held by the bitmaps (rows covered) and pending lists (the most they held)."""
        nbytes = (self._rows + 7) // 8
        return sum(b.memory_bytes(nbytes) + p.memory_bytes(most)
                   for b, p, most in zip(self._bits, self._pending, self._most))


class DeletedIds:
    """The ids deleted since the table's last committed save (a delta save's tombstones).

    Not thread-safe: the owning table calls it under its lock. An append-only int64 list
    that grows in place; ``take`` hands it out and empties it.
    """

    def __init__(self):
        self._ids = ReservedArray((), np.int64, 16)
        self._count = 0
        self._most = 0

    def __len__(self):
        return self._count

    def append(self, ids):
        """Appends int64 ``ids``."""
        n = len(ids)
        if n:
            self._ids.ensure(self._count + n, self._count)[self._count:self._count + n] = ids
            self._count += n
            self._most = max(self._most, self._count)

    def take(self):
        """Returns the ids appended since the last take (a copy) and empties the list."""
        out = self._ids.array[: self._count].copy()
        self._count = 0
        return out

    def memory_bytes(self):
        """Bytes held (the most ids the list ever held)."""
        return self._ids.memory_bytes(self._most)
