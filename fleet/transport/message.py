"""The wire format: ``[header, *buffers]``, validated both ways.

The header is a msgpack map::

    {v: PROTOCOL_VERSION, op: str, seq: int, worker: int,
     names: [str], dtypes: [str], shapes: [[int]], ...op-specific fields}

and replies add ``ok: bool`` and, when not ok, ``error: str``. Buffer i is the raw
C-order bytes of array ``names[i]``; arrays never go through msgpack or pickle. On send
each frame is passed to ZeroMQ without a copy; on receive each array is an
``np.frombuffer`` view of its frame (no copy, writable, aligned).

Every check that can fail on hostile input raises ``TransportError`` with a message that
says what is wrong, so a server can answer it as an error reply.
"""
import math

import msgpack
import numpy as np

from fleet.errors import TransportError

PROTOCOL_VERSION = 1
DTYPES = {name: np.dtype(name) for name in ("float32", "int64", "uint8", "float64", "int32")}
RESERVED_KEYS = frozenset(("v", "op", "seq", "worker", "names", "dtypes", "shapes", "ok", "error"))
MAX_HEADER_BYTES = 1 << 20
MAX_ARRAYS = 1 << 16
MAX_NDIM = 32
MAX_OP_CHARS = 128
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Message:
    """A decoded message: its header and its arrays.

    Attributes:
        header: the header dict (op-specific fields included).
        arrays: numpy arrays, one per name, views of the received frames.
    """

    __slots__ = ("header", "arrays")

    def __init__(self, header, arrays):
        self.header = header
        self.arrays = arrays

    op = property(lambda self: self.header["op"], doc="the operation name")
    seq = property(lambda self: self.header["seq"], doc="the request's sequence number")
    worker = property(lambda self: self.header["worker"], doc="the requesting worker's id")
    names = property(lambda self: self.header["names"], doc="names of the arrays, in order")

    @property
    def meta(self):
        """The op-specific header fields (everything but the reserved keys)."""
        return {k: v for k, v in self.header.items() if k not in RESERVED_KEYS}

    def __getitem__(self, name):
        """Returns the array called ``name``."""
        try:
            return self.arrays[self.header["names"].index(name)]
        except ValueError:
            raise KeyError(f"message {self.op!r} has no array {name!r}; it has {self.names}") from None

    def __contains__(self, name):
        return name in self.header["names"]

    def as_dict(self):
        """Returns {name: array}."""
        return dict(zip(self.header["names"], self.arrays))

    def __repr__(self):
        return f"{type(self).__name__}(op={self.op!r}, seq={self.seq}, names={self.names})"


def encode(op, seq, worker, names=(), arrays=(), meta=None, ok=None, error=None, max_bytes=None):
    """Returns the frames ``[header bytes, *array byte views]`` of a message.

    Args:
        op: operation name; seq: sequence number; worker: worker id (ints).
        names, arrays: equally long; unique str names; numpy arrays of an allowed dtype
            (float32, int64, uint8, float64, int32), native byte order, C-contiguous.
        meta: op-specific header fields (str keys, msgpack-able values, no reserved key).
        ok, error: reply status (``None`` for requests).
        max_bytes: refuse a message larger than this (None: no limit).

    Raises:
        TransportError: anything above does not hold (the message names the field or
            array and how to fix it).
    """
    if not isinstance(op, str) or not op or len(op) > MAX_OP_CHARS:
        raise TransportError(f"op {op!r} must be a non-empty string of at most {MAX_OP_CHARS} characters")
    names = list(names)
    arrays = list(arrays)
    if len(names) != len(arrays):
        raise TransportError(f"op {op!r}: {len(names)} names for {len(arrays)} arrays; give one name per array")
    if len(arrays) > MAX_ARRAYS:
        raise TransportError(f"op {op!r}: {len(arrays)} arrays exceed the limit of {MAX_ARRAYS} per message")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise TransportError(f"op {op!r}: array name {dup!r} is used twice; names must be unique")
    dtypes, shapes, buffers = [], [], []
    total = 0
    for name, arr in zip(names, arrays):
        if not isinstance(name, str):
            raise TransportError(f"op {op!r}: array name {name!r} is not a string")
        if not isinstance(arr, np.ndarray):
            raise TransportError(f"op {op!r}: {name!r} is a {type(arr).__name__}, not a numpy array")
        if arr.dtype.name not in DTYPES or not arr.dtype.isnative:
            raise TransportError(
                f"op {op!r}: array {name!r} has dtype {arr.dtype.str}; send one of {sorted(DTYPES)} "
                f"in native byte order (convert with arr.astype(...))"
            )
        if not arr.flags.c_contiguous:
            raise TransportError(
                f"op {op!r}: array {name!r} is not C-contiguous; send np.ascontiguousarray(arr)"
            )
        dtypes.append(arr.dtype.name)
        shapes.append(list(arr.shape))
        buffers.append(arr.reshape(-1).view(np.uint8))
        total += arr.nbytes
    header = {"v": PROTOCOL_VERSION, "op": op, "seq": int(seq), "worker": int(worker),
              "names": names, "dtypes": dtypes, "shapes": shapes}
    if ok is not None:
        header["ok"] = bool(ok)
        if not ok:
            header["error"] = str(error)
    if meta:
        clash = sorted(set(meta) & RESERVED_KEYS)
        if clash or not all(isinstance(k, str) for k in meta):
            raise TransportError(
                f"op {op!r}: meta keys must be strings other than the reserved {sorted(RESERVED_KEYS)}; "
                f"got {clash or list(meta)}"
            )
        header.update(meta)
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TransportError(f"op {op!r}: the header fields cannot be packed ({e}); meta values must be "
                             f"msgpack types (str, int, float, bool, None, bytes, list, dict)") from e
    if len(packed) > MAX_HEADER_BYTES:
        raise TransportError(f"op {op!r}: the header is {len(packed)} bytes, over the limit of {MAX_HEADER_BYTES}; "
                             f"send large data as arrays")
    total += len(packed)
    if max_bytes is not None and total > max_bytes:
        raise TransportError(
            f"op {op!r}: the message is {total} bytes, over the limit of {max_bytes}; split it into "
            f"smaller messages or raise FLEET_MAX_MESSAGE_BYTES on every process"
        )
    return [packed, *buffers]


def decode(frames, max_bytes=None, reply=False):
    """Returns the Message of ``frames`` (a list of zmq.Frame or bytes), checked.

    Args:
        frames: ``[header, *buffers]`` as received.
        max_bytes: refuse a message larger than this (None: no limit).
        reply: also require the reply fields ``ok`` (and ``error`` when not ok).

    Raises:
        TransportError: malformed header, wrong protocol version, frame count or sizes
            that do not match the header, or a message over ``max_bytes``.
    """
    if not frames:
        raise TransportError("empty message: expected a header frame")
    sizes = [_nbytes(f) for f in frames]
    total = sum(sizes)
    if max_bytes is not None and total > max_bytes:
        raise TransportError(f"message of {total} bytes is over the limit of {max_bytes} (FLEET_MAX_MESSAGE_BYTES)")
    if sizes[0] > MAX_HEADER_BYTES:
        raise TransportError(f"header of {sizes[0]} bytes is over the limit of {MAX_HEADER_BYTES}")
    header = _unpack(frames[0])
    try:
        _check_header(header, reply)
    except TransportError:
        raise
    except Exception as e:  # a check met a type it did not expect: still just a bad header
        raise TransportError(f"header has fields of unexpected types ({type(e).__name__}: {e})") from e
    names, dtypes, shapes = header["names"], header["dtypes"], header["shapes"]
    if len(frames) - 1 != len(names):
        raise TransportError(
            f"op {header['op']!r}: header names {len(names)} arrays but {len(frames) - 1} buffer frames followed"
        )
    arrays = []
    for name, dtype_name, shape, frame, size in zip(names, dtypes, shapes, frames[1:], sizes[1:]):
        dtype = DTYPES[dtype_name]
        expected = math.prod(shape) * dtype.itemsize
        if size != expected:
            raise TransportError(
                f"op {header['op']!r}: array {name!r} has {size} bytes but {dtype_name}{shape} needs {expected}"
            )
        arrays.append(_array(frame, dtype, shape, size))
    return Message(header, arrays)


def salvage(frame):
    """Best effort (op, seq, worker) of a malformed message's header, for its error reply."""
    try:
        header = _unpack(frame)
    except TransportError:
        return "?", -1, -1
    if not isinstance(header, dict):
        return "?", -1, -1
    op = header.get("op")
    seq, worker = header.get("seq"), header.get("worker")
    op = op if isinstance(op, str) and 0 < len(op) <= MAX_OP_CHARS else "?"
    seq = seq if _is_int64(seq) else -1
    worker = worker if _is_int64(worker) else -1
    return op, seq, worker


def _nbytes(frame):
    return len(frame.buffer) if hasattr(frame, "buffer") else len(frame)


def _unpack(frame):
    data = frame.bytes if hasattr(frame, "bytes") else bytes(frame)
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, StackError, ValueError...)
        raise TransportError(f"header is not a valid msgpack map ({type(e).__name__}: {e})") from e


def _is_int64(x):
    return isinstance(x, int) and not isinstance(x, bool) and _INT64_MIN <= x <= _INT64_MAX


def _check_header(header, reply):
    if not isinstance(header, dict):
        raise TransportError(f"header is a msgpack {type(header).__name__}, not a map")
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise TransportError(
            f"protocol version {version!r} is not {PROTOCOL_VERSION}, the version this side speaks; "
            f"run the same fleet version on every worker and server"
        )
    op = header.get("op")
    if not isinstance(op, str) or not op or len(op) > MAX_OP_CHARS:
        raise TransportError(f"header field 'op' must be a non-empty string of at most {MAX_OP_CHARS} characters")
    for key in ("seq", "worker"):
        if not _is_int64(header.get(key)):
            raise TransportError(f"op {op!r}: header field {key!r} must be an int64; got {header.get(key)!r:.80}")
    lists = [header.get(key) for key in ("names", "dtypes", "shapes")]
    if not all(isinstance(x, list) for x in lists) or len({len(x) for x in lists}) != 1:
        raise TransportError(f"op {op!r}: header fields names, dtypes and shapes must be lists of equal length")
    names, dtypes, shapes = lists
    if len(names) > MAX_ARRAYS:
        raise TransportError(f"op {op!r}: {len(names)} arrays exceed the limit of {MAX_ARRAYS}")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise TransportError(f"op {op!r}: array names must be unique strings")
    for name, dtype, shape in zip(names, dtypes, shapes):
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise TransportError(f"op {op!r}: array {name!r} has dtype {dtype!r:.40}; allowed are {sorted(DTYPES)}")
        if (not isinstance(shape, list) or len(shape) > MAX_NDIM
                or not all(_is_int64(d) and d >= 0 for d in shape)):
            raise TransportError(f"op {op!r}: array {name!r} has shape {shape!r:.80}; expected a list of "
                                 f"at most {MAX_NDIM} non-negative ints")
    if reply:
        if not isinstance(header.get("ok"), bool):
            raise TransportError(f"reply to {op!r}: header field 'ok' must be a bool")
        if not header["ok"] and not isinstance(header.get("error"), str):
            raise TransportError(f"reply to {op!r}: an error reply needs a string 'error'")


def _array(frame, dtype, shape, size):
    if size == 0:
        return np.zeros(shape, dtype=dtype)
    buffer = frame.buffer if hasattr(frame, "buffer") else frame
    arr = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    if not arr.flags.aligned or not arr.flags.writeable:
        # tiny frames may sit unaligned inside ZeroMQ's message struct; bytes are read-only
        arr = arr.copy()
    return arr
