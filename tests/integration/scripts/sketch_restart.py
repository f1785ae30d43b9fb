"""Helper of tests/integration/test_saves.py: a table with CountFilterEntry(2) keeps its
candidates' counts across a kill and restart, through the sketch its saves hold.

    sketch_restart.py before SAVE_DIR
        servers start fresh; the worker sees the ids TWICE twice, saves a base (mode 0) to
        SAVE_DIR/base, sees the ids ONCE once, saves a delta (mode 1) to SAVE_DIR/delta,
        writes SAVE_DIR/saved and waits to be killed
    sketch_restart.py after SAVE_DIR OUT_DIR
        servers load SAVE_DIR/delta (fleet.init_server walks the chain); the worker sees
        ONCE and NEW once each, then saves every row (mode 0) to OUT_DIR
"""
import os
import sys
import time

import numpy as np

import fleet
import fleet.layers as layers
from fleet.framework.tensor import LoDTensor
from fleet.initializer import Uniform
from fleet.optimizer import SGD
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

VOCAB = 100000
TWICE = np.arange(1, 21, dtype=np.int64) * 331
ONCE = np.arange(21, 41, dtype=np.int64) * 331
NEW = np.arange(41, 61, dtype=np.int64) * 331


def build():
    startup = fleet.default_startup_program()
    startup.random_seed = 3
    ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    emb = layers.sparse_embedding(ids, [VOCAB, 4], entry=fleet.CountFilterEntry(2),
                                  param_attr=fleet.ParamAttr(name="emb", initializer=Uniform(-0.1, 0.1)))
    loss = layers.mean(layers.fc(layers.sequence_pool(emb, "sum"), 1))
    fleet.distributed_optimizer(SGD(0.1), DistributedStrategyFactory.create_async_strategy()).minimize(loss)


def sight(exe, ids):
    """One training step in which each of ``ids`` occurs once."""
    exe.run(fleet.main_program, feed={"ids": LoDTensor.from_lengths(ids, np.ones(len(ids), np.int64))})


def main():
    what, save_dir = sys.argv[1], sys.argv[2]
    fleet.init(PaddleCloudRoleMaker())
    build()
    if fleet.is_server():
        fleet.init_server(os.path.join(save_dir, "delta") if what == "after" else None)
        fleet.run_server()
        return
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    if what == "before":
        sight(exe, TWICE)
        sight(exe, TWICE)
        fleet.save_persistables(exe, os.path.join(save_dir, "base"), mode=0)
        sight(exe, ONCE)
        fleet.save_persistables(exe, os.path.join(save_dir, "delta"), mode=1)
        with open(os.path.join(save_dir, "saved"), "w") as f:
            f.write("ok\n")
        time.sleep(600)  # killed by the test (SIGKILL) before this ends
        return
    sight(exe, np.concatenate([ONCE, NEW]))
    fleet.save_persistables(exe, sys.argv[3], mode=0)
    fleet.stop_worker()


if __name__ == "__main__":
    main()
