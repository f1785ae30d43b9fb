"""CTR-DNN, built exactly as examples/ctr_dnn/network.py (the README's model), learns a planted signal in local training.

The data has Criteo's shape (13 dense features in [0, 1), 26 categorical slots of one
id each, hashed into a table of 1000001 rows, a 0/1 click label). The label is drawn
from ``sigmoid(logit)`` where the logit depends on the values of slots C1..C3 (each value
has its own effect) and on two dense features; the other 23 slots are noise. The
best possible test AUC (scoring by the true probability) is about 0.88; the model must
reach well above 0.5 on held-out data after 200 batches of 500 (about 3 s on an idle
2-core machine; batches of 500 rather than the example's 1000 halve the time and learn as well).
"""
import math

import numpy as np
import pytest

import fleet
import fleet.base
import fleet.framework as fw
from fleet import layers, optimizer
from role_makers import LocalRoleMaker

HASH_DIM = 1000001
SLOTS = 26
VOCAB = 50          # distinct values per slot
SIGNAL_SLOTS = (0, 1, 2)
BATCH = 500
TRAIN_BATCHES = 200
LEARNING_RATE = 2e-3


class World:
    """The planted generative model: slot values -> ids and effects."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.ids = np.stack([rng.choice(HASH_DIM, VOCAB, replace=False) for _ in range(SLOTS)])
        self.effects = np.zeros((SLOTS, VOCAB))
        for k in SIGNAL_SLOTS:
            self.effects[k] = rng.normal(0.0, 1.0, VOCAB)

    def batch(self, rng, size=BATCH):
        """Returns (feed, true click probabilities)."""
        raw = rng.integers(0, VOCAB, (size, SLOTS))
        dense = rng.random((size, 13), dtype=np.float32)
        logit = (self.effects[np.arange(SLOTS), raw].sum(axis=1)
                 + 3.0 * (dense[:, 0] - 0.5) - 2.0 * (dense[:, 1] - 0.5))
        prob = 1.0 / (1.0 + np.exp(-logit))
        label = (rng.random(size) < prob).astype(np.int64).reshape(size, 1)
        feed = {"dense_input": dense, "label": label}
        ones = np.ones(size, dtype=np.int64)
        for k in range(SLOTS):
            feed[f"C{k + 1}"] = (self.ids[k][raw[:, k]], ones)
        return feed, prob


def numpy_auc(score, label):
    """Mann-Whitney AUC with average ranks for ties."""
    score = np.asarray(score, dtype=np.float64)
    label = np.asarray(label).reshape(-1).astype(bool)
    order = np.argsort(score, kind="mergesort")
    sorted_scores = score[order]
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    uniq, start, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    for s, c in zip(start[counts > 1], counts[counts > 1]):
        ranks[order[s:s + c]] = s + (c + 1) / 2.0
    n_pos = label.sum()
    n_neg = len(label) - n_pos
    return float((ranks[label].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def test_numpy_auc_reference_counts_ties_half():
    assert numpy_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert numpy_auc([0.5, 0.5], [0, 1]) == 0.5


def build_ctr_dnn():
    """The README's CTR-DNN model, verbatim except for the optimizer (see the test)."""
    dense = layers.data("dense_input", shape=[13], dtype="float32")
    slots = [layers.data(f"C{i}", shape=[1], lod_level=1, dtype="int64") for i in range(1, 27)]
    label = layers.data("label", shape=[1], dtype="int64")
    table = fleet.ParamAttr(name="SparseFeatFactors", initializer=fleet.initializer.Uniform(-1.0, 1.0))
    embs = [layers.embedding(s, size=[1000001, 10], is_sparse=True, param_attr=table) for s in slots]
    x = layers.concat([layers.sequence_pool(e, "sum") for e in embs] + [dense], axis=1)
    for width in (400, 400, 400):
        w = fleet.ParamAttr(initializer=fleet.initializer.Normal(0.0, 1.0 / math.sqrt(x.shape[1])))
        x = layers.fc(x, width, act="relu", param_attr=w)
    predict = layers.fc(x, 2, act="softmax")
    avg_cost = layers.mean(layers.cross_entropy(predict, label))
    auc, batch_auc, states = layers.auc(predict, label)
    return predict, avg_cost, auc, batch_auc, states


@pytest.fixture
def local_fleet(monkeypatch):
    monkeypatch.setattr(fleet.base, "fleet", fleet.base.Fleet())
    monkeypatch.delenv("TRAINING_ROLE", raising=False)
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        yield
    fw.reset_default_programs()


def test_ctr_dnn_trains_locally_and_its_test_auc_rises_well_above_chance(local_fleet):
    fleet.init(LocalRoleMaker())
    fleet.default_main_program().random_seed = 1
    predict, avg_cost, auc, batch_auc, states = build_ctr_dnn()
    assert predict.shape == (-1, 2)
    block = fleet.default_main_program().global_block()
    (concat,) = [op for op in block.ops if op.type == "concat"]
    assert block.var(concat.output("Out")[0]).shape == (-1, 26 * 10 + 13)
    assert [p.shape for p in fleet.default_main_program().all_parameters() if p.name.endswith(".w_0")] == [
        (273, 400), (400, 400), (400, 400), (400, 2)]
    # The README's script uses SGD(1e-4), which needs many epochs; lazy Adam learns the planted
    # signal within a test's time budget and keeps each step to the batch's table rows.
    fleet.distributed_optimizer(optimizer.Adam(LEARNING_RATE, lazy_mode=True)).minimize(avg_cost)
    test_program = fleet.main_program.clone(for_test=True)

    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    scope = fleet.global_scope()
    assert scope["SparseFeatFactors"].shape == (HASH_DIM, 10)

    world = World(seed=0)
    rng = np.random.default_rng(1)
    costs, batch_aucs = [], []
    for _ in range(TRAIN_BATCHES):
        feed, _ = world.batch(rng)
        cost, b_auc = exe.run(fleet.main_program, feed=feed, fetch_list=[avg_cost, batch_auc])
        costs.append(float(cost[0]))
        batch_aucs.append(float(b_auc[0]))
    assert np.mean(costs[-20:]) < np.mean(costs[:20]) - 0.1
    assert np.mean(batch_aucs[-20:]) > 0.75

    for var in states:  # evaluate the held-out set with fresh metric state
        scope[var.name][...] = 0
    table_before = np.array(scope["SparseFeatFactors"][world.ids[0]])
    test_rng = np.random.default_rng(99)
    scores, labels, truth = [], [], []
    for _ in range(4):
        feed, prob = world.batch(test_rng, 1000)
        pred, global_auc = exe.run(test_program, feed=feed, fetch_list=[predict, auc])
        scores.append(pred[:, 1])
        labels.append(feed["label"])
        truth.append(prob)
    scores, labels = np.concatenate(scores), np.concatenate(labels)
    test_auc = numpy_auc(scores, labels)
    best_auc = numpy_auc(np.concatenate(truth), labels)
    assert best_auc > 0.85
    assert test_auc > 0.75, f"test AUC {test_auc:.4f} (best possible {best_auc:.4f})"
    # the engine's bucketed AUC op agrees with the exact AUC on the same predictions
    assert abs(float(global_auc[0]) - test_auc) < 0.005
    # evaluating moved no parameter
    np.testing.assert_array_equal(scope["SparseFeatFactors"][world.ids[0]], table_before)
