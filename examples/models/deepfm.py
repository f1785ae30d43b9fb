"""DeepFM (Guo et al., 2017): a factorization machine (first-order weights plus the
pairwise inner products of the 39 field embeddings, by the sum-square identity) and an
MLP over the same embeddings, their logits summed into a sigmoid. As PaddleRec's DeepFM,
the first-order weights and the field embeddings carry an L1 decay (``reg``)."""
import fleet.fluid as fluid
from common import FIELDS, binary_outputs, criteo_inputs, field_matrix, first_order, mlp

REG = 1e-4  # L1 decay of the sparse weights and embeddings


def fm_second_order(fields):
    """0.5 * sum_d ((sum_f v_fd)^2 - sum_f v_fd^2): [batch, fields, dim] -> [batch, 1]."""
    summed = fluid.layers.reduce_sum(fields, dim=1)
    squares = fluid.layers.reduce_sum(fluid.layers.square(fields), dim=1)
    return 0.5 * fluid.layers.reduce_sum(fluid.layers.square(summed) - squares, dim=1, keep_dim=True)


def build(hash_dim=100003, embedding_size=8, hidden=(64, 32), reg=REG):
    """Returns {"feeds", "loss", "auc": [auc], "predict": [click probability [batch, 1]]}."""
    dense, slots, (label,) = criteo_inputs()
    decay = fluid.regularizer.L1DecayRegularizer(reg) if reg else None
    fields = field_matrix(slots, dense, hash_dim, embedding_size, regularizer=decay)
    deep = fluid.layers.fc(mlp(fluid.layers.reshape(fields, [-1, FIELDS * embedding_size]), hidden), 1)
    logit = first_order(slots, dense, hash_dim, regularizer=decay) + fm_second_order(fields) + deep
    loss, auc, prob = binary_outputs(logit, label)
    return {"feeds": [dense, *slots, label], "loss": loss, "auc": [auc], "predict": [prob]}
