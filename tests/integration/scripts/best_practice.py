"""Paddle 1.x's "best practices of distributed training on CPU" page, run as written
(imports aside) by tests/integration/test_best_practice.py.

Usage: best_practice.py pe|compiled OUT_DIR   (BP_STRATEGY: sync (default), half_async,
async or geo)

- pe: the page's first example: ExecutionStrategy.num_threads, BuildStrategy Reduce when
  CPU_NUM > 1, fluid.ParallelExecutor(use_cuda=False, ...) trained with pe.run.
- compiled: the page's fleet example (PaddleCloudRoleMaker, a strategy from
  DistributedStrategyFactory, distributed_optimizer) with its
  fluid.compiler.CompiledProgram(fleet.main_program).with_data_parallel(loss_name=...,
  build_strategy=strategy.get_build_strategy(), exec_strategy=strategy.get_execute_strategy())
  trained with exe.run; locally or as a fleetrun worker.

Each run trains 20 steps of 32 generated examples and writes OUT_DIR/<mode>-<role>.npz
(the dense parameters after training) and .json (the losses).
"""
import json
import os
import sys

import numpy as np

import fleet.fluid as fluid
import fleet as fleet_api
import role_makers as role_maker
from strategies import DistributedStrategyFactory

mode, out_dir = sys.argv[1], sys.argv[2]
fleet = fleet_api  # the page: from paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet

VOCAB = 1000
ids = fluid.layers.data(name="ids", shape=[1], dtype="int64", lod_level=1)
dense = fluid.layers.data(name="dense", shape=[4], dtype="float32")
label = fluid.layers.data(name="label", shape=[1], dtype="int64")
emb = fluid.layers.embedding(input=ids, size=[VOCAB, 8], is_sparse=True,
                             param_attr=fluid.ParamAttr(name="SparseFeatFactors"))
h = fluid.layers.fc(fluid.layers.concat([fluid.layers.sequence_pool(emb, "sum"), dense], axis=1), 16, act="relu")
predict = fluid.layers.fc(h, 2, act="softmax")
avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))
loss = avg_cost
fluid.default_startup_program().random_seed = 5

rng = np.random.default_rng(1)
signal = rng.normal(0, 2, VOCAB)
batches = []
for _ in range(20):
    lengths = rng.integers(1, 4, 32)
    flat = rng.integers(0, VOCAB, lengths.sum())
    first = flat[np.concatenate([[0], np.cumsum(lengths)[:-1]])]
    x = rng.normal(size=(32, 4)).astype("float32")
    y = (signal[first] + x[:, 0] > 0).astype("int64").reshape(-1, 1)
    batches.append({"ids": (flat, lengths), "dense": x, "label": y})

exe = fluid.Executor(fluid.CPUPlace())
losses = []

if mode == "pe":
    fluid.optimizer.SGD(learning_rate=0.1).minimize(avg_cost)
    main_program = fluid.default_main_program()
    exe.run(fluid.default_startup_program())
    # Configure the execution strategy, mainly to set the number of threads
    exec_strategy = fluid.ExecutionStrategy()
    exec_strategy.num_threads = 8

    # Configure the composition strategy, for CPU training, you should use the Reduce mode for training.
    build_strategy = fluid.BuildStrategy()
    if int(os.getenv("CPU_NUM")) > 1:
        build_strategy.reduce_strategy = fluid.BuildStrategy.ReduceStrategy.Reduce

    pe = fluid.ParallelExecutor(
        use_cuda=False,
        loss_name=avg_cost.name,
        main_program=main_program,
        build_strategy=build_strategy,
        exec_strategy=exec_strategy)
    for feed in batches:
        value, = pe.run(fetch_list=[avg_cost.name], feed=feed)
        losses.append(float(np.mean(value)))
    role = "local"
else:
    # step1: the strategy (the page lists all four; BP_STRATEGY picks one)
    strategy = {
        "sync": DistributedStrategyFactory.create_sync_strategy,
        "half_async": DistributedStrategyFactory.create_half_async_strategy,
        "async": DistributedStrategyFactory.create_async_strategy,
        "geo": lambda: DistributedStrategyFactory.create_geo_strategy(update_frequency=4),
    }[os.getenv("BP_STRATEGY", "sync")]()
    # step2: the role
    role = role_maker.PaddleCloudRoleMaker()
    fleet.init(role)
    # step3: the distributed program
    optimizer = fluid.optimizer.SGD(0.1)
    optimizer = fleet.distributed_optimizer(optimizer, strategy)
    optimizer.minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        sys.exit(0)
    fleet.init_worker()
    exe.run(fleet.startup_program)
    compiled_program = fluid.compiler.CompiledProgram(fleet.main_program).with_data_parallel(
        loss_name=loss.name,
        build_strategy=strategy.get_build_strategy(),
        exec_strategy=strategy.get_execute_strategy())
    for feed in batches:
        value, = exe.run(compiled_program, feed=feed, fetch_list=[loss.name])
        losses.append(float(np.mean(value)))
    role = "local" if fleet.is_local() else "worker%d" % fleet.worker_index()

scope = fluid.global_scope()
tag = "%s-%s%s" % (mode, role, "" if os.getenv("BP_STRATEGY", "sync") == "sync" else "-" + os.environ["BP_STRATEGY"])
np.savez(os.path.join(out_dir, tag + ".npz"),
         **{name.replace(".", "_"): np.array(scope[name]) for name in ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0")})
with open(os.path.join(out_dir, tag + ".json"), "w") as f:
    json.dump({"losses": losses}, f)
if mode == "compiled":
    fleet.stop_worker()
