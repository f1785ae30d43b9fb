"""Deep & Cross Network (Wang et al., 2017): cross layers x_{l+1} = x0 * (x_l . w_l) + b_l +
x_l over the concatenated embeddings and dense features, beside an MLP with batch norm;
both concatenated into one logit."""
import fleet.fluid as fluid
from common import DENSE_DIM, SLOTS, binary_outputs, criteo_inputs, slot_embeddings


def cross_layers(x0, width, count):
    x = x0
    for k in range(count):
        w = fluid.layers.create_parameter([width], dtype="float32", name=f"cross_{k}.w_0",
                                          default_initializer=fluid.initializer.Normal(0.0, 0.01))
        b = fluid.layers.create_parameter([width], dtype="float32", name=f"cross_{k}.b_0", is_bias=True)
        x = x0 * fluid.layers.reduce_sum(x * w, dim=1, keep_dim=True) + b + x
    return x


def build(hash_dim=100003, embedding_size=8, cross=3, hidden=(64, 32)):
    """Returns {"feeds", "loss", "auc": [auc], "predict": [click probability [batch, 1]]}."""
    dense, slots, (label,) = criteo_inputs()
    x0 = fluid.layers.concat(slot_embeddings(slots, hash_dim, embedding_size) + [dense], axis=1)
    crossed = cross_layers(x0, SLOTS * embedding_size + DENSE_DIM, cross)
    deep = x0
    for size in hidden:
        deep = fluid.layers.batch_norm(fluid.layers.fc(deep, size), act="relu")
    logit = fluid.layers.fc(fluid.layers.concat([deep, crossed], axis=1), 1)
    loss, auc, prob = binary_outputs(logit, label)
    return {"feeds": [dense, *slots, label], "loss": loss, "auc": [auc], "predict": [prob]}
