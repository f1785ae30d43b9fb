"""A small CTR-like model trained with train_from_dataset under fleetrun, for the tests of
jobs whose workers get no data.

Usage: data_model.py MODE OUT_DIR FILES [--worker1-raise | --worker1-exit]

FILES is a comma-separated list of MultiSlot files (empty: none); every worker takes
fleet.split_files(FILES). Each process writes OUT_DIR/<tag>.pid; the first worker saves
the model to OUT_DIR/model after its pass.

  --worker1-raise  worker 1 raises RuntimeError after init_worker (outside any pass)
  --worker1-exit   worker 1 ends its script after init_worker without stop_worker()
"""
import os
import sys

import fleet
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

mode, out_dir, files = sys.argv[1], sys.argv[2], [f for f in sys.argv[3].split(",") if f]
options = sys.argv[4:]

fleet.init(PaddleCloudRoleMaker())
tag = f"server{fleet.server_index()}" if fleet.is_server() else f"worker{fleet.worker_index()}"
with open(os.path.join(out_dir, f"{tag}.pid"), "w") as f:
    f.write(str(os.getpid()))
strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
            "async": DistributedStrategyFactory.create_async_strategy}[mode]()

x = layers.data("x", shape=[2])
ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
y = layers.data("y", shape=[1], dtype="int64")
emb = layers.sequence_pool(layers.embedding(ids, size=[100, 4], is_sparse=True), "sum")
pred = layers.fc(layers.concat([emb, x], axis=1), 2, act="softmax")
loss = layers.mean(layers.cross_entropy(pred, y))
fleet.distributed_optimizer(optimizer.SGD(0.1), strategy).minimize(loss)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    fleet.init_worker()
    if fleet.worker_index() == 1 and "--worker1-raise" in options:
        raise RuntimeError("worker 1 broke outside train_from_dataset")
    if fleet.worker_index() == 1 and "--worker1-exit" in options:
        sys.exit(0)
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    dataset = fleet.DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var([x, ids, y])
    dataset.set_batch_size(8)
    dataset.set_filelist(fleet.split_files(files))
    exe.train_from_dataset(fleet.main_program, dataset, print_period=0)
    if fleet.is_first_worker():
        fleet.save_persistables(exe, os.path.join(out_dir, "model"))
    fleet.stop_worker()
