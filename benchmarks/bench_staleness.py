"""What async staleness alone costs CTR-DNN's test AUC: async training simulated in one
process, deterministically, with no communication at all.

    python benchmarks/bench_staleness.py [--lines 200000,1000000] [--lags 0,1,3,7,15]
        [--seeds 1] [--batch_size 1000] [--lr 0.001] [--keep]

Update k applies (Adam 1e-3, lazy, as train.py) the gradient of batch k computed on the
parameters, dense layers and embedding table alike, as they were ``lag`` updates earlier:
an async job whose gradients all arrive ``lag`` updates late. Lag 0 is local training
with one thread (the same arithmetic as an ``exe.run`` loop). In a real async job with W
workers of one thread, each push meets the W - 1 updates the other workers applied since
its parameters were pulled, and the async pipeline (a step computes on parameters pulled
after the step before the previous one was sent) can add up to another W: lag W - 1 to
2W - 1. Comparing bench_scaling's async figures with these says how much of their
accuracy loss is staleness and how much would be a defect of the distributed engine.

Prints one JSON line: per data size (generated lines, seen once) and lag, the test AUC
on 50,000 held-out lines (mean over the seeds, and per seed) and its difference from lag
0's. Progress goes to stderr.
"""
import argparse
import collections
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jobs  # noqa: E402

sys.path.insert(0, _jobs.EXAMPLE)
import fleet  # noqa: E402
from fleet import optimizer  # noqa: E402
from fleet.fluid import unique_name  # noqa: E402
from fleet.framework.hooks import program_to_run  # noqa: E402
from fleet.framework.runner import Plan, Runner  # noqa: E402
from infer import auc_score, criteo_dataset, predict_files  # noqa: E402
from network import ctr_dnn_model  # noqa: E402

HASH_DIM = 1000001


def train(data, lag, seed, batch_size, lr):
    """Test AUC after one pass in which every gradient is ``lag`` updates stale; also the
    updates made."""
    main, startup = fleet.Program(), fleet.Program()
    # Fresh names (fc_0.w_0, ...) for every model: initial values come from the seed and
    # the names, so every lag starts from the same parameters for a seed.
    with fleet.program_guard(main, startup), unique_name.guard():
        startup.random_seed = seed
        inputs, avg_cost, _, _, predict, _ = ctr_dnn_model(HASH_DIM)
        test_program = main.clone(for_test=True)
        optimizer.Adam(lr, lazy_mode=True).minimize(avg_cost)
    scope = fleet.Scope()
    exe = fleet.Executor()
    exe.run(startup, scope=scope)
    params = [p.name for p in main.global_block().all_parameters()]
    plan = Plan(program_to_run(main))
    # The "server" holds the parameters and applies updates; the "worker" computes each
    # gradient in a child scope whose parameters are a snapshot `lag` updates old.
    server = Runner(plan, scope)
    worker_scope = scope.new_scope()
    worker = Runner(plan, worker_scope)
    history = collections.deque([{n: scope[n].copy() for n in params}])
    updates = 0
    for feed in criteo_dataset(inputs, sorted(glob.glob(os.path.join(data, "train", "*"))), HASH_DIM,
                               batch_size).batches():
        for n in params:
            worker_scope[n] = history[0][n] if lag else scope[n]
        worker.local.clear()
        worker.local.update(feed)
        worker.run(optimize=False, schedule=False)
        server.local.clear()  # the update phase reads only the gradients
        for g in plan.grad_names:
            server.local[g] = worker.local[g]
        server.run(compute=False, optimize=True, schedule=True)
        updates += 1
        if lag:
            history.append({n: scope[n].copy() for n in params})
            while len(history) > lag + 1:  # history[0]: the parameters after update k - 1 - lag
                history.popleft()
    with fleet.scope_guard(scope):
        labels, scores = predict_files(exe, test_program, inputs, predict,
                                       sorted(glob.glob(os.path.join(data, "test", "*"))), HASH_DIM, 1000)
    return auc_score(labels, scores), updates


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", default="200000,1000000", help="train lines of each data size (comma-separated)")
    p.add_argument("--lags", default="0,1,3,7,15")
    p.add_argument("--seeds", default="1", help="seeds of the model's initial values (comma-separated)")
    p.add_argument("--batch_size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--keep", action="store_true", help="keep the work directory (the data; printed)")
    args = p.parse_args()
    sizes = [int(x) for x in args.lines.split(",")]
    lags = [int(x) for x in args.lags.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    if 0 not in lags:
        lags = [0] + lags  # every figure is a difference from lag 0 in the same run
    results = []
    t0 = time.time()
    with _jobs.work_directory("bench-staleness", args.keep) as work:
        for lines in sizes:
            data = os.path.join(work, f"data-{lines}")
            _jobs.generate_data(data, lines)
            base = None
            for lag in lags:
                runs = []
                for seed in seeds:
                    started = time.time()
                    value, updates = train(data, lag, seed, args.batch_size, args.lr)
                    runs.append(value)
                    _jobs.say(f"{lines} lines, lag {lag}, seed {seed}: test AUC {value:.4f} "
                              f"({updates} updates, {time.time() - started:.1f} s)")
                mean = sum(runs) / len(runs)
                if lag == 0:
                    base = runs
                results.append({"lines": lines, "lag": lag, "updates": updates, "test_auc": round(mean, 4),
                                "auc_minus_lag0": round(mean - sum(base) / len(base), 4),
                                "per_seed": [round(v, 4) for v in runs]})
    print(json.dumps({"name": "staleness", "bench": "staleness", "batch_size": args.batch_size, "lr": args.lr,
                      "optimizer": "adam (lazy)", "seeds": seeds, "results": results,
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
