"""What the model builders share: the Criteo-format inputs, their embeddings, an MLP, and
the data they train on.

Every model reads the inputs of Paddle's CTR scripts: ``dense_input`` (13 floats),
``C1``..``C26`` (one hashed id each, lod_level=1) and ``label`` (the click); the multi-task
models also read ``conversion`` (see ``criteo_data.py`` for how it is derived).
"""
import fleet.fluid as fluid

DENSE_DIM, SLOTS = 13, 26
FIELDS = SLOTS + DENSE_DIM  # the FM-style models treat each dense feature as a field too


def criteo_inputs(multi_task=False):
    """Declares the inputs; returns (dense, [C1..C26], labels) with labels [click] or
    [click, conversion]."""
    dense = fluid.layers.data(name="dense_input", shape=[DENSE_DIM], dtype="float32")
    slots = [fluid.layers.data(name=f"C{i}", shape=[1], lod_level=1, dtype="int64") for i in range(1, SLOTS + 1)]
    labels = [fluid.layers.data(name="label", shape=[1], dtype="int64")]
    if multi_task:
        labels.append(fluid.layers.data(name="conversion", shape=[1], dtype="int64"))
    return dense, slots, labels


def slot_embeddings(slots, hash_dim, dim, name="SparseFeatFactors", regularizer=None):
    """One [batch, dim] embedding per slot, all rows of one is_sparse table (as Paddle's
    CTR scripts share ``SparseFeatFactors``); ``regularizer`` decays the table's rows."""
    attr = fluid.ParamAttr(name=name, initializer=fluid.initializer.Uniform(-0.05, 0.05),
                           regularizer=regularizer)
    return [fluid.layers.sequence_pool(
        fluid.layers.embedding(s, size=[hash_dim, dim], is_sparse=True, param_attr=attr), "sum") for s in slots]


def field_matrix(slots, dense, hash_dim, dim, regularizer=None):
    """All 39 fields as [batch, 39, dim]: the 26 slot embeddings, then each dense feature
    times a learned vector of its own (the value-scaled field embedding of FM models)."""
    sparse = fluid.layers.reshape(fluid.layers.concat(slot_embeddings(slots, hash_dim, dim,
                                                                      regularizer=regularizer), axis=1),
                                  [-1, SLOTS, dim])
    vectors = fluid.layers.create_parameter([DENSE_DIM, dim], dtype="float32", name="dense_field_vectors",
                                            default_initializer=fluid.initializer.Uniform(-0.05, 0.05))
    values = fluid.layers.expand(fluid.layers.reshape(dense, [-1, DENSE_DIM, 1]), [1, 1, dim])
    dense_fields = fluid.layers.elementwise_mul(values, vectors, axis=1)
    return fluid.layers.concat([sparse, dense_fields], axis=1)


def first_order(slots, dense, hash_dim, regularizer=None):
    """The linear part of FM / wide models: one weight per id (a [hash_dim, 1] table) plus
    a linear function of the dense features; [batch, 1]."""
    attr = fluid.ParamAttr(name="first_order_weights", initializer=fluid.initializer.Constant(0.0),
                           regularizer=regularizer)
    weights = [fluid.layers.sequence_pool(
        fluid.layers.embedding(s, size=[hash_dim, 1], is_sparse=True, param_attr=attr), "sum") for s in slots]
    return fluid.layers.sums(weights) + fluid.layers.fc(dense, 1)


def mlp(x, sizes, act="relu"):
    for size in sizes:
        x = fluid.layers.fc(x, size, act=act)
    return x


def binary_outputs(logit, label):
    """Sigmoid output of a [batch, 1] logit: (mean log loss, auc, probability [batch, 1])."""
    loss = fluid.layers.reduce_mean(
        fluid.layers.sigmoid_cross_entropy_with_logits(logit, fluid.layers.cast(label, "float32")))
    prob = fluid.layers.sigmoid(logit)
    auc, _, _ = fluid.layers.auc(fluid.layers.concat([1 - prob, prob], axis=1), label)
    return loss, auc, prob
