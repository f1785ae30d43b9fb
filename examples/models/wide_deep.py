"""Wide & Deep (Cheng et al., 2016): a wide linear part (one weight per id plus a linear
function of the dense features) and a deep MLP over the embeddings and dense features,
their logits summed into a sigmoid."""
import fleet.fluid as fluid
from common import binary_outputs, criteo_inputs, first_order, mlp, slot_embeddings


def build(hash_dim=100003, embedding_size=8, hidden=(64, 32)):
    """Returns {"feeds", "loss", "auc": [auc], "predict": [click probability [batch, 1]]}."""
    dense, slots, (label,) = criteo_inputs()
    wide = first_order(slots, dense, hash_dim)
    deep_in = fluid.layers.concat(slot_embeddings(slots, hash_dim, embedding_size) + [dense], axis=1)
    deep = fluid.layers.fc(mlp(deep_in, hidden), 1)
    logit = fluid.layers.clip(wide + deep, min=-15.0, max=15.0)
    loss, auc, prob = binary_outputs(logit, label)
    return {"feeds": [dense, *slots, label], "loss": loss, "auc": [auc], "predict": [prob]}
