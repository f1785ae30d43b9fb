"""The chain of saves (fleet.framework.save_chain): records, walking a delta back to its
base, and the errors for a missing, foreign or out-of-order link."""
import os
import shutil
import uuid

import numpy as np
import pytest

from fleet.errors import ConfigError
from fleet.framework import io as fio
from fleet.framework.save_chain import check_save_mode, new_link, read_chain, resolve_chain


def _save(dirname, mode, parent_dir=None):
    save_id = uuid.uuid4().hex
    parent = read_chain(parent_dir) if parent_dir is not None else None
    link = new_link(mode, save_id, str(dirname), parent, None if parent_dir is None else str(parent_dir))
    fio.write_vars(str(dirname), {"w": np.zeros(2, np.float32)}, {"save_id": save_id, "chain": link})
    return link


def test_a_base_starts_a_chain_and_each_delta_records_the_save_it_follows(tmp_path):
    base = _save(tmp_path / "base", 2)
    d1 = _save(tmp_path / "deltas" / "d1", 1, tmp_path / "base")
    d2 = _save(tmp_path / "deltas" / "d2", 1, tmp_path / "deltas" / "d1")
    assert base == {"mode": 2, "id": base["save_id"], "sequence": 0, "save_id": base["save_id"], "parent": None}
    assert (d1["mode"], d1["id"], d1["sequence"]) == (1, base["id"], 1)
    assert d1["parent"] == {"save_id": base["save_id"], "dirname": os.path.join("..", "base")}
    assert d2["parent"] == {"save_id": d1["save_id"], "dirname": "d1"} and d2["sequence"] == 2
    assert resolve_chain(tmp_path / "deltas" / "d2") == [str(tmp_path / "base"), str(tmp_path / "deltas" / "d1"),
                                                        str(tmp_path / "deltas" / "d2")]
    assert resolve_chain(tmp_path / "base") == [str(tmp_path / "base")]


def test_a_chain_moved_as_a_whole_still_resolves(tmp_path):
    _save(tmp_path / "a" / "base", 0)
    _save(tmp_path / "a" / "d1", 1, tmp_path / "a" / "base")
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    assert resolve_chain(tmp_path / "b" / "d1") == [str(tmp_path / "b" / "base"), str(tmp_path / "b" / "d1")]


def test_a_save_without_a_chain_record_is_a_base_of_its_own(tmp_path):
    fio.write_vars(str(tmp_path / "old"), {"w": np.zeros(2, np.float32)}, {"save_id": "abc"})
    assert read_chain(tmp_path / "old") == {"mode": 0, "id": "abc", "sequence": 0, "save_id": "abc", "parent": None}
    _save(tmp_path / "d1", 1, tmp_path / "old")
    assert resolve_chain(tmp_path / "d1") == [str(tmp_path / "old"), str(tmp_path / "d1")]


def test_a_missing_link_is_an_error_naming_it_and_the_fix(tmp_path):
    _save(tmp_path / "base", 0)
    d1 = _save(tmp_path / "d1", 1, tmp_path / "base")
    _save(tmp_path / "d2", 1, tmp_path / "d1")
    shutil.rmtree(tmp_path / "d1")
    with pytest.raises(ConfigError, match=(
            rf"delta save '{tmp_path / 'd2'}' \(sequence 2 of chain {d1['id']}\) follows the save in "
            rf"'{tmp_path / 'd1'}', which is missing or incomplete: restore that directory")):
        resolve_chain(tmp_path / "d2")


def test_a_link_overwritten_by_another_chain_is_an_error(tmp_path):
    _save(tmp_path / "base", 0)
    d1 = _save(tmp_path / "d1", 1, tmp_path / "base")
    _save(tmp_path / "d2", 1, tmp_path / "d1")
    other = _save(tmp_path / "d1", 0)  # a new base written over d1
    with pytest.raises(ConfigError, match=(
            rf"follows save {d1['save_id']} in '{tmp_path / 'd1'}', but that directory holds a save of another "
            rf"chain \({other['id']}, sequence 0\): it was overwritten")):
        resolve_chain(tmp_path / "d2")


def test_an_out_of_order_delta_is_an_error(tmp_path):
    _save(tmp_path / "base", 0)
    _save(tmp_path / "d1", 1, tmp_path / "base")
    _save(tmp_path / "d2", 1, tmp_path / "d1")
    _save(tmp_path / "d3", 1, tmp_path / "d2")
    _save(tmp_path / "d2", 1, tmp_path / "d3")  # d2 saved again, after d3: sequence 4
    with pytest.raises(ConfigError, match=(
            rf"delta save '{tmp_path / 'd3'}' \(sequence 3 of chain \w+\) follows sequence 2, but "
            rf"'{tmp_path / 'd2'}' holds sequence 4 of that chain \(save \w+\): the deltas are out of order")):
        resolve_chain(tmp_path / "d3")


def test_a_delta_needs_a_previous_save_in_another_directory(tmp_path):
    base = _save(tmp_path / "base", 0)
    with pytest.raises(ConfigError, match=r"save_persistables\(mode=1\) to 'x' saves the changes since the "
                                          r"previous save, but this job has none .* save a base first"):
        new_link(1, "id", "x")
    with pytest.raises(ConfigError, match="would replace the save it follows, which is in that directory"):
        new_link(1, "id", str(tmp_path / "base"), base, str(tmp_path / "base"))


@pytest.mark.parametrize("mode", [3, -1, "1", True, None, 1.0])
def test_a_save_mode_other_than_0_1_2_is_refused(mode):
    with pytest.raises(ConfigError, match=rf"save mode {mode!r} is not one of 0 \(every row\), 1 \(delta"):
        check_save_mode(mode)
