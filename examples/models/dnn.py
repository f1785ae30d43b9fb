"""DNN (Paddle's CTR-DNN): the slot embeddings and the dense features concatenated, fully
connected layers with ReLU, a softmax over click / no click, mean cross entropy."""
import fleet.fluid as fluid
from common import criteo_inputs, mlp, slot_embeddings


def build(hash_dim=100003, embedding_size=8, hidden=(64, 32)):
    """Returns {"feeds", "loss", "auc": [auc], "predict": [probability of a click, [batch, 1]]}."""
    dense, slots, (label,) = criteo_inputs()
    x = fluid.layers.concat(slot_embeddings(slots, hash_dim, embedding_size) + [dense], axis=1)
    predict = fluid.layers.fc(mlp(x, hidden), 2, act="softmax")
    loss = fluid.layers.mean(fluid.layers.cross_entropy(predict, label))
    auc, _, _ = fluid.layers.auc(predict, label)
    click = fluid.layers.slice(predict, axes=[1], starts=[1], ends=[2])
    return {"feeds": [dense, *slots, label], "loss": loss, "auc": [auc], "predict": [click]}
