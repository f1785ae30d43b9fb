"""A small model (a sparse embedding table, two fc layers) trained on deterministic data,
for the collective tests: run alone (local: global batches of workers x batch) or as one
collective worker (PaddleCloudRoleMaker(is_collective=True): worker i takes rows
i*batch..(i+1)*batch of every global batch). Writes every persistable variable of its
scope to --out as an .npz.

    python collective_model.py --out w.npz --opt adam --workers 2 --batch 16 --steps 6 [--feed dataset
        --data_dir D --threads 2] [--die_after 2] [--steps_of_worker 1:3]
"""
import argparse
import os
import signal
import sys

import numpy as np

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from role_makers import PaddleCloudRoleMaker
from strategies import CollectiveStrategy

VOCAB = 40


def example_rows(n, seed=3):
    """n examples: 2 dense values, one sequence of 1-3 ids, a label planted on the ids."""
    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(7).normal(0, 1.5, VOCAB)
    rows = []
    for _ in range(n):
        x = rng.normal(size=2).astype(np.float32)
        seq = rng.integers(0, VOCAB, rng.integers(1, 4))
        y = int(rng.random() < 1 / (1 + np.exp(-(weights[seq[0]] + x[0]))))
        rows.append((x, seq, y))
    return rows


def write_multislot(path, rows):
    with open(path, "w") as f:
        for x, seq, y in rows:
            f.write(f"2 {x[0]:.6f} {x[1]:.6f} {len(seq)} {' '.join(map(str, seq))} 1 {y}\n")


def feed_of(rows):
    return {"x": np.stack([np.float32(np.round(r[0], 6)) for r in rows]),
            "s": [np.asarray(r[1], np.int64) for r in rows],
            "y": np.array([[r[2]] for r in rows], np.int64)}


def build(opt_name):
    x = layers.data("x", shape=[2])
    s = layers.data("s", shape=[1], dtype="int64", lod_level=1)
    y = layers.data("y", shape=[1], dtype="int64")
    emb = layers.sequence_pool(layers.embedding(s, size=[VOCAB, 4], is_sparse=True, param_attr="table"), "sum")
    h = layers.fc(layers.concat([emb, x], axis=1), 8, act="relu")
    pred = layers.fc(h, 2, act="softmax")
    loss = layers.mean(layers.cross_entropy(pred, y))
    opt = optimizer.SGD(0.1) if opt_name == "sgd" else optimizer.Adam(0.02)
    fw.default_startup_program().random_seed = 11 + int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    return [x, s, y], loss, opt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--opt", default="sgd")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--feed", default="run", choices=["run", "dataset"])
    p.add_argument("--data_dir")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--die_after", type=int, default=0)
    args = p.parse_args()
    collective = "PADDLE_TRAINER_ENDPOINTS" in os.environ
    fleet.init(PaddleCloudRoleMaker(is_collective=collective))
    inputs, loss, opt = build(args.opt)
    fleet.distributed_optimizer(opt, CollectiveStrategy()).minimize(loss)
    me, n = (fleet.worker_index(), fleet.worker_num()) if collective else (0, 1)
    fleet.init_worker()
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    batch = args.batch * (args.workers if not collective else 1)
    if args.feed == "run":
        rows = example_rows(args.steps * args.batch * args.workers)
        for step in range(args.steps):
            glob = rows[step * args.batch * args.workers:(step + 1) * args.batch * args.workers]
            mine = glob if not collective else glob[me * args.batch:(me + 1) * args.batch]
            exe.run(fleet.main_program, feed=feed_of(mine), fetch_list=[loss])
            if args.die_after and step + 1 == args.die_after and me == 1:
                os.kill(os.getpid(), signal.SIGKILL)
    else:
        ds = fleet.DatasetFactory().create_dataset("QueueDataset")
        ds.set_use_var(inputs)
        ds.set_batch_size(batch)
        ds.set_thread(1)
        ds.set_filelist([os.path.join(args.data_dir, f"part{me if collective else 'all'}")])
        summary = exe.train_from_dataset(fleet.main_program, ds, thread=args.threads, print_period=0)
        print(f"examples {summary['examples']}", flush=True)
    scope = fleet.global_scope()
    np.savez(args.out.format(rank=me), **{k: np.asarray(v) for k, v in scope.vars.items() if isinstance(v, np.ndarray)})
    if fleet.is_first_worker():
        fleet.save_persistables(exe, args.out + ".saved")
    fleet.stop_worker()
    print("done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
