"""A Paddle 1.x parameter-server worker that reads through a non-iterable
``fluid.io.PyReader`` (start(), exe.run without a feed until ``fluid.core.EOFException``,
reset()) on a ``CompiledProgram``, two epochs, as Paddle 1.x's pyreader-mode scripts do.
Each worker prints "worker I epoch E steps S auc A"."""
import numpy as np

import fleet.fluid as fluid
import role_makers as role_maker
import fleet
from strategies import StrategyFactory

role = role_maker.PaddleCloudRoleMaker()
fleet.init(role)
x = fluid.layers.data(name="x", shape=[8], dtype="float32")
ids = fluid.layers.data(name="ids", shape=[1], dtype="int64", lod_level=1)
label = fluid.layers.data(name="label", shape=[1], dtype="int64")
reader = fluid.io.PyReader(feed_list=[x, ids, label], capacity=64, iterable=False, use_double_buffer=False)
emb = fluid.layers.embedding(input=ids, size=[1000, 8], is_sparse=True)
pool = fluid.layers.sequence_pool(emb, "sum")
h = fluid.layers.fc(fluid.layers.concat([x, pool], axis=1), 16, act="relu")
pred = fluid.layers.fc(h, 2, act="softmax")
cost = fluid.layers.mean(fluid.layers.cross_entropy(pred, label))
auc, _, _ = fluid.layers.auc(pred, label)
opt = fleet.distributed_optimizer(fluid.optimizer.Adam(0.01), StrategyFactory.create_async_strategy())
opt.minimize(cost)
if fleet.is_server():
    fleet.init_server(); fleet.run_server()
else:
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    fleet.init_worker()
    rng = np.random.RandomState(fleet.worker_index())
    w = np.random.RandomState(0).normal(size=1000)
    def samples():
        for _ in range(3000):
            xi = rng.normal(size=8).astype("float32")
            s = rng.randint(0, 1000, size=rng.randint(1, 4))
            yield xi, s, [int(w[s].sum() + xi[0] > 0)]
    reader.decorate_sample_generator(samples, batch_size=64, drop_last=False)
    compiled = fluid.compiler.CompiledProgram(fleet.main_program)
    for epoch in range(2):
        reader.start()
        steps = 0
        try:
            while True:
                loss_val, auc_val = exe.run(program=compiled, fetch_list=[cost.name, auc.name])
                steps += 1
        except fluid.core.EOFException:
            reader.reset()
        print("worker", fleet.worker_index(), "epoch", epoch, "steps", steps, "auc %.4f" % np.array(auc_val)[0], flush=True)
    fleet.stop_worker()
