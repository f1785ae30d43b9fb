"""The CTR-DNN model of fleet's design (Paddle's ctr_dnn): 26 sparse slots sharing one
embedding table, sum-pooled, concatenated with 13 dense features, three fc layers of 400
with relu, a softmax over 2 classes, mean cross entropy and AUC."""
import math

import fleet
from fleet import layers

DENSE_DIM = 13
SLOTS = 26


def ctr_dnn_model(sparse_feature_dim=1000001, embedding_size=10, hidden=(400, 400, 400),
                  is_distributed=False, sparse_embedding=False, entry=None):
    """Builds the model in the current programs.

    Args:
        sparse_embedding: look the slots up with ``fleet.layers.sparse_embedding`` (Paddle
            2.x's layer for a production table kept on the servers, as ``online.py`` does)
            instead of ``fleet.layers.embedding``.
        entry: with sparse_embedding, the table's admission (``fleet.CountFilterEntry(n)``,
            ``fleet.ProbabilityEntry(p)``) or None (every id gets a row).

    Returns:
        (inputs, avg_cost, auc, batch_auc, predict, auc_states): ``inputs`` in dataset
        order (dense_input, C1..C26, label).
    """
    dense = layers.data("dense_input", shape=[DENSE_DIM], dtype="float32")
    slots = [layers.data(f"C{i}", shape=[1], lod_level=1, dtype="int64") for i in range(1, SLOTS + 1)]
    label = layers.data("label", shape=[1], dtype="int64")
    table = fleet.ParamAttr(name="SparseFeatFactors", initializer=fleet.initializer.Uniform(-1.0, 1.0))
    if sparse_embedding:
        embs = [layers.sparse_embedding(s, size=[sparse_feature_dim, embedding_size], entry=entry, param_attr=table)
                for s in slots]
    else:
        embs = [layers.embedding(s, size=[sparse_feature_dim, embedding_size], is_sparse=True,
                                 is_distributed=is_distributed, param_attr=table) for s in slots]
    x = layers.concat([layers.sequence_pool(e, "sum") for e in embs] + [dense], axis=1)
    for width in hidden:
        w = fleet.ParamAttr(initializer=fleet.initializer.Normal(0.0, 1.0 / math.sqrt(x.shape[1])))
        x = layers.fc(x, width, act="relu", param_attr=w)
    w = fleet.ParamAttr(initializer=fleet.initializer.Normal(0.0, 1.0 / math.sqrt(x.shape[1])))
    predict = layers.fc(x, 2, act="softmax", param_attr=w)
    avg_cost = layers.mean(layers.cross_entropy(predict, label))
    auc, batch_auc, states = layers.auc(predict, label)
    return [dense, *slots, label], avg_cost, auc, batch_auc, predict, states
