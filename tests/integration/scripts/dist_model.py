"""A small model trained by tests/integration/test_distributed.py under fleetrun.

Usage: dist_model.py MODE OUT_DIR STEPS BATCH [--distributed-table] [--schedule]

With --schedule the optimizer is RMSProp whose rate is an exponential_decay schedule,
with an optimizer-wide L2Decay and an L1Decay on the table's ParamAttr.

Every run (local or each worker) trains STEPS steps on the same global data; a worker
trains on its share of each global batch of 2*BATCH examples. At the end each worker
writes OUT_DIR/<tag>.npz with the parameters it sees after all workers finished, and
its communicator's counters.
"""
import json
import os
import sys

import numpy as np

import fleet
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

mode, out_dir, steps, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
distributed_table = "--distributed-table" in sys.argv
save_midway = "--save-midway" in sys.argv  # the first worker checkpoints halfway, then trains on
schedule = "--schedule" in sys.argv
geo_k = 4

fleet.init(PaddleCloudRoleMaker())
strategy = {
    "sync": DistributedStrategyFactory.create_sync_strategy,
    "async": DistributedStrategyFactory.create_async_strategy,
    "half_async": DistributedStrategyFactory.create_half_async_strategy,
    "geo": lambda: DistributedStrategyFactory.create_geo_strategy(geo_k),
}[mode]()

ROWS = 5000  # 5000 x 4 = 20000 elements: two blocks of a table with two servers
x = layers.data("x", shape=[6])
ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
y = layers.data("y", shape=[1], dtype="int64")
table = fleet.ParamAttr(name="emb", initializer=fleet.initializer.Uniform(-0.5, 0.5),
                        regularizer=fleet.regularizer.L1Decay(1e-3) if schedule else None)
emb = layers.embedding(ids, size=[ROWS, 4], is_sparse=True, is_distributed=distributed_table,
                       param_attr=table)
h = layers.fc(layers.concat([layers.sequence_pool(emb, "sum"), x], axis=1), 2000, act="relu")
pred = layers.fc(h, 2, act="softmax")
loss = layers.mean(layers.cross_entropy(pred, y))
fleet.default_startup_program().random_seed = 7
if schedule:
    lr = layers.exponential_decay(0.01, decay_steps=2, decay_rate=0.5)
    opt = optimizer.RMSProp(lr, momentum=0.5, regularization=fleet.regularizer.L2Decay(1e-2))
else:
    opt = optimizer.SGD(0.1)
fleet.distributed_optimizer(opt, strategy).minimize(loss)

rng = np.random.default_rng(0)
n = 2 * batch
if distributed_table:  # ids anywhere in int64, few distinct so rows get updated often
    pool = np.concatenate([rng.integers(-2**63, 2**63 - 1, 64, dtype=np.int64), [0, -1, 2**63 - 1, -2**63]])
    all_ids = [pool[rng.integers(0, len(pool), 2 * n)] for _ in range(steps)]
else:
    all_ids = [rng.integers(0, ROWS, 2 * n) for _ in range(steps)]
data = []
for s in range(steps):  # a planted signal: the label is the sign of x0 + x1
    xx = rng.normal(size=(n, 6)).astype("float32")
    data.append((xx, all_ids[s], (xx[:, :1] + xx[:, 1:2] > 0).astype("int64")))


def feed(step, part, parts):
    xx, ii, yy = data[step]
    m = n // parts
    sl = slice(part * m, (part + 1) * m)
    return {"x": xx[sl], "ids": (ii.reshape(n, 2)[sl].reshape(-1), np.full(m, 2)), "y": yy[sl]}


if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    losses = []
    for s in range(steps):
        if save_midway and s == steps // 2 and fleet.is_first_worker():
            fleet.save_persistables(exe, os.path.join(out_dir, "midway"))
        losses.append(float(exe.run(fleet.main_program, feed=feed(s, fleet.worker_index(), fleet.worker_num()),
                                    fetch_list=[loss])[0][0]))
    scope = fleet.global_scope()
    info = {"losses": losses}
    if schedule:
        info["lr"] = opt.get_lr()
    arrays = {}
    if fleet.is_local():
        arrays["emb"] = scope["emb"]
    else:
        comm = fleet.main_program.training_hooks
        comm.flush()
        fleet.barrier_worker()  # every worker's updates are on the servers
        comm.pull_dense()
        if not distributed_table:
            arrays["emb"] = comm.pull_whole(comm.plan.params["emb"])
        probe = np.array([0, -1, 2**63 - 1, -2**63], dtype=np.int64) if distributed_table else np.arange(10)
        arrays["emb_probe"] = comm.prefetch("emb", probe).values
        info["stats"] = dict(comm.stats)
        info["blocks"] = {p.name: [(b.name, b.endpoint, b.rows) for b in p.blocks] for p in comm.plan.params.values()}
    for name in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"):
        arrays[name.replace(".", "_")] = scope[name]
    tag = "local" if fleet.is_local() else f"worker{fleet.worker_index()}"
    np.savez(os.path.join(out_dir, tag + ".npz"), **arrays)
    with open(os.path.join(out_dir, tag + ".json"), "w") as f:
        json.dump(info, f)
    fleet.stop_worker()
