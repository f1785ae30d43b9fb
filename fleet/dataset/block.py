"""ExampleBlock: many parsed examples stored by column, cut into batches without copies."""
import json
import struct

import numpy as np

from fleet.errors import DataError
from fleet.framework.tensor import LoDTensor

_MAGIC = b"FLDB"
_HEAD = struct.Struct("<4sI")


class ExampleBlock:
    """``n`` examples, one column per slot, in ``set_use_var`` order.

    A column is ``(values, offsets)``: with ``offsets`` None, ``values`` has one row
    per example (a dense slot's [n, width] array, or a sequence slot holding exactly one
    value per example, as Criteo's C1..C26); otherwise ``values`` is flat and example i
    is ``values[offsets[i]:offsets[i + 1]]`` (offsets int64 [n + 1], starting at 0).

    Blocks are immutable by convention: ``slice`` returns views that share memory.
    Thread-safety: safe to read from many threads.
    """

    __slots__ = ("n", "columns")

    def __init__(self, n, columns):
        self.n = int(n)
        self.columns = columns

    def __len__(self):
        return self.n

    @property
    def nbytes(self):
        total = 0
        for values, offsets in self.columns:
            total += values.nbytes + (0 if offsets is None else offsets.nbytes)
        return total

    def slice(self, a, b):
        """Examples [a, b) as a new block of views (only sequence offsets are new)."""
        columns = []
        for values, offsets in self.columns:
            if offsets is None:
                columns.append((values[a:b], None))
            else:
                lo, hi = offsets[a], offsets[b]
                columns.append((values[lo:hi], offsets[a:b + 1] - lo))
        return ExampleBlock(b - a, columns)

    def take(self, index):
        """The examples at ``index`` (int64 array), in that order, as a new block."""
        index = np.asarray(index, dtype=np.int64)
        columns = []
        for values, offsets in self.columns:
            if offsets is None:
                columns.append((values[index], None))
                continue
            starts = offsets[index]
            lengths = offsets[index + 1] - starts
            new_offsets = np.zeros(len(index) + 1, dtype=np.int64)
            np.cumsum(lengths, out=new_offsets[1:])
            positions = np.repeat(starts - new_offsets[:-1], lengths)
            positions += np.arange(new_offsets[-1], dtype=np.int64)
            columns.append((values[positions], new_offsets))
        return ExampleBlock(len(index), columns)

    @staticmethod
    def concat(blocks):
        """One block holding the examples of ``blocks`` (non-empty list) in order."""
        if len(blocks) == 1:
            return blocks[0]
        n = sum(b.n for b in blocks)
        columns = []
        for parts in zip(*(b.columns for b in blocks)):
            values = np.concatenate([p[0] for p in parts])
            if all(p[1] is None for p in parts):
                columns.append((values, None))
                continue
            offsets = np.zeros(n + 1, dtype=np.int64)
            at = 0
            base = 0
            for (vals, offs) in parts:
                k = len(vals) if offs is None else len(offs) - 1
                offs = np.arange(k + 1, dtype=np.int64) if offs is None else offs
                offsets[at + 1:at + k + 1] = offs[1:] + base
                at += k
                base += offs[-1]
            columns.append((values, offsets))
        return ExampleBlock(n, columns)

    @staticmethod
    def empty(slots):
        """A block with no examples and the columns ``slots`` describe."""
        columns = []
        for slot in slots:
            if slot.is_dense:
                columns.append((np.zeros((0, slot.width), dtype=slot.np_dtype), None))
            else:
                columns.append((np.zeros(0, dtype=slot.np_dtype), np.zeros(1, dtype=np.int64)))
        return ExampleBlock(0, columns)

    def to_feed(self, slots):
        """The feed dict of this block as one batch.

        Returns:
            {slot.name: value}: a C-contiguous [n, *shape[1:]] array for dense slots, a
            ``LoDTensor(values, offsets)`` for lod_level=1 slots.
        """
        feed = {}
        ones = None
        for slot, (values, offsets) in zip(slots, self.columns):
            if slot.is_dense:
                feed[slot.name] = values.reshape((self.n,) + slot.shape[1:])
                continue
            if offsets is None:
                if ones is None:  # shared by every one-value-per-example slot of the batch
                    ones = np.arange(self.n + 1, dtype=np.int64)
                offsets = ones
            feed[slot.name] = LoDTensor(values.reshape(-1), offsets)
        return feed

    def to_bytes(self):
        """Serializes the block: a small JSON header and the raw column arrays."""
        header = {"n": self.n, "columns": []}
        buffers = []
        for values, offsets in self.columns:
            header["columns"].append(
                [values.dtype.str, list(values.shape), offsets is not None])
            buffers.append(np.ascontiguousarray(values))
            if offsets is not None:
                buffers.append(np.ascontiguousarray(offsets))
        head = json.dumps(header, separators=(",", ":")).encode()
        return b"".join([_HEAD.pack(_MAGIC, len(head)), head] + [b.tobytes() for b in buffers])

    @staticmethod
    def from_bytes(data):
        """Inverse of ``to_bytes``; arrays are read-only views of ``data``.

        Raises:
            DataError: ``data`` is not a serialized block.
        """
        view = memoryview(data)
        if len(view) < _HEAD.size:
            raise DataError(f"a shuffled block of {len(view)} bytes is too short to be a block")
        magic, head_len = _HEAD.unpack_from(view)
        if magic != _MAGIC:
            raise DataError(f"a shuffled block starts with {bytes(magic)!r}, not {_MAGIC!r}")
        header = json.loads(bytes(view[_HEAD.size:_HEAD.size + head_len]))
        at = _HEAD.size + head_len
        n = header["n"]
        columns = []
        for dtype, shape, has_offsets in header["columns"]:
            count = int(np.prod(shape))
            values = np.frombuffer(view, dtype=dtype, count=count, offset=at).reshape(shape)
            at += values.nbytes
            offsets = None
            if has_offsets:
                offsets = np.frombuffer(view, dtype=np.int64, count=n + 1, offset=at)
                at += offsets.nbytes
            columns.append((values, offsets))
        if at != len(view):
            raise DataError(f"a shuffled block has {len(view) - at} bytes after its last column")
        return ExampleBlock(n, columns)
