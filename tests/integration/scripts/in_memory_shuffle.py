"""A Paddle 1.x style worker that loads its files into memory and shuffles them across
the workers with ``dataset.global_shuffle(fleet)``, ``fleet`` being the imported package
(Paddle's ``from ...distribute_transpiler import fleet``), then trains one pass.

Usage: in_memory_shuffle.py FILES   (comma-separated MultiSlot files: "4 x1..x4 1 label")

Each worker prints one JSON line: its local example count before and after the shuffle,
and the counts summed over the workers (get_memory_data_size / get_shuffle_data_size
with fleet); its pass prints the examples it trained.
"""
import json
import sys

import fleet.fluid as fluid
import role_makers as role_maker
import fleet
from strategies import DistributeTranspilerConfig

files = sys.argv[1].split(",")
fleet.init(role_maker.PaddleCloudRoleMaker())
x = fluid.data(name="x", shape=[None, 4], dtype="float32")
label = fluid.data(name="label", shape=[None, 1], dtype="int64")
predict = fluid.layers.fc(input=x, size=2, act="softmax")
cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))
strategy = DistributeTranspilerConfig()
strategy.sync_mode = False
fleet.distributed_optimizer(fluid.optimizer.SGD(learning_rate=0.1), strategy).minimize(cost)

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    fleet.init_worker()
    dataset = fluid.DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var([x, label])
    dataset.set_batch_size(16)
    dataset.set_thread(2)
    dataset.set_filelist(fleet.split_files(files))
    dataset.load_into_memory()
    before = dataset.get_memory_data_size()
    memory_total = dataset.get_memory_data_size(fleet)
    dataset.global_shuffle(fleet)
    after = dataset.get_shuffle_data_size()
    shuffle_total = dataset.get_shuffle_data_size(fleet)
    exe.train_from_dataset(program=fleet.main_program, dataset=dataset, fetch_list=[cost], fetch_info=["loss"],
                           print_period=1000)
    dataset.release_memory()
    print(json.dumps({"worker": fleet.worker_index(), "before": before, "after": after,
                      "memory_total": memory_total, "shuffle_total": shuffle_total}), flush=True)
    fleet.stop_worker()
