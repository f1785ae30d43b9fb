"""CTR-DNN test AUC and examples/s for 1, 2, 4 and 8 trainers in each strategy, same data,
against local training with 1 thread measured in the same run.

    python benchmarks/bench_scaling.py [--lines 200000] [--epochs 1] [--trainers 1,2,4,8]
        [--layout workers|threads] [--servers 1] [--geo_k 100]
        [--strategies sync,async,half_async,geo] [--timeout 900] [--no_warmup] [train.py options...]

Trainers = workers x training threads. ``--layout workers`` (default) makes N trainers as N
workers with 1 thread each; ``--layout threads`` as 2 workers with N/2 threads each (1
worker for N = 1). Each worker reads its share of the train files, written as a multiple
of the largest worker count so every worker gets as many lines. train.py gives each thread
batch_size divided by what one update averages (sync: trainers; half-async: threads, times
the pushes merged; async: the pushes merged; GEO: workers); ``batch_per_thread`` reports
it. Options this script does not know go to train.py (e.g. ``--merge_pushes 0``). GEO
exchanges after 1, 2, 4, ... steps up to every --geo_k steps per worker, and at the end of
a pass; ``geo_exchanges_per_worker`` is counted from each worker's batches (its "pass done"
line).

Prints one JSON line: ``local`` (1 thread, the baseline) and, per strategy, a list of
{trainers, workers, threads, batch_per_thread, test_auc, examples_per_sec,
job_examples_per_sec, speed_vs_local, auc_minus_sync (sync at the same trainer count),
auc_minus_local, cpu_s_per_1k_examples, cpu_ratio, seconds} (see _jobs.py for the speed
and CPU figures), a run that failed as {trainers, workers, threads, error}; "checks" each
goal with its value and whether it is met. Every run (training, infer) has --timeout
seconds; a failed run is reported and the others go on (exit status 1).
Progress goes to stderr. Unknown options go to train.py (e.g. --batch_size 500).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jobs  # noqa: E402

# (strategy, trainers, largest |test AUC - sync's| at the same trainer count)
AUC_GOALS = (("async", 4, 0.005), ("async", 8, 0.01), ("half_async", 8, 0.005), ("geo", 4, 0.01))
GOAL = ("test AUC vs sync at the same trainer count: async within 0.005 at 4 trainers and 0.01 at 8; "
        "half-async within 0.005 at 8; GEO within 0.01 at 4")


def layout(trainers, how):
    """(workers, threads per worker) of a trainer count."""
    if how == "workers" or trainers == 1:
        return trainers, 1
    if trainers % 2:
        raise SystemExit(f"--layout threads needs even trainer counts (2 workers x N/2 threads); got {trainers}")
    return 2, trainers // 2


def checks(results):
    out = []
    for strategy, trainers, limit in AUC_GOALS:
        row = next((r for r in results.get(strategy, []) if r["trainers"] == trainers), None)
        v = None if row is None else row.get("auc_minus_sync")
        out.append({"figure": f"{strategy} test AUC minus sync's at {trainers} trainers",
                    "goal": f"within {limit}", "value": v, "met": None if v is None else abs(v) <= limit})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--trainers", default="1,2,4,8")
    p.add_argument("--layout", choices=["workers", "threads"], default="workers")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--geo_k", type=int, default=100, help="GEO's steps per worker between exchanges")
    p.add_argument("--strategies", default="sync,async,half_async,geo")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one run (training or infer) may take")
    p.add_argument("--no_warmup", action="store_true",
                   help="skip the few-line runs that compile numba's kernels before timing")
    p.add_argument("--keep", action="store_true", help="keep the work directory (data, models, logs; printed)")
    args, train_args = p.parse_known_args(argv)
    batch_size = argparse.ArgumentParser(add_help=False)
    batch_size.add_argument("--batch_size", type=int, default=1000)
    batch = batch_size.parse_known_args(train_args)[0].batch_size
    trainer_counts = [int(t) for t in args.trainers.split(",") if t]
    strategies = [s for s in args.strategies.split(",") if s]
    shapes = {n: layout(n, args.layout) for n in trainer_counts}
    files = 1
    for workers, _ in shapes.values():
        files = math.lcm(files, workers)
    files *= -(-4 // files)  # at least generate_data's default 4 (producer threads read a file each)

    with _jobs.work_directory("bench-scaling", args.keep) as work:
        data = os.path.join(work, "data")
        try:
            _jobs.generate_data(data, args.lines, files, timeout=args.timeout)
            if not args.no_warmup:
                _jobs.say("bench_scaling: warm-up (numba's cache)")
                _jobs.warm_up(work, strategies, args.timeout)
            last = f"epoch_{args.epochs - 1}"
            # A large print period: no progress lines, but each pass's "pass done" line (batches).
            common = ["--epochs", str(args.epochs), "--print_period", str(10**9), *train_args]
            model = os.path.join(work, "local")
            local = _jobs.train_local("local, 1 thread", model, data, 1, common, args.timeout)
            local["test_auc"] = _jobs.test_auc("local, 1 thread", os.path.join(model, last), data, args.timeout)
        except _jobs.RunFailed as e:
            raise SystemExit(f"bench_scaling: {e}")
        _jobs.say(f"local, 1 thread: {local['examples_per_sec']:,.0f} examples/s, test AUC {local['test_auc']:.4f}")

        results = {s: [] for s in strategies}
        failed = []
        for n in trainer_counts:
            workers, threads = shapes[n]
            for strategy in strategies:
                name = f"{strategy}, {n} trainers ({workers} workers x {threads} threads)"
                row = {"trainers": n, "workers": workers, "threads": threads}
                model = os.path.join(work, f"{strategy}-{n}")
                try:
                    r = _jobs.train_fleet(name, model, data, strategy, args.servers, workers, threads,
                                          [*common, "--geo_k", str(args.geo_k)], args.timeout)
                    r["test_auc"] = _jobs.test_auc(name, os.path.join(model, last), data, args.timeout)
                except _jobs.RunFailed as e:
                    _jobs.say(f"bench_scaling: {e}")
                    failed.append(name)
                    row["error"] = str(e)[:2000]
                    results[strategy].append(row)
                    continue
                # train.py prints the thread batch when it differs from --batch_size
                per_thread = _jobs.thread_batch(r["logs"][0]) or batch
                row.update({
                    "batch_per_thread": per_thread,
                    "test_auc": round(r["test_auc"], 4),
                    "examples_per_sec": round(r["examples_per_sec"]),
                    "job_examples_per_sec": _jobs.rounded(r["job_examples_per_sec"], 0),
                    "speed_vs_local": round(r["examples_per_sec"] / local["examples_per_sec"], 3),
                    "auc_minus_sync": None,
                    "auc_minus_local": round(r["test_auc"] - local["test_auc"], 4),
                    "cpu_s_per_1k_examples": round(r["cpu_s_per_1k_examples"], 3),
                    "cpu_ratio": round(r["cpu_s_per_1k_examples"] / local["cpu_s_per_1k_examples"], 3),
                    "seconds": round(r["seconds"], 1),
                })
                if strategy == "geo":
                    row["geo_exchanges_per_worker"] = [_jobs.geo_exchanges(log, args.geo_k) for log in r["logs"]]
                results[strategy].append(row)
                _jobs.say(f"{name}: {row['examples_per_sec']:,} examples/s, test AUC {row['test_auc']:.4f}")
    sync = {r["trainers"]: r.get("test_auc") for r in results.get("sync", [])}
    for rows in results.values():
        for r in rows:
            if r.get("test_auc") is not None and sync.get(r["trainers"]) is not None:
                r["auc_minus_sync"] = round(r["test_auc"] - sync[r["trainers"]], 4)
    print(json.dumps({
        "bench": "scaling", "model": "ctr_dnn", "lines": args.lines, "epochs": args.epochs,
        "layout": args.layout, "servers": args.servers, "geo_k": args.geo_k, "batch_size": batch,
        "train_files": files,
        "local": {"threads": 1, "test_auc": round(local["test_auc"], 4),
                  "examples_per_sec": round(local["examples_per_sec"]),
                  "job_examples_per_sec": _jobs.rounded(local["job_examples_per_sec"], 0),
                  "cpu_s_per_1k_examples": round(local["cpu_s_per_1k_examples"], 3),
                  "seconds": round(local["seconds"], 1)},
        "results": results, "checks": checks(results), "goal": GOAL,
        **({"failed": failed} if failed else {})}))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
