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
    types = [op.type for op in passes._fuse_embedding_pool(main, list(main.global_block().ops))]
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


# ---------------------------------------------------------------- one op per table's slots
def _types(program):
    return [op.type for op in passes.optimize_for_execution(program)]


def test_ctr_dnn_slots_become_one_lookup_and_one_gradient_op():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn"))
    from network import SLOTS, ctr_dnn_model
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        _, loss, *_ = ctr_dnn_model(sparse_feature_dim=1000)
        optimizer.Adam(1e-3).minimize(loss)
    ops = passes.optimize_for_execution(main)
    types = [op.type for op in ops]
    assert types.count("fused_multi_embedding_seq_pool") == 1
    assert types.count("fused_multi_embedding_seq_pool_grad") == 1
    assert not {"fused_embedding_seq_pool", "fused_embedding_seq_pool_grad", "sum", "lookup_table"} & set(types)
    multi = ops[types.index("fused_multi_embedding_seq_pool")]
    grad = ops[types.index("fused_multi_embedding_seq_pool_grad")]
    assert len(multi.input("Ids")) == SLOTS and multi.input("W") == ["SparseFeatFactors"]
    assert grad.output("W@GRAD") == ["SparseFeatFactors@GRAD"]
    # the sum concatenated the slots' rows from the last slot's lookup to the first's
    assert grad.input("Ids") == [f"C{i}" for i in range(SLOTS, 0, -1)]


def _build_slots(dense_grads=False, two_tables=False, pools=("sum", "average", "sqrt"), padding=0):
    """Three slots (one may share another's ids) looked up in T with each pool, and with
    ``two_tables`` one slot also in U; a loss mixing them all."""
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        slots = [layers.data(f"s{i}", shape=[1], dtype="int64", lod_level=1) for i in range(3)]
        y = layers.data("y", shape=[1], dtype="int64")
        outs = []
        for pool in pools:
            for s in slots:
                e = layers.embedding(s, size=[40, 3], is_sparse=not dense_grads, param_attr="T", padding_idx=padding)
                outs.append(layers.sequence_pool(e, pool))
        if two_tables:
            e = layers.embedding(slots[1], size=[40, 3], is_sparse=True, param_attr="U")
            outs.append(layers.sequence_pool(e, "sum"))
        pred = layers.fc(layers.concat(outs, axis=1), 2, act="softmax")
        loss = layers.mean(layers.cross_entropy(pred, y))
        optimizer.SGD(0.5).minimize(loss)
    startup.random_seed = 5
    return main, startup, loss


def _slot_feed(rng, batch=7):
    feed = {}
    shared = rng.integers(0, 40, 5)
    for i in range(3):
        lengths = rng.integers(0, 4, batch)
        lengths[i] = 0  # an empty sequence in every slot
        ids = rng.integers(0, 40, int(lengths.sum()))
        ids[:min(len(ids), 5)] = shared[:min(len(ids), 5)]  # ids repeated across slots
        ids[::4] = 0  # the padding id
        feed[f"s{i}"] = (ids, lengths)
    feed["y"] = rng.integers(0, 2, (batch, 1))
    return feed


def _train_slots(main, startup, loss, steps=3):
    rng = np.random.default_rng(11)
    scope = fw.Scope()
    exe = fw.Executor()
    exe.run(startup, scope=scope)
    grads = [n for n in ("T@GRAD", "U@GRAD") if n in main.global_block().vars]
    fetched = []
    for _ in range(steps):
        fetched.append(exe.run(main, feed=_slot_feed(rng), fetch_list=[loss] + grads, scope=scope,
                               return_numpy=False))
    params = {n: scope[n].copy() for n in ("T", "U") if n in main.global_block().vars}
    return fetched, params


def _assert_same_run(a, b):
    for step_a, step_b in zip(a[0], b[0]):
        for x, y in zip(step_a, step_b):
            if isinstance(x, fw.SparseRows):
                assert isinstance(y, fw.SparseRows)
                np.testing.assert_array_equal(x.rows, y.rows)
                np.testing.assert_array_equal(x.values, y.values)
            else:
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        np.testing.assert_array_equal(a[1][name], b[1][name])


@pytest.mark.parametrize("options", [{}, {"pools": ("sqrt",)}, {"pools": ("average",), "dense_grads": True},
                                     {"pools": ("sum",), "two_tables": True}, {"pools": ("sum",), "padding": -1},
                                     {"pools": ("sum", "max")}])
def test_slot_merging_gives_bit_identical_outputs_gradients_and_parameters(monkeypatch, options):
    main, startup, loss = _build_slots(**options)
    types = _types(main)
    merged = _train_slots(main, startup, loss)
    monkeypatch.setattr(passes, "_fuse_table_slots", lambda ops: ops)
    plain = _train_slots(*_build_slots(**options))
    _assert_same_run(merged, plain)
    pools = options.get("pools", ("sum", "average", "sqrt"))
    assert types.count("fused_multi_embedding_seq_pool") == sum(p != "max" for p in pools)
    # T's gradients become one op when they are sparse and all slots are in one merged op
    fused_grads = not options.get("dense_grads") and len(pools) == 1
    assert types.count("fused_multi_embedding_seq_pool_grad") == (1 if fused_grads else 0)
    if options.get("two_tables"):
        assert types.count("fused_embedding_seq_pool") == 1  # U's only lookup stays as it was


def test_slot_merging_leaves_ops_whose_ids_are_written_in_between():
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        a = layers.data("a", shape=[1], dtype="int64", lod_level=1)
        b = layers.data("b", shape=[1], dtype="int64", lod_level=1)
        pa = layers.sequence_pool(layers.embedding(a, size=[10, 2], is_sparse=True, param_attr="T"), "sum")
        b2 = layers.scale(b, scale=1.0)  # ids computed after the first slot's pool
        pb = layers.sequence_pool(layers.embedding(b2, size=[10, 2], is_sparse=True, param_attr="T"), "sum")
        pc = layers.sequence_pool(layers.embedding(a, size=[10, 2], is_sparse=True, param_attr="T"), "sum")
        out = layers.concat([pa, pb, pc], axis=1)
    types = _types(main)
    assert types.count("fused_multi_embedding_seq_pool") == 1
    assert types.count("fused_embedding_seq_pool") == 1
    feed = {"a": (np.array([1, 2, 3]), np.array([2, 1])), "b": (np.array([4, 5]), np.array([0, 2]))}
    exe = fw.Executor()
    scope = fw.Scope()
    exe.run(startup, scope=scope)
    got = exe.run(main, feed=feed, fetch_list=[out], scope=scope)[0]
    table = scope["T"]
    want = np.concatenate([[table[1] + table[2], table[3]], [[0, 0], table[4] + table[5]],
                           [table[1] + table[2], table[3]]], axis=1)
    np.testing.assert_array_equal(got, want)


def test_slot_merging_reads_prefetched_rows_as_the_slots_did(monkeypatch):
    """On a distributed worker the table is the batch's PrefetchedRows (padding id too)."""
    def run():
        fw.unique_name.reset()
        main, startup = fw.Program(), fw.Program()
        with fw.program_guard(main, startup):
            slots = [layers.data(f"s{i}", shape=[1], dtype="int64", lod_level=1) for i in range(3)]
            pooled = [layers.sequence_pool(layers.embedding(s, size=[10**9, 3], is_distributed=True, is_sparse=True,
                                                            param_attr="T", padding_idx=7), "sqrt") for s in slots]
            out = layers.concat(pooled, axis=1)
            loss = layers.mean(layers.square(out))
            fw.append_backward(loss, parameter_list=["T"])
        feed = _slot_feed(np.random.default_rng(4))
        feed = {k: ((v[0] * 999983 + 7) % 10**9, v[1]) if k != "y" else v for k, v in feed.items() if k != "y"}
        feed["s0"][0][:2] = 7
        uniq = np.unique(np.concatenate([feed[f"s{i}"][0] for i in range(3)] + [np.array([5])]))
        values = np.random.default_rng(2).standard_normal((len(uniq), 3)).astype(np.float32)
        scope = fw.Scope()
        scope.vars["T"] = fw.tensor.PrefetchedRows("T", uniq, values, 10**9)
        return _types(main), fw.Executor().run(main, feed=feed, fetch_list=[out, loss, "T@GRAD"], scope=scope,
                                               return_numpy=False)
    types, merged = run()
    monkeypatch.setattr(passes, "_fuse_table_slots", lambda ops: ops)
    _, plain = run()
    assert "fused_multi_embedding_seq_pool_grad" in types
    _assert_same_run(([merged], {}), ([plain], {}))
