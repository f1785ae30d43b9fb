"""A small fleet job for the --hosts tests: async SGD of a softmax regression.

Usage: train.py STEPS PAUSE_SECONDS FAIL_WORKER

Each worker trains STEPS steps on its own generated batches (a planted signal: the label
is the sign of x0 + x1), printing "worker I step S loss L" and sleeping PAUSE_SECONDS
after each step. Worker FAIL_WORKER (-1: none) raises ValueError at step 2. Worker 0
saves the model to model/ in the workspace at the end.
"""
import sys
import time

import numpy as np

import fleet
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

steps, pause, fail_worker = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

fleet.init(PaddleCloudRoleMaker())
x = layers.data("x", shape=[4])
y = layers.data("y", shape=[1], dtype="int64")
pred = layers.fc(x, 2, act="softmax")
loss = layers.mean(layers.cross_entropy(pred, y))
fleet.distributed_optimizer(optimizer.SGD(0.5),
                            DistributedStrategyFactory.create_async_strategy()).minimize(loss)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    me = fleet.worker_index()
    rng = np.random.default_rng(me)
    for s in range(steps):
        if s == 2 and me == fail_worker:
            raise ValueError(f"planted failure of worker {me} at step {s}")
        xx = rng.normal(size=(64, 4)).astype("float32")
        yy = (xx[:, :1] + xx[:, 1:2] > 0).astype("int64")
        value = float(exe.run(fleet.main_program, feed={"x": xx, "y": yy}, fetch_list=[loss])[0][0])
        print(f"worker {me} step {s} loss {value:.4f}", flush=True)
        time.sleep(pause)
    if fleet.is_first_worker():
        fleet.save_persistables(exe, "model")
    fleet.stop_worker()
