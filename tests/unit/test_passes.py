"""The execution passes change how a program runs, never what it computes."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.framework import passes


def _build(pools):
    fw.unique_name.reset()  # same parameter names -> same seeded initial values
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        ids2 = layers.data("ids2", shape=[1], dtype="int64", lod_level=1)
        y = layers.data("y", shape=[1], dtype="int64")
        outs = []
        for pool in pools:
            for s in (ids, ids2):
                e = layers.embedding(s, size=[50, 4], is_sparse=True, param_attr="T", padding_idx=0)
                outs.append(layers.sequence_pool(e, pool))
        pred = layers.fc(layers.concat(outs, axis=1), 2, act="softmax")
        loss = layers.mean(layers.cross_entropy(pred, y))
        optimizer.SGD(0.5).minimize(loss)
    startup.random_seed = 3
    return main, startup, loss


def _train(main, startup, loss, steps=3):
    rng = np.random.default_rng(0)
    feed = {"ids": (rng.integers(0, 50, 20), np.array([3, 0, 5, 2, 4, 6])),
            "ids2": (rng.integers(0, 50, 12), np.array([2, 2, 2, 2, 2, 2])),
            "y": rng.integers(0, 2, (6, 1))}
    scope = fw.Scope()
    exe = fw.Executor()
    exe.run(startup, scope=scope)
    losses = [exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0] for _ in range(steps)]
    return np.concatenate(losses), scope["T"].copy()


def test_embedding_pool_fusion_replaces_each_lookup_and_pool_pair():
    main, _, _ = _build(["sum", "max"])
    types = [op.type for op in passes.optimize_for_execution(main)]
    assert types.count("fused_embedding_seq_pool") == 4
    assert types.count("fused_embedding_seq_pool_grad") == 4
    assert "lookup_table" not in types and "sequence_pool" not in types
    assert [op.type for op in main.global_block().ops].count("lookup_table") == 4  # program untouched


@pytest.mark.parametrize("pools", [["sum"], ["average", "max", "sqrt"]])
def test_fused_training_equals_unfused_training(monkeypatch, pools):
    fused = _train(*_build(pools))
    monkeypatch.setattr(passes, "_fuse_embedding_pool", lambda program, ops: ops)
    plain = _train(*_build(pools))
    np.testing.assert_array_equal(fused[0], plain[0])
    np.testing.assert_array_equal(fused[1], plain[1])


def test_pool_first_is_not_fused_and_still_trains():
    main, startup, loss = _build(["first"])
    types = [op.type for op in passes.optimize_for_execution(main)]
    assert "fused_embedding_seq_pool" not in types
    losses, _ = _train(main, startup, loss, steps=5)
    assert losses[-1] < losses[0]
