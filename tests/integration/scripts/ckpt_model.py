"""A model with every kind of parameter, checkpointed by tests/integration/test_checkpoint.py.

Usage: ckpt_model.py MODE OUT_DIR CKPT_DIR STEPS [--interval N] [--keep K] [--load DIR]
                     [--resave DIR] [--infer DIR] [--hold]

Parameters: a dense fc weight split across servers, an is_sparse embedding (row blocks)
and an is_distributed table (ids anywhere in int64), trained with Adam whose rate is an
exponential_decay schedule.

- Servers load ``--load DIR``, else ``fleet.latest_checkpoint(CKPT_DIR)`` (None: fresh).
- Workers restore the counters with ``fleet.load_checkpoint`` and train from the restored
  step up to STEPS on the same global data every run, checkpointing every ``--interval``
  steps (``--keep`` newest kept). ``--resave DIR``: the first worker saves to DIR before
  training. ``--infer DIR``: after training the first worker saves an inference model and
  its own predictions on a probe batch (OUT_DIR/probe.npz). ``--hold``: after training,
  workers write OUT_DIR/trained.<index> and wait to be killed.
Every process writes its pid to OUT_DIR/pid.<role>.<index>; workers write
OUT_DIR/worker<index>.json (losses, resumed step and epoch).
"""
import argparse
import json
import os
import time

import numpy as np

import fleet
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

parser = argparse.ArgumentParser()
parser.add_argument("mode")
parser.add_argument("out")
parser.add_argument("ckpt")
parser.add_argument("steps", type=int)
parser.add_argument("--interval", type=int)
parser.add_argument("--keep", type=int, default=3)
parser.add_argument("--load")
parser.add_argument("--resave")
parser.add_argument("--infer")
parser.add_argument("--hold", action="store_true")
args = parser.parse_args()

fleet.init(PaddleCloudRoleMaker())
strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
            "async": DistributedStrategyFactory.create_async_strategy}[args.mode]()

ROWS, BATCH = 7000, 16  # 7000 x 4 = 28000 elements: a block per server up to 3 servers
x = layers.data("x", shape=[6])
ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
dids = layers.data("dids", shape=[1], dtype="int64", lod_level=1)
y = layers.data("y", shape=[1], dtype="int64")
emb = layers.embedding(ids, size=[ROWS, 4], is_sparse=True,
                       param_attr=fleet.ParamAttr(name="emb", initializer=fleet.initializer.Uniform(-0.1, 0.1)))
demb = layers.embedding(dids, size=[10, 3], is_distributed=True,
                        param_attr=fleet.ParamAttr(name="dtable", initializer=fleet.initializer.Uniform(-0.1, 0.1)))
feats = layers.concat([layers.sequence_pool(emb, "sum"), layers.sequence_pool(demb, "sum"), x], axis=1)
h = layers.fc(feats, 2048, act="relu")  # [13, 2048]: split across servers
pred = layers.fc(h, 2, act="softmax")
loss = layers.mean(layers.cross_entropy(pred, y))
fleet.default_startup_program().random_seed = 11
# a schedule: the servers' step counters are checkpointed and restored too
fleet.distributed_optimizer(optimizer.Adam(layers.exponential_decay(0.01, 4, 0.9)), strategy).minimize(loss)

ID_POOL = np.array([0, 1, -1, 2**63 - 1, -2**63, 12345678901234, 7, 99, 3, 5], dtype=np.int64)


def batch(step, part, parts):
    rng = np.random.default_rng(1000 + step)
    xx = rng.normal(size=(BATCH, 6)).astype("float32")
    yy = (xx[:, :1] + xx[:, 1:2] > 0).astype("int64")
    ii = rng.integers(0, ROWS, 2 * BATCH)
    dd = ID_POOL[rng.integers(0, len(ID_POOL), BATCH)]
    m = BATCH // parts
    sl = slice(part * m, (part + 1) * m)
    return {"x": xx[sl], "ids": (ii.reshape(BATCH, 2)[sl].reshape(-1), np.full(m, 2)),
            "dids": (dd[sl], np.ones(m, dtype=np.int64)), "y": yy[sl]}


role = "server" if fleet.is_server() else "worker"
index = fleet.server_index() if fleet.is_server() else fleet.worker_index()
with open(os.path.join(args.out, f"pid.{role}.{index}"), "w") as f:
    f.write(str(os.getpid()))

if fleet.is_server():
    fleet.init_server(args.load or fleet.latest_checkpoint(args.ckpt))
    fleet.run_server()
else:
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    cfg = fleet.CheckpointConfig(args.ckpt, step_interval=args.interval, max_num_checkpoints=args.keep)
    resumed = fleet.load_checkpoint(exe, cfg)
    info = {"resumed": resumed, "step": cfg.global_step, "epoch": cfg.epoch, "losses": []}
    if args.resave:
        if fleet.is_first_worker():
            fleet.save_persistables(exe, args.resave)
        fleet.barrier_worker()  # no worker's lookups create table rows during the save
    for step in range(cfg.global_step, args.steps):
        out = exe.run(fleet.main_program, feed=batch(step, fleet.worker_index(), fleet.worker_num()),
                      fetch_list=[loss])
        info["losses"].append(float(out[0][0]))
        cfg.after_step(exe)
    info["final_step"] = cfg.global_step
    if args.infer and fleet.is_first_worker():
        fleet.save_inference_model(exe, args.infer, ["x", "ids", "dids"], [pred])
        probe = batch(10_000, 0, 1)
        probe["dids"] = (np.array([5, 424242424242, 0, -7] * (BATCH // 4), dtype=np.int64),
                         np.ones(BATCH, dtype=np.int64))  # 424242424242 and -7 were never seen
        test = fleet.main_program.clone(for_test=True)
        (p,) = exe.run(test, feed=probe, fetch_list=[pred])
        np.savez(os.path.join(args.out, "probe.npz"), x=probe["x"], ids=probe["ids"][0],
                 dids=probe["dids"][0], pred=p)
    with open(os.path.join(args.out, f"worker{fleet.worker_index()}.json"), "w") as f:
        json.dump(info, f)
    if args.hold:
        open(os.path.join(args.out, f"trained.{fleet.worker_index()}"), "w").close()
        while True:  # until the test kills the whole job
            time.sleep(1)
    fleet.stop_worker()
