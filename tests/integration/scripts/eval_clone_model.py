"""The evaluation idiom of Paddle 1.x scripts, run under fleetrun by
tests/integration/test_eval_clone.py: a test program cloned with clone(for_test=True)
*before* minimize, run on a worker after training.

Usage: eval_clone_model.py MODE OUT_DIR STEPS

The model reads a dense input, an is_sparse table and an is_distributed table (in GEO,
which refuses distributed tables, a second is_sparse table). Each worker
trains STEPS steps on its own data (worker 0 with fleet.main_program, worker 1 with the
default programs); then every worker's updates reach the servers and
worker 0 predicts one evaluation batch (holding ids no step trained) with
- the pre-minimize test clone (also before training: ``before``),
- a test clone of fleet.main_program,
- the inference model it saves right after, loaded into a fresh scope,
and writes OUT_DIR/eval.npz with the three predictions, the ids the saved distributed
table holds, the evaluation's unseen ids and the training losses.
"""
import os
import sys

import numpy as np

import fleet
import fleet.fluid as fluid
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

mode, out_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
BATCH, ROWS = 32, 1000

fleet.init(PaddleCloudRoleMaker())
fluid.default_startup_program().random_seed = 3
x = fluid.layers.data("x", shape=[4])
sparse_ids = fluid.layers.data("sparse_ids", shape=[1], dtype="int64", lod_level=1)
dist_ids = fluid.layers.data("dist_ids", shape=[1], dtype="int64", lod_level=1)
label = fluid.layers.data("label", shape=[1], dtype="int64")
sparse_emb = fluid.layers.embedding(sparse_ids, size=[ROWS, 4], is_sparse=True,
                                    param_attr=fluid.ParamAttr(name="sparse_table"))
dist_emb = fluid.layers.embedding(dist_ids, size=[ROWS, 4], is_sparse=True, is_distributed=mode != "geo",
                                  param_attr=fluid.ParamAttr(name="dist_table",
                                                             initializer=fluid.initializer.Uniform(-0.1, 0.1)))
merged = fluid.layers.concat([fluid.layers.sequence_pool(sparse_emb, "sum"),
                              fluid.layers.sequence_pool(dist_emb, "sum"), x], axis=1)
predict = fluid.layers.fc(fluid.layers.fc(merged, 16, act="relu"), 2, act="softmax")
avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(predict, label))
test_program = fluid.default_main_program().clone(for_test=True)  # before minimize

strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
            "async": DistributedStrategyFactory.create_async_strategy,
            "geo": lambda: DistributedStrategyFactory.create_geo_strategy(5)}[mode]()
fleet.distributed_optimizer(fluid.optimizer.Adam(0.02), strategy).minimize(avg_cost)


def batch(rng, n, id_high):
    """A batch whose label is whether its first ids are small (learnable from both tables)."""
    sp = rng.integers(0, id_high, (n, 2))
    dt = rng.integers(0, id_high, (n, 2))
    xx = rng.normal(size=(n, 4)).astype("float32")
    yy = (sp[:, 0] + dt[:, 0] < id_high).reshape(n, 1).astype("int64")
    return {"x": xx, "sparse_ids": (sp.reshape(-1), np.full(n, 2)), "dist_ids": (dt.reshape(-1), np.full(n, 2)),
            "label": yy}


if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
    sys.exit(0)

# Worker 1 runs the default programs, as Paddle 2.0 scripts do: on a worker they run as
# fleet.main_program / fleet.startup_program.
if fleet.worker_index() == 1:
    main_program, startup_program = fluid.default_main_program(), fluid.default_startup_program()
else:
    main_program, startup_program = fleet.main_program, fleet.startup_program
fleet.init_worker()
exe = fluid.Executor(fluid.CPUPlace())
exe.run(startup_program)
eval_feed = batch(np.random.default_rng(99), 64, ROWS)  # ids >= 500 are never trained
before, = exe.run(test_program, feed=eval_feed, fetch_list=[predict])  # the initial parameters
rng = np.random.default_rng(10 + fleet.worker_index())
losses = [float(exe.run(main_program, feed=batch(rng, BATCH, 500), fetch_list=[avg_cost])[0][0])
          for _ in range(steps)]
fleet.barrier_worker()  # sends this worker's queued updates first
if fleet.is_first_worker():
    feed = eval_feed
    unseen = np.setdiff1d(feed["dist_ids"][0], np.arange(500))
    pre, = exe.run(test_program, feed=feed, fetch_list=[predict])
    post, = exe.run(fleet.main_program.clone(for_test=True), feed=feed, fetch_list=[predict])
    model_dir = os.path.join(out_dir, "model")
    fleet.save_inference_model(exe, model_dir, ["x", "sparse_ids", "dist_ids"], [predict])
    with fluid.scope_guard(fluid.Scope()):
        program, feeds, fetches = fleet.load_inference_model(model_dir, exe)
        saved, = exe.run(program, feed={k: feed[k] for k in feeds}, fetch_list=fetches)
    saved_ids = np.load(os.path.join(model_dir, "dist_table@ids")) if mode != "geo" else np.zeros(0, np.int64)
    np.savez(os.path.join(out_dir, "eval.npz"), pre=pre, post=post, saved=saved, saved_ids=saved_ids,
             unseen=unseen, before=before)
sends = fleet.main_program.training_hooks.stats["sends"]  # the communicator's count of step sends
np.save(os.path.join(out_dir, f"worker{fleet.worker_index()}.npy"), np.array([sends] + losses))
fleet.barrier_worker()
fleet.stop_worker()
