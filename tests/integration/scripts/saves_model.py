"""Saves taken while two async workers push at full speed (tests/integration/test_saves.py).

Usage: saves_model.py OUT_DIR [--load DIR] [--check]

One is_distributed table ``dtable`` (width 4, initial value 0, Adagrad) trained by raw
pushes whose every gradient is 1.0, so a row's Adagrad moment counts the pushes it got
and its value is a function of that count. Worker ``w``'s push ``j`` (j = 0, 1, ...)
touches the counter rows ``w*1000 + 990`` and ``w*1000 + 991`` (one on each of two
servers: id % 2) and the data row ``w*1000 + j % 61``: in a snapshot of server s taken
when it had applied J pushes of worker w, that worker's counter there counts J and its
data rows there count J // 61 (+1 for j % 61 < J % 61).

- Workers push in a thread until OUT_DIR/stop exists, each reporting its pushes applied
  in OUT_DIR/progress.<w> every 10; meanwhile worker 0 saves a base (mode 0) to
  OUT_DIR/base and deltas (mode 1) to OUT_DIR/d1, OUT_DIR/d2, each after both workers
  reported 50 more pushes than when the previous save ended, then writes OUT_DIR/stop.
  After a barrier (no push in flight) worker 0 saves OUT_DIR/d3 (mode 1) and
  OUT_DIR/full (mode 0, the same instant). Workers write OUT_DIR/pushes.<w>.
- ``--load DIR``: servers load DIR (e.g. a delta: its chain); with ``--check`` worker 0
  only saves OUT_DIR/reloaded (mode 0, no pushes) and every worker stops.
"""
import argparse
import os
import threading
import time

import numpy as np

import fleet
import fleet.base
from fleet import layers, optimizer
from fleet.framework.tensor import SparseRows
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--load")
parser.add_argument("--check", action="store_true")
args = parser.parse_args()

fleet.init(PaddleCloudRoleMaker())
ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
emb = layers.embedding(ids, size=[10, 4], is_distributed=True,
                       param_attr=fleet.ParamAttr(name="dtable", initializer=fleet.initializer.Constant(0.0)))
loss = layers.mean(layers.sequence_pool(emb, "sum"))
fleet.distributed_optimizer(optimizer.Adagrad(0.5),
                            DistributedStrategyFactory.create_async_strategy()).minimize(loss)
DATA_ROWS = 61


def push_ids(worker, j):
    return np.array([worker * 1000 + 990, worker * 1000 + 991, worker * 1000 + j % DATA_ROWS], dtype=np.int64)


def pusher(comm, grad, worker, stop, counter, progress):
    while not stop.is_set():
        rows = push_ids(worker, counter[0])
        split = comm.split_grads({grad: SparseRows(rows, np.ones((3, 4), np.float32), 10)})
        comm._all({ep: ("push", names, arrays, None) for ep, (names, arrays) in split.items() if names})
        counter[0] += 1
        if counter[0] % 10 == 0:  # pushes answered, so applied: the other worker may rely on it
            with open(progress + ".tmp", "w") as f:
                f.write(str(counter[0]))
            os.replace(progress + ".tmp", progress)


def pushed(out, worker):
    """The pushes ``worker`` reported applied so far (0 before its first report)."""
    try:
        with open(os.path.join(out, f"progress.{worker}")) as f:
            return int(f.read())
    except FileNotFoundError:
        return 0


def wait_both_pushed(out, since, more=50, timeout=60):
    """Waits until each worker reported ``more`` pushes past ``since`` ([w0, w1]); returns the counts."""
    deadline = time.monotonic() + timeout
    while True:
        now = [pushed(out, w) for w in (0, 1)]
        if all(n >= s + more for n, s in zip(now, since)):
            return now
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for both workers to push (reported {now}, since {since})")
        time.sleep(0.002)


def wait_file(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.01)


if fleet.is_server():
    fleet.init_server(args.load)
    fleet.run_server()
else:
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    me = fleet.worker_index()
    out = args.out
    if args.check:
        if me == 0:
            os.environ["FLEET_SAVE_UNTRAINED"] = "1"
            fleet.save_persistables(exe, os.path.join(out, "reloaded"), mode=0)
        fleet.barrier_worker()
        fleet.stop_worker()
        raise SystemExit(0)
    comm = fleet.base.fleet._runtime.comm
    grad = fleet.base.fleet._runtime.plan.params["dtable"].grad
    stop, counter = threading.Event(), [0]
    thread = threading.Thread(target=pusher, args=(comm, grad, me, stop, counter,
                                                     os.path.join(out, f"progress.{me}")), daemon=True)
    thread.start()
    if me == 0:
        seen = [0, 0]
        for name, mode in (("base", 0), ("d1", 1), ("d2", 1)):
            wait_both_pushed(out, seen)  # both workers push before and between the saves
            fleet.save_persistables(exe, os.path.join(out, name), mode=mode)
            seen = [pushed(out, w) for w in (0, 1)]  # at most 9 behind what the save holds
        wait_both_pushed(out, seen)
        open(os.path.join(out, "stop"), "w").close()
    else:
        wait_file(os.path.join(out, "stop"))
    stop.set()
    thread.join()
    with open(os.path.join(out, f"pushes.{me}"), "w") as f:
        f.write(str(counter[0]))
    fleet.barrier_worker()
    if me == 0:
        fleet.save_persistables(exe, os.path.join(out, "d3"), mode=1)
        fleet.save_persistables(exe, os.path.join(out, "full"), mode=0)
    fleet.barrier_worker()
    fleet.stop_worker()
