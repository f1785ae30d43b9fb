"""xDeepFM (Lian et al., 2018): a linear part, a Compressed Interaction Network (each layer
takes the outer products of the previous layer's feature maps with the categorical field
embeddings,
per embedding dimension, and compresses them with a 1x1 convolution; each layer's maps
are sum-pooled over the embedding dimension) and an MLP, their logits summed."""
import fleet.fluid as fluid
from common import FIELDS, SLOTS, binary_outputs, criteo_inputs, field_matrix, first_order, mlp


def cin(fields, count, dim, layer_sizes):
    """[batch, count, dim] -> [batch, sum(layer_sizes)]."""
    x0 = fluid.layers.reshape(fluid.layers.transpose(fields, [0, 2, 1]), [-1, dim, count, 1])
    xk, width, pooled = fields, count, []
    for size in layer_sizes:
        xk_t = fluid.layers.reshape(fluid.layers.transpose(xk, [0, 2, 1]), [-1, dim, 1, width])
        outer = fluid.layers.reshape(fluid.layers.matmul(x0, xk_t), [-1, dim, count * width])  # per dimension
        maps = fluid.layers.conv2d(fluid.layers.reshape(fluid.layers.transpose(outer, [0, 2, 1]),
                                                        [-1, count * width, 1, dim]),
                                   num_filters=size, filter_size=(1, 1), act="relu")
        xk, width = fluid.layers.reshape(maps, [-1, size, dim]), size
        pooled.append(fluid.layers.reduce_sum(xk, dim=-1))
    return fluid.layers.concat(pooled, axis=1)


def build(hash_dim=100003, embedding_size=8, cin_sizes=(16, 16), hidden=(64, 32)):
    """Returns {"feeds", "loss", "auc": [auc], "predict": [click probability [batch, 1]]}."""
    dense, slots, (label,) = criteo_inputs()
    fields = field_matrix(slots, dense, hash_dim, embedding_size)
    # the CIN reads the 26 categorical fields (the dense ones reach the linear part and the MLP):
    # its first layer's outer products are 26 x 26 maps instead of 39 x 39, half the cost
    sparse = fluid.layers.slice(fields, axes=[1], starts=[0], ends=[SLOTS])
    y_cin = fluid.layers.fc(cin(sparse, SLOTS, embedding_size, cin_sizes), 1)
    y_dnn = fluid.layers.fc(mlp(fluid.layers.reshape(fields, [-1, FIELDS * embedding_size]), hidden), 1)
    logit = first_order(slots, dense, hash_dim) + y_cin + y_dnn
    loss, auc, prob = binary_outputs(logit, label)
    return {"feeds": [dense, *slots, label], "loss": loss, "auc": [auc], "predict": [prob]}
