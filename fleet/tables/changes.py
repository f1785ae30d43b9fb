"""Per-worker sets of rows changed since that worker last asked (GEO's "changed rows").

Paddle's AsyncSparseParamUpdateRecorder: every update of a row marks it for every
worker; ``take(worker)`` hands the worker its marked rows and clears them. Storage is a
bitmap (1 bit per row) and a list of pending rows per worker, so a mark or a take costs
O(rows touched), never a sweep over the table.
"""
import numpy as np

from fleet.errors import ConfigError
from fleet.kernels.hashtable import clear_marks, mark_rows


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
        self._bits = [np.zeros(0, dtype=np.uint8) for _ in range(self.workers)]
        self._pending = [np.empty(16, dtype=np.int64) for _ in range(self.workers)]
        self._counts = [0] * self.workers
        self.ensure_rows(rows)

    def ensure_rows(self, rows):
        """Makes the bitmaps cover rows 0 .. rows-1 (amortized doubling)."""
        if rows <= self._rows:
            return
        rows = max(int(rows), 2 * self._rows)
        nbytes = (rows + 7) // 8
        for w in range(self.workers):
            grown = np.zeros(nbytes, dtype=np.uint8)
            grown[: len(self._bits[w])] = self._bits[w]
            self._bits[w] = grown
        self._rows = rows

    def mark(self, rows):
        """Marks int64 ``rows`` (each in range, repeats allowed) as changed for every worker."""
        if not len(rows):
            return
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        for w in range(self.workers):
            need = min(self._counts[w] + len(rows), self._rows)
            if need > len(self._pending[w]):
                grown = np.empty(max(need, 2 * len(self._pending[w])), dtype=np.int64)
                grown[: self._counts[w]] = self._pending[w][: self._counts[w]]
                self._pending[w] = grown
            self._counts[w] = mark_rows(self._bits[w], self._pending[w], self._counts[w], rows)

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
        rows = self._pending[worker][:count].copy()
        clear_marks(self._bits[worker], rows)
        self._counts[worker] = 0
        return rows

    def clear(self):
        """Forgets every pending change (e.g. after loading a checkpoint)."""
        for w in range(self.workers):
            self._bits[w][:] = 0
            self._counts[w] = 0

    def memory_bytes(self):
        """Bytes held by the bitmaps and pending lists."""
        return sum(b.nbytes + p.nbytes for b, p in zip(self._bits, self._pending))
