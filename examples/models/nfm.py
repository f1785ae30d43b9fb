"""NFM (He and Chua, 2017): bi-interaction pooling of the field embeddings (the sum of
their pairwise element-wise products, a vector) fed to an MLP, plus the linear part."""
import fleet.fluid as fluid
from common import binary_outputs, criteo_inputs, field_matrix, first_order, mlp


def bi_interaction(fields):
    """0.5 * ((sum_f v_f)^2 - sum_f v_f^2), element-wise: [batch, fields, dim] -> [batch, dim]."""
    summed = fluid.layers.reduce_sum(fields, dim=1)
    return 0.5 * (fluid.layers.square(summed) - fluid.layers.reduce_sum(fluid.layers.square(fields), dim=1))


def build(hash_dim=100003, embedding_size=8, hidden=(32,), dropout=0.1):
    """Returns {"feeds", "loss", "auc": [auc], "predict": [click probability [batch, 1]]}."""
    dense, slots, (label,) = criteo_inputs()
    pooled = fluid.layers.batch_norm(bi_interaction(field_matrix(slots, dense, hash_dim, embedding_size)))
    pooled = fluid.layers.dropout(pooled, dropout, dropout_implementation="upscale_in_train")
    logit = first_order(slots, dense, hash_dim) + fluid.layers.fc(mlp(pooled, hidden), 1)
    loss, auc, prob = binary_outputs(logit, label)
    return {"feeds": [dense, *slots, label], "loss": loss, "auc": [auc], "predict": [prob]}
