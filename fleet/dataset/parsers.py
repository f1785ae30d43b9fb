"""Chunk parsers: whole lines of text -> ExampleBlocks, bad lines -> DataError or skipped.

One parser object per producer thread (it keeps scratch buffers); the numba kernels
of ``fleet.kernels.parse`` do the work with the GIL released.
"""
import threading

import numpy as np

from fleet.dataset.block import ExampleBlock
from fleet.errors import DataError
from fleet.kernels import parse as K

_ZERO_MESSAGE = (
    "error: the number of ids can not be zero, you need padding it in data generator; or if "
    "there is something wrong with the data, please check if the data contains unresolvable "
    "characters.")
_MULTISLOT_MAX_LINES = 8192


class BadLines:
    """Counts the lines skipped in a pass and keeps the first message (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self.first = None

    def add(self, message):
        with self._lock:
            self.count += 1
            if self.first is None:
                self.first = message


def _token(buf, err):
    text = bytes(buf[err[K.ERR_TOKEN_START]:err[K.ERR_TOKEN_END]]).decode("utf-8", "replace")
    return repr(text if len(text) <= 40 else text[:37] + "...")


class _ChunkParser:
    """Shared loop: call the kernel, turn its errors into messages, skip or raise."""

    def __init__(self, slots, skip_bad_lines):
        self.slots = slots
        self.skip_bad_lines = skip_bad_lines
        self.err = np.zeros(K.ERR_SIZE, dtype=np.int64)

    def parse(self, buf, end, where, line_base, bad):
        """Parses ``buf[0:end]`` (whole lines; see fleet.kernels.parse for the sentinel).

        Args:
            buf: uint8 array. end: bytes of whole lines at its start.
            where: callable(line_number) -> text naming the file and line for messages.
            line_base: lines of this input before ``buf``.
            bad: BadLines of this producer, updated when lines are skipped.

        Returns:
            (blocks, lines): the parsed examples (a list of ExampleBlock) and the number
            of text lines consumed (blank and skipped ones included).

        Raises:
            DataError: a malformed line, unless the parser skips bad lines.
        """
        blocks = []
        lines = 0
        pos = 0
        while pos < end:
            pos, consumed, block, status = self._run(buf, pos, end)
            if block is not None:
                blocks.append(block)
            lines += consumed
            if status == K.STATUS_ERROR:
                message = f"{where(line_base + lines + 1)}, {self._describe(buf, self.err)}"
                if not self.skip_bad_lines:
                    raise DataError(message)
                bad.add(message)
                lines += 1
                pos = int(self.err[K.ERR_NEXT])
        return blocks, lines


class MultiSlotParser(_ChunkParser):
    """Paddle's MultiSlot text: per slot ``n v1 .. vn``, slots in set_use_var order."""

    def __init__(self, slots, skip_bad_lines, chunk_bytes):
        super().__init__(slots, skip_bad_lines)
        self.slot_float = np.array([int(s.is_float) for s in slots], dtype=np.int64)
        self.slot_width = np.array([s.width for s in slots], dtype=np.int64)
        self.counts = np.zeros((_MULTISLOT_MAX_LINES, len(slots)), dtype=np.int64)
        self._alloc(chunk_bytes // 2 + 64)

    def _alloc(self, capacity):
        self.ivals = np.empty(capacity, dtype=np.int64)
        self.fvals = np.empty(capacity, dtype=np.float32)

    def _run(self, buf, pos, end):
        npos, lines, ex, _, _, status = K.parse_multislot(
            buf, pos, end, self.slot_float, self.slot_width, self.counts, self.ivals,
            self.fvals, self.err)
        if status == K.STATUS_FULL and ex == 0 and npos == pos:
            self._alloc(2 * len(self.ivals))  # one line longer than the scratch buffers
        block = self._columns(ex) if ex else None
        return npos, lines, block, status

    def _columns(self, n):
        counts = self.counts[:n]
        totals = counts.sum(axis=0)
        base = np.zeros(len(self.slots), dtype=np.int64)
        floats = self.slot_float == 1
        for mask in (floats, ~floats):
            sizes = totals[mask]
            base[mask] = np.cumsum(sizes) - sizes
        out_i = np.empty(int(totals[~floats].sum()), dtype=np.int64)
        out_f = np.empty(int(totals[floats].sum()), dtype=np.float32)
        K.columnize_multislot(self.counts, n, self.slot_float, self.ivals, self.fvals, base,
                              out_i, out_f)
        offsets = np.zeros((len(self.slots), n + 1), dtype=np.int64)
        np.cumsum(counts.T, axis=1, out=offsets[:, 1:])
        columns = []
        for s, slot in enumerate(self.slots):
            out = out_f if slot.is_float else out_i
            values = out[base[s]:base[s] + totals[s]]
            if slot.is_dense:
                columns.append((values.reshape(n, slot.width), None))
            else:
                columns.append((values, offsets[s]))
        return ExampleBlock(n, columns)

    def _describe(self, buf, err):
        code = err[K.ERR_CODE]
        field = err[K.ERR_FIELD]
        token = _token(buf, err)
        if field >= len(self.slots):
            return (f"after the last slot: unexpected text {token}; the line has more values "
                    f"than the {len(self.slots)} slots given to set_use_var")
        slot = self.slots[field]
        head = f"slot {slot.name!r}"
        if code == K.E_ZERO_COUNT:
            return f"{head}: {_ZERO_MESSAGE}"
        if code == K.E_MISSING_SLOT:
            names = ", ".join(s.name for s in self.slots)
            return (f"{head}: the line ends before this slot; every line needs all "
                    f"{len(self.slots)} slots given to set_use_var, in order: {names}")
        if code == K.E_BAD_COUNT:
            return (f"{head}: the number of values {token} is not an integer in [1, 2**31); "
                    f"each slot is written as its count n followed by n values")
        if code == K.E_WIDTH:
            return (f"{head}: a dense slot of shape {list(slot.shape[1:])} needs exactly "
                    f"{slot.width} values, the line gives {err[K.ERR_VALUE]}; write "
                    f"{slot.width} values or declare the variable with lod_level=1")
        if code == K.E_TOO_FEW:
            return (f"{head}: the line ends after {err[K.ERR_VALUE]} values but the slot's "
                    f"count announces more; the count and the values disagree")
        if code == K.E_BAD_FLOAT:
            return f"{head}: {token} is not a float (C strtof syntax, e.g. 0.5 or -1.5e-3)"
        if code == K.E_BAD_INT:
            return f"{head}: {token} is not an integer id (int64 slots hold decimal integers)"
        return f"{head}: id {token} does not fit in 64 bits"


class CriteoParser(_ChunkParser):
    """Raw Criteo lines: label, I1..I13, C1..C26, tab-separated, empty fields allowed."""

    def __init__(self, slots, skip_bad_lines, hash_dim):
        super().__init__(slots, skip_bad_lines)
        self.hash_dim = int(hash_dim)
        self.bytes_per_line = 200.0  # running estimate, sizes the output arrays

    def _run(self, buf, pos, end):
        cap = int((end - pos) / self.bytes_per_line * 1.1) + 64
        label = np.empty(cap, dtype=np.int64)
        dense = np.empty((cap, K.CRITEO_DENSE), dtype=np.float32)
        ids = np.empty((K.CRITEO_SPARSE, cap), dtype=np.int64)
        npos, lines, ex, status = K.parse_criteo(
            buf, pos, end, self.hash_dim, K.CRITEO_CONT_MIN, K.CRITEO_CONT_DIFF, label, dense,
            ids, self.err)
        if lines > 16:
            self.bytes_per_line = max(41.0, (npos - pos) / lines)
        block = None
        if ex:
            columns = [(dense[:ex], None)]
            columns += [(ids[k, :ex], None) for k in range(K.CRITEO_SPARSE)]
            columns.append((label[:ex].reshape(ex, 1), None))
            block = ExampleBlock(ex, columns)
        return npos, lines, block, status

    def _field(self, f):
        if f == 0:
            return f"field 'label' (column 1, variable {self.slots[-1].name!r})"
        if f <= K.CRITEO_DENSE:
            return f"field I{f} (column {f + 1}, variable {self.slots[0].name!r}[{f - 1}])"
        k = f - K.CRITEO_DENSE
        return f"field C{k} (column {f + 1}, variable {self.slots[k].name!r})"

    def _describe(self, buf, err):
        code = err[K.ERR_CODE]
        token = _token(buf, err)
        if code == K.E_FIELD_COUNT:
            return (f"a Criteo line has {K.CRITEO_FIELDS} tab-separated fields (label, I1..I13, "
                    f"C1..C26; empty fields allowed), this one has {err[K.ERR_VALUE]}")
        field = self._field(err[K.ERR_FIELD])
        if code == K.E_BAD_LABEL:
            return f"{field}: {token} is not an integer label"
        if code == K.E_BAD_INT:
            return f"{field}: {token} is not an integer"
        if code == K.E_INT_RANGE:
            return f"{field}: {token} does not fit in 64 bits"
        if code == K.E_BAD_HEX:
            return f"{field}: {token} is not a hexadecimal value"
        return f"{field}: {token} is above 2**64 - 1"
