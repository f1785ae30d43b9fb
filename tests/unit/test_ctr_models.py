"""The networks of Paddle 1.x CTR and multi-task models, written with fleet.layers the way
their scripts use fluid.layers, build, train (the loss falls on a batch they can fit)
and run as test clones. Small sizes; each model is a sketch of its structure, not a
reference implementation."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.initializer import TruncatedNormal

B, F, V, D = 16, 4, 30, 4  # batch, fields, vocabulary, embedding width
RNG = np.random.default_rng(0)
IDS = RNG.integers(1, V, (B, F))
VALUES = RNG.uniform(0.5, 1.5, (B, F)).astype(np.float32)
DENSE = RNG.normal(size=(B, 5)).astype(np.float32)
CLICK = (IDS[:, 0] % 2).reshape(B, 1)  # a signal the models can learn
LENGTHS = RNG.integers(0, 4, B)
HIST = RNG.integers(1, V, int(LENGTHS.sum()))


def _ids():
    return layers.data("ids", shape=[F], dtype="int64")


def _label(dtype="int64"):
    return layers.data("label", shape=[1], dtype=dtype)


def _dnn(x, sizes, act="relu"):
    for size in sizes:
        x = layers.fc(x, size, act=act)
    return x


def _fm_inputs():
    """DeepFM / NFM / AFM inputs: per-field embeddings scaled by the field values."""
    ids, values = _ids(), layers.data("values", shape=[F])
    value3 = layers.reshape(values, [-1, F, 1])
    first = layers.embedding(ids, size=[V, 1], is_sparse=True, padding_idx=0)
    emb = layers.embedding(ids, size=[V, D], is_sparse=True, padding_idx=0,
                           param_attr=TruncatedNormal(0.0, 0.1))
    y_first = layers.reduce_sum(first * value3, 1)
    return y_first, emb * value3


def deepfm():
    y_first, emb = _fm_inputs()
    summed = layers.reduce_sum(emb, 1)
    y_second = 0.5 * layers.reduce_sum(layers.square(summed) - layers.reduce_sum(layers.square(emb), 1), 1,
                                       keep_dim=True)
    y_dnn = layers.fc(_dnn(layers.reshape(emb, [-1, F * D]), [8, 8]), 1)
    pred = layers.sigmoid(y_first + y_second + y_dnn)
    return layers.reduce_sum(layers.log_loss(pred, layers.cast(_label(), "float32")))


def nfm():
    _, emb = _fm_inputs()
    summed = layers.reduce_sum(emb, 1)
    bi = 0.5 * (layers.square(summed) - layers.reduce_sum(layers.square(emb), 1))
    bi = layers.dropout(layers.batch_norm(bi), 0.2, seed=3)
    pred = layers.fc(layers.batch_norm(layers.fc(bi, 8), act="relu"), 1, act="sigmoid")
    return layers.mse_loss(pred, layers.cast(_label(), "float32"))


def afm():
    y_first, emb = _fm_inputs()
    pairs = [emb[:, i, :] * emb[:, j, :] for i in range(F) for j in range(i + 1, F)]
    stacked = layers.transpose(layers.stack(pairs, axis=0), perm=[1, 0, 2])  # [B, P, D]
    hidden = layers.fc(layers.reshape(stacked, [-1, D]), 6, act="relu")
    scores = layers.matmul(hidden, layers.create_parameter([6, 1], dtype="float32"))
    weights = layers.reshape(layers.softmax(layers.reshape(scores, [-1, len(pairs)])), [-1, len(pairs), 1])
    pooled = layers.reshape(layers.matmul(weights, stacked, transpose_x=True), [-1, D])
    pred = layers.sigmoid(y_first + layers.fc(pooled, 1))
    return layers.mean(layers.log_loss(pred, layers.cast(_label(), "float32")))


def xdeepfm():
    y_first, emb = _fm_inputs()
    xs, last = [emb], F
    for size in (3, 2):  # CIN
        x0 = layers.reshape(layers.transpose(xs[0], [0, 2, 1]), [-1, D, F, 1])
        xk = layers.reshape(layers.transpose(xs[-1], [0, 2, 1]), [-1, D, 1, last])
        z = layers.transpose(layers.reshape(layers.matmul(x0, xk), [-1, D, last * F]), [0, 2, 1])
        z = layers.conv2d(layers.reshape(z, [-1, last * F, 1, D]), num_filters=size, filter_size=(1, 1),
                          bias_attr=False)
        xs.append(layers.reshape(z, [-1, size, D]))
        last = size
    y_cin = layers.fc(layers.reduce_sum(layers.concat(xs[1:], 1), -1), 1)
    y_dnn = layers.fc(_dnn(layers.reshape(emb, [-1, F * D]), [8]), 1)
    pred = layers.sigmoid(y_first + y_cin + y_dnn)
    return layers.reduce_mean(layers.log_loss(pred, layers.cast(_label(), "float32")))


def dcn():
    emb = layers.flatten(layers.embedding(_ids(), size=[V, D], is_sparse=True), axis=1)
    x0 = layers.concat([layers.data("dense", shape=[5]), emb], axis=-1)
    x, l2 = x0, []
    for k in range(2):  # cross layers
        w = layers.create_parameter([5 + F * D], dtype="float32", name=f"cross_{k}_w")
        b = layers.create_parameter([5 + F * D], dtype="float32", name=f"cross_{k}_b", is_bias=True)
        x = x0 * layers.reduce_sum(x * w, dim=1, keep_dim=True) + b + x
        l2.append(layers.reduce_sum(layers.square(w)))
    deep = x0
    for size in (8, 8):
        deep = layers.relu(layers.batch_norm(layers.fc(deep, size)))
    logit = layers.fc(layers.concat([deep, x], axis=-1), 1)
    loss = layers.reduce_mean(layers.sigmoid_cross_entropy_with_logits(logit, layers.cast(_label(), "float32")))
    return loss + 1e-4 * layers.reduce_sum(layers.concat(l2, axis=-1))


def wide_deep():
    dense = layers.data("dense", shape=[5])
    wide = layers.fc(dense, 1)
    deep = layers.fc(_dnn(dense, [8, 8]), 1)
    pred = layers.sigmoid(layers.clip(layers.elementwise_add(wide, deep), min=-15.0, max=15.0))
    label = layers.cast(_label(), "float32")
    total = layers.create_tensor(dtype="int64")
    layers.accuracy(layers.concat([1 - pred, pred], axis=1), _label_int(label), total=total)
    return layers.mean(layers.log_loss(pred, label))


def _label_int(label):
    return layers.cast(label, "int64")


def fibinet():
    ids = [layers.data(f"slot{k}", shape=[1], dtype="int64", lod_level=1) for k in range(F)]
    emb = layers.concat([layers.sequence_pool(layers.embedding(i, size=[V, D], is_sparse=True, param_attr="dis_emb"),
                                              "sum") for i in ids], axis=1)
    emb = layers.reshape(emb, [-1, F, D])
    squeeze = layers.reduce_mean(emb, dim=-1)  # SENET
    weights = layers.fc(layers.fc(squeeze, 2, act="relu"), F, act="relu")
    senet = layers.elementwise_mul(emb, layers.unsqueeze(weights, axes=[2]))

    def bilinear(fields):
        parts = layers.split(fields, num_or_sections=F, dim=1)
        return layers.concat([layers.elementwise_mul(layers.fc(parts[i], D, num_flatten_dims=2, bias_attr=False),
                                                     parts[j]) for i in range(F) for j in range(i + 1, F)], axis=1)

    x = layers.flatten(layers.concat([bilinear(senet), bilinear(emb)], axis=1), axis=1)
    x = layers.dropout(layers.fc(x, 8, act="relu"), 0.1, seed=2)
    pred = layers.fc(x, 1, act="sigmoid")
    return layers.reduce_mean(layers.log_loss(pred, layers.cast(_label(), "float32")))


def din():
    hist = layers.data("hist", shape=[1], dtype="int64", lod_level=1)
    target = layers.data("target", shape=[1], dtype="int64")
    hist_emb = layers.embedding(hist, size=[V, D], param_attr="item_emb")
    target_emb = layers.embedding(target, size=[V, D], param_attr="item_emb")
    expanded = layers.sequence_expand_as(target_emb, hist_emb)
    att = layers.concat([hist_emb, expanded, hist_emb - expanded, hist_emb * expanded], axis=1)
    score = layers.fc(layers.fc(att, 8, act="sigmoid"), 1)
    weighted = layers.elementwise_mul(hist_emb, layers.sequence_softmax(score))
    interest = layers.sequence_pool(weighted, "sum")
    logit = layers.fc(layers.fc(layers.concat([interest, target_emb], axis=1), 8, act="sigmoid"), 1)
    return layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, layers.cast(_label(), "float32")))


def mmoe():
    x = layers.data("dense", shape=[5])
    experts = layers.reshape(layers.concat([layers.fc(x, 4, act="relu") for _ in range(3)], axis=1), [-1, 3, 4])
    losses = []
    for task in range(2):
        gate = layers.fc(x, 3, act="softmax")
        mixed = layers.reduce_sum(layers.elementwise_mul(experts, gate, axis=0), dim=1)
        pred = layers.clip(layers.fc(layers.fc(mixed, 4, act="relu"), 2, act="softmax"), min=1e-15, max=1.0 - 1e-15)
        label = layers.data(f"task{task}", shape=[2])
        losses.append(layers.cross_entropy(pred, label, soft_label=True))
        layers.auc(pred, layers.cast(layers.slice(label, axes=[1], starts=[1], ends=[2]), "int64"))
    return layers.mean(layers.elementwise_add(losses[0], losses[1], axis=1))


def esmm():
    slots = [layers.data(f"slot{k}", shape=[1], dtype="int64", lod_level=1) for k in range(F)]
    emb = layers.concat([layers.sequence_pool(layers.embedding(s, size=[V, D], is_sparse=True, param_attr="dis_emb"),
                                              "sum") for s in slots], axis=1)
    ctr = layers.fc(_dnn(emb, [8]), 2, act="softmax")
    cvr = layers.fc(_dnn(emb, [8]), 2, act="softmax")
    ctcvr_one = layers.elementwise_mul(layers.slice(ctr, axes=[1], starts=[1], ends=[2]),
                                       layers.slice(cvr, axes=[1], starts=[1], ends=[2]))
    ctcvr = layers.concat([1 - ctcvr_one, ctcvr_one], axis=1)
    label = _label()
    return layers.mean(layers.cross_entropy(ctr, label) + layers.cross_entropy(ctcvr, label))


def _feed():
    soft = np.eye(2, dtype=np.float32)[CLICK[:, 0]]
    feed = {"ids": IDS, "values": VALUES, "dense": DENSE + CLICK, "label": CLICK, "task0": soft, "task1": soft,
            "hist": (HIST, LENGTHS), "target": IDS[:, :1] * 0 + CLICK + 1}
    for k in range(F):
        feed[f"slot{k}"] = (IDS[:, k], np.ones(B, np.int64))
    return feed


MODELS = [deepfm, nfm, afm, xdeepfm, dcn, wide_deep, fibinet, din, mmoe, esmm]


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_the_model_builds_trains_and_runs_as_a_test_clone(model):
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        loss = model()
        test = main.clone(for_test=True)
        optimizer.Adam(0.02).minimize(loss)
    startup.random_seed = 1
    scope, exe = fw.Scope(), fw.Executor()
    exe.run(startup, scope=scope)
    fed = {v.name for v in main.list_vars() if v.is_data}
    feed = {k: v for k, v in _feed().items() if k in fed}
    losses = [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0][0]) for _ in range(40)]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.7 * losses[0], losses[::8]
    (test_loss,) = exe.run(test, feed=feed, fetch_list=[loss], scope=scope)
    assert np.isfinite(test_loss).all()


@pytest.mark.parametrize("model", [deepfm, xdeepfm, afm, fibinet, din], ids=lambda m: m.__name__)
def test_a_saved_test_program_of_the_model_comes_back_and_predicts_the_same(model):
    from fleet.framework.program import deserialize_program, serialize_program

    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        loss = model()
    startup.random_seed = 2
    scope, exe = fw.Scope(), fw.Executor()
    exe.run(startup, scope=scope)
    test = main.clone(for_test=True)
    fed = {v.name for v in main.list_vars() if v.is_data}
    feed = {k: v for k, v in _feed().items() if k in fed}
    (expected,) = exe.run(test, feed=feed, fetch_list=[loss], scope=scope)
    loaded = deserialize_program(serialize_program(test))
    (got,) = exe.run(loaded, feed=feed, fetch_list=[loss.name], scope=scope)
    np.testing.assert_array_equal(got, expected)
