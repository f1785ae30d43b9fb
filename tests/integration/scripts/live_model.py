"""A small model for the liveness and hostile-input tests, run under fleetrun.

Usage: live_model.py MODE OUT_DIR STEPS BATCH [--forever | --until-stop] [--step-sleep S]
                     [--hold STEP] [--occupy-own-port]

Every process writes OUT_DIR/<tag>.pid (tag: server0, worker1, ...). Each worker trains
on its half of every global batch of 2*BATCH examples (the same data on every run), writes
OUT_DIR/<tag>.training after its first step, and at the end OUT_DIR/<tag>.npz with the
parameters the servers hold after every worker finished.

  --forever          cycle over the STEPS batches until the job fails (kill tests)
  --until-stop       cycle over the STEPS batches until OUT_DIR/stop exists (at most 120 s),
                     then end as usual (telemetry tests watch a job while it trains)
  --step-sleep S     sleep S seconds after each step (keeps a job running, cheaply)
  --hold STEP        before step STEP, write <tag>.held and wait for OUT_DIR/go (60 s)
  --occupy-own-port  a server binds its own port before run_server, as another program
                     taking the port between fleetrun's check and the server's start would
"""
import itertools
import os
import socket
import sys
import time

import numpy as np

import fleet
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

mode, out_dir, steps, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = sys.argv[5:]
forever = "--forever" in options
until_stop = "--until-stop" in options
step_sleep = float(options[options.index("--step-sleep") + 1]) if "--step-sleep" in options else 0.0
hold = int(options[options.index("--hold") + 1]) if "--hold" in options else -1

fleet.init(PaddleCloudRoleMaker())
tag = f"server{fleet.server_index()}" if fleet.is_server() else f"worker{fleet.worker_index()}"


def record(name, text=""):
    path = os.path.join(out_dir, f"{tag}.{name}")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


record("pid", str(os.getpid()))
strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
            "async": DistributedStrategyFactory.create_async_strategy}[mode]()

ROWS = 1000
x = layers.data("x", shape=[6])
ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
y = layers.data("y", shape=[1], dtype="int64")
table = fleet.ParamAttr(name="emb", initializer=fleet.initializer.Uniform(-0.5, 0.5))
emb = layers.embedding(ids, size=[ROWS, 4], is_sparse=True, param_attr=table)
h = layers.fc(layers.concat([layers.sequence_pool(emb, "sum"), x], axis=1), 32, act="relu")
pred = layers.fc(h, 2, act="softmax")
loss = layers.mean(layers.cross_entropy(pred, y))
fleet.default_startup_program().random_seed = 7
fleet.distributed_optimizer(optimizer.SGD(0.1), strategy).minimize(loss)

rng = np.random.default_rng(0)
n = 2 * batch
data = []
for _ in range(steps):  # a planted signal: the label is the sign of x0 + x1
    xx = rng.normal(size=(n, 6)).astype("float32")
    data.append((xx, rng.integers(0, ROWS, 2 * n), (xx[:, :1] + xx[:, 1:2] > 0).astype("int64")))


def feed(step):
    xx, ii, yy = data[step % steps]
    part, parts = fleet.worker_index(), fleet.worker_num()
    m = n // parts
    sl = slice(part * m, (part + 1) * m)
    return {"x": xx[sl], "ids": (ii.reshape(n, 2)[sl].reshape(-1), np.full(m, 2)), "y": yy[sl]}


def wait_for_go():
    record("held")
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out_dir, "go")):
        if time.monotonic() > deadline:
            sys.exit(f"{tag}: no {out_dir}/go within 60 s")
        time.sleep(0.02)


if fleet.is_server():
    if "--occupy-own-port" in options:
        squatter = socket.socket()
        squatter.bind((os.environ["POD_IP"], int(os.environ["PADDLE_PORT"])))
        squatter.listen()
    fleet.init_server()
    fleet.run_server()
else:
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    stop_deadline = time.monotonic() + 120
    for step in itertools.count() if forever or until_stop else range(steps):
        if until_stop and os.path.exists(os.path.join(out_dir, "stop")):
            break
        if until_stop and time.monotonic() > stop_deadline:
            sys.exit(f"{tag}: no {out_dir}/stop within 120 s")
        if step == hold:
            wait_for_go()
        exe.run(fleet.main_program, feed=feed(step), fetch_list=[loss])
        if step == 0:
            record("training")
        if step_sleep:
            time.sleep(step_sleep)
    comm = fleet.main_program.training_hooks
    comm.flush()
    fleet.barrier_worker()  # every worker's updates are on the servers
    comm.pull_dense()
    arrays = {"emb": comm.pull_whole(comm.plan.params["emb"])}
    for name in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"):
        arrays[name.replace(".", "_")] = fleet.global_scope()[name]
    np.savez(os.path.join(out_dir, f"{tag}.npz"), **arrays)
    fleet.stop_worker()
