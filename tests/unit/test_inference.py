"""Inference models: program serialization, pruning, save_inference_model /
load_inference_model in local training (Paddle's argument errors), and saved
distributed tables read without servers."""
import json
import os

import numpy as np
import pytest

import fleet
import fleet.base
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError
from fleet.framework import inference
from fleet.framework import io as fio
from fleet.framework.ops.saved_table import saved_rows
from fleet.framework.program import deserialize_program, serialize_program
from role_makers import LocalRoleMaker

pytestmark = pytest.mark.usefixtures("fresh_fleet")


def _model(distributed=False):
    x = layers.data("x", shape=[3])
    ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    y = layers.data("y", shape=[1], dtype="int64")
    table = fleet.ParamAttr(name="table", initializer=fleet.initializer.Uniform(-1.0, 1.0))
    emb = layers.sequence_pool(layers.embedding(ids, size=[50, 4], is_sparse=True, is_distributed=distributed,
                                                param_attr=table), "sum")
    h = layers.fc(layers.concat([emb, x], axis=1), 8, act="relu")
    pred = layers.fc(h, 2, act="softmax")
    loss = layers.mean(layers.cross_entropy(pred, y))
    auc, _, _ = layers.auc(pred, y)
    return pred, loss, auc


def _feed(seed, batch=6):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(batch, 3)).astype(np.float32),
            "ids": (rng.integers(0, 50, 2 * batch), np.full(batch, 2)),
            "y": rng.integers(0, 2, (batch, 1))}


def _trained(distributed=False, steps=4):
    fleet.init(LocalRoleMaker())
    fleet.default_startup_program().random_seed = 3
    pred, loss, auc = _model(distributed)
    fleet.distributed_optimizer(optimizer.Adam(0.05)).minimize(loss)
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    for k in range(steps):
        exe.run(fleet.main_program, feed=_feed(k), fetch_list=[loss, auc])
    return exe, pred


def _predict_in_fresh_scope(dirname, feed):
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        program, feeds, fetch = fleet.load_inference_model(dirname)
        (out,) = fleet.Executor().run(program, feed={k: feed[k] for k in feeds}, fetch_list=fetch)
        return out, feeds, program


# ------------------------------------------------------------------ serialization
def test_a_serialized_program_comes_back_with_every_var_op_and_attribute():
    pred, loss, _ = _model()
    optimizer.Adam(0.05).minimize(loss)
    program = fw.default_main_program()
    program.random_seed = 9
    back = deserialize_program(serialize_program(program))
    assert back.random_seed == 9
    src, dst = program.global_block(), back.global_block()
    assert list(src.vars) == list(dst.vars)
    for name, var in src.vars.items():
        got = dst.vars[name]
        assert type(got) is type(var), name
        for attr in ("shape", "dtype", "lod_level", "persistable", "stop_gradient", "is_data"):
            assert getattr(got, attr) == getattr(var, attr), (name, attr)
    table = dst.vars["table"]
    assert table.is_sparse and not table.is_distributed and table.trainable and table.initializer is None
    assert [(o.type, o.inputs, o.outputs, o.attrs) for o in src.ops] == \
           [(o.type, o.inputs, o.outputs, o.attrs) for o in dst.ops]


def test_tuples_dicts_and_arrays_in_attributes_survive_serialization():
    program = fw.Program()
    block = program.global_block()
    block.create_var("a", shape=(2,))
    attrs = {"t": (1, 2.5), "d": {"k": [1, (2,)]}, "arr": np.arange(6, dtype=np.int64).reshape(2, 3),
             "f": np.float32(0.25), "none": None, "s": "x", "inf": float("inf")}
    block.ops.append(fw.Operator(block, "scale", {"X": ["a"]}, {"Out": ["a"]}, attrs))
    back = deserialize_program(serialize_program(program)).global_block().ops[0].attrs
    assert back["t"] == (1, 2.5) and back["d"] == {"k": [1, (2,)]} and back["f"] == 0.25
    assert back["none"] is None and back["s"] == "x" and back["inf"] == float("inf")
    np.testing.assert_array_equal(back["arr"], attrs["arr"])
    assert back["arr"].dtype == np.int64


def test_an_attribute_that_cannot_be_saved_is_named():
    program = fw.Program()
    block = program.global_block()
    block.ops.append(fw.Operator(block, "scale", {}, {}, {"fn": object()}))
    with pytest.raises(ConfigError, match=r"op 'scale' attribute 'fn' holds a object .* cannot be saved"):
        serialize_program(program)


def test_a_foreign_or_newer_program_file_is_refused():
    with pytest.raises(DataError, match=r"the saved program is not fleet.s JSON program format .*written by Paddle itself \(protobuf\)"):
        deserialize_program(b"\x80not json")
    with pytest.raises(ConfigError, match=r"not a saved fleet program: format 'paddle', expected 'fleet-program'"):
        deserialize_program(json.dumps({"format": "paddle"}).encode())
    data = fw.Program().to_dict()
    data["version"] = 99
    with pytest.raises(ConfigError, match="saved program version 99 is not supported; this fleet reads version 1"):
        deserialize_program(json.dumps(data).encode())


# ------------------------------------------------------------------ pruning
def test_pruning_keeps_only_what_the_target_needs_from_the_feeds():
    pred, loss, auc = _model()
    optimizer.SGD(0.1).minimize(loss)
    test = fw.default_main_program().clone(for_test=True)
    pruned = inference.prune_program(test, ["x", "ids"], [pred.name])
    types = [op.type for op in pruned.global_block().ops]
    assert types == ["lookup_table", "sequence_pool", "concat", "fc", "fc"]
    assert "y" not in pruned.global_block().vars and loss.name not in pruned.global_block().vars
    # feeding an intermediate drops the ops that compute it
    hidden = pruned.global_block().ops[3].output("Out")[0]
    tail = inference.prune_program(test, [hidden], [pred.name])
    assert [op.type for op in tail.global_block().ops] == ["fc"]


def test_a_target_that_needs_an_unfed_input_is_an_error_naming_it():
    pred, loss, _ = _model()
    test = fw.default_main_program().clone(for_test=True)
    with pytest.raises(ConfigError, match=r"need 'ids', which is not fed and no kept op computes it; add it "
                                          r"to feeded_var_names \(fed: \['x'\]\)"):
        inference.prune_program(test, ["x"], [pred.name])
    with pytest.raises(ConfigError, match="variable 'nope' is not in this program"):
        inference.prune_program(test, ["x", "nope"], [pred.name])


# ------------------------------------------------------------------ save / load (local)
def test_a_loaded_inference_model_predicts_what_the_training_process_predicts(tmp_path):
    exe, pred = _trained()
    feed = _feed(42)
    test = fleet.main_program.clone(for_test=True)
    (expected,) = exe.run(test, feed=feed, fetch_list=[pred])
    target = fleet.save_inference_model(exe, str(tmp_path / "infer"), ["x", "ids"], [pred])
    assert target == str(tmp_path / "infer")
    saved = set(fio.read_manifest(target)["vars"])
    assert saved == {"table", "fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}  # no state, no metric
    got, feeds, program = _predict_in_fresh_scope(target, feed)
    assert feeds == ["x", "ids"]
    np.testing.assert_array_equal(got, expected)
    assert all(op.attr("is_test") for op in program.global_block().ops)


def test_export_for_deployment_false_keeps_the_whole_test_program(tmp_path):
    exe, pred = _trained(steps=1)
    target = fleet.save_inference_model(exe, str(tmp_path / "m"), ["x", "ids", "y"], [pred],
                                        export_for_deployment=False)
    got, _, program = _predict_in_fresh_scope(target, _feed(1))
    assert "auc" in [op.type for op in program.global_block().ops]
    assert got.shape == (6, 2)


def test_save_inference_model_raises_paddles_type_and_value_errors(tmp_path):
    exe, pred = _trained(steps=0)

    class ParallelExecutor:
        pass

    class CompiledProgram:
        pass

    d = str(tmp_path / "m")
    with pytest.raises(TypeError, match=r"^in fleet.save_inference_model\(\) function, executor must be as "
                                        r"Executor type, ParallelExecutor is not allowed$"):
        fleet.save_inference_model(ParallelExecutor(), d, ["x"], [pred])
    with pytest.raises(TypeError, match=r"^in fleet.save_inference_model\(\) function, executor must be as "
                                        r"Executor type$"):
        fleet.save_inference_model("exe", d, ["x"], [pred])
    with pytest.raises(TypeError, match=r"^in fleet.save_inference_model\(\) function, main_program must be "
                                        r"as Program type, CompiledProgram is not allowed$"):
        fleet.save_inference_model(exe, d, ["x"], [pred], main_program=CompiledProgram())
    with pytest.raises(TypeError, match=r"^in fleet.save_inference_model\(\) function, main_program must be "
                                        r"as Program type$"):
        fleet.save_inference_model(exe, d, ["x"], [pred], main_program="prog")
    with pytest.raises(ValueError, match=r"^'feed_var_names' should be a list of str.$"):
        fleet.save_inference_model(exe, d, ["x", 3], [pred])
    with pytest.raises(ValueError, match=r"^'target_vars' should be a list of Variable.$"):
        fleet.save_inference_model(exe, d, ["x", "ids"], ["fc_1.tmp_0"])
    with pytest.raises(TypeError, match=r"^in fleet.save_persistables\(\) function, executor must be as "
                                        r"Executor type, ParallelExecutor is not allowed$"):
        fleet.save_persistables(ParallelExecutor(), d)
    assert not os.path.exists(d)


def test_load_inference_model_refuses_a_checkpoint_that_is_not_an_inference_model(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEET_SAVE_UNTRAINED", "1")  # initial values are enough here
    exe, _ = _trained(steps=0)
    fleet.save_persistables(exe, str(tmp_path / "ckpt"))
    with pytest.raises(ConfigError, match=r"is not an inference model \(it holds no __model__\)"):
        fleet.load_inference_model(str(tmp_path / "ckpt"))


# ------------------------------------------------------------------ saved distributed tables
def test_saved_rows_give_the_saved_row_or_a_zero_row_for_an_unseen_id():
    table_ids = np.array([-5, 0, 7, 2**62], dtype=np.int64)
    table_values = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    rows = saved_rows(table_ids, table_values, np.array([7, 3, -5, 7, 2**63 - 1]))
    np.testing.assert_array_equal(rows.ids, [-5, 3, 7, 2**63 - 1])
    np.testing.assert_array_equal(rows.values, [[1, 2, 3], [0, 0, 0], [7, 8, 9], [0, 0, 0]])
    empty = saved_rows(np.zeros(0, np.int64), np.zeros((0, 3), np.float32), np.array([4]))
    np.testing.assert_array_equal(empty.values, [[0, 0, 0]])
    with pytest.raises(DataError, match=r"saved table 'table': ids \[4\] and values \[3, 3\] do not match"):
        saved_rows(table_ids, table_values[:3], np.array([1]))


def test_a_program_reading_a_saved_distributed_table_predicts_with_unseen_ids_as_zero_rows(tmp_path):
    exe, pred = _trained(distributed=True)
    scope = fleet.global_scope()
    table = np.array(scope["table"])
    held = np.array([31, 4, 17, 0, 9, 44, 2], dtype=np.int64)  # unsorted, as servers save it
    program, feeds, fetches = inference.inference_program(fleet.main_program, ["x", "ids"], [pred])
    reads = inference.use_saved_tables(program, {"table": 4})
    assert reads == ["table@ids", "table@values"]
    with fio.VarsWriter(str(tmp_path / "m"), inference.manifest_extra(feeds, fetches)) as w:
        w.add_file(inference.MODEL_FILE, serialize_program(program))
        for name in inference.persistable_names(program):
            if name == "table@ids":
                w.add(name, held)
            elif name == "table@values":
                w.add(name, table[held])
            else:
                w.add(name, scope[name])
    feed = _feed(5)
    # what the training process predicts when only the held rows exist (a server's is_test answer)
    zeroed = np.zeros_like(table)
    zeroed[held] = table[held]
    scope["table"][...] = zeroed
    (expected,) = exe.run(fleet.main_program.clone(for_test=True), feed=feed, fetch_list=[pred])
    got, _, loaded = _predict_in_fresh_scope(str(tmp_path / "m"), feed)
    np.testing.assert_array_equal(got, expected)
    assert [op.type for op in loaded.global_block().ops][:2] == ["saved_table_prefetch", "lookup_table"]


# ------------------------------------------------------------------ Paddle's layout
PARAMS = ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0", "table"]


def _saved_and_expected(tmp_path, **kwargs):
    exe, pred = _trained()
    feed = _feed(42)
    (expected,) = exe.run(fleet.main_program.clone(for_test=True), feed=feed, fetch_list=[pred])
    target = fleet.save_inference_model(exe, str(tmp_path / "infer"), ["x", "ids"], [pred], **kwargs)
    return target, {"x": feed["x"], "ids": feed["ids"]}, expected


def test_an_inference_model_is_a_model_file_and_one_file_per_parameter_named_as_the_parameter(tmp_path):
    target, _, _ = _saved_and_expected(tmp_path)
    assert sorted(os.listdir(target)) == sorted(PARAMS + ["MANIFEST.json", "__model__"])
    np.testing.assert_array_equal(np.load(os.path.join(target, "fc_0.w_0")), fleet.global_scope()["fc_0.w_0"])


def test_params_filename_puts_every_parameter_in_one_file_and_model_filename_renames_the_program(tmp_path):
    target, feed, expected = _saved_and_expected(tmp_path, model_filename="model", params_filename="params")
    assert sorted(os.listdir(target)) == ["MANIFEST.json", "model", "params"]
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        program, feeds, fetch = fleet.load_inference_model(target, fleet.Executor(), model_filename="model",
                                                           params_filename="params")
        (got,) = fleet.Executor().run(program, feed=feed, fetch_list=fetch)
    np.testing.assert_array_equal(got, expected)


def test_loading_with_other_file_names_than_the_save_names_the_ones_to_pass(tmp_path):
    target, _, _ = _saved_and_expected(tmp_path, params_filename="params")
    with pytest.raises(ConfigError, match=r"holds no program file 'model'; it was saved with "
                                          r"model_filename='__model__': pass that"):
        fleet.load_inference_model(target, model_filename="model")
    with pytest.raises(ConfigError, match=r"holds no parameter file 'weights'; it was saved with "
                                          r"params_filename='params': pass that"):
        fleet.load_inference_model(target, params_filename="weights")


def test_load_inference_model_returns_a_list_as_paddle_does(tmp_path):
    target, _, _ = _saved_and_expected(tmp_path)
    loaded = fleet.load_inference_model(target)
    assert isinstance(loaded, list) and len(loaded) == 3 and loaded[1] == ["x", "ids"]


def test_program_parse_from_string_of_model_file_runs_and_predicts_as_the_original(tmp_path):
    target, feed, expected = _saved_and_expected(tmp_path)
    with open(os.path.join(target, "__model__"), "rb") as f:
        program = fleet.Program.parse_from_string(f.read())
    fetch = fio.read_manifest(target)["extra"]["fetch"]  # the manifest holds the feed and fetch names
    (got,) = fleet.Executor().run(program, feed=feed, fetch_list=fetch)
    np.testing.assert_array_equal(got, expected)
    again = fleet.Program.parse_from_string(program.desc.serialize_to_string())
    assert again.serialize_to_string() == program.serialize_to_string()
    assert [op.type for op in again.global_block().ops] == [op.type for op in program.global_block().ops]


_FRESH_PROCESS = """
import sys
import numpy as np
import fleet
program, feeds, fetch = fleet.load_inference_model(sys.argv[1], fleet.Executor())
feed = dict(np.load(sys.argv[2]))
feed["ids"] = (feed.pop("ids_values"), feed.pop("ids_lengths"))
(out,) = fleet.Executor().run(program, feed={k: feed[k] for k in feeds}, fetch_list=fetch)
np.save(sys.argv[3], out)
"""


def test_an_inference_model_loaded_in_a_fresh_process_predicts_as_the_training_process(tmp_path):
    import subprocess
    import sys

    target, feed, expected = _saved_and_expected(tmp_path)
    np.savez(tmp_path / "feed.npz", x=feed["x"], ids_values=feed["ids"][0], ids_lengths=feed["ids"][1])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", _FRESH_PROCESS, target, str(tmp_path / "feed.npz"),
                    str(tmp_path / "out.npy")], check=True, env=env, timeout=300)
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


def test_a_damaged_parameter_file_is_a_data_error_naming_the_parameter(tmp_path):
    target, _, _ = _saved_and_expected(tmp_path)
    path = os.path.join(target, "fc_1.w_0")
    data = bytearray(open(path, "rb").read())
    data[-2] ^= 0x04
    open(path, "wb").write(bytes(data))
    with pytest.raises(DataError, match=r"fc_1.w_0 does not match its manifest entry for 'fc_1.w_0' "
                                        r"\(corrupt or altered save\); save it again or restore the file"):
        fleet.load_inference_model(target)


def test_an_inference_model_saved_by_the_previous_fleet_still_loads(tmp_path):
    target, feed, expected = _saved_and_expected(tmp_path)
    # the previous layout: sanitised file names with a CRC, the program as a .bin blob
    path = os.path.join(target, fio.MANIFEST)
    manifest = json.load(open(path))
    for name, entry in list(manifest["vars"].items()) + list(manifest["files"].items()):
        old = f"{name}.{abs(hash(name)) % 10**8:08d}." + ("bin" if name == "__model__" else "npy")
        os.rename(os.path.join(target, entry["file"]), os.path.join(target, old))
        entry["file"] = old
    manifest["format"] = "fleet-vars-1"
    for key in ("model_filename", "params_filename", "program_only"):
        del manifest["extra"][key]
    json.dump(manifest, open(path, "w"))
    assert "__model__" not in os.listdir(target)
    got, feeds, _ = _predict_in_fresh_scope(target, feed)
    np.testing.assert_array_equal(got, expected)
