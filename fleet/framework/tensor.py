"""The two data types that cross layers besides dense arrays: SparseRows and LoDTensor."""
import numpy as np

from fleet.errors import DataError
from fleet.kernels import embedding as emb
from fleet.kernels import sparse as sparse_kernels


class SparseRows:
    """Rows of a tall matrix (Paddle's SelectedRows): ``values[i]`` is row ``rows[i]``.

    Invariant: ``rows`` is int64 [n], ``values`` float32 [n, width], every row in
    [0, height). Rows need not be unique or sorted until merged; merging sums duplicates.
    ``unique``: True when the rows are known to be distinct and ascending (``merged``).
    """

    __slots__ = ("rows", "values", "height", "unique")

    def __init__(self, rows, values, height, unique=False):
        self.rows = rows
        self.values = values
        self.height = int(height)
        self.unique = bool(unique)

    def merged(self):
        """These rows with each id once, ascending, its values summed in the order they
        appear (Paddle's MergeAdd), in new arrays. Stands for the same matrix
        (``to_dense`` is unchanged up to float32 rounding of the sums). Releases the GIL
        while it merges."""
        rows, values = sparse_kernels.merge_rows(np.ascontiguousarray(self.rows, dtype=np.int64),
                                                 np.ascontiguousarray(self.values, dtype=np.float32))
        return SparseRows(rows, values, self.height, unique=True)

    @property
    def width(self):
        return self.values.shape[1]

    def to_dense(self):
        """Returns the float32 [height, width] matrix these rows stand for (duplicates summed)."""
        out = np.zeros((self.height, self.width), dtype=np.float32)
        np.add.at(out, self.rows, self.values)
        return out

    def __repr__(self):
        return f"SparseRows(n={len(self.rows)}, width={self.width}, height={self.height})"


class LoDTensor:
    """A batch of variable-length sequences: ``values[offsets[b]:offsets[b+1]]`` is example b.

    ``values`` is int64 [total] (ids) or float32 [total, width]; ``offsets`` int64 [batch+1],
    starting at 0 and non-decreasing.
    """

    __slots__ = ("values", "offsets")

    def __init__(self, values, offsets):
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_lengths(cls, values, lengths):
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(values, offsets)

    @property
    def lengths(self):
        return np.diff(self.offsets)

    @property
    def batch_size(self):
        return len(self.offsets) - 1

    def __len__(self):
        return self.batch_size

    def __repr__(self):
        return f"LoDTensor(batch={self.batch_size}, total={len(self.values)}, dtype={self.values.dtype})"


def as_lod_tensor(name, value, dtype):
    """Converts a fed lod_level=1 value to a LoDTensor of ``dtype``.

    Accepts a LoDTensor, a ``(values, lengths)`` pair, or a list of per-example sequences.

    Raises:
        DataError: the value is none of these, or lengths do not add up to the values.
    """
    if isinstance(value, LoDTensor):
        values = np.ascontiguousarray(value.values, dtype=dtype)
        return value if values is value.values else LoDTensor(values, value.offsets)
    if isinstance(value, tuple) and len(value) == 2:
        values, lengths = value
        values = np.ascontiguousarray(values, dtype=dtype)
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if values.ndim == 2 and values.shape[1] == 1 and dtype == np.int64:
            values = values.reshape(-1)
        if int(lengths.sum()) != len(values) or (lengths < 0).any():
            raise DataError(
                f"feed {name!r}: lengths {lengths.tolist()[:8]} sum to {int(lengths.sum())} but "
                f"there are {len(values)} values; feed (values, lengths) with one length per example"
            )
        return LoDTensor.from_lengths(values, lengths)
    if isinstance(value, (list, np.ndarray)) and len(value) and all(
        isinstance(seq, (list, tuple, np.ndarray)) for seq in value
    ):
        lengths = [len(seq) for seq in value]
        flat = [np.asarray(seq, dtype=dtype).reshape(len(seq), -1) for seq in value]
        values = np.concatenate(flat) if flat else np.zeros((0,), dtype=dtype)
        if dtype == np.int64 or values.shape[1] == 1:
            values = values.reshape(-1)
        return LoDTensor.from_lengths(np.ascontiguousarray(values), lengths)
    raise DataError(
        f"feed {name!r} is a lod_level=1 input; got {type(value).__name__}. Feed a "
        f"(values, lengths) pair, a list of per-example sequences, or a fleet LoDTensor"
    )


def flat_ids(values):
    """The ids of several ``Ids`` inputs (LoDTensors or arrays; None skipped) as one flat
    int64 array: what a table read for a whole batch needs."""
    parts = []
    for ids in values:
        if isinstance(ids, LoDTensor):
            parts.append(ids.values)
        elif ids is not None:
            parts.append(np.asarray(ids, dtype=np.int64).reshape(-1))
    if not parts:
        return np.zeros(0, np.int64)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


class PrefetchedRows:
    """The rows of a server-side table that one batch needs: ``values[i]`` is row
    ``ids[i]``; ``ids`` sorted and unique. Lookup ops read a table through it on a
    distributed worker (the table itself lives on the servers)."""

    __slots__ = ("ids", "values", "height", "name", "_index")

    def __init__(self, name, ids, values, height):
        self.name = name
        self.ids = ids
        self.values = values
        self.height = int(height)
        self._index = None

    @property
    def shape(self):
        return (self.height, self.values.shape[1])

    def local(self, ids):
        """Maps table row ids (each present in ``self.ids``) to positions in ``values``
        (``np.searchsorted(self.ids, ids)``, through a hash index of ``self.ids`` built on
        the first call: a batch's lookups of one table share it). Thread-safe: threads
        racing on the first call each build the same index."""
        table_ids = np.ascontiguousarray(self.ids, dtype=np.int64)
        if self._index is None:
            self._index = emb.index_sorted_ids(table_ids)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty(ids.shape, dtype=np.int64)
        emb.positions_in_sorted(table_ids, self._index, ids.reshape(-1), out.reshape(-1))
        return out
