"""Save modes and the chain of saves they form (Paddle 2.x's save modes).

``fleet.save_persistables(exe, dirname, mode=...)`` writes one of:

- mode 0 (``ALL``): every row of every table;
- mode 1 (``DELTA``): of each distributed table, the rows changed since its previous
  committed save of any mode, and the ids deleted since (``<table>@deleted``);
- mode 2 (``BASE``): of each table with statistics, the rows worth keeping (score >=
  base_threshold and unseen_days <= delta_keep_days).

A chain is a mode-0 or mode-2 save (its base, sequence 0) followed by mode-1 saves, each
recording the save it follows. The manifest's ``extra["chain"]`` holds::

    {"mode": 0 | 1 | 2, "id": chain id (the base's save_id), "sequence": 0, 1, ...,
     "save_id": this save's id,
     "parent": None | {"save_id": the previous save's id,
                       "dirname": its directory relative to this save's parent directory}}

A save written before save modes existed (no ``chain`` record) counts as a mode-0 base.
``resolve_chain(dirname)`` walks from any save back to its base and checks every link, so
loading a delta loads base then every delta in order.
"""
import os

from fleet.errors import ConfigError
from fleet.framework import io as fio

ALL, DELTA, BASE = 0, 1, 2
SAVE_MODES = (ALL, DELTA, BASE)
_MAX_LINKS = 100000  # a chain longer than this is a cycle of hand-edited manifests


def check_save_mode(mode):
    """Returns ``mode`` as an int after checking it is 0, 1 or 2.

    Raises:
        ConfigError: any other value (names it and the modes).
    """
    if isinstance(mode, bool) or not isinstance(mode, int) or mode not in SAVE_MODES:
        raise ConfigError(f"save mode {mode!r} is not one of 0 (every row), 1 (delta: rows changed since the "
                          f"previous save, and the ids deleted since) or 2 (base: rows passing base_threshold)")
    return int(mode)


def chain_of(manifest, dirname):
    """The chain record of a save's manifest (a legacy save: a mode-0 base of its own)."""
    extra = manifest.get("extra", {})
    record = extra.get("chain")
    if record is None:
        save_id = extra.get("save_id") or os.path.abspath(dirname)
        return {"mode": ALL, "id": save_id, "sequence": 0, "save_id": save_id, "parent": None}
    return record


def read_chain(dirname):
    """The chain record of the save at ``dirname``.

    Raises:
        ConfigError: no complete save there.
    """
    return chain_of(fio.read_manifest(dirname), dirname)


def new_link(mode, save_id, dirname, parent=None, parent_dirname=None):
    """The chain record of a new save.

    Args:
        mode: 0, 1 or 2; save_id: the new save's id; dirname: where it is written.
        parent: for a delta, the chain record of the save it follows; parent_dirname:
            that save's directory.

    Raises:
        ConfigError: a delta without a previous save, or written over the save it follows.
    """
    mode = check_save_mode(mode)
    if mode != DELTA:
        return {"mode": mode, "id": save_id, "sequence": 0, "save_id": save_id, "parent": None}
    if parent is None:
        raise ConfigError(
            f"save_persistables(mode=1) to {dirname!r} saves the changes since the previous save, but this job "
            f"has none (no save of mode 0, 1 or 2 was committed and no checkpoint was loaded): save a base "
            f"first (mode=0 for every row, mode=2 for the rows passing base_threshold)")
    here, there = os.path.abspath(dirname), os.path.abspath(parent_dirname)
    if here == there:
        raise ConfigError(f"save_persistables(mode=1) to {dirname!r} would replace the save it follows, which is "
                          f"in that directory; write each delta to a directory of its own")
    return {"mode": DELTA, "id": parent["id"], "sequence": int(parent["sequence"]) + 1, "save_id": save_id,
            "parent": {"save_id": parent["save_id"], "dirname": os.path.relpath(there, os.path.dirname(here))}}


def resolve_chain(dirname):
    """The directories to load for the save at ``dirname``: its base, then every delta up
    to it, in order, each link checked.

    Returns:
        [absolute directory], base first, ``dirname`` last.

    Raises:
        ConfigError: a link is missing, belongs to another chain or is out of order (the
            message names the directories and what to do).
    """
    here = os.path.abspath(dirname)
    record = read_chain(here)
    dirs = [here]
    while record.get("mode") == DELTA:
        link = record.get("parent") or {}
        parent_dir = os.path.normpath(os.path.join(os.path.dirname(here), str(link.get("dirname"))))
        what = f"delta save {here!r} (sequence {record['sequence']} of chain {record['id']})"
        if not os.path.isfile(os.path.join(parent_dir, fio.MANIFEST)):
            raise ConfigError(
                f"{what} follows the save in {parent_dir!r}, which is missing or incomplete: restore that "
                f"directory (a chain loads its base and every delta in order), or load the chain's base or a "
                f"newer base (a mode 0 or 2 save) instead")
        parent = read_chain(parent_dir)
        if parent.get("save_id") != link.get("save_id"):
            if parent.get("id") != record["id"]:
                raise ConfigError(
                    f"{what} follows save {link.get('save_id')} in {parent_dir!r}, but that directory holds a save "
                    f"of another chain ({parent.get('id')}, sequence {parent.get('sequence')}): it was "
                    f"overwritten; restore the chain's save there, or load a base of the chain you want")
            raise ConfigError(
                f"{what} follows sequence {record['sequence'] - 1}, but {parent_dir!r} holds sequence "
                f"{parent.get('sequence')} of that chain (save {parent.get('save_id')}): the deltas are out of "
                f"order (that directory was saved to again); restore the save it follows, or load up to "
                f"{parent_dir!r} only")
        if int(parent.get("sequence", -1)) != int(record["sequence"]) - 1:
            raise ConfigError(
                f"{what} follows {parent_dir!r}, which has sequence {parent.get('sequence')} instead of "
                f"{record['sequence'] - 1}: the chain's records are out of order; load a base instead")
        here, record = parent_dir, parent
        dirs.insert(0, here)
        if len(dirs) > _MAX_LINKS:
            raise ConfigError(f"the chain of {dirname!r} has more than {_MAX_LINKS} links; its manifests loop")
    return dirs


def check_next_delta(reader, loaded, who):
    """Checks that the save of ``reader`` (a ``VarsReader``) is a delta that follows the
    save ``loaded`` ({"save_id", "dirname"}: what ``who`` holds), for loading it onto it.

    Raises:
        ConfigError: not a delta, or a delta of another save (names both and the fix).
    """
    record = chain_of(reader.manifest, reader.dirname)
    if record.get("mode") != DELTA:
        raise ConfigError(f"load_model({reader.dirname!r}, mode=1) applies a delta, but that directory holds a "
                          f"mode-{record.get('mode')} save: load it with mode=0")
    parent = (record.get("parent") or {}).get("save_id")
    if parent != loaded.get("save_id"):
        raise ConfigError(
            f"load_model({reader.dirname!r}, mode=1): that delta (sequence {record.get('sequence')} of chain "
            f"{record.get('id')}) follows save {parent}, but the save {who} hold is {loaded.get('save_id')} "
            f"({loaded.get('dirname') or 'nothing loaded'}): apply a chain's deltas in order after the save "
            f"loaded, or load the delta with mode=0 (its whole chain)")
