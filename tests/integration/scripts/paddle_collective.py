"""A Paddle 1.x collective ("NCCL2") script with only its imports changed: it puts its
program on ``fluid.CUDAPlace(FLAGS_selected_gpus)``, never calls fleet.init_worker() or
fleet.stop_worker() (Paddle's collective startup program joins the workers and broadcasts
rank 0's parameters), and feeds batches through a DataFeeder. Each worker's startup seed
differs, so only the broadcast makes their initial values equal.

Usage: paddle_collective.py OUT_DIR   (writes OUT_DIR/params.<rank>.npz)
"""
import os
import sys

import numpy as np

import fleet.fluid as fluid
import role_makers as role_maker
import fleet
from strategies import CollectiveStrategy as DistributedStrategy

out_dir = sys.argv[1]
role = role_maker.PaddleCloudRoleMaker(is_collective=True)
fleet.init(role)

img = fluid.layers.data(name="img", shape=[8], dtype="float32")
label = fluid.layers.data(name="label", shape=[1], dtype="int64")
hidden = fluid.layers.fc(input=img, size=16, act="relu")
prediction = fluid.layers.fc(input=hidden, size=3, act="softmax")
avg_loss = fluid.layers.mean(fluid.layers.cross_entropy(input=prediction, label=label))
fluid.default_startup_program().random_seed = 5 + fleet.worker_index()

dist_strategy = DistributedStrategy()
dist_strategy.nccl_comm_num = 1
optimizer = fleet.distributed_optimizer(fluid.optimizer.Momentum(learning_rate=0.1, momentum=0.9),
                                        strategy=dist_strategy)
optimizer.minimize(avg_loss)

place = fluid.CUDAPlace(int(os.environ["FLAGS_selected_gpus"]))
exe = fluid.Executor(place)
exe.run(fluid.default_startup_program())
feeder = fluid.DataFeeder(place=place, feed_list=[img, label])
rng = np.random.RandomState(100 + fleet.worker_index())
for step in range(20):
    x = rng.normal(size=(16, 8)).astype("float32")
    y = (x[:, :3].argmax(1)).reshape(-1, 1).astype("int64")
    exe.run(fleet.main_program, feed=feeder.feed(list(zip(x, y))), fetch_list=[avg_loss])
scope = fluid.global_scope()
np.savez(os.path.join(out_dir, f"params.{fleet.worker_index()}.npz"),
         **{name: np.asarray(scope.find_var(name)) for name in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0")})
