"""Global metrics on a real job, run under fleetrun by tests/integration/test_metrics_job.py.

Usage: metrics_job.py OUT_DIR STEPS

Each worker trains STEPS + its index steps (so the workers see different amounts of data,
from different distributions) with an ``auc`` layer, keeping every prediction its
training steps bucketed; then every worker calls each fleet.metrics function on its own
values and writes OUT_DIR/worker<i>.npz: its predictions and labels, its own buckets, its
own inputs to the metrics and what each metric returned.
"""
import os
import sys

import numpy as np

import fleet
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

out_dir, steps = sys.argv[1], int(sys.argv[2])
BATCH = 64

fleet.init(PaddleCloudRoleMaker())
fleet.default_startup_program().random_seed = 5
x = layers.data("x", shape=[4])
label = layers.data("label", shape=[1], dtype="int64")
predict = layers.fc(layers.fc(x, 8, act="relu"), 2, act="softmax")
avg_cost = layers.mean(layers.cross_entropy(predict, label))
_, _, [_, _, stat_pos, stat_neg] = layers.auc(predict, label)
fleet.distributed_optimizer(optimizer.Adam(0.05), DistributedStrategyFactory.create_async_strategy()
                            ).minimize(avg_cost)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
    sys.exit(0)

fleet.init_worker()
exe = fleet.Executor()
exe.run(fleet.startup_program)
me = fleet.worker_index()
rng = np.random.default_rng(100 + me)
scores, labels = [], []
for _ in range(steps + me):
    xx = rng.normal(0.2 * me, 1.0, (BATCH, 4)).astype(np.float32)
    yy = (xx[:, 0] + 0.5 * xx[:, 1] + rng.normal(0, 0.7, BATCH) > 0.2 * me).astype(np.int64).reshape(-1, 1)
    (p,) = exe.run(fleet.main_program, feed={"x": xx, "label": yy}, fetch_list=[predict])
    scores.append(p)
    labels.append(yy)
p, y = np.concatenate(scores), np.concatenate(labels).reshape(-1)
p1 = p[:, 1].astype(np.float64)
own = {
    "vector": np.array([[p1.sum(), p1.max()], [p1.min(), len(p1)]], dtype=np.float64),
    "counts": np.bincount(y, minlength=2).astype(np.int64),
    "correct": np.array([(p.argmax(axis=1) == y).sum()], dtype=np.int64),
    "total": np.array([len(y)], dtype=np.int64),
    "abserr": np.array([np.abs(p1 - y).sum()]),
    "sqrerr": np.array([((p1 - y) ** 2).sum()]),
}
results = {
    "auc": fleet.metrics.auc(stat_pos, stat_neg),          # Variables, read from the global scope
    "auc_by_name": fleet.metrics.auc(stat_pos.name, stat_neg.name),
    "sum": fleet.metrics.sum(own["vector"]),
    "max": fleet.metrics.max(own["vector"]),
    "min": fleet.metrics.min(own["vector"]),
    "sum_counts": fleet.metrics.sum(own["counts"]),
    "acc": fleet.metrics.acc(own["correct"], own["total"]),
    "mae": fleet.metrics.mae(own["abserr"], own["total"]),
    "mse": fleet.metrics.mse(own["sqrerr"], own["total"]),
    "rmse": fleet.metrics.rmse(own["sqrerr"], own["total"]),
}
scope = fleet.global_scope()
np.savez(os.path.join(out_dir, f"worker{me}.npz"), predict=p, label=y,
         stat_pos=scope[stat_pos.name], stat_neg=scope[stat_neg.name],
         **{f"own_{k}": v for k, v in own.items()}, **{f"result_{k}": np.asarray(v) for k, v in results.items()})
fleet.stop_worker()
