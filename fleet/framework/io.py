"""Saving and loading variables: atomic directories with a manifest and checksums.

A saved directory holds one ``.npy`` file per variable and ``MANIFEST.json`` listing each
variable's file, shape, dtype and CRC32. It is written under a temporary name in the same
parent and renamed into place only when complete, so a crash mid-save never leaves a
directory that loads as valid; an existing directory of the same name is replaced only
after the new one is complete.
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
FORMAT = "fleet-vars-1"


def _file_for(name):
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return f"{safe}.{zlib.crc32(name.encode()):08x}.npy"


def _crc(arr):
    return zlib.crc32(np.ascontiguousarray(arr).view(np.uint8).reshape(-1)) & 0xFFFFFFFF


def write_vars(dirname, arrays, extra=None):
    """Writes ``arrays`` ({name: ndarray}) to ``dirname`` atomically.

    Args:
        dirname: the directory to create or replace.
        arrays: the values to save.
        extra: JSON-serialisable metadata stored in the manifest.

    Raises:
        ConfigError: ``dirname`` exists and is not a directory.
    """
    dirname = os.path.abspath(dirname)
    if os.path.exists(dirname) and not os.path.isdir(dirname):
        raise ConfigError(f"cannot save to {dirname!r}: it exists and is not a directory")
    parent = os.path.dirname(dirname)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(dirname)}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        entries = {}
        for name, value in arrays.items():
            arr = np.ascontiguousarray(value)
            fname = _file_for(name)
            with open(os.path.join(tmp, fname), "wb") as f:
                np.save(f, arr, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            entries[name] = {"file": fname, "shape": list(arr.shape), "dtype": arr.dtype.name,
                             "crc32": _crc(arr)}
        manifest = {"format": FORMAT, "time": time.time(), "vars": entries, "extra": extra or {}}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        old = None
        if os.path.isdir(dirname):
            old = os.path.join(parent, f".{os.path.basename(dirname)}.old-{uuid.uuid4().hex[:8]}")
            os.rename(dirname, old)
        os.rename(tmp, dirname)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dirname


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
    with open(path) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def read_vars(dirname, names=None):
    """Reads variables from a saved directory, verifying each checksum.

    Args:
        names: the variables to read (default: all).

    Returns:
        {name: ndarray}.

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
    out = {}
    for name in names:
        entry = entries[name]
        path = os.path.join(dirname, entry["file"])
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {name!r} from {path}: {e}") from e
        if list(arr.shape) != entry["shape"] or arr.dtype.name != entry["dtype"] or _crc(arr) != entry["crc32"]:
            raise DataError(f"{path} does not match its manifest entry for {name!r} (corrupt or altered save)")
        out[name] = arr
    return out
