"""Trains one of the example models on generated Criteo-format data, locally or as a
server or worker (the same script under fleetrun), and prints the test AUC.

Locally:      python train.py --model deepfm
Distributed:  fleetrun --server_num 1 --worker_num 2 train.py --model deepfm --strategy async

Each worker trains on every worker_num-th line of the same generated train set; after the
last epoch the first worker evaluates the test set with a test program cloned before
``minimize`` (Paddle's idiom: on a worker it reads the servers' current parameters) and
prints one JSON line: {"model", "strategy", "auc": [one per task], "examples", "seconds"}.
"""
import argparse
import importlib
import json
import time

import numpy as np

import fleet
import fleet.fluid as fluid
import criteo_data
from role_makers import PaddleCloudRoleMaker
from strategies import DistributedStrategyFactory

MODELS = ("dnn", "wide_deep", "deepfm", "xdeepfm", "dcn", "nfm", "mmoe", "share_bottom", "esmm")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--strategy", default="async", choices=["sync", "async", "geo"])
    p.add_argument("--train_lines", type=int, default=20000)
    p.add_argument("--test_lines", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hash_dim", type=int, default=100003)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def make_strategy(name):
    if name == "geo":
        return DistributedStrategyFactory.create_geo_strategy(update_frequency=10)
    return getattr(DistributedStrategyFactory, f"create_{name}_strategy")()


def evaluate(exe, program, net, test, batch_size):
    """The test AUC of each task, predicted batch by batch with ``program``."""
    names = [v.name for v in net["feeds"]]
    label_names = names[27:]
    scores = [[] for _ in net["predict"]]
    for start in range(0, len(test["label"]), batch_size):
        rows = slice(start, start + batch_size)
        out = exe.run(program, feed=criteo_data.feed(test, rows, names), fetch_list=net["predict"])
        for k, value in enumerate(out):
            scores[k].append(value.reshape(-1))
    return [criteo_data.auc(test[label], np.concatenate(s)) for label, s in zip(label_names, scores)]


def main(argv=None):
    args = parse_args(argv)
    fleet.init(PaddleCloudRoleMaker())
    fluid.default_startup_program().random_seed = args.seed
    net = importlib.import_module(args.model).build(hash_dim=args.hash_dim)
    test_program = fluid.default_main_program().clone(for_test=True)
    optimizer = fluid.optimizer.Adam(args.lr, lazy_mode=True)
    fleet.distributed_optimizer(optimizer, make_strategy(args.strategy)).minimize(net["loss"])

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return
    fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    train, test = criteo_data.make(args.train_lines, args.test_lines, args.hash_dim)
    mine = np.arange(fleet.worker_index(), args.train_lines, fleet.worker_num())
    names = [v.name for v in net["feeds"]]
    started = time.time()
    for epoch in range(args.epochs):
        order = np.random.default_rng(args.seed + epoch).permutation(mine)
        for start in range(0, len(order), args.batch_size):
            rows = np.sort(order[start:start + args.batch_size])
            exe.run(fleet.main_program, feed=criteo_data.feed(train, rows, names), fetch_list=[net["loss"]])
    seconds = time.time() - started
    fleet.barrier_worker()  # every worker's updates are on the servers
    if fleet.is_first_worker():
        aucs = evaluate(exe, test_program, net, test, 1000)
        print(json.dumps({"model": args.model, "strategy": "local" if fleet.is_local() else args.strategy,
                          "auc": [round(a, 4) for a in aucs], "examples": int(len(mine) * args.epochs),
                          "seconds": round(seconds, 2)}), flush=True)
    fleet.barrier_worker()
    fleet.stop_worker()


if __name__ == "__main__":
    main()
