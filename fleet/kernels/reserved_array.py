"""Arrays that grow without moving: address space reserved once, memory taken as rows are written.

A sparse table's arrays (values, optimizer state, ids, change bitmaps) grow with the
table. Growing a numpy array means allocating a bigger one and copying, which at tens of
millions of rows stalls the table for seconds (the copy plus the page faults of the new
array, all at once). A ``ReservedArray`` instead reserves address space for as many rows
as the machine's memory could ever hold, with an anonymous private mapping made with
``MAP_NORESERVE``: the kernel commits no memory for it, and a page becomes resident only
when first written. Rows are appended in place, so growth costs only the first-touch
page faults of the rows written, paid by the call that writes them.

Mappings are advised to use transparent huge pages (as numpy does for its own large
arrays): random row accesses into gigabytes of rows are measurably faster with fewer TLB
misses (benchmarks/bench_sparse_table.py), and touching new memory costs about the same
per byte either way.

Small arrays (up to ``RESERVE_AFTER_BYTES``) stay ordinary numpy arrays grown by
doubling, so a process with many small tables does not hold many large reservations;
the one move into a reservation copies at most that many bytes.

If the address space cannot be reserved (a ``ulimit -v``, or ``vm.overcommit_memory=2``,
which ignores ``MAP_NORESERVE``), the reservation is halved until it fits, down to twice
the rows asked for; outgrowing such a smaller reservation moves the array (a copy), as
plain numpy growth would.
"""
import mmap
import os
import sys

import numpy as np

RESERVE_AFTER_BYTES = 1 << 22
"""Arrays up to this many bytes live on the heap; a larger one moves into a reservation."""

PAGE_BYTES = mmap.PAGESIZE


def _transparent_huge_page_bytes():
    """2 MiB-ish when transparent huge pages may back an madvised mapping, else the page size."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return PAGE_BYTES
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return PAGE_BYTES
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return PAGE_BYTES


_THP_BYTES = _transparent_huge_page_bytes()
"""Granularity in which a mapping here becomes resident (its pages are advised huge)."""

# Python exposes mmap.MAP_NORESERVE only from 3.13; the value is 0x4000 on every Linux arch
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
_machine_bytes = None


def machine_bytes():
    """Returns the bytes of physical memory plus swap: more than any array here can fill."""
    global _machine_bytes
    if _machine_bytes is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("SwapTotal:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass  # no /proc (not Linux): physical memory alone
        _machine_bytes = total
    return _machine_bytes


def fresh_zeros(count, dtype):
    """Returns a zero-filled 1-D array whose pages are not resident until written.

    Large arrays come from their own anonymous mapping (the kernel's zero pages), so
    creating one costs nothing in proportion to its size; small ones are ``np.zeros``.

    Raises:
        MemoryError: the address space for it cannot be mapped.
    """
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if nbytes <= RESERVE_AFTER_BYTES:
        return np.zeros(count, dtype=dtype)
    try:
        return _mapped(count, (), dtype)
    except (OSError, OverflowError) as e:
        raise MemoryError(f"cannot map {nbytes} bytes for {count} zeros of {dtype}: {e}") from e


class ReservedArray:
    """A [capacity, *row_shape] array whose rows do not move once it is large.

    Not thread-safe: the owning table calls it under its lock.

    Args:
        row_shape: shape of one row (``()`` for a 1-D array).
        dtype: element type.
        rows: rows to make room for now.
        zeroed: rows not yet written read as zero (else their content is undefined).
    """

    def __init__(self, row_shape, dtype, rows=0, zeroed=False):
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))
        self.zeroed = bool(zeroed)
        self.reserved = False
        self.array = self._heap(0)
        self.ensure(max(int(rows), 1), 0)

    @property
    def capacity(self):
        """Rows the array has room for without moving."""
        return len(self.array)

    def ensure(self, rows, keep):
        """Makes room for ``rows`` rows, keeping the content of the first ``keep``.

        Within a reservation this costs nothing: rows past those written are untouched
        address space. Returns ``self.array`` (a new object only when the array moved:
        while small, when it moves into a reservation, or when it outgrows a reservation
        that the address space limited).

        Raises:
            MemoryError: no reservation for ``rows`` rows can be mapped.
        """
        rows = int(rows)
        if rows <= self.capacity:
            return self.array
        want = max(rows, 2 * self.capacity)
        if want * self.row_bytes <= RESERVE_AFTER_BYTES:
            grown = self._heap(want)
            reserved = False
        else:
            grown = self._reserve(rows)
            reserved = True
        grown[:keep] = self.array[:keep]
        self.array, self.reserved = grown, reserved
        return self.array

    def memory_bytes(self, rows):
        """Bytes resident for the first ``rows`` rows.

        Within a reservation, rounded up to whole pages of the size the mapping may use
        (huge pages where the kernel offers them): within one such page of what the kernel
        reports resident. Assumes only rows below ``rows`` were ever written, which is how
        the tables use it.
        """
        used = int(rows) * self.row_bytes
        if self.reserved:
            return -(-used // _THP_BYTES) * _THP_BYTES
        return used

    def _heap(self, rows):
        make = np.zeros if self.zeroed else np.empty
        return make((rows,) + self.row_shape, dtype=self.dtype)

    def _reserve(self, rows):
        """A mapping for at least ``rows`` rows: as many as the machine could hold, if allowed."""
        target = max(rows, -(-machine_bytes() // max(self.row_bytes, 1)))
        floor = 2 * rows
        while True:
            try:
                return _mapped(target, self.row_shape, self.dtype)
            except (OSError, OverflowError) as e:
                if target <= floor:
                    raise MemoryError(
                        f"cannot reserve address space for {target} rows of {self.row_bytes} bytes "
                        f"({target * self.row_bytes} bytes): {e}; raise the process's address-space "
                        f"limit (ulimit -v) or free memory"
                    ) from e
                target = max(floor, target // 2)


def _mapped(rows, row_shape, dtype):
    """A writable [rows, *row_shape] array over its own anonymous, lazily backed mapping."""
    count = rows * int(np.prod(row_shape, dtype=np.int64))
    nbytes = max(count * dtype.itemsize, 1)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if _THP_BYTES > PAGE_BYTES:
        buf.madvise(mmap.MADV_HUGEPAGE)
    # the array holds the mapping alive; it is unmapped when the last view goes
    return np.frombuffer(buf, dtype=dtype, count=count).reshape((rows,) + tuple(row_shape))
