"""lod_level=1 values behave as in Paddle: ops that work row by row take an embedding of
a sequence input ([total ids, dim], one row per id) and keep its LoD, sequence_pool then
reduces per example; ops that need one row per example refuse such a value when the
program is built, naming the layer and the fix."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError
from fleet.framework import passes
from fleet.framework.tensor import LoDTensor
from fleet.initializer import Normal


def _f32(a):
    return np.asarray(a, dtype=np.float32)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _segments(lengths):
    """The example index of every row of a batch with these sequence lengths."""
    return np.repeat(np.arange(len(lengths)), lengths)


def _pool_sum(rows, lengths):
    out = np.zeros((len(lengths), rows.shape[1]))
    np.add.at(out, _segments(lengths), rows)
    return out


class _Run:
    """A built program with its scope: ``step(feed)`` trains once and returns the loss."""

    def __init__(self, build, lr=0.5, seed=7):
        fw.unique_name.reset()
        self.main, self.startup = fw.Program(), fw.Program()
        with fw.program_guard(self.main, self.startup):
            self.loss, self.extra = build()
            optimizer.SGD(lr).minimize(self.loss)
        self.startup.random_seed = seed
        self.scope, self.exe = fw.Scope(), fw.Executor()
        self.exe.run(self.startup, scope=self.scope)

    def params(self):
        return {p.name: self.scope[p.name].astype(np.float64) for p in self.main.all_parameters()}

    def step(self, feed):
        return float(self.exe.run(self.main, feed=feed, fetch_list=[self.loss], scope=self.scope)[0][0])


def _label(n, seed=0):
    return _f32(np.random.default_rng(seed).integers(0, 2, (n, 1)))


# ------------------------------------------------------------------ training against numpy
def test_fc_on_a_lod_embedding_then_sequence_pool_trains_like_the_numpy_reference():
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int64)
    lengths = np.array([3, 0, 1, 4], dtype=np.int64)
    label = _label(4)
    feed = {"ids": (ids, lengths), "label": label}

    def build():
        x = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        y = layers.data("label", shape=[1])
        emb = layers.embedding(x, size=[10, 4], is_sparse=True, param_attr="table")
        hidden = layers.fc(emb, 3, act="tanh", param_attr="w1", bias_attr="b1")
        assert hidden.lod_level == 1 and hidden.shape == (-1, 3)
        pooled = layers.sequence_pool(hidden, "sum")
        logit = layers.fc(pooled, 1, param_attr="w2", bias_attr="b2")
        return layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, y)), hidden

    run = _Run(build)
    p = run.params()
    lr, seg = 0.5, _segments(lengths)
    for _ in range(3):
        emb = p["table"][ids]
        h = np.tanh(emb @ p["w1"] + p["b1"])
        pooled = _pool_sum(h, lengths)
        logit = pooled @ p["w2"] + p["b2"]
        loss = np.mean(np.maximum(logit, 0) - logit * label + np.log1p(np.exp(-np.abs(logit))))
        assert run.step(feed) == pytest.approx(loss, rel=1e-5)
        dlogit = (_sigmoid(logit) - label) / len(label)
        dpre = (dlogit @ p["w2"].T)[seg] * (1 - h * h)
        demb = dpre @ p["w1"].T
        grads = {"w2": pooled.T @ dlogit, "b2": dlogit.sum(0), "w1": emb.T @ dpre, "b1": dpre.sum(0)}
        grads["table"] = np.zeros_like(p["table"])
        np.add.at(grads["table"], ids, demb)
        p = {k: v - lr * grads[k] for k, v in p.items()}
        for name, value in run.params().items():
            np.testing.assert_allclose(value, p[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_concat_of_two_lod_embeddings_then_sequence_pool_trains_like_the_numpy_reference():
    items = np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.int64)
    cats = np.array([0, 1, 0, 2, 2, 1, 0], dtype=np.int64)
    lengths = np.array([2, 4, 0, 1], dtype=np.int64)
    label = _label(4, seed=1)
    feed = {"item": (items, lengths), "cat": (cats, lengths), "label": label}

    def build():
        item = layers.data("item", shape=[1], dtype="int64", lod_level=1)
        cat = layers.data("cat", shape=[1], dtype="int64", lod_level=1)
        y = layers.data("label", shape=[1])
        joined = layers.concat([layers.embedding(item, size=[8, 3], param_attr="item_emb"),
                                layers.embedding(cat, size=[3, 2], is_sparse=True, param_attr="cat_emb")],
                               axis=1)
        assert joined.lod_level == 1 and joined.shape == (-1, 5)
        pooled = layers.sequence_pool(joined, "average")
        logit = layers.fc(pooled, 1, param_attr="w", bias_attr="b")
        return layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, y)), joined

    run = _Run(build)
    p = run.params()
    lr, seg = 0.5, _segments(lengths)
    for _ in range(3):
        rows = np.concatenate([p["item_emb"][items], p["cat_emb"][cats]], axis=1)
        counts = np.maximum(lengths, 1)[:, None]
        pooled = _pool_sum(rows, lengths) / counts
        logit = pooled @ p["w"] + p["b"]
        loss = np.mean(np.maximum(logit, 0) - logit * label + np.log1p(np.exp(-np.abs(logit))))
        assert run.step(feed) == pytest.approx(loss, rel=1e-5)
        dlogit = (_sigmoid(logit) - label) / len(label)
        drows = ((dlogit @ p["w"].T) / counts)[seg]
        grads = {"w": pooled.T @ dlogit, "b": dlogit.sum(0),
                 "item_emb": np.zeros_like(p["item_emb"]), "cat_emb": np.zeros_like(p["cat_emb"])}
        np.add.at(grads["item_emb"], items, drows[:, :3])
        np.add.at(grads["cat_emb"], cats, drows[:, 3:])
        p = {k: v - lr * grads[k] for k, v in p.items()}
        for name, value in run.params().items():
            np.testing.assert_allclose(value, p[name], rtol=1e-4, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------ the LoD is carried
def _lod_program(build):
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        fetch = build()
    scope, exe = fw.Scope(), fw.Executor()
    startup.random_seed = 3
    exe.run(startup, scope=scope)
    return main, scope, exe, fetch


def test_row_by_row_ops_keep_the_lod_of_their_input_at_build_and_at_run_time():
    def build():
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(ids, size=[10, 4])
        outs = [layers.fc(emb, 3), layers.relu(emb), layers.scale(emb, 2.0),
                layers.elementwise_mul(emb, layers.create_parameter([4], name="w")),
                layers.reshape(emb, [-1, 2, 2]), layers.reduce_sum(emb, dim=1), layers.cast(emb, "float64"),
                layers.batch_norm(emb), layers.layer_norm(emb), layers.dropout(emb, 0.5),
                layers.matmul(emb, layers.create_parameter([4, 2], name="m")), layers.slice(emb, [1], [1], [3]),
                layers.split(emb, 2, dim=1)[1], emb[:, 0], 1 - emb]
        assert all(o.lod_level == 1 for o in outs)
        return outs

    main, scope, exe, outs = _lod_program(build)
    values = exe.run(main, feed={"ids": ([1, 2, 3, 4], [1, 3])}, fetch_list=outs, scope=scope,
                     return_numpy=False)
    shapes = [(4, 3), (4, 4), (4, 4), (4, 4), (4, 2, 2), (4,), (4, 4), (4, 4), (4, 4), (4, 4), (4, 2), (4, 2),
              (4, 2), (4,), (4, 4)]
    assert len(values) == len(shapes)
    for value, shape in zip(values, shapes):
        assert isinstance(value, LoDTensor)
        np.testing.assert_array_equal(value.offsets, [0, 1, 4])
        assert value.values.shape == shape


def test_reducing_over_the_rows_of_a_lod_value_gives_a_plain_tensor():
    def build():
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(ids, size=[10, 4], param_attr=Normal(0.0, 1.0))
        outs = [layers.reduce_sum(emb), layers.reduce_sum(emb, dim=0), layers.mean(emb)]
        assert [o.lod_level for o in outs] == [0, 0, 0]
        return outs + [emb]

    main, scope, exe, outs = _lod_program(build)
    total, per_column, mean, emb = exe.run(main, feed={"ids": ([1, 2, 3], [2, 1])}, fetch_list=outs,
                                           scope=scope)
    np.testing.assert_allclose(total, [emb.sum()], rtol=1e-5)
    np.testing.assert_allclose(per_column, emb.sum(0), rtol=1e-5)
    np.testing.assert_allclose(mean, [emb.mean()], rtol=1e-5)


def test_two_sequence_inputs_of_different_lengths_cannot_be_joined_row_by_row():
    def build():
        a = layers.data("a", shape=[1], dtype="int64", lod_level=1)
        b = layers.data("b", shape=[1], dtype="int64", lod_level=1)
        return [layers.concat([layers.embedding(a, size=[5, 2], param_attr="t"),
                               layers.embedding(b, size=[5, 2], param_attr="t")], axis=1)]

    main, scope, exe, outs = _lod_program(build)
    with pytest.raises(DataError, match=r"concat: 'embedding.tmp_0' and 'embedding.tmp_1' are sequences of "
                                        r"different lengths \(\[2, 1\] and \[1, 2\]\)"):
        exe.run(main, feed={"a": ([1, 2, 3], [2, 1]), "b": ([1, 2, 3], [1, 2])}, fetch_list=outs, scope=scope)


# ------------------------------------------------------------------ refused at build time
@pytest.fixture
def seq():
    fw.reset_default_programs()
    ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    yield layers.embedding(ids, size=[10, 4])
    fw.reset_default_programs()


def test_concat_of_one_id_sequences_with_a_per_example_input_joins_rows_as_paddle_does():
    """Paddle's CTR scripts concatenate the embeddings of one-id slots with the dense
    features unpooled: the rows line up when every sequence holds one id."""
    def build():
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        dense = layers.data("dense_input", shape=[3])
        joined = layers.concat([layers.embedding(ids, size=[10, 4], param_attr="t"), dense], axis=1)
        assert joined.lod_level == 0 and joined.shape == (-1, 7)
        return [joined, layers.reduce_sum(layers.fc(joined, 2))]

    main, scope, exe, outs = _lod_program(build)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    joined, _ = exe.run(main, feed={"ids": ([4, 0, 9], [1, 1, 1]), "dense_input": x}, fetch_list=outs, scope=scope)
    np.testing.assert_array_equal(joined, np.concatenate([scope["t"][[4, 0, 9]], x], axis=1))
    with pytest.raises(DataError) as e:
        exe.run(main, feed={"ids": ([4, 0, 9, 2], [1, 2, 1]), "dense_input": x}, fetch_list=outs, scope=scope)
    assert str(e.value) == (
        "concat of 'embedding.tmp_0' (lod_level=1) with inputs of one row per example: its sequences hold 4 ids "
        "for 3 examples, and joining them needs exactly one id per example; pool the sequence first with "
        "layers.sequence_pool(emb, 'sum') where emb is 'embedding.tmp_0'")


def test_elementwise_ops_refuse_a_per_example_operand_for_a_sequence(seq):
    dense = layers.fc(layers.data("dense", shape=[3]), 4)
    with pytest.raises(ConfigError, match=r"^elementwise_add of 'embedding.tmp_0' \(lod_level=1, one row per "
                                          r"id\) with 'fc_0.tmp_0' \(one row per example\): pool"):
        layers.elementwise_add(seq, dense)
    with pytest.raises(ConfigError, match=r"^elementwise_mul of 'embedding.tmp_0' \(lod_level=1, one row per "
                                          r"id\): as y it would be broadcast onto x 'w', which has no row "
                                          r"per id; make the lod_level=1 value x \(the first operand\)$"):
        layers.elementwise_mul(layers.create_parameter([4], name="w"), seq)


def test_layers_that_need_one_row_per_example_say_to_pool_first(seq):
    label = layers.data("label", shape=[1], dtype="int64")
    with pytest.raises(ConfigError) as e:
        layers.cross_entropy(seq, label)
    assert str(e.value) == (
        "cross_entropy of 'embedding.tmp_0' (lod_level=1, one row per id): cross_entropy needs one row "
        "per example; pool the sequence first with layers.sequence_pool(emb, 'sum') where emb is "
        "'embedding.tmp_0'")
    with pytest.raises(ConfigError, match=r"^auc of 'embedding.tmp_0' \(lod_level=1, one row per id\): auc "
                                          r"needs one row per example; pool the sequence first"):
        layers.auc(seq, label)


def test_concat_along_the_rows_and_a_reshape_that_moves_rows_are_refused(seq):
    with pytest.raises(ConfigError, match=r"^concat of 'embedding.tmp_0' \(lod_level=1, one row per id\): "
                                          r"concat along axis 0 would stack the ids of different batches; "
                                          r"join sequences along axis 1; use axis=1, or pool"):
        layers.concat([seq, seq], axis=0)
    with pytest.raises(ConfigError, match=r"^reshape of 'embedding.tmp_0' \(lod_level=1, one row per id\): "
                                          r"reshape to \[-1, 8\] does not keep one row per id \(the first "
                                          r"dimension must stay 0 or -1, the others hold 4 values\)"):
        layers.reshape(seq, [-1, 8])


# ------------------------------------------------------------------ the execution pass
def _mixed_model():
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        ids2 = layers.data("ids2", shape=[1], dtype="int64", lod_level=1)
        y = layers.data("y", shape=[1])
        pooled = layers.sequence_pool(layers.embedding(ids2, size=[20, 4], is_sparse=True, param_attr="T"), "sum")
        emb = layers.embedding(ids, size=[20, 4], is_sparse=True, param_attr="T")
        rowwise = layers.sequence_pool(layers.fc(emb, 4, act="relu"), "max")
        also_pooled = layers.sequence_pool(emb, "average")  # the same lookup feeds two ops
        logit = layers.fc(layers.concat([pooled, rowwise, also_pooled], axis=1), 1)
        loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, y))
        optimizer.SGD(0.3).minimize(loss)
    startup.random_seed = 5
    return main, startup, loss


def _train(main, startup, loss, steps=4):
    rng = np.random.default_rng(2)
    feed = {"ids": (rng.integers(0, 20, 9), [3, 0, 4, 2]), "ids2": (rng.integers(0, 20, 6), [1, 2, 2, 1]),
            "y": _label(4, seed=3)}
    scope, exe = fw.Scope(), fw.Executor()
    exe.run(startup, scope=scope)
    losses = [exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0][0] for _ in range(steps)]
    return np.array(losses), scope["T"].copy()


def test_a_lookup_feeding_a_row_by_row_op_is_not_fused_and_training_is_unchanged(monkeypatch):
    # ids2's lookup feeds only a sequence_pool (fused); ids' feeds an fc and a sequence_pool
    main, startup, loss = _mixed_model()
    types = [op.type for op in passes.optimize_for_execution(main)]
    assert types.count("fused_embedding_seq_pool") == 1 and types.count("lookup_table") == 1
    assert types.count("fused_embedding_seq_pool_grad") == 1 and types.count("lookup_table_grad") == 1
    fused = _train(main, startup, loss)
    monkeypatch.setattr(passes, "_fuse_embedding_pool", lambda program, ops: ops)
    plain = _train(*_mixed_model())
    np.testing.assert_array_equal(fused[0], plain[0])
    np.testing.assert_array_equal(fused[1], plain[1])
    assert fused[0][-1] < fused[0][0]


# ------------------------------------------------------------------ from a dataset, with threads
def _dataset_program(reduce):
    from strategies import BuildStrategy, ReduceStrategy

    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        slots = [layers.data(f"s{i}", shape=[1], dtype="int64", lod_level=1) for i in range(3)]
        y = layers.data("y", shape=[1], dtype="int64")
        embs = [layers.embedding(s, size=[300, 4], is_sparse=True, param_attr="table") for s in slots]
        per_id = layers.fc(embs[0], 4, act="tanh")  # one row per id of slot 0
        pooled = [layers.sequence_pool(per_id, "sum")] + [layers.sequence_pool(e, "average") for e in embs[1:]]
        pred = layers.fc(layers.concat(pooled + [x], axis=1), 2, act="softmax")
        optimizer.Adam(0.01).minimize(layers.mean(layers.cross_entropy(pred, y)))
    startup.random_seed = 4
    if reduce:
        main._build_strategy = BuildStrategy()
        main._build_strategy.reduce_strategy = ReduceStrategy.Reduce
    return main, startup, [x, *slots, y]


def _train_from_files(path, threads, reduce):
    import fleet

    main, startup, inputs = _dataset_program(reduce)
    scope, exe = fw.Scope(), fw.Executor()
    exe.run(startup, scope=scope)
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var(inputs)
    ds.set_batch_size(50)
    ds.set_thread(1)
    ds.set_filelist([path])
    assert exe.train_from_dataset(main, ds, scope=scope, thread=threads, print_period=0)["examples"] == 300
    return {p.name: scope[p.name].copy() for p in main.all_parameters()}


def test_row_by_row_ops_on_sequences_train_from_a_dataset_with_reduce_threads_as_with_one(tmp_path):
    from test_thread_equivalence import _write_data

    path = str(tmp_path / "part0")
    _write_data(path, 300, 0)
    want = _train_from_files(path, 1, reduce=False)
    got = _train_from_files(path, 2, reduce=True)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
