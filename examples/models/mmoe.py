"""MMoE (Ma et al., 2018): experts (MLPs) shared by the tasks, and per task a softmax gate
that mixes them and a tower; here the tasks are the click and the conversion."""
import fleet.fluid as fluid
from common import criteo_inputs, mlp, slot_embeddings


def build(hash_dim=100003, embedding_size=8, experts=4, expert_size=32, tower=(16,)):
    """Returns {"feeds", "loss" (the sum of both tasks' mean cross entropy), "auc": [click
    auc, conversion auc], "predict": [click probability, conversion probability]}."""
    dense, slots, labels = criteo_inputs(multi_task=True)
    x = fluid.layers.concat(slot_embeddings(slots, hash_dim, embedding_size) + [dense], axis=1)
    outs = [fluid.layers.fc(x, expert_size, act="relu") for _ in range(experts)]
    stacked = fluid.layers.reshape(fluid.layers.concat(outs, axis=1), [-1, experts, expert_size])
    losses, aucs, predicts = [], [], []
    for label in labels:
        gate = fluid.layers.fc(x, experts, act="softmax")
        mixed = fluid.layers.reduce_sum(fluid.layers.elementwise_mul(stacked, gate, axis=0), dim=1)
        predict = fluid.layers.fc(mlp(mixed, tower), 2, act="softmax")
        losses.append(fluid.layers.mean(fluid.layers.cross_entropy(predict, label)))
        aucs.append(fluid.layers.auc(predict, label)[0])
        predicts.append(fluid.layers.slice(predict, axes=[1], starts=[1], ends=[2]))
    return {"feeds": [dense, *slots, *labels], "loss": losses[0] + losses[1], "auc": aucs, "predict": predicts}
