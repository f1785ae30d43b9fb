"""The CTR-DNN network of PaddleFleetX's distribute_ctr example: 26 one-id slots embedded
in one table and concatenated (unpooled, one id each) with the 13 dense features, three
fc layers of 400 with ReLU, a softmax over 2 classes; the cost is the batch's summed cross
entropy, with AUC over 4096 thresholds and a 20-batch sliding window."""
import math

import fleet.fluid as fluid


class CTR(object):
    """DNN for click-through-rate prediction."""

    def input_data(self, params):
        dense_input = fluid.layers.data(name="dense_input", shape=[params.dense_feature_dim], dtype="float32")
        sparse_input_ids = [fluid.layers.data(name="C" + str(i), shape=[1], lod_level=1, dtype="int64")
                            for i in range(1, 27)]
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        return [dense_input] + sparse_input_ids + [label]

    def net(self, inputs, params):
        def embedding_layer(ids):
            return fluid.layers.embedding(
                input=ids, is_sparse=params.is_sparse, size=[params.sparse_feature_dim, params.embedding_size],
                param_attr=fluid.ParamAttr(name="SparseFeatFactors", initializer=fluid.initializer.Uniform()))

        sparse_embed_seq = [embedding_layer(ids) for ids in inputs[1:-1]]
        layer = fluid.layers.concat(sparse_embed_seq + inputs[0:1], axis=1)
        for _ in range(3):
            layer = fluid.layers.fc(
                input=layer, size=400, act="relu",
                param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(scale=1 / math.sqrt(layer.shape[1]))))
        predict = fluid.layers.fc(
            input=layer, size=2, act="softmax",
            param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(scale=1 / math.sqrt(layer.shape[1]))))
        cost = fluid.layers.cross_entropy(input=predict, label=inputs[-1])
        avg_cost = fluid.layers.reduce_sum(cost)
        auc_var, batch_auc_var, _ = fluid.layers.auc(input=predict, label=inputs[-1], num_thresholds=2 ** 12,
                                                     slide_steps=20)
        return avg_cost, auc_var, batch_auc_var
