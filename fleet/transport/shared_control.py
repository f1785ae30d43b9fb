"""The control block of the worker group's shared-memory all_reduce: per-rank progress
words and descriptors in a small segment every rank maps, waited on with Linux futexes.

Rank 0 creates it when the group forms (``SharedSegment``: anonymous, nothing left
behind) and names it in its join message; the others attach. Layout after the segment's
header: the data area (``DATA``: the generation, that is the operation number in which
rank 0 made the current data segment, then that segment's key and size), then one
``RECORD``-byte record per rank: 16 little 32-bit words (``ARRIVED``, ``WRITTEN``,
``REDUCED``: the number of the last operation in which the rank reached that point;
``WROTE``: the generation of the data segment the rank copied its array into before it
arrived, 0 for none; ``DESC_LEN``; for a large array's pipelined all_reduce
``PIECES_WRITTEN``, ``PIECES_REDUCED``, ``PIECES_COPIED``: how many pieces the rank has
copied in, reduced and copied out in operation ``PIECES_CALL``, which it stores after
setting them to 0), then the rank's descriptor of its current call (JSON).

A word is set by one rank only (its own record; the data area by rank 0) and read by the
others, so plain aligned stores and loads suffice where the processor keeps stores in
order and loads in order (x86-64, which ``supported()`` requires): a reader that sees a
word set also sees everything its writer stored before it. Waiting is ``FUTEX_WAIT`` on
the word (shared, not the PRIVATE variant: the ranks are different processes) in slices,
so a waiting rank uses no CPU and the caller checks liveness between slices; every store
is followed by ``FUTEX_WAKE``.

Not thread-safe (the group's lock serializes its use).
"""
import ctypes
import json
import platform

import numpy as np

from fleet.transport.shared_segment import SharedSegment

ARRIVED, WRITTEN, REDUCED, WROTE, DESC_LEN, PIECES_WRITTEN, PIECES_REDUCED, PIECES_COPIED, PIECES_CALL = range(9)
RECORD = 2048  # 64 bytes of words, then the descriptor (a shape of 64 dimensions fits)
DATA = 64  # the data area's bytes, before the records
_WORDS = 16
_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_MASK = 0xFFFF_FFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_syscall = None


def supported():
    """Whether this machine can run the control block: Linux on x86-64 (futexes, and a
    memory order in which plain stores and loads are seen in program order)."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64") and _futex() is not None


def _futex():
    global _syscall
    if _syscall is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.syscall
        except (OSError, AttributeError):
            return None
        fn.restype = ctypes.c_long
        fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_uint32]
        _syscall = fn
    return _syscall


def word(seq):
    """An operation number as stored in a 32-bit word: 1 to 2**32 - 1, never 0 (the
    words' initial value, so no operation is taken as reached before it was)."""
    return seq % _MASK + 1


class ControlBlock:
    """The ranks' progress words and descriptors (see the module docstring).

    Args:
        segment: the SharedSegment holding it.
        size: the number of ranks.
    """

    def __init__(self, segment, size):
        self.segment = segment
        self.size = size
        total = DATA + size * RECORD
        self._u32 = segment.view(np.uint32, total // 4, 0)
        self._u64 = segment.view(np.uint64, total // 8, 0)
        self._u8 = segment.view(np.uint8, total, 0)
        self._base = self._u32.ctypes.data

    @staticmethod
    def nbytes(size):
        """Bytes of the control block of a group of ``size`` ranks."""
        return DATA + size * RECORD

    @classmethod
    def create(cls, size):
        """Creates the control block of a group of ``size`` ranks (TransportError as
        ``SharedSegment.create``)."""
        return cls(SharedSegment.create(cls.nbytes(size), name="fleet-group-control"), size)

    @classmethod
    def attach(cls, key, nbytes, size):
        """Maps the control block rank 0 described (TransportError as ``SharedSegment.attach``)."""
        return cls(SharedSegment.attach(key, nbytes), size)

    def close(self):
        """Unmaps the control block."""
        self._u32 = self._u64 = self._u8 = None
        self.segment.close()

    # ------------------------------------------------------------------ words

    def _index(self, rank, which):
        return (DATA + rank * RECORD) // 4 + which

    def get(self, rank, which):
        """Returns word ``which`` of rank ``rank``'s record."""
        return int(self._u32[self._index(rank, which)])

    def put(self, rank, which, value):
        """Stores ``value`` in word ``which`` of rank ``rank``'s record (no wake-up)."""
        self._u32[self._index(rank, which)] = value & _MASK

    def post(self, rank, which, value):
        """Stores ``value`` and wakes every rank waiting on that word."""
        index = self._index(rank, which)
        self._u32[index] = value & _MASK
        _futex()(_SYS_FUTEX, self._base + 4 * index, _FUTEX_WAKE, 0x7FFF_FFFF, None, None, 0)

    def wait(self, rank, which, value, timeout_s):
        """Waits until word ``which`` of ``rank`` equals ``value``, it changes, a signal
        comes or ``timeout_s`` passes; returns whether it equals ``value``."""
        index = self._index(rank, which)
        value &= _MASK
        seen = int(self._u32[index])
        if seen == value:
            return True
        self.sleep(rank, which, seen, timeout_s)
        return int(self._u32[index]) == value

    def sleep(self, rank, which, seen, timeout_s):
        """Sleeps while word ``which`` of ``rank`` holds ``seen``, until a wake-up of that
        word, a signal or ``timeout_s``; returns at once if it no longer holds ``seen``
        (so no wake-up is lost)."""
        seconds = max(0.0, timeout_s)
        spec = _Timespec(int(seconds), int((seconds - int(seconds)) * 1e9))
        index = self._index(rank, which)
        _futex()(_SYS_FUTEX, self._base + 4 * index, _FUTEX_WAIT, seen & _MASK, ctypes.byref(spec), None, 0)

    # ------------------------------------------------------------------ descriptors

    def put_desc(self, rank, data):
        """Stores ``data`` (bytes) as rank ``rank``'s descriptor.

        Raises:
            ValueError: it does not fit in a record.
        """
        room = RECORD - 4 * _WORDS
        if len(data) > room:
            raise ValueError(f"a descriptor of {len(data)} bytes does not fit in {room}")
        start = DATA + rank * RECORD + 4 * _WORDS
        self._u8[start:start + len(data)] = np.frombuffer(data, np.uint8)
        self.put(rank, DESC_LEN, len(data))

    def desc_bytes(self, rank):
        """Returns rank ``rank``'s descriptor as stored (bytes)."""
        start = DATA + rank * RECORD + 4 * _WORDS
        return self._u8[start:start + self.get(rank, DESC_LEN)].tobytes()

    def desc(self, rank):
        """Returns rank ``rank``'s descriptor (a dict), or None if it does not decode."""
        try:
            return json.loads(self.desc_bytes(rank))
        except ValueError:
            return None

    # ------------------------------------------------------------------ the data segment

    def publish_data(self, key, nbytes, generation):
        """Rank 0: names the current data segment (``key`` [pid, fd, random], ``nbytes``)
        and its ``generation``, stored last (see the module docstring)."""
        self._u64[1:5] = [key[0], key[1], key[2], nbytes]
        self._u32[0] = generation & _MASK

    def generation(self):
        """The generation of the data segment rank 0 published last (0: none yet)."""
        return int(self._u32[0])

    def data(self):
        """Returns (generation, key, nbytes) of the published data segment."""
        pid, fd, number, nbytes = (int(v) for v in self._u64[1:5])
        return self.generation(), [pid, fd, number], nbytes


def encode_desc(desc):
    """A descriptor as the bytes ``put_desc`` stores: the same dict gives the same bytes."""
    return json.dumps(desc, sort_keys=True, separators=(",", ":")).encode()

