"""The servers' sparse-table kernels: an int64 id -> row hash index and per-row helpers.

The index is open addressing with linear probing over a power-of-two array of uint64
slots. A slot is 0 when empty, else ``(tag << 40) | (row + 1)`` where ``tag`` is the top
24 bits of the id's splitmix64 hash. The id of row r lives in a separate per-row array
``row_ids[r]``, so every int64 value (0, negative, extremes) is a valid key and no key
needs to be reserved as a sentinel. A probe compares tags first and reads ``row_ids``
only on a tag match, so a hit costs about one slot read and one id read. Rows are
numbered 0, 1, 2, ... in creation order and never move: ``row_ids[:size]`` is the
iteration order used by saves, and the tables keep values and optimizer state in
parallel arrays indexed by the same row.

Memory: 8 bytes of ``row_ids`` per row plus 8 bytes per slot: 18-23 bytes per row while
only one slot array is held (load 0.35-0.45), up to 35 while a growth holds a second one
(``HashIndex`` grows incrementally, never rehashing everything in one call).

Row initial values come from a counter-based generator: the value of (seed, id, column)
is a pure function of those three numbers (splitmix64 streams), so a row gets the same
initial value whatever order ids arrive in.

All kernels are ``njit(cache=True, nogil=True)``: they release the GIL, and are compiled
on first use (nothing at import). Plain-Python ``*_reference`` twins are used by tests.
"""
import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from fleet.errors import ConfigError
from fleet.kernels.reserved_array import ReservedArray, fresh_zeros

MAX_LOAD = 0.7
"""Fraction of slots in use at which inserts move to a slot array twice as large."""
PREPARE_LOAD = 0.45
"""Fraction of slots in use at which the next slot array is allocated and its pages touched."""
MIGRATE_ROWS_PER_KEY = 4
"""Rows of the old slot array re-inserted per key of a call while migrating (>= 3.5 needed:
a switch at slot capacity C leaves 0.35 C rows to move, to be done in the 0.1 C inserts
before the next prepare phase at 0.45 of 2 C slots)."""
PREFAULT_SLOTS_PER_ROW = 8
"""Slots of the next slot array made resident per row beyond PREPARE_LOAD: its 2 C slots
over the 0.25 C rows up to MAX_LOAD, so the work is spread over the whole cycle."""
MIN_SLOTS = 1 << 15
"""The smallest slot array."""

_TAG_SHIFT = np.uint64(40)
_ROW_MASK = np.uint64((1 << 40) - 1)
_MAX_ROWS = (1 << 40) - 2
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_ONE = np.uint64(1)
_TWO_POW_M53 = 1.0 / 9007199254740992.0

# initializer kinds understood by init_rows
INIT_UNIFORM = 0
INIT_NORMAL = 1
INIT_TRUNCATED_NORMAL = 2
INIT_CONSTANT = 3
_TRUNCATED_RETRIES = 64


@numba.njit(cache=True, nogil=True)
def splitmix64(x):
    """Returns splitmix64 of the uint64 ``x`` (the Criteo hash of docs/internals.md), all modulo 2**64."""
    z = x + _GAMMA
    z = (z ^ (z >> _S30)) * _MUL1
    z = (z ^ (z >> _S27)) * _MUL2
    return z ^ (z >> _S31)


def splitmix64_reference(x):
    """Plain-Python splitmix64 of an int (any sign; taken modulo 2**64)."""
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


# ---------------------------------------------------------------------------- probe kernels
#
# Batch probes are software-pipelined: key i's slot is prefetched _AHEAD keys before it
# is probed, and the id of the row in that slot half-way in between, so the two cache
# misses of a lookup overlap with other keys' work (about 2x faster on tables beyond
# the cache; see benchmarks/bench_sparse_table.py).

_AHEAD = 32
_RING = 2 * _AHEAD


@intrinsic
def prefetch(typingctx, arr, index):
    """Hints the CPU to load ``arr[index]`` (for a 2-D array the start of that row) into cache."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = context.cast(builder, args[1], idxty, types.intp)
        zero = context.get_constant(types.intp, 0)
        indices = [idx] + [zero] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, indices, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch"
        )
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, index), codegen


@numba.njit(cache=True, nogil=True)
def _probe(slots, row_ids, key, h, mask):
    """Returns (slot, row): the key's slot and row, or the empty slot it would take and -1."""
    tag = h >> _TAG_SHIFT
    j = h & mask
    while True:
        s = slots[j]
        if s == 0:
            return j, -1
        if (s >> _TAG_SHIFT) == tag:
            r = np.int64(s & _ROW_MASK) - 1
            if row_ids[r] == key:
                return j, r
        j = (j + _ONE) & mask


@numba.njit(cache=True, nogil=True)
def hash_lookup(slots, old_slots, row_ids, keys, out_rows):
    """Writes the row of each key into ``out_rows`` (-1 for a key not in the index).

    Args:
        slots: uint64 [capacity] slot array (capacity a power of two).
        old_slots: uint64 [old capacity] frozen slot array still being migrated into
            ``slots`` (probed when a key is not in ``slots``), or empty.
        row_ids: int64 [>= size] id of each row.
        keys: int64 [n] ids to find (any values, repeats allowed).
        out_rows: int64 [n] output.
    """
    mask = np.uint64(len(slots) - 1)
    old_mask = np.uint64(max(len(old_slots), 1) - 1)
    migrating = len(old_slots) > 0
    n = len(keys)
    hashes = np.empty(_RING, dtype=np.uint64)
    for i in range(n + _AHEAD):
        # pipeline front (kept inline: as a function call it is several times slower)
        if i < n:
            h = splitmix64(np.uint64(keys[i]))
            hashes[i & (_RING - 1)] = h
            prefetch(slots, h & mask)
            if migrating:
                prefetch(old_slots, h & old_mask)
        k = i - _AHEAD // 2
        if k >= 0 and k < n:
            h = hashes[k & (_RING - 1)]
            s = slots[h & mask]
            if s != 0:
                prefetch(row_ids, np.int64(s & _ROW_MASK) - 1)
            if migrating:
                s = old_slots[h & old_mask]
                if s != 0:
                    prefetch(row_ids, np.int64(s & _ROW_MASK) - 1)
        j = i - _AHEAD
        if j >= 0:
            h = hashes[j & (_RING - 1)]
            row = _probe(slots, row_ids, keys[j], h, mask)[1]
            if row < 0 and migrating:
                row = _probe(old_slots, row_ids, keys[j], h, old_mask)[1]
            out_rows[j] = row


@numba.njit(cache=True, nogil=True)
def hash_lookup_or_insert(slots, old_slots, row_ids, size, keys, out_rows, start, limit):
    """Finds or creates the row of each key from ``keys[start]`` on.

    A key is looked for in ``slots``, then in ``old_slots``; a key in neither gets row
    ``size`` (then size + 1, ...) in ``slots`` and its id is written to ``row_ids``
    (``old_slots`` is never written). Stops early, before creating row number ``limit``,
    so the caller can grow and call again from the returned position.

    Args:
        slots, old_slots, row_ids: as for ``hash_lookup`` (``len(row_ids) >= limit``).
        size: rows in use.
        keys: int64 [n]; out_rows: int64 [n] output.
        start: first position of ``keys`` to process.
        limit: maximum number of rows allowed after this call.

    Returns:
        (stop, new_size): keys[start:stop] are done; stop < n means "grow and resume".
    """
    mask = np.uint64(len(slots) - 1)
    old_mask = np.uint64(max(len(old_slots), 1) - 1)
    migrating = len(old_slots) > 0
    n = len(keys)
    hashes = np.empty(_RING, dtype=np.uint64)
    for i in range(start, n + _AHEAD):
        # pipeline front (kept inline: as a function call it is several times slower)
        if i < n:
            h = splitmix64(np.uint64(keys[i]))
            hashes[i & (_RING - 1)] = h
            prefetch(slots, h & mask)
            if migrating:
                prefetch(old_slots, h & old_mask)
        k = i - _AHEAD // 2
        if k >= start and k < n:
            h = hashes[k & (_RING - 1)]
            s = slots[h & mask]
            if s != 0:
                prefetch(row_ids, np.int64(s & _ROW_MASK) - 1)
            if migrating:
                s = old_slots[h & old_mask]
                if s != 0:
                    prefetch(row_ids, np.int64(s & _ROW_MASK) - 1)
        j = i - _AHEAD
        if j < start:
            continue
        h = hashes[j & (_RING - 1)]
        slot, row = _probe(slots, row_ids, keys[j], h, mask)
        if row < 0 and migrating:
            row = _probe(old_slots, row_ids, keys[j], h, old_mask)[1]
        if row < 0:
            if size >= limit:
                return j, size
            slots[slot] = ((h >> _TAG_SHIFT) << _TAG_SHIFT) | np.uint64(size + 1)
            row_ids[size] = keys[j]
            row = size
            size += 1
        out_rows[j] = row
    return n, size


@numba.njit(cache=True, nogil=True)
def hash_insert_rows(slots, row_ids, start, stop):
    """Inserts rows start..stop-1 (ids from ``row_ids``), known to be absent, into ``slots``."""
    mask = np.uint64(len(slots) - 1)
    hashes = np.empty(_RING, dtype=np.uint64)
    for i in range(start, stop + _AHEAD):
        if i < stop:
            h = splitmix64(np.uint64(row_ids[i]))
            hashes[i & (_RING - 1)] = h
            prefetch(slots, h & mask)
        r = i - _AHEAD
        if r < start:
            continue
        h = hashes[r & (_RING - 1)]
        j = h & mask
        while slots[j] != 0:
            j = (j + _ONE) & mask
        slots[j] = ((h >> _TAG_SHIFT) << _TAG_SHIFT) | np.uint64(r + 1)


def lookup_reference(mapping, keys):
    """Plain-Python twin of ``hash_lookup``: rows from a dict id -> row, -1 if absent."""
    return np.array([mapping.get(int(k), -1) for k in keys], dtype=np.int64)


def lookup_or_insert_reference(mapping, keys):
    """Plain-Python twin of ``hash_lookup_or_insert``: new ids get rows len(mapping), ..."""
    out = np.empty(len(keys), dtype=np.int64)
    for i, k in enumerate(keys):
        out[i] = mapping.setdefault(int(k), len(mapping))
    return out


# ---------------------------------------------------------------------------- the index

_NO_SLOTS = np.zeros(0, dtype=np.uint64)


class HashIndex:
    """An int64 id -> int64 row index whose rows are numbered in creation order.

    Not thread-safe: the owning table serializes calls with its lock.

    Growth never stops a call for a time proportional to the index. The ids live in a
    ``ReservedArray`` (appended in place). The slot array grows in three phases, each
    paying a bounded amount of work per key (or row created) of each call:

    1. prepare: from ``PREPARE_LOAD`` the next slot array (twice as large) is allocated
       untouched, and ``lookup_or_insert`` writes ``PREFAULT_SLOTS_PER_ROW`` of its slots
       per row beyond that load, so its pages are resident before use instead of faulting
       at random later (paced by rows created: calls that only find rows pay nothing, and
       the memory is taken no sooner than the growth needs it);
    2. switch: at ``MAX_LOAD`` the prepared array becomes the one inserts go to, and the
       old one is frozen;
    3. migrate: each call (``lookup`` too) re-inserts ``MIGRATE_ROWS_PER_KEY`` of the old
       array's rows per key into the new one, in row order; until all are, a key not in
       the new array is looked for in the old one, and a key in neither is inserted into
       the new one only. Paced by keys, so the old array is freed soon whatever the mix.

    With the default constants, migration ends before the next prepare phase begins (its
    work divided by the inserts available is below its rate), and the next array is
    prepared just in time: the call that reaches the switch completes its own rows' share.
    A call creating more rows than that (a batch comparable to the index) completes
    whatever is pending at the switch: the work it pays is then proportional to its size.

    Args:
        capacity: rows to make room for before the first growth.
    """

    def __init__(self, capacity=1024):
        capacity = max(int(capacity), 16)
        self.size = 0
        self._ids = ReservedArray((), np.int64, capacity)
        self.slots = fresh_zeros(_slot_capacity_for(capacity, PREPARE_LOAD), np.uint64)
        self._clear_growth()

    @property
    def row_ids(self):
        """int64 [capacity] id of each row (entries past ``size`` are undefined)."""
        return self._ids.array

    @property
    def ids(self):
        """int64 [size] view: the id of each row, in row (creation) order."""
        return self._ids.array[: self.size]

    @property
    def migrating(self):
        """True while an old slot array is still being migrated (lookups probe both)."""
        return len(self._old) > 0

    def lookup(self, keys, out=None):
        """Returns the int64 row of each key, -1 for keys not in the index. Creates nothing.

        Migrates ``MIGRATE_ROWS_PER_KEY`` old rows per key when a migration is under way.
        """
        keys = _as_ids(keys)
        out = np.empty(len(keys), dtype=np.int64) if out is None else out
        hash_lookup(self.slots, self._old, self._ids.array, keys, out)
        self._migrate(MIGRATE_ROWS_PER_KEY * len(keys))
        return out

    def lookup_or_insert(self, keys, out=None):
        """Returns (rows, new_rows): the row of each key, creating rows for unknown keys.

        Rows created by this call are ``size_before .. size_before + new_rows - 1`` (in
        the order their ids first appear in ``keys``).
        """
        keys = _as_ids(keys)
        out = np.empty(len(keys), dtype=np.int64) if out is None else out
        before = self.size
        start = 0
        while True:
            limit = min(self._ids.capacity, int(len(self.slots) * MAX_LOAD), _MAX_ROWS)
            start, self.size = hash_lookup_or_insert(
                self.slots, self._old, self._ids.array, self.size, keys, out, start, limit
            )
            if start == len(keys):
                break
            if self.size >= _MAX_ROWS:
                raise ConfigError(f"a hash index holds at most {_MAX_ROWS} rows; this one is full")
            if self.size >= self._ids.capacity:
                self._ids.ensure(self.size + 1, self.size)
            if self.size >= int(len(self.slots) * MAX_LOAD):
                self._switch()
        self._advance(len(keys))
        return out, self.size - before

    def reserve(self, rows):
        """Makes room for ``rows`` rows in total without further growth (rebuilds now if needed)."""
        rows = int(rows)
        if rows > _MAX_ROWS:
            raise ConfigError(f"a hash index holds at most {_MAX_ROWS} rows; asked for {rows}")
        self._ids.ensure(rows, self.size)
        if rows > int(len(self.slots) * PREPARE_LOAD):
            self._rebuild(_slot_capacity_for(rows, PREPARE_LOAD))

    def load_ids(self, ids):
        """Replaces the content with rows 0..n-1 holding ``ids`` (which must be unique).

        Raises:
            ConfigError: an id appears twice (the message names it).
        """
        ids = _as_ids(ids)
        self.size = 0
        self._ids = ReservedArray((), np.int64, max(len(ids), 16))
        self.slots = fresh_zeros(_slot_capacity_for(max(len(ids), 16), PREPARE_LOAD), np.uint64)
        self._clear_growth()
        rows, created = self.lookup_or_insert(ids)
        if created != len(ids):
            # rows == arange(n) up to the first repeat, which maps back to an earlier row
            first = int(np.flatnonzero(rows != np.arange(len(ids)))[0])
            duplicate = int(ids[first])
            self.__init__()
            raise ConfigError(
                f"id {duplicate} appears more than once in the ids to load (position {first}); "
                f"ids must be unique"
            )

    def memory_bytes(self):
        """Bytes held: the slot arrays (the old one while migrating, the prepared part of
        the next one) plus the ids of the rows in use."""
        prepared = 0 if self._next is None else self._touched * self._next.itemsize
        return self.slots.nbytes + self._old.nbytes + prepared + self._ids.memory_bytes(self.size)

    # ------------------------------------------------------------------------ growth

    def _clear_growth(self):
        self._old = _NO_SLOTS       # frozen slot array being migrated into self.slots
        self._old_rows = 0          # rows 0.._old_rows-1 are in _old
        self._migrated = 0          # rows 0.._migrated-1 are also in self.slots
        self._next = None           # the prepared slot array of the next switch
        self._touched = 0           # its slots written so far (pages resident)

    def _advance(self, keys):
        """The growth work a call of ``keys`` keys pays for: migrate, else prepare."""
        if self.migrating:
            self._migrate(MIGRATE_ROWS_PER_KEY * keys)
            return
        if self._next is None and self.size >= len(self.slots) * PREPARE_LOAD:
            self._next = fresh_zeros(2 * len(self.slots), np.uint64)
            self._touched = 0
        if self._next is not None:
            beyond = self.size - int(len(self.slots) * PREPARE_LOAD)
            self._prepare(PREFAULT_SLOTS_PER_ROW * beyond - self._touched)

    def _migrate(self, rows):
        if not self.migrating or rows <= 0:
            return
        stop = min(self._old_rows, self._migrated + rows)
        hash_insert_rows(self.slots, self._ids.array, self._migrated, stop)
        self._migrated = stop
        if stop == self._old_rows:
            self._old = _NO_SLOTS

    def _prepare(self, slots):
        if slots <= 0:
            return
        stop = min(len(self._next), self._touched + slots)
        # a write makes the page resident (the mapping reads as zeros, so zeros keep it empty)
        self._next[self._touched : stop] = 0
        self._touched = stop

    def _switch(self):
        """Moves inserts to the next slot array, finishing whatever earlier calls left."""
        self._migrate(self._old_rows)
        if self._next is None:
            self._next = fresh_zeros(2 * len(self.slots), np.uint64)
            self._touched = 0
        self._prepare(len(self._next))
        self._old, self.slots = self.slots, self._next
        self._old_rows, self._migrated = self.size, 0
        self._next, self._touched = None, 0

    def _rebuild(self, slot_capacity):
        slots = fresh_zeros(slot_capacity, np.uint64)
        hash_insert_rows(slots, self._ids.array, 0, self.size)
        self.slots = slots
        self._clear_growth()


def _slot_capacity_for(rows, load):
    """The smallest power of two (>= MIN_SLOTS) of slots holding ``rows`` at most at ``load``."""
    need = max(int(math.ceil(rows / load)), MIN_SLOTS)
    return 1 << (need - 1).bit_length()


def _as_ids(keys):
    keys = np.asarray(keys)
    if keys.dtype != np.int64 or keys.ndim != 1 or not keys.flags.c_contiguous:
        if keys.size and not np.issubdtype(keys.dtype, np.integer):
            raise ConfigError(f"ids must be integers; got dtype {keys.dtype}")
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
    return keys


# ---------------------------------------------------------------------------- row kernels


@numba.njit(cache=True, nogil=True)
def _draw(base, k):
    return splitmix64(base + np.uint64(k + 1) * _GAMMA)


@numba.njit(cache=True, nogil=True)
def _uniform01(x):
    return np.float64(x >> _S11) * _TWO_POW_M53


@numba.njit(cache=True, nogil=True)
def _normal01(x):
    u1 = (np.float64(x >> _S11) + 1.0) * _TWO_POW_M53
    u2 = _uniform01(splitmix64(x))
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@numba.njit(cache=True, nogil=True)
def init_rows(values, row_ids, start, stop, kind, a, b, seed):
    """Writes the initial value of rows start..stop-1 from their ids.

    Row r, column c gets a value that depends only on (seed, row_ids[r], c):
    kind INIT_UNIFORM: uniform in [a, b]; INIT_NORMAL: normal(mean a, std b);
    INIT_TRUNCATED_NORMAL: normal(a, b) redrawn outside a +- 2b; INIT_CONSTANT: a.
    """
    dim = values.shape[1]
    seed_key = splitmix64(np.uint64(seed))
    for r in range(start, stop):
        base = splitmix64(seed_key ^ np.uint64(row_ids[r]))
        for c in range(dim):
            if kind == INIT_UNIFORM:
                v = a + (b - a) * _uniform01(_draw(base, c))
            elif kind == INIT_NORMAL:
                v = a + b * _normal01(_draw(base, c))
            elif kind == INIT_TRUNCATED_NORMAL:
                z = 0.0
                for t in range(_TRUNCATED_RETRIES):
                    z = _normal01(_draw(base, c + t * dim))
                    if -2.0 <= z <= 2.0:
                        break
                v = a + b * min(max(z, -2.0), 2.0)
            else:
                v = a
            values[r, c] = v


def init_value_reference(seed, key, column, kind, a, b, dim):
    """Plain-Python twin of ``init_rows`` for one (seed, id, column): returns a float."""
    mask = (1 << 64) - 1
    base = splitmix64_reference(splitmix64_reference(seed & mask) ^ (key & mask))

    def draw(k):
        return splitmix64_reference((base + (k + 1) * 0x9E3779B97F4A7C15) & mask)

    def normal(x):
        u1 = ((x >> 11) + 1.0) * _TWO_POW_M53
        u2 = (splitmix64_reference(x) >> 11) * _TWO_POW_M53
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    if kind == INIT_UNIFORM:
        return a + (b - a) * ((draw(column) >> 11) * _TWO_POW_M53)
    if kind == INIT_NORMAL:
        return a + b * normal(draw(column))
    if kind == INIT_TRUNCATED_NORMAL:
        z = 0.0
        for t in range(_TRUNCATED_RETRIES):
            z = normal(draw(column + t * dim))
            if -2.0 <= z <= 2.0:
                break
        return a + b * min(max(z, -2.0), 2.0)
    return a


@numba.njit(cache=True, nogil=True)
def take_rows(values, rows, out):
    """out[i] = values[rows[i]], or zeros where rows[i] < 0."""
    dim = values.shape[1]
    n = len(rows)
    for i in range(n):
        if i + _AHEAD < n and rows[i + _AHEAD] >= 0:
            prefetch(values, rows[i + _AHEAD])
        r = rows[i]
        if r < 0:
            for c in range(dim):
                out[i, c] = 0.0
        else:
            for c in range(dim):
                out[i, c] = values[r, c]


@numba.njit(cache=True, nogil=True)
def fill_rows(values, start, stop, row):
    """values[start:stop] = row (a template row, e.g. an optimizer state's initial value)."""
    dim = values.shape[1]
    for r in range(start, stop):
        for c in range(dim):
            values[r, c] = row[c]


@numba.njit(cache=True, nogil=True)
def mark_rows(bits, pending, count, rows):
    """Records rows as changed for one tracker; returns the new pending count.

    ``bits`` is a uint8 bitmap over rows (bit set = already pending), ``pending`` the
    int64 list of pending rows (capacity >= count + len(rows)), rows in order of first change.
    """
    for i in range(len(rows)):
        r = rows[i]
        byte = r >> 3
        bit = np.uint8(1 << (r & 7))
        if (bits[byte] & bit) == 0:
            bits[byte] |= bit
            pending[count] = r
            count += 1
    return count


@numba.njit(cache=True, nogil=True)
def clear_marks(bits, rows):
    """Clears the bitmap bits of ``rows`` (after they were handed out)."""
    for i in range(len(rows)):
        r = rows[i]
        bits[r >> 3] &= np.uint8(~(1 << (r & 7)) & 0xFF)
