"""The CTR half of ``SparseTable``: training lookups with admission and statistics, and shrink.

A table with an entry or a ``CtrAccessorConfig`` keeps float32 [rows, 4] statistics in a
``ReservedArray`` beside its values: show, click, unseen_days, delta_score (Paddle's
CtrCommonAccessor). A training lookup (``pull_train``) of an id with a row adds the
lookup's show and click to it, sets unseen_days to 0 and adds score(show, click) to
delta_score, in the same kernel pass that reads the row. An id without a row is
created (no entry) or offered to the entry's ``AdmissionFilter``; an id not admitted
reads as a zero row.

``shrink`` (once per day or pass) decays show and click, ages unseen_days, deletes the
rows the accessor's rule names and compacts the rest, keeping their order. It is the
one call whose work is proportional to the table.
"""
import numpy as np

from fleet.entries import float_column
from fleet.errors import ConfigError, DataError
from fleet.kernels.hashtable import HashIndex, take_rows
from fleet.kernels.row_stats import STAT_COLUMNS, compact_rows, shrink_stats, take_rows_update_stats
from fleet.tables.table_state import as_ids, check_shape


class StatisticsMixin:
    """``pull_train``, ``statistics`` and ``shrink`` of ``SparseTable`` (which see)."""

    def pull_train(self, ids, shows=None, clicks=None, out=None):
        """Training lookup: returns float32 [n, dim], creating admitted rows and counting statistics.

        Without an entry this is ``pull(ids, create=True)`` plus statistics (when kept).
        With one, ids without a row are offered to the entry (``fleet.entries``): admitted
        ones are created (reading their initial value), the others read as zero rows and
        are counted as candidates. Every row read gets show += shows, click += clicks,
        unseen_days = 0, delta_score += score(shows, clicks), and counts as changed for
        the next delta save. Thread-safe; blocks only on the table's lock.

        Args:
            ids: int64 [n], unique (a repeated id counts its statistics twice).
            shows: float32 [n], e.g. each id's occurrences in the batch (None: 1 each).
            clicks: float32 [n] (None: 0 each).
            out: optional float32 [n, dim] C-contiguous output.

        Raises:
            DataError: shows, clicks or out do not have one entry (row) per id.
        """
        ids = as_ids(ids, self.name)
        n = len(ids)
        shows = float_column(shows, n, 1.0, "shows", f"sparse table {self.name!r}: ")
        clicks = float_column(clicks, n, 0.0, "clicks", f"sparse table {self.name!r}: ")
        out = self._out_arg(out, n)
        with self._lock:
            if self._admission is None:
                rows = self._rows(ids)
            else:
                rows = self._index.lookup(ids)
                missing = np.flatnonzero(rows < 0)
                if len(missing):
                    admitted = missing[self._admission.admit(ids[missing], shows[missing], clicks[missing])]
                    if len(admitted):
                        rows[admitted] = self._rows(np.ascontiguousarray(ids[admitted]))
            if not self.has_statistics:
                take_rows(self._values, rows, out)
                return out
            if self._snapshot is not None or self._delta is not None:
                found = rows[rows >= 0] if self._admission is not None else rows
                self._before_write(found)
                if self._delta is not None:
                    self._mark_delta(found)
            a = self.accessor
            take_rows_update_stats(self._values, self._stats, rows, shows, clicks,
                                   a.nonclk_coeff, a.click_coeff, out)
        return out

    def statistics(self, ids):
        """Returns float32 [n, 4]: show, click, unseen_days, delta_score of each id (zeros if no row).

        Raises:
            ConfigError: the table keeps no statistics.
        """
        self._need_statistics("statistics")
        ids = as_ids(ids, self.name)
        out = np.empty((len(ids), STAT_COLUMNS), dtype=np.float32)
        with self._lock:
            take_rows(self._stats, self._index.lookup(ids), out)
        return out

    @property
    def admission(self):
        """The table's ``AdmissionFilter`` (None without an entry); use it under no other lock."""
        return self._admission

    def shrink(self, timeout=None):
        """Decays, ages and deletes rows by the accessor's rule; returns the number of rows deleted.

        show *= show_click_decay_rate, click *= show_click_decay_rate, unseen_days += 1;
        then rows with score < delete_threshold or unseen_days > delete_after_unseen_days
        are deleted. Survivors keep their order (rows are renumbered); GEO change tracking
        and the next delta's changed rows follow them; deleted ids become the next delta's
        tombstones. The admission sketch decays by the same rate. Holds the table's lock
        for the whole pass (work proportional to the table); first waits for an open
        snapshot to close.

        Args:
            timeout: seconds to wait for an open snapshot (None: ``SNAPSHOT_WAIT_SECONDS``).

        Raises:
            ConfigError: the table keeps no statistics.
            FleetTimeoutError: an open snapshot did not close in time (the message names it).
        """
        self._need_statistics("shrink")
        a = self.accessor
        with self._lock:
            self._wait_for_snapshot("shrink", timeout)
            size = self._index.size
            keep = np.empty(size, dtype=np.bool_)
            deleted = shrink_stats(self._stats, size, a.show_click_decay_rate, a.nonclk_coeff, a.click_coeff,
                                   a.delete_threshold, a.delete_after_unseen_days, keep)
            if self._admission is not None:
                self._admission.decay(a.show_click_decay_rate)
            if self._delta is not None:
                self._all_changed = True  # every row's statistics changed
            if deleted:
                self._compact(keep, record=True)
            return int(deleted)

    # ---------------------------------------------------------------------- private

    def _compact(self, keep, record):
        """Deletes the rows with ``keep[r]`` False, moving the others down in order. Caller holds the lock.

        Args:
            keep: bool [size].
            record: append the deleted ids to the next delta's tombstones.
        """
        size = self._index.size
        ids = self._index.ids
        if record and self._deleted is not None:
            self._deleted.append(ids[~keep])
        survivors = np.ascontiguousarray(ids[keep])
        for arr in [self._values, self._stats, *self._row_state.values()]:
            if arr is not None:
                compact_rows(arr, keep, size)
        index = HashIndex()
        index.load_ids(survivors)
        self._index = index
        new_of_old = np.cumsum(keep, dtype=np.int64) - 1
        new_of_old[~keep] = -1
        for tracker in (self._changes, self._delta):
            if tracker is not None:
                tracker.remap(new_of_old)

    def _need_statistics(self, what):
        if not self.has_statistics:
            raise ConfigError(
                f"sparse table {self.name!r} keeps no statistics, so it has no {what}(); create it with "
                f"entry=... or accessor=CtrAccessorConfig() (in a program: sparse_embedding(..., entry=...) "
                f"or strategy.set_sparse_table_config)"
            )

    def _stats_arg(self, state, n):
        """The optional "stats" [n, 4] of a state to load (None when absent)."""
        if "stats" not in state:
            return None
        if not self.has_statistics:
            raise ConfigError(
                f"sparse table {self.name!r}: the state to load has 'stats' but the table keeps no statistics; "
                f"create it with entry=... or accessor=CtrAccessorConfig(), or leave 'stats' out"
            )
        stats = np.asarray(state["stats"])
        check_shape(stats, (n, STAT_COLUMNS), np.float32, "stats", self.name)
        return stats

    def _out_arg(self, out, n):
        if out is None:
            return np.empty((n, self.dim), dtype=np.float32)
        if out.shape != (n, self.dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise DataError(f"sparse table {self.name!r}: out must be float32 C-contiguous {(n, self.dim)}")
        return out
