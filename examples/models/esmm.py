"""ESMM (Ma et al., 2018): a CTR tower and a CVR tower over shared embeddings; the CVR is
learned only through pCTCVR = pCTR * pCVR, supervised by click-and-conversion over every
impression, and pCTR by the click."""
import fleet.fluid as fluid
from common import criteo_inputs, mlp, slot_embeddings


def build(hash_dim=100003, embedding_size=8, tower=(64, 32)):
    """Returns {"feeds", "loss" (CTR plus CTCVR mean cross entropy), "auc": [ctr auc,
    ctcvr auc], "predict": [pCTR, pCTCVR]}; the second label fed is the conversion
    (click and conversion: see criteo_data.py)."""
    dense, slots, (click, conversion) = criteo_inputs(multi_task=True)
    x = fluid.layers.concat(slot_embeddings(slots, hash_dim, embedding_size) + [dense], axis=1)
    ctr = fluid.layers.fc(mlp(x, tower), 2, act="softmax")
    cvr = fluid.layers.fc(mlp(x, tower), 2, act="softmax")
    p_ctr = fluid.layers.slice(ctr, axes=[1], starts=[1], ends=[2])
    p_ctcvr = p_ctr * fluid.layers.slice(cvr, axes=[1], starts=[1], ends=[2])
    ctcvr = fluid.layers.clip(fluid.layers.concat([1 - p_ctcvr, p_ctcvr], axis=1), min=1e-7, max=1.0)
    loss = (fluid.layers.mean(fluid.layers.cross_entropy(ctr, click))
            + fluid.layers.mean(fluid.layers.cross_entropy(ctcvr, conversion)))
    aucs = [fluid.layers.auc(ctr, click)[0], fluid.layers.auc(ctcvr, conversion)[0]]
    return {"feeds": [dense, *slots, click, conversion], "loss": loss, "auc": aucs, "predict": [p_ctr, p_ctcvr]}
