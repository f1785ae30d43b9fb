"""A Paddle 1.x parameter-server worker that reports through FleetUtil, run under fleetrun
by tests/integration/test_fleet_util_job.py.

Usage: fleet_util_job.py OUT_DIR

Each worker trains 5 + its index batches of its own data with an ``auc`` layer, then
calls FleetUtil: print_global_auc, get_global_auc, all_reduce (sum, max), all_gather,
barrier, print_on_rank, get_file_shard and set_zero; it writes OUT_DIR/worker<i>.npz with
its own AUC buckets (before set_zero) and what each call returned.
"""
import os
import sys

import numpy as np

import fleet.fluid as fluid
import role_makers as role_maker
import fleet
from fleet.fleet_util import FleetUtil
from strategies import StrategyFactory

out_dir = sys.argv[1]
fleet.init(role_maker.PaddleCloudRoleMaker())
x = fluid.layers.data(name="x", shape=[4], dtype="float32")
label = fluid.layers.data(name="label", shape=[1], dtype="int64")
predict = fluid.layers.fc(fluid.layers.fc(x, 8, act="relu"), 2, act="softmax")
avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(predict, label))
auc, batch_auc, states = fluid.layers.auc(predict, label)
fleet.distributed_optimizer(fluid.optimizer.SGD(0.1), StrategyFactory.create_async_strategy()).minimize(avg_cost)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    fleet_util = FleetUtil()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    fleet.init_worker()
    me = fleet.worker_index()
    rng = np.random.default_rng(10 + me)
    for _ in range(5 + me):
        xs = rng.normal(size=(64, 4)).astype("float32")
        ys = (xs[:, 0] + 0.5 * rng.normal(size=64) > 0).astype("int64").reshape(-1, 1)
        exe.run(fleet.main_program, feed={"x": xs, "label": ys}, fetch_list=[avg_cost])
    scope = fluid.global_scope()
    pos = np.array(scope.find_var(states[2].name).get_tensor())
    neg = np.array(scope.find_var(states[3].name).get_tensor())
    fleet_util.print_global_auc(scope, stat_pos=states[2].name, stat_neg=states[3].name, print_prefix="after pass")
    global_auc = fleet_util.get_global_auc(scope, states[2].name, states[3].name)
    total = fleet_util.all_reduce(np.array([5 + me]), mode="sum")
    most = fleet_util.all_reduce(np.array([float(me)]), mode="max")
    gathered = fleet_util.all_gather({"worker": me})
    fleet_util.barrier()
    fleet_util.print_on_rank(f"rank {me} speaking", 1)
    shard = fleet_util.get_file_shard(["a", "b", "c", "d"])
    fleet_util.set_zero(states[2].name, scope)
    np.savez(os.path.join(out_dir, f"worker{me}.npz"), pos=pos, neg=neg, global_auc=global_auc, total=total,
             most=most, gathered=np.array([g["worker"] for g in gathered]), shard=np.array(shard),
             zeroed=np.array(scope.find_var(states[2].name).get_tensor()))
    fleet.stop_worker()
