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

Memory: 8 bytes per slot (load 0.35-0.7, so 11-23 bytes per row) plus 8 bytes of
``row_ids`` per row.

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

MAX_LOAD = 0.7
"""Fraction of slots in use above which the slot array doubles (rehash)."""

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
    """Returns splitmix64 of the uint64 ``x`` (DESIGN section 6), all modulo 2**64."""
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
def hash_lookup(slots, row_ids, keys, out_rows):
    """Writes the row of each key into ``out_rows`` (-1 for a key not in the index).

    Args:
        slots: uint64 [capacity] slot array (capacity a power of two).
        row_ids: int64 [>= size] id of each row.
        keys: int64 [n] ids to find (any values, repeats allowed).
        out_rows: int64 [n] output.
    """
    mask = np.uint64(len(slots) - 1)
    n = len(keys)
    hashes = np.empty(_RING, dtype=np.uint64)
    for i in range(n + _AHEAD):
        # pipeline front (kept inline: as a function call it is several times slower)
        if i < n:
            h = splitmix64(np.uint64(keys[i]))
            hashes[i & (_RING - 1)] = h
            prefetch(slots, h & mask)
        k = i - _AHEAD // 2
        if k >= 0 and k < n:
            s = slots[hashes[k & (_RING - 1)] & mask]
            if s != 0:
                prefetch(row_ids, np.int64(s & _ROW_MASK) - 1)
        j = i - _AHEAD
        if j >= 0:
            out_rows[j] = _probe(slots, row_ids, keys[j], hashes[j & (_RING - 1)], mask)[1]


@numba.njit(cache=True, nogil=True)
def hash_lookup_or_insert(slots, row_ids, size, keys, out_rows, start, limit):
    """Finds or creates the row of each key from ``keys[start]`` on.

    A new key gets row ``size`` (then size + 1, ...) and its id is written to
    ``row_ids``. Stops early, before creating row number ``limit``, so the caller can
    grow the arrays and call again from the returned position.

    Args:
        slots, row_ids: the index arrays (``len(row_ids) >= limit``).
        size: rows in use.
        keys: int64 [n]; out_rows: int64 [n] output.
        start: first position of ``keys`` to process.
        limit: maximum number of rows allowed after this call.

    Returns:
        (stop, new_size): keys[start:stop] are done; stop < n means "grow and resume".
    """
    mask = np.uint64(len(slots) - 1)
    n = len(keys)
    hashes = np.empty(_RING, dtype=np.uint64)
    for i in range(start, n + _AHEAD):
        # pipeline front, as in hash_lookup
        if i < n:
            h = splitmix64(np.uint64(keys[i]))
            hashes[i & (_RING - 1)] = h
            prefetch(slots, h & mask)
        k = i - _AHEAD // 2
        if k >= start and k < n:
            s = slots[hashes[k & (_RING - 1)] & mask]
            if s != 0:
                prefetch(row_ids, np.int64(s & _ROW_MASK) - 1)
        j = i - _AHEAD
        if j < start:
            continue
        h = hashes[j & (_RING - 1)]
        slot, row = _probe(slots, row_ids, keys[j], h, mask)
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
def hash_rebuild(slots, row_ids, size):
    """Inserts rows 0..size-1 (ids from ``row_ids``) into the empty ``slots`` array."""
    mask = np.uint64(len(slots) - 1)
    hashes = np.empty(_RING, dtype=np.uint64)
    for i in range(size + _AHEAD):
        if i < size:
            h = splitmix64(np.uint64(row_ids[i]))
            hashes[i & (_RING - 1)] = h
            prefetch(slots, h & mask)
        r = i - _AHEAD
        if r < 0:
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


class HashIndex:
    """An int64 id -> int64 row index whose rows are numbered in creation order.

    Not thread-safe: the owning table serializes calls with its lock. Growth is
    amortized: the slot array doubles (one rehash, O(size)) when more than ``MAX_LOAD``
    of it would be used, the id array doubles by copy when full; neither happens per insert.

    Args:
        capacity: rows to make room for before the first growth.
    """

    def __init__(self, capacity=1024):
        capacity = max(int(capacity), 16)
        self.size = 0
        self.slots = np.zeros(_slot_capacity_for(capacity), dtype=np.uint64)
        self.row_ids = np.empty(capacity, dtype=np.int64)

    @property
    def ids(self):
        """int64 [size] view: the id of each row, in row (creation) order."""
        return self.row_ids[: self.size]

    def lookup(self, keys, out=None):
        """Returns the int64 row of each key, -1 for keys not in the index. Creates nothing."""
        keys = _as_ids(keys)
        out = np.empty(len(keys), dtype=np.int64) if out is None else out
        hash_lookup(self.slots, self.row_ids, keys, out)
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
            limit = min(len(self.row_ids), int(len(self.slots) * MAX_LOAD), _MAX_ROWS)
            start, self.size = hash_lookup_or_insert(
                self.slots, self.row_ids, self.size, keys, out, start, limit
            )
            if start == len(keys):
                return out, self.size - before
            if self.size >= _MAX_ROWS:
                raise ConfigError(f"a hash index holds at most {_MAX_ROWS} rows; this one is full")
            self._grow()

    def reserve(self, rows):
        """Makes room for ``rows`` rows in total without further growth."""
        rows = int(rows)
        if rows > _MAX_ROWS:
            raise ConfigError(f"a hash index holds at most {_MAX_ROWS} rows; asked for {rows}")
        if rows > len(self.row_ids):
            self._resize_ids(rows)
        if rows > int(len(self.slots) * MAX_LOAD):
            self._rehash(_slot_capacity_for(rows))

    def load_ids(self, ids):
        """Replaces the content with rows 0..n-1 holding ``ids`` (which must be unique).

        Raises:
            ConfigError: an id appears twice (the message names it).
        """
        ids = _as_ids(ids)
        self.size = 0
        self.slots = np.zeros(_slot_capacity_for(max(len(ids), 16)), dtype=np.uint64)
        self.row_ids = np.empty(max(len(ids), 16), dtype=np.int64)
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
        """Bytes held: the whole slot array plus 8 bytes of id per row in use."""
        return self.slots.nbytes + 8 * self.size

    def _grow(self):
        if self.size >= len(self.row_ids):
            self._resize_ids(2 * len(self.row_ids))
        if self.size >= int(len(self.slots) * MAX_LOAD):
            self._rehash(2 * len(self.slots))

    def _resize_ids(self, capacity):
        # np.empty: pages past `size` are never written, so the OS backs only rows in use
        grown = np.empty(capacity, dtype=np.int64)
        grown[: self.size] = self.row_ids[: self.size]
        self.row_ids = grown

    def _rehash(self, slot_capacity):
        slots = np.zeros(slot_capacity, dtype=np.uint64)
        hash_rebuild(slots, self.row_ids, self.size)
        self.slots = slots


def _slot_capacity_for(rows):
    need = int(math.ceil(rows / MAX_LOAD)) + 1
    return 1 << max(need - 1, 15).bit_length()


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
