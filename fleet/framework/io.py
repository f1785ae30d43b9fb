"""Saving and loading variables: atomic directories with a manifest and checksums.

A saved directory is laid out as Paddle 1.x lays out ``save_persistables`` /
``save_inference_model``: one file per variable named exactly as the variable (its
content is a ``.npy`` array), or, with ``filename=``, every variable in that one file
(their ``.npy`` records one after another in name order, as Paddle orders a combined
file); named blobs such as ``__model__`` are files of that name. A variable whose name
cannot be a file name (it holds ``/``, is ``.`` or ``..``, is too long, or is a name the
save uses itself) is stored under a sanitised name with its CRC32. ``MANIFEST.json``
lists each variable's file (and offset in a combined file), shape, dtype, size in bytes
and CRC32, so loads are verified. It is written under a temporary name in the same parent and renamed into place
only when complete (files, manifest and directory fsynced first), so a crash mid-save
never leaves a directory that loads as valid; an existing directory of the same name is
replaced only after the new one is complete.

``VarsWriter`` writes such a directory; besides whole arrays it takes arrays streamed in
row chunks (``open_stream``), so a table larger than memory goes to disk chunk by chunk.
``read_vars`` verifies every checksum; with ``mmap=True`` it maps the files instead of
reading them, so a reader that needs a few rows of a large array touches only those
(after one streaming pass for the checksum).
"""
import json
import os
import shutil
import time
import uuid
import zlib

import numpy as np

from fleet.errors import ConfigError, DataError

MANIFEST = "MANIFEST.json"
FORMAT = "fleet-vars-2"
READ_FORMATS = ("fleet-vars-1", FORMAT)  # version 1: sanitised file names, no combined file
_CRC_CHUNK = 16 << 20  # bytes checksummed per step when verifying a mapped file
_NPY_MAGIC = b"\x93NUMPY\x01\x00"


def _sanitised(name):
    safe = "".join(c if c.isalnum() or c in "._-@" else "_" for c in name)[:200]
    return f"{safe}.{zlib.crc32(name.encode()):08x}.npy"


def usable_file_name(name):
    """True when ``name`` can be a file directly inside a save directory."""
    return (isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name
            and "\\" not in name and "\0" not in name and not name.startswith(".")
            and len(name.encode("utf-8", "surrogatepass")) <= 255)


def _crc(arr, crc=0):
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for start in range(0, len(flat), _CRC_CHUNK):
        crc = zlib.crc32(flat[start:start + _CRC_CHUNK], crc)
    return crc & 0xFFFFFFFF


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not every platform opens directories; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _jsonable(value):
    """``value`` with tuples as lists, numpy scalars as Python numbers, other objects as repr."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _npy_header(dtype, shape, size):
    """The bytes of a .npy (version 1.0) header of exactly ``size`` bytes."""
    text = _npy_header_text(dtype, shape)
    room = size - len(_NPY_MAGIC) - 2
    if len(text) + 1 > room:
        raise ConfigError(f"array shape {tuple(shape)} does not fit a {size}-byte .npy header")
    text = text.ljust(room - 1) + "\n"
    return _NPY_MAGIC + room.to_bytes(2, "little") + text.encode("latin1")


def _stream_header_size(dtype, row_shape):
    widest = (10 ** 19,) + tuple(row_shape)  # room for any row count
    need = len(_NPY_MAGIC) + 2 + len(_npy_header_text(dtype, widest)) + 1
    return -(-need // 64) * 64


def _npy_header_text(dtype, shape):
    return "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (
        np.lib.format.dtype_to_descr(np.dtype(dtype)), tuple(int(d) for d in shape))


class ArrayStream:
    """One variable written in row chunks: ``append(rows)`` then ``close()``.

    Made by ``VarsWriter.open_stream``; the file holds the rows appended so far and gets
    its final shape in the header at ``close``. Not thread-safe.
    """

    def __init__(self, writer, name, fname, dtype, row_shape):
        self._writer = writer
        self.name = name
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(int(d) for d in row_shape)
        self.rows = 0
        self._crc = 0
        self._fname = fname
        self._header = _stream_header_size(self.dtype, self.row_shape)
        self._file = open(os.path.join(writer._tmp, fname), "wb")
        self._file.write(b"\0" * self._header)

    def append(self, rows):
        """Appends ``rows`` (shape [n, *row_shape], the stream's dtype; copied if needed).

        Raises:
            DataError: another dtype or row shape (names the variable).
        """
        arr = np.asarray(rows)
        if arr.dtype != self.dtype or arr.shape[1:] != self.row_shape:
            raise DataError(
                f"stream {self.name!r} takes {self.dtype}[n, {', '.join(map(str, self.row_shape))}] rows; "
                f"got {arr.dtype}{list(arr.shape)}")
        arr = np.ascontiguousarray(arr)
        data = arr.reshape(-1).view(np.uint8)
        self._file.write(data)
        self._crc = zlib.crc32(data, self._crc)
        self.rows += arr.shape[0]

    def close(self):
        """Writes the final header and flushes the file to disk."""
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            shape = (self.rows,) + self.row_shape
            f.seek(0)
            f.write(_npy_header(self.dtype, shape, self._header))
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        finally:
            f.close()
        self._writer._record(self.name, self._fname, shape, self.dtype, self._crc & 0xFFFFFFFF, size)

    def _discard(self):
        if self._file is not None:
            self._file.close()
            self._file = None


class VarsWriter:
    """Writes a directory of variables atomically: complete and valid, or not there at all.

    Use as a context manager: leaving the block normally commits (fsync, manifest, rename
    into place, replacing an older directory of the same name); leaving it by an
    exception removes the temporary directory and leaves any older save untouched.

    Args:
        dirname: the directory to create or replace.
        extra: JSON-serialisable metadata stored in the manifest (``extra`` may also be
            updated before the block ends).
        filename: put every variable in this one file (Paddle's ``filename=`` /
            ``params_filename=``), in name order; default: one file per variable, named
            as the variable.

    Raises:
        ConfigError: ``dirname`` exists and is not a directory, or ``filename`` is not a
            plain file name.

    Not thread-safe: one thread writes.
    """

    def __init__(self, dirname, extra=None, filename=None):
        self.dirname = os.path.abspath(dirname)
        if os.path.exists(self.dirname) and not os.path.isdir(self.dirname):
            raise ConfigError(f"cannot save to {self.dirname!r}: it exists and is not a directory")
        if filename is not None and not usable_file_name(filename):
            raise ConfigError(f"filename={filename!r} is not a plain file name; give a name such as "
                              f"'params' (no '/', not hidden, not {MANIFEST!r})")
        self.extra = dict(extra or {})
        self.filename = filename
        self._parent = os.path.dirname(self.dirname)
        self._tmp = None
        self._entries = {}
        self._files = {}
        self._streams = []
        self._used = {MANIFEST} | ({filename} if filename else set())

    def _file_name(self, name, suffix=".npy"):
        """The file ``name`` is stored in: the name itself when it can be a file name and
        is free, else its sanitised form (a hidden part file when combining)."""
        if self.filename is not None and suffix == ".npy":
            fname = f".part-{len(self._used)}.npy"
        elif usable_file_name(name) and name not in self._used:
            fname = name
        else:
            fname = _sanitised(name)[:-4] + suffix
        if fname in self._used:
            raise ConfigError(f"{name!r} would be stored as {fname!r}, which this save already uses; "
                              f"rename the variable")
        self._used.add(fname)
        return fname

    def __enter__(self):
        os.makedirs(self._parent, exist_ok=True)
        self._tmp = os.path.join(self._parent, f".{os.path.basename(self.dirname)}.tmp-{uuid.uuid4().hex[:8]}")
        os.makedirs(self._tmp)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                self._commit()
            except BaseException:
                self._abort()
                raise
        else:
            self._abort()
        return False

    # ------------------------------------------------------------------ writing
    def add(self, name, value):
        """Writes one whole array under ``name``.

        Raises:
            ConfigError: ``name`` was written already.
        """
        self._claim(name)
        arr = np.ascontiguousarray(value)
        fname = self._file_name(name)
        with open(os.path.join(self._tmp, fname), "wb") as f:
            np.save(f, arr, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        self._record(name, fname, arr.shape, arr.dtype, _crc(arr), size)

    def open_stream(self, name, dtype, row_shape=()):
        """Returns an ``ArrayStream`` that writes ``name`` in row chunks; close it before
        the block ends.

        Args:
            dtype: the rows' dtype; row_shape: the shape of one row ([] for a vector).

        Raises:
            ConfigError: ``name`` was written already.
        """
        self._claim(name)
        stream = ArrayStream(self, name, self._file_name(name), dtype, row_shape)
        self._streams.append(stream)
        return stream

    def add_file(self, name, data):
        """Writes the bytes ``data`` as the blob ``name`` (read back with ``read_file``), in
        a file of that name when it is a plain file name.

        Raises:
            ConfigError: ``name`` was written already.
        """
        if name in self._files:
            raise ConfigError(f"file {name!r} is written twice in one save")
        if self._tmp is None:
            raise ConfigError("use VarsWriter as a context manager: with VarsWriter(dirname) as w: ...")
        data = bytes(data)
        fname = self._file_name(name, ".bin")
        with open(os.path.join(self._tmp, fname), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._files[name] = {"file": fname, "bytes": len(data), "crc32": zlib.crc32(data) & 0xFFFFFFFF}

    def _claim(self, name):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"variable names are non-empty strings; got {name!r}")
        if name in self._entries or any(s.name == name for s in self._streams):
            raise ConfigError(f"variable {name!r} is written twice in one save")
        if self._tmp is None:
            raise ConfigError("use VarsWriter as a context manager: with VarsWriter(dirname) as w: ...")

    def _record(self, name, fname, shape, dtype, crc, size):
        self._entries[name] = {"file": fname, "shape": [int(d) for d in shape], "dtype": np.dtype(dtype).name,
                               "crc32": int(crc), "bytes": int(size)}

    # ------------------------------------------------------------------ commit
    def _commit(self):
        open_streams = [s.name for s in self._streams if s._file is not None]
        if open_streams:
            raise ConfigError(f"streams {open_streams} were not closed before the save ended")
        manifest = {"format": FORMAT, "time": time.time(), "vars": self._entries,
                    "files": self._files, "extra": _jsonable(self.extra)}
        if self.filename is not None:
            manifest["combined"] = {self.filename: self._combine()}
        with open(os.path.join(self._tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self._tmp)
        old = None
        if os.path.isdir(self.dirname):
            old = os.path.join(self._parent, f".{os.path.basename(self.dirname)}.old-{uuid.uuid4().hex[:8]}")
            os.rename(self.dirname, old)
        os.rename(self._tmp, self.dirname)
        _fsync_dir(self._parent)
        if old:
            shutil.rmtree(old, ignore_errors=True)

    def _combine(self):
        """Concatenates the part files into ``self.filename`` in name order (Paddle's order
        of a combined file); returns its size."""
        tmp_path = os.path.join(self._tmp, ".combined.tmp")
        offset = 0
        with open(tmp_path, "wb") as out:
            for name in sorted(self._entries):
                entry = self._entries[name]
                part = os.path.join(self._tmp, entry["file"])
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, _CRC_CHUNK)
                os.remove(part)
                entry.update(file=self.filename, offset=offset)
                offset += entry["bytes"]
            out.flush()
            os.fsync(out.fileno())
        os.rename(tmp_path, os.path.join(self._tmp, self.filename))
        return offset

    def _abort(self):
        for stream in self._streams:
            stream._discard()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def write_vars(dirname, arrays, extra=None, filename=None):
    """Writes ``arrays`` ({name: ndarray}) to ``dirname`` atomically.

    Args:
        dirname: the directory to create or replace.
        arrays: the values to save.
        extra: JSON-serialisable metadata stored in the manifest.
        filename: one file for every variable (default: one file per variable, named as
            the variable).

    Returns:
        The absolute path of the directory.

    Raises:
        ConfigError: ``dirname`` exists and is not a directory.
    """
    with VarsWriter(dirname, extra, filename) as writer:
        for name, value in arrays.items():
            writer.add(name, value)
    return writer.dirname


# ---------------------------------------------------------------------- reading
def read_manifest(dirname):
    """Returns the manifest of a saved directory.

    Raises:
        ConfigError: not a directory, or no manifest (not a complete fleet save).
    """
    if not os.path.isdir(dirname):
        raise ConfigError(f"There is no directory named '{dirname}'")
    path = os.path.join(dirname, MANIFEST)
    if not os.path.isfile(path):
        raise ConfigError(
            f"{dirname!r} has no {MANIFEST}: it is not a complete fleet save (an interrupted save "
            f"never gets one); point to a directory written by fleet.save_persistables")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not readable JSON ({e}); the save is damaged") from e
    if not isinstance(manifest, dict) or manifest.get("format") not in READ_FORMATS:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ConfigError(f"{path} has format {found!r}, expected one of {list(READ_FORMATS)}; it was "
                          f"written by another program or a newer fleet (upgrade fleet to read it)")
    return manifest


def check_files(dirname, manifest=None):
    """Checks, without reading them, that every file of a save exists with its recorded size.

    Returns:
        The manifest.

    Raises:
        ConfigError: no complete save at ``dirname``.
        DataError: a file is missing or has another size (names the variable).
    """
    manifest = manifest or read_manifest(dirname)
    entries = list(manifest["vars"].items()) + list(manifest.get("files", {}).items())
    for name, entry in entries:
        _check_size(dirname, name, entry, manifest)
    return manifest


def _check_size(dirname, name, entry, manifest):
    """Raises DataError when the file holding ``name`` is missing or has another size."""
    path = os.path.join(dirname, entry["file"])
    expected = manifest.get("combined", {}).get(entry["file"]) if "offset" in entry else entry.get("bytes")
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataError(f"cannot read {name!r} from {path}: {e}") from e
    if expected is not None and size != expected:
        raise DataError(f"cannot read {name!r} from {path}: it has {size} bytes, the manifest says "
                        f"{expected} (truncated or altered save); save it again or restore the file")


def _read_one(dirname, name, entry, mmap, manifest):
    path = os.path.join(dirname, entry["file"])
    _check_size(dirname, name, entry, manifest)
    try:
        if "offset" in entry:
            arr = _read_record(path, entry["offset"], mmap)
        else:
            arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"cannot read {name!r} from {path}: {e}") from e
    if list(arr.shape) != entry["shape"] or arr.dtype.name != entry["dtype"] or _crc(arr) != entry["crc32"]:
        raise DataError(f"{path} does not match its manifest entry for {name!r} (corrupt or altered save); "
                        f"save it again or restore the file")
    return arr


def _read_record(path, offset, mmap):
    """The ``.npy`` record at byte ``offset`` of a combined file (mapped with ``mmap``)."""
    with open(path, "rb") as f:
        f.seek(offset)
        version = np.lib.format.read_magic(f)
        if version != (1, 0):
            raise ValueError(f"unsupported .npy version {version} at byte {offset}")
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        if fortran or dtype.hasobject:
            raise ValueError(f"the record at byte {offset} is not a C-ordered plain array")
        start = f.tell()
        count = int(np.prod(shape, dtype=np.int64))
        if mmap and count:
            return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape)
        arr = np.fromfile(f, dtype=dtype, count=count)
    if arr.size != count:
        raise ValueError(f"the record at byte {offset} ends early")
    return arr.reshape(shape)


def read_vars(dirname, names=None, mmap=False):
    """Reads variables from a saved directory, verifying each checksum.

    Args:
        names: the variables to read (default: all).
        mmap: map the files read-only instead of reading them (each is still read once,
            in chunks, for its checksum); slices of the result read only what they touch.

    Returns:
        {name: ndarray} (read-only ``numpy.memmap`` with ``mmap``).

    Raises:
        ConfigError: a requested variable is not in the save.
        DataError: a file is missing, truncated or fails its checksum.
    """
    manifest = read_manifest(dirname)
    entries = manifest["vars"]
    names = list(entries) if names is None else list(names)
    missing = [n for n in names if n not in entries]
    if missing:
        raise ConfigError(
            f"{dirname!r} has no saved value for {missing[:5]}; it holds {sorted(entries)[:10]}"
            f"{'...' if len(entries) > 10 else ''}. Save and load with the same program")
    return {name: _read_one(dirname, name, entries[name], mmap, manifest) for name in names}


def read_file(dirname, name):
    """Returns the bytes of blob ``name`` (written by ``VarsWriter.add_file``), verified.

    Raises:
        ConfigError: the save has no such blob.
        DataError: the blob is missing, truncated or fails its checksum.
    """
    manifest = read_manifest(dirname)
    entry = manifest.get("files", {}).get(name)
    if entry is None:
        raise ConfigError(f"{dirname!r} holds no file {name!r}; it holds {sorted(manifest.get('files', {}))}")
    path = os.path.join(dirname, entry["file"])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read {name!r} from {path}: {e}") from e
    if len(data) != entry["bytes"] or zlib.crc32(data) & 0xFFFFFFFF != entry["crc32"]:
        raise DataError(f"{path} does not match its manifest entry for {name!r} (corrupt or altered save)")
    return data


class VarsReader:
    """Reads a saved directory lazily: each variable is mapped (``numpy.memmap``) and its
    checksum verified the first time it is asked for, then kept.

    Args:
        dirname: a directory written by ``VarsWriter`` / ``write_vars``.

    Raises:
        ConfigError: no complete save at ``dirname``.

    Not thread-safe.
    """

    def __init__(self, dirname):
        self.dirname = dirname
        self.manifest = read_manifest(dirname)
        self.entries = self.manifest["vars"]
        self.extra = self.manifest.get("extra", {})
        self._cache = {}

    def __contains__(self, name):
        return name in self.entries

    def names(self):
        return sorted(self.entries)

    def shape(self, name):
        """The saved shape of ``name`` (from the manifest; reads nothing)."""
        return tuple(self._entry(name)["shape"])

    def dtype(self, name):
        return np.dtype(self._entry(name)["dtype"])

    def get(self, name):
        """Returns the read-only mapped array ``name``, verified.

        Raises:
            ConfigError: the save has no ``name`` (the message names it and the save).
            DataError: its file is missing, truncated or fails its checksum.
        """
        arr = self._cache.get(name)
        if arr is None:
            arr = self._cache[name] = _read_one(self.dirname, name, self._entry(name), True, self.manifest)
        return arr

    def _entry(self, name):
        entry = self.entries.get(name)
        if entry is None:
            raise ConfigError(
                f"{self.dirname!r} has no saved value for {name!r}; it holds {sorted(self.entries)[:10]}"
                f"{'...' if len(self.entries) > 10 else ''}. Was it saved from another model or optimizer?")
        return entry
