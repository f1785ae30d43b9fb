"""Shared-Bottom multi-task model (Caruana, 1997): one bottom MLP shared by the tasks and
a tower per task (click and conversion)."""
import fleet.fluid as fluid
from common import criteo_inputs, mlp, slot_embeddings


def build(hash_dim=100003, embedding_size=8, bottom=(64,), tower=(16,)):
    """Returns {"feeds", "loss" (the sum of both tasks' mean cross entropy), "auc": [click
    auc, conversion auc], "predict": [click probability, conversion probability]}."""
    dense, slots, labels = criteo_inputs(multi_task=True)
    shared = mlp(fluid.layers.concat(slot_embeddings(slots, hash_dim, embedding_size) + [dense], axis=1), bottom)
    losses, aucs, predicts = [], [], []
    for label in labels:
        predict = fluid.layers.fc(mlp(shared, tower), 2, act="softmax")
        losses.append(fluid.layers.mean(fluid.layers.cross_entropy(predict, label)))
        aucs.append(fluid.layers.auc(predict, label)[0])
        predicts.append(fluid.layers.slice(predict, axes=[1], starts=[1], ends=[2]))
    return {"feeds": [dense, *slots, *labels], "loss": losses[0] + losses[1], "auc": aucs, "predict": predicts}
