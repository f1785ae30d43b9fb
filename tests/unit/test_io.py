"""fleet.framework.io: saved directories are complete or absent, verified on load."""
import json
import os

import numpy as np
import pytest

from fleet.errors import ConfigError, DataError
from fleet.framework import io as fio


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "fc_0.w_0": rng.normal(size=(5, 3)).astype(np.float32),
        "emb/table@weird name": rng.normal(size=(7, 2)).astype(np.float32),
        "emb_table@weird_name": np.arange(4, dtype=np.float32),  # sanitises like the one above
        "auc.stat_pos_0": np.arange(10, dtype=np.int64),
        "w_beta1_pow_0": np.array([0.9 ** 3], dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def _listing(parent):
    return sorted(os.listdir(parent))


def test_written_variables_read_back_bit_for_bit_with_dtype_and_shape(tmp_path):
    arrays = _arrays()
    target = fio.write_vars(str(tmp_path / "model"), arrays, {"epoch": 3})
    assert target == str(tmp_path / "model")
    back = fio.read_vars(target)
    assert sorted(back) == sorted(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
    manifest = fio.read_manifest(target)
    assert manifest["format"] == fio.FORMAT and manifest["extra"] == {"epoch": 3}
    assert len({e["file"] for e in manifest["vars"].values()}) == len(arrays)


def test_read_vars_reads_only_the_names_asked_for(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays())
    assert list(fio.read_vars(target, ["fc_0.w_0"])) == ["fc_0.w_0"]
    with pytest.raises(ConfigError, match=r"has no saved value for \['nope'\]; it holds \[.*'fc_0.w_0'"):
        fio.read_vars(target, ["fc_0.w_0", "nope"])


def test_saving_over_a_directory_replaces_it_atomically_and_leaves_no_temporaries(tmp_path):
    target = str(tmp_path / "model")
    fio.write_vars(target, {"a": np.ones(3, np.float32), "old_only": np.zeros(2, np.float32)})
    fio.write_vars(target, {"a": np.full(3, 2.0, np.float32)})
    assert _listing(tmp_path) == ["model"]
    back = fio.read_vars(target)
    assert list(back) == ["a"]
    np.testing.assert_array_equal(back["a"], [2, 2, 2])
    assert all(not f.startswith(".") for f in os.listdir(target))


def _fail_on_second_save(monkeypatch):
    calls = {"n": 0}
    real = np.save

    def flaky(f, arr, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(f, arr, **kw)

    monkeypatch.setattr(fio.np, "save", flaky)


def test_a_save_that_fails_midway_leaves_the_previous_save_intact_and_no_temporaries(tmp_path, monkeypatch):
    target = str(tmp_path / "model")
    fio.write_vars(target, {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    _fail_on_second_save(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        fio.write_vars(target, {"a": np.full(3, 5.0, np.float32), "b": np.zeros(2, np.float32)})
    assert _listing(tmp_path) == ["model"]
    np.testing.assert_array_equal(fio.read_vars(target)["a"], [1, 1, 1])


def test_a_first_save_that_fails_midway_leaves_no_directory(tmp_path, monkeypatch):
    _fail_on_second_save(monkeypatch)
    with pytest.raises(OSError):
        fio.write_vars(str(tmp_path / "model"), {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    assert _listing(tmp_path) == []


def test_a_save_killed_before_cleanup_never_looks_like_a_valid_save(tmp_path, monkeypatch):
    # A process killed mid-save runs no cleanup: simulate it by making the cleanup a no-op.
    _fail_on_second_save(monkeypatch)
    monkeypatch.setattr(fio.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(OSError):
        fio.write_vars(str(tmp_path / "model"), {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)})
    assert not (tmp_path / "model").exists()
    (leftover,) = _listing(tmp_path)
    assert leftover.startswith(".model.tmp-")
    with pytest.raises(ConfigError, match="has no MANIFEST.json: it is not a complete fleet save"):
        fio.read_vars(str(tmp_path / leftover))


def test_a_missing_or_foreign_manifest_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^There is no directory named '.*nowhere'$"):
        fio.read_manifest(str(tmp_path / "nowhere"))
    (tmp_path / "bare").mkdir()
    with pytest.raises(ConfigError, match="has no MANIFEST.json"):
        fio.read_manifest(str(tmp_path / "bare"))
    target = fio.write_vars(str(tmp_path / "m"), {"a": np.ones(1, np.float32)})
    path = os.path.join(target, fio.MANIFEST)
    manifest = json.load(open(path))
    manifest["format"] = "paddle-lodtensor"
    json.dump(manifest, open(path, "w"))
    with pytest.raises(ConfigError, match=r"has format 'paddle-lodtensor', expected one of \['fleet-vars-1', 'fleet-vars-2'\]"):
        fio.read_manifest(target)


def _file_of(target, name):
    return os.path.join(target, fio.read_manifest(target)["vars"][name]["file"])


def test_a_truncated_file_is_a_data_error_naming_the_variable(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays())
    path = _file_of(target, "fc_0.w_0")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cannot read 'fc_0.w_0' from "):
        fio.read_vars(target)


def test_a_flipped_bit_is_caught_by_the_checksum(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays())
    path = _file_of(target, "auc.stat_pos_0")
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(DataError, match=r"does not match its manifest entry for 'auc.stat_pos_0'"):
        fio.read_vars(target)
    assert list(fio.read_vars(target, ["fc_0.w_0"])) == ["fc_0.w_0"]  # the others still load


def test_a_deleted_file_is_a_data_error(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays())
    os.remove(_file_of(target, "empty"))
    with pytest.raises(DataError, match=r"cannot read 'empty'"):
        fio.read_vars(target)


def test_saving_onto_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        fio.write_vars(str(tmp_path / "f"), {"a": np.ones(1, np.float32)})


def test_a_save_creates_missing_parent_directories(tmp_path):
    target = fio.write_vars(str(tmp_path / "a" / "b" / "epoch_0"), {"a": np.ones(1, np.float32)})
    assert os.path.isfile(os.path.join(target, fio.MANIFEST))


# ------------------------------------------------------------------ streaming and blobs
def test_arrays_streamed_in_chunks_read_back_like_whole_arrays(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.normal(size=(1000, 3, 2)).astype(np.float32)
    ids = rng.integers(-2**63, 2**63 - 1, 1000, dtype=np.int64)
    with fio.VarsWriter(str(tmp_path / "m"), {"step": 7}) as w:
        sv = w.open_stream("t@values", np.float32, (3, 2))
        si = w.open_stream("t@ids", np.int64)
        for start in range(0, 1000, 333):
            sv.append(values[start:start + 333])
            si.append(ids[start:start + 333])
        sv.close()
        si.close()
        w.add("whole", values)
        empty = w.open_stream("none@ids", np.int64)
        empty.close()
    back = fio.read_vars(str(tmp_path / "m"))
    np.testing.assert_array_equal(back["t@values"], values)
    np.testing.assert_array_equal(back["t@ids"], ids)
    assert back["none@ids"].shape == (0,) and back["none@ids"].dtype == np.int64
    manifest = fio.read_manifest(str(tmp_path / "m"))
    # a streamed array's checksum is the one a whole array of the same content gets
    assert manifest["vars"]["t@values"]["crc32"] == manifest["vars"]["whole"]["crc32"]
    assert manifest["extra"] == {"step": 7}
    mapped = fio.read_vars(str(tmp_path / "m"), ["t@values"], mmap=True)["t@values"]
    assert isinstance(mapped, np.memmap)
    np.testing.assert_array_equal(mapped[10:20], values[10:20])


def test_a_stream_refuses_rows_of_another_dtype_or_shape_naming_it(tmp_path):
    with pytest.raises(DataError, match=r"stream 't' takes float32\[n, 3\] rows; got float64\[2, 3\]"):
        with fio.VarsWriter(str(tmp_path / "m")) as w:
            w.open_stream("t", np.float32, (3,)).append(np.zeros((2, 3)))
    assert _listing(tmp_path) == []


def test_a_save_with_an_unclosed_stream_is_not_committed(tmp_path):
    with pytest.raises(ConfigError, match=r"streams \['t'\] were not closed before the save ended"):
        with fio.VarsWriter(str(tmp_path / "m")) as w:
            w.open_stream("t", np.float32, (3,)).append(np.zeros((2, 3), np.float32))
    assert _listing(tmp_path) == []


def test_a_name_written_twice_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"variable 'a' is written twice in one save"):
        with fio.VarsWriter(str(tmp_path / "m")) as w:
            w.add("a", np.ones(2, np.float32))
            w.open_stream("a", np.float32)


def test_blobs_are_saved_verified_and_read_back(tmp_path):
    target = str(tmp_path / "m")
    with fio.VarsWriter(target) as w:
        w.add_file("__model__", b'{"ops": []}')
        w.add("a", np.ones(2, np.float32))
    assert fio.read_file(target, "__model__") == b'{"ops": []}'
    with pytest.raises(ConfigError, match=r"holds no file 'other'; it holds \['__model__'\]"):
        fio.read_file(target, "other")
    path = os.path.join(target, fio.read_manifest(target)["files"]["__model__"]["file"])
    open(path, "wb").write(b'{"ops": [1]}')
    with pytest.raises(DataError, match=r"does not match its manifest entry for '__model__'"):
        fio.read_file(target, "__model__")


def test_check_files_finds_a_missing_or_truncated_file_without_reading_it(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays())
    assert fio.check_files(target)["format"] == fio.FORMAT
    path = _file_of(target, "fc_0.w_0")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-4])
    with pytest.raises(DataError, match=r"cannot read 'fc_0.w_0' from .* it has \d+ bytes, the manifest says \d+"):
        fio.check_files(target)
    os.remove(path)
    with pytest.raises(DataError, match=r"cannot read 'fc_0.w_0'"):
        fio.check_files(target)


def test_a_vars_reader_maps_each_variable_once_and_names_a_missing_one(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays(), {"step": 3})
    reader = fio.VarsReader(target)
    assert reader.extra == {"step": 3} and "fc_0.w_0" in reader and "nope" not in reader
    assert reader.shape("fc_0.w_0") == (5, 3) and reader.dtype("w_beta1_pow_0") == np.float64
    first = reader.get("fc_0.w_0")
    assert reader.get("fc_0.w_0") is first
    np.testing.assert_array_equal(first, _arrays()["fc_0.w_0"])
    with pytest.raises(ConfigError, match=r"has no saved value for 'nope'; it holds \["):
        reader.get("nope")


def test_a_killed_stream_save_leaves_only_an_invisible_temporary(tmp_path, monkeypatch):
    monkeypatch.setattr(fio.shutil, "rmtree", lambda *a, **k: None)  # a killed process cleans nothing

    class Killed(BaseException):
        pass

    with pytest.raises(Killed):
        with fio.VarsWriter(str(tmp_path / "ckpt-5")) as w:
            w.open_stream("t", np.float32, (2,)).append(np.ones((4, 2), np.float32))
            raise Killed()
    (leftover,) = _listing(tmp_path)
    assert leftover.startswith(".ckpt-5.tmp-")


# ------------------------------------------------------------------ Paddle's layout
def test_each_variable_is_a_file_named_exactly_as_the_variable(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays())
    files = sorted(os.listdir(target))
    assert "fc_0.w_0" in files and "auc.stat_pos_0" in files and "emb_table@weird_name" in files
    # a name holding '/' cannot be a file: it is sanitised and found through the manifest
    assert fio.read_manifest(target)["vars"]["emb/table@weird name"]["file"].startswith("emb_table@weird_name.")
    np.testing.assert_array_equal(np.load(os.path.join(target, "fc_0.w_0")), _arrays()["fc_0.w_0"])


def test_a_combined_save_is_one_file_in_name_order_and_reads_back_whole_or_mapped(tmp_path):
    arrays = _arrays()
    target = str(tmp_path / "m")
    with fio.VarsWriter(target, {"step": 1}, filename="params") as w:
        for name, value in arrays.items():
            if name != "fc_0.w_0":
                w.add(name, value)
        stream = w.open_stream("fc_0.w_0", np.float32, [3])
        stream.append(arrays["fc_0.w_0"][:2])
        stream.append(arrays["fc_0.w_0"][2:])
        stream.close()
    assert sorted(os.listdir(target)) == ["MANIFEST.json", "params"]
    entries = fio.read_manifest(target)["vars"]
    offsets = [entries[n]["offset"] for n in sorted(entries)]
    assert offsets == sorted(offsets) and offsets[0] == 0
    for mmap in (False, True):
        back = fio.read_vars(target, mmap=mmap)
        for name, value in arrays.items():
            np.testing.assert_array_equal(back[name], value)
            assert back[name].dtype == value.dtype
    assert fio.VarsReader(target).get("w_beta1_pow_0")[0] == 0.9 ** 3


def test_a_flipped_bit_in_a_combined_file_names_the_variable_it_hits(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), _arrays(), filename="all_params")
    entry = fio.read_manifest(target)["vars"]["fc_0.w_0"]
    path = os.path.join(target, "all_params")
    data = bytearray(open(path, "rb").read())
    data[entry["offset"] + entry["bytes"] - 1] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(DataError, match=r"all_params does not match its manifest entry for 'fc_0.w_0'"):
        fio.read_vars(target)
    assert list(fio.read_vars(target, ["auc.stat_pos_0"])) == ["auc.stat_pos_0"]
    open(path, "ab").write(b"x")
    with pytest.raises(DataError, match=r"it has \d+ bytes, the manifest says \d+ \(truncated or altered save\)"):
        fio.check_files(target)


def test_a_combined_file_name_must_be_a_plain_file_name(tmp_path):
    for bad in ("sub/params", fio.MANIFEST, ".hidden", ""):
        with pytest.raises(ConfigError, match="is not a plain file name"):
            fio.VarsWriter(str(tmp_path / "m"), filename=bad)


def test_a_version_1_save_with_sanitised_file_names_still_reads(tmp_path):
    target = fio.write_vars(str(tmp_path / "m"), {"fc_0.w_0": np.arange(6, dtype=np.float32)})
    path = os.path.join(target, fio.MANIFEST)
    manifest = json.load(open(path))
    os.rename(os.path.join(target, "fc_0.w_0"), os.path.join(target, "fc_0.w_0.1234abcd.npy"))
    manifest["vars"]["fc_0.w_0"]["file"] = "fc_0.w_0.1234abcd.npy"
    manifest["format"] = "fleet-vars-1"
    json.dump(manifest, open(path, "w"))
    np.testing.assert_array_equal(fio.read_vars(target)["fc_0.w_0"], np.arange(6))
