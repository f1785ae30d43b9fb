"""A CTR model whose sparse_embedding has an entry and a CTR accessor, trained locally or
under fleetrun by tests/integration/test_entries_job.py.

Usage: entries_model.py MODE OUT_DIR ENTRY     (ENTRY: count or show_click)

Every process (the local one, or each worker of a job) trains the same fixed batches
(with several workers, worker k takes every k-th batch), calls fleet.shrink(), trains
two more batches, and writes OUT_DIR/worker<k>.json (or local.json) with what shrink
returned. A server writes OUT_DIR/server<i>.npz after run_server: its shard's ids,
values and statistics, its accessor's fields and its last shrink's counts; the local
process writes OUT_DIR/local.npz likewise from fleet.runtime.local_tables().
"""
import json
import os
import sys

import numpy as np

import fleet
import fleet.layers as layers
from fleet.framework.tensor import LoDTensor
from fleet.initializer import Uniform
from fleet.optimizer import SGD
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

mode, out_dir, entry_kind = sys.argv[1], sys.argv[2], sys.argv[3]
BATCHES, BATCH, VOCAB = 16, 16, 300
ACCESSOR = {"delete_threshold": 0.3, "sparse_show_click_decay_rate": 0.9}


def batches(n, seed=5):
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        seqs = [list(rng.zipf(1.5, size=rng.randint(1, 5)) % VOCAB) for _ in range(BATCH)]
        shows = rng.randint(1, 4, size=BATCH).astype(np.float32)
        clicks = (rng.rand(BATCH) < 0.3).astype(np.float32)
        values = np.array([i for s in seqs for i in s], np.int64)
        lengths = np.array([len(s) for s in seqs], np.int64)
        out.append({"ids": LoDTensor.from_lengths(values, lengths), "show": shows.reshape(-1, 1),
                    "click": clicks.reshape(-1, 1)})
    return out


fleet.init(PaddleCloudRoleMaker())
main, startup = fleet.default_main_program(), fleet.default_startup_program()
startup.random_seed = 11
ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
show = layers.data("show", shape=[1], dtype="float32")
click = layers.data("click", shape=[1], dtype="float32")
entry = fleet.CountFilterEntry(2) if entry_kind == "count" else fleet.ShowClickEntry("show", "click")
emb = layers.sparse_embedding(ids, [VOCAB, 8], entry=entry,
                              param_attr=fleet.ParamAttr(name="emb", initializer=Uniform(-0.1, 0.1)))
pooled = layers.sequence_pool(emb, "sum")
logit = layers.fc(layers.concat([pooled, show], axis=1), 1)
loss = layers.mean(layers.sigmoid_cross_entropy_with_logits(logit, click))
strategy = getattr(DistributedStrategyFactory, f"create_{mode}_strategy")()
strategy.set_sparse_table_config("emb", **ACCESSOR)
fleet.distributed_optimizer(SGD(0.2), strategy).minimize(loss)


def dump(path, table, deleted):
    state = table.state_dict()
    np.savez(path, ids=state["ids"], values=state["values"], stats=table.statistics(state["ids"]),
             accessor=json.dumps(table.accessor.to_dict()), deleted=json.dumps(deleted))


if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
    ps = fleet.base.fleet._runtime.server
    dump(os.path.join(out_dir, f"server{fleet.server_index()}.npz"), ps.shards["emb"][1], ps.last_shrink)
    sys.exit(0)

workers = 1 if fleet.is_local() else fleet.worker_num()
me = 0 if fleet.is_local() else fleet.worker_index()
data = batches(BATCHES + 2)
exe = fleet.Executor()
fleet.init_worker()
exe.run(fleet.startup_program)
for feed in data[:BATCHES][me::workers]:
    exe.run(fleet.main_program, feed=feed)
deleted = fleet.shrink()
for feed in data[BATCHES:][me::workers]:
    exe.run(fleet.main_program, feed=feed)
name = "local" if fleet.is_local() else f"worker{me}"
with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
    json.dump({"deleted": deleted}, f)
if fleet.is_local():
    import fleet.runtime

    dump(os.path.join(out_dir, "local.npz"), fleet.runtime.local_tables()["emb"], deleted)
fleet.stop_worker()
