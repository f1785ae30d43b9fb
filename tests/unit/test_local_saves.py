"""Save modes in local training: the local tables (fleet.local_tables) are saved from
snapshots, and fleet.load_persistables on a delta loads its base and every delta."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
import fleet.layers as layers
from fleet import local_tables
from fleet.errors import ConfigError
from fleet.framework import io as fio
from fleet.framework.save_chain import read_chain
from fleet.framework.tensor import LoDTensor
from fleet.initializer import Uniform
from fleet.optimizer import Adam
from role_makers import LocalRoleMaker

pytestmark = pytest.mark.usefixtures("fresh_fleet")


@pytest.fixture(autouse=True)
def fresh_local_tables():
    local_tables.LOCAL.reset()
    yield
    local_tables.LOCAL.reset()


def _job():
    """A local job whose table ``emb`` admits an id on its second sight and keeps statistics."""
    fleet.init(LocalRoleMaker())
    main, startup = fw.Program(), fw.Program()
    main.random_seed = 7
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        show = layers.data("show", shape=[1], dtype="float32")
        click = layers.data("click", shape=[1], dtype="float32")
        emb = layers.sparse_embedding(ids, [1000, 4], entry=fleet.CountFilterEntry(2),
                                      param_attr=fleet.ParamAttr(name="emb", initializer=Uniform(-0.5, 0.5)))
        logit = layers.fc(layers.concat([layers.sequence_pool(emb, "sum"), show], axis=1), 1, param_attr="fc.w",
                          bias_attr="fc.b")
        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, click))
        Adam(0.05, lazy_mode=True).minimize(loss)
    exe = fleet.Executor()
    exe.run(startup)
    return exe, main


def _train(exe, main, seed, vocab, batches=6):
    rng = np.random.RandomState(seed)
    for _ in range(batches):
        seqs = [list(rng.randint(0, vocab, size=rng.randint(1, 4))) for _ in range(8)]
        feed = {"ids": LoDTensor.from_lengths(np.array([i for s in seqs for i in s], np.int64),
                                              np.array([len(s) for s in seqs], np.int64)),
                "show": np.ones((8, 1), np.float32), "click": rng.randint(0, 2, (8, 1)).astype(np.float32)}
        exe.run(main, feed=feed)


def _state(main):
    table = local_tables.local_tables()["emb"]
    state = table.state_dict()
    order = np.argsort(state["ids"])
    out = {k: (v[order] if v.shape[:1] == state["ids"].shape else v) for k, v in state.items()}
    scope = fw.global_scope()
    out.update({n: np.array(scope.find_var(n)) for n in ("fc.w", "fc.b")})
    return out


def _load(dirname):
    local_tables.LOCAL.reset()
    exe, main = _job()
    fleet.load_persistables(exe, str(dirname), main)
    return _state(main)


def test_a_local_base_and_deltas_load_as_the_full_save_and_shrunk_rows_stay_deleted(tmp_path):
    exe, main = _job()
    _train(exe, main, seed=1, vocab=40)
    fleet.save_persistables(exe, str(tmp_path / "base"), main, mode=0)
    _train(exe, main, seed=2, vocab=80)
    fleet.save_persistables(exe, str(tmp_path / "d1"), main, mode=1)
    deleted = fleet.shrink()["emb"]
    _train(exe, main, seed=3, vocab=30, batches=2)
    fleet.save_persistables(exe, str(tmp_path / "d2"), main, 1)
    expected = _state(main)
    fleet.save_persistables(exe, str(tmp_path / "full"), main, mode=0)

    assert deleted > 0
    assert read_chain(tmp_path / "d2")["sequence"] == 2
    d2 = fio.read_vars(str(tmp_path / "d2"))
    assert len(d2["emb@deleted"]) >= 1 and d2["emb@stats"].shape == (len(d2["emb@ids"]), 4)
    assert "emb" not in d2 and "emb_moment1_0" not in d2  # the table is saved from its snapshot only
    for name, dirname in (("chain", tmp_path / "d2"), ("full", tmp_path / "full")):
        got = _load(dirname)
        assert sorted(got) == sorted(expected)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name}: {key}")


def test_a_local_save_passes_filename_as_the_4th_argument_and_refuses_bad_modes(tmp_path):
    exe, main = _job()
    _train(exe, main, seed=1, vocab=40)
    with pytest.raises(ConfigError, match=r"save_persistables\(mode=1\) to .* saves the changes since the previous "
                                          r"save, but this job has none"):
        fleet.save_persistables(exe, str(tmp_path / "x"), main, mode=1)
    with pytest.raises(ConfigError, match=r"save mode 3 is not one of 0 \(every row\)"):
        fleet.save_persistables(exe, str(tmp_path / "x"), main, mode=3)
    fleet.save_persistables(exe, str(tmp_path / "one"), main, "params")
    assert sorted(fio.read_manifest(str(tmp_path / "one"))["combined"]) == ["params"]
    fleet.save_persistables(exe, str(tmp_path / "d1"), main, mode=1, filename="params")  # follows "one"
    assert read_chain(tmp_path / "d1")["parent"]["dirname"] == "one"


def test_load_model_applies_deltas_one_by_one_in_order_only(tmp_path):
    exe, main = _job()
    _train(exe, main, seed=1, vocab=40)
    fleet.save_persistables(exe, str(tmp_path / "base"), main, mode=0)
    for i in (1, 2):
        _train(exe, main, seed=1 + i, vocab=60)
        fleet.save_persistables(exe, str(tmp_path / f"d{i}"), main, mode=1)
    expected = _state(main)

    local_tables.LOCAL.reset()
    exe, main = _job()
    fleet.load_model(str(tmp_path / "base"), mode=0, main_program=main)
    with pytest.raises(ConfigError, match=(
            rf"load_model\('{tmp_path / 'd2'}', mode=1\): that delta \(sequence 2 of chain \w+\) follows save \w+, "
            rf"but the save the local tables hold is \w+ \({tmp_path / 'base'}\): apply a chain's deltas in order")):
        fleet.load_model(str(tmp_path / "d2"), mode=1, main_program=main)
    with pytest.raises(ConfigError, match=r"applies a delta, but that directory holds a mode-0 save: load it with "
                                          r"mode=0"):
        fleet.load_model(str(tmp_path / "base"), mode=1, main_program=main)
    fleet.load_model(str(tmp_path / "d1"), mode=1, main_program=main)
    fleet.load_model(str(tmp_path / "d2"), mode=1, main_program=main)
    got = _state(main)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_a_checkpoint_between_saves_commits_nothing_and_the_next_delta_follows_the_last_save(tmp_path):
    exe, main = _job()
    _train(exe, main, seed=1, vocab=40)
    fleet.save_persistables(exe, str(tmp_path / "base"), main, mode=0)
    _train(exe, main, seed=2, vocab=80)
    with fw.program_guard(main):
        path = fleet.save_checkpoint(exe, fleet.CheckpointConfig(str(tmp_path / "ckpt")))
    _train(exe, main, seed=3, vocab=30, batches=2)
    fleet.save_persistables(exe, str(tmp_path / "d1"), main, mode=1)
    expected = _state(main)
    assert read_chain(path)["mode"] == 0 and "emb@ids" in fio.read_manifest(path)["vars"]
    assert read_chain(tmp_path / "d1")["parent"]["dirname"] == "base"
    got = _load(tmp_path / "d1")
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
