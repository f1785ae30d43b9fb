"""CTR-DNN with 1 server + 2 workers in each strategy vs local training, same data
(the collective strategy: 2 workers and no server; hybrid: dense parameters all-reduced
between the 2 workers, tables on the server).

    python benchmarks/bench_distributed.py [--lines 200000] [--epochs 1] [--seeds 1]
        [--strategies sync,async,half_async,geo,hybrid,collective] [--local_threads 2] [--worker_threads N]
        [--servers 1] [--geo_k 20] [--timeout 1800] [--no_warmup] [train.py options...]

The data are generated once (the generator's seed is fixed). For each seed s = 1..--seeds
(train.py --seed: the model's initial values) local training and every strategy run in
turn. Prints one JSON line; per run (local, local_<T>_threads, each strategy) the mean over
the seeds of:

- examples_per_sec: each worker's own train_from_dataset figure, summed over workers;
  job_examples_per_sec: all examples over the wall-clock span from the first worker's pass
  start to the last one's end (see _jobs.py);
- test_auc: of the model the first worker saved, on 50,000 held-out lines;
- cpu_s_per_1k_examples: CPU seconds of every process of the run (fleetrun, its servers
  and workers) per 1,000 examples trained (see _jobs.py for how it is measured);
- seconds: wall seconds of the training run;

with test_auc_spread and examples_per_sec_spread ({min, max, std} over the seeds), and for
the strategies: speed_vs_local and job_speed_vs_local (the mean over seeds of the ratio to
the same seed's local run), auc_minus_local (mean difference) and cpu_ratio (the mean
ratio of cpu_s_per_1k_examples to local's). "per_seed" lists each seed's figures, "checks"
each goal with its value and whether it is met. Progress goes to stderr.
Unknown options go to train.py (e.g. --batch_size 500).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jobs  # noqa: E402

# strategy -> least examples/s as a fraction of local's; and the job's CPU per example.
SPEED_GOALS = {"async": 0.95, "half_async": 0.9, "geo": 1.0, "sync": 0.8}
CPU_GOAL = 1.1
HYBRID_AUC_GOAL = 0.003
GOAL = ("async >= 0.95x local examples/s, half-async >= 0.9x, GEO >= 1.0x, sync >= 0.8x; "
        "job CPU-seconds per example <= 1.1x local; hybrid within 0.003 test AUC of sync and at least "
        "async's examples/s")


def mean(values):
    return sum(values) / len(values)


def aggregate(runs, local_runs=None):
    """The figures of one configuration over the seeds (runs: one per seed, in seed order)."""
    out = {}
    for key in ("examples_per_sec", "job_examples_per_sec", "test_auc", "cpu_s_per_1k_examples", "seconds"):
        values = [r[key] for r in runs]
        out[key] = None if None in values else mean(values)
    out["test_auc_spread"] = _jobs.spread([r["test_auc"] for r in runs])
    out["examples_per_sec_spread"] = _jobs.spread([r["examples_per_sec"] for r in runs])
    if local_runs is not None:
        pairs = list(zip(runs, local_runs))
        out["speed_vs_local"] = mean([r["examples_per_sec"] / l["examples_per_sec"] for r, l in pairs])
        if all(r["job_examples_per_sec"] and l["job_examples_per_sec"] for r, l in pairs):
            out["job_speed_vs_local"] = mean([r["job_examples_per_sec"] / l["job_examples_per_sec"]
                                              for r, l in pairs])
        out["auc_minus_local"] = mean([r["test_auc"] - l["test_auc"] for r, l in pairs])
        out["cpu_ratio"] = mean([r["cpu_s_per_1k_examples"] / l["cpu_s_per_1k_examples"] for r, l in pairs])
    return out


def rounded_result(agg, runs, seeds, extra=None):
    r = {**(extra or {})}
    digits = {"examples_per_sec": 0, "job_examples_per_sec": 0, "test_auc": 4, "cpu_s_per_1k_examples": 3,
              "seconds": 1, "test_auc_spread": 4, "examples_per_sec_spread": 0, "speed_vs_local": 3,
              "job_speed_vs_local": 3, "auc_minus_local": 4, "cpu_ratio": 3}
    for key, value in agg.items():
        r[key] = _jobs.rounded(value, digits[key])
    r["per_seed"] = [{"seed": s, "test_auc": round(x["test_auc"], 4), "examples_per_sec": round(x["examples_per_sec"]),
                      "job_examples_per_sec": _jobs.rounded(x["job_examples_per_sec"], 0),
                      "cpu_s_per_1k_examples": round(x["cpu_s_per_1k_examples"], 3)} for s, x in zip(seeds, runs)]
    return r


def checks(results):
    """Each goal with the figure measured and whether it is met (None: not measured)."""
    out = []
    for strategy, goal in SPEED_GOALS.items():
        v = results.get(strategy, {}).get("speed_vs_local")
        out.append({"figure": f"{strategy} examples/s vs local", "goal": f">= {goal}x", "value": v,
                    "met": None if v is None else v >= goal})
    for strategy in SPEED_GOALS:
        v = results.get(strategy, {}).get("cpu_ratio")
        out.append({"figure": f"{strategy} job CPU-seconds per example vs local", "goal": f"<= {CPU_GOAL}x",
                    "value": v, "met": None if v is None else v <= CPU_GOAL})
    hybrid, sync, async_ = (results.get(s, {}) for s in ("hybrid", "sync", "async"))
    v = None
    if hybrid.get("test_auc") is not None and sync.get("test_auc") is not None:
        v = round(hybrid["test_auc"] - sync["test_auc"], 4)
    out.append({"figure": "hybrid test AUC minus sync's", "goal": f"|value| <= {HYBRID_AUC_GOAL}", "value": v,
                "met": None if v is None else abs(v) <= HYBRID_AUC_GOAL})
    v = None
    if hybrid.get("examples_per_sec") and async_.get("examples_per_sec"):
        v = round(hybrid["examples_per_sec"] / async_["examples_per_sec"], 3)
    out.append({"figure": "hybrid examples/s vs async's", "goal": ">= 1.0x", "value": v,
                "met": None if v is None else v >= 1.0})
    return out


def run_all_jobs(work, args, strategies, local_threads, seeds, train_args):
    """Every timed run of the bench in ``work``: {name: [result per seed]}."""
    data = os.path.join(work, "data")
    _jobs.generate_data(data, args.lines, timeout=args.timeout)
    if not args.no_warmup:
        _jobs.say("bench_distributed: warm-up (numba's cache)")
        _jobs.warm_up(work, strategies, args.timeout)
    last = f"epoch_{args.epochs - 1}"
    runs = {}
    try:
        for seed in seeds:
            common = ["--epochs", str(args.epochs), "--print_period", "0", "--seed", str(seed), *train_args]
            for i, threads in enumerate(local_threads):
                name = "local" if i == 0 else f"local_{threads}_threads"
                model = os.path.join(work, f"{name}-seed{seed}")
                r = _jobs.train_local(f"{name}, seed {seed}", model, data, threads, common, args.timeout)
                r["test_auc"] = _jobs.test_auc(f"{name}, seed {seed}", os.path.join(model, last), data, args.timeout)
                runs.setdefault(name, []).append(r)
                _jobs.say(f"seed {seed} {name}: {r['examples_per_sec']:,.0f} examples/s, test AUC {r['test_auc']:.4f}, "
                          f"{r['cpu_s_per_1k_examples']:.3f} CPU s per 1k examples")
            for strategy in strategies:
                model = os.path.join(work, f"{strategy}-seed{seed}")
                threads = args.worker_threads
                r = _jobs.train_fleet(f"{strategy}, seed {seed}", model, data, strategy, args.servers, 2, threads,
                                      [*common, "--geo_k", str(args.geo_k)], args.timeout)
                r["test_auc"] = _jobs.test_auc(f"{strategy}, seed {seed}", os.path.join(model, last), data,
                                               args.timeout)
                runs.setdefault(strategy, []).append(r)
                _jobs.say(f"seed {seed} {strategy}: {r['examples_per_sec']:,.0f} examples/s, test AUC "
                          f"{r['test_auc']:.4f}, {r['cpu_s_per_1k_examples']:.3f} CPU s per 1k examples")
    except _jobs.RunFailed as e:
        raise SystemExit(f"bench_distributed: {e}")
    return runs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="train.py --seed 1..N (model init); data fixed")
    p.add_argument("--strategies", default="sync,async,half_async,geo,hybrid,collective")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--geo_k", type=int, default=20)
    p.add_argument("--local_threads", default="2",
                   help="threads of the local baseline; a list such as 2,1 adds more local runs (the first is "
                        "the baseline of the ratios)")
    p.add_argument("--worker_threads", type=int, default=None,
                   help="training threads per worker (default: train.py's --threads, as local)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one run (training or infer) may take")
    p.add_argument("--no_warmup", action="store_true",
                   help="skip the few-line runs that compile numba's kernels before timing")
    p.add_argument("--keep", action="store_true", help="keep the work directory (data, models, logs; printed)")
    args, train_args = p.parse_known_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    strategies = [s for s in args.strategies.split(",") if s]
    local_threads = [int(t) for t in args.local_threads.split(",")]
    seeds = list(range(1, args.seeds + 1))
    with _jobs.work_directory("bench-dist", args.keep) as work:
        runs = run_all_jobs(work, args, strategies, local_threads, seeds, train_args)
    results = {}
    for i, threads in enumerate(local_threads):
        name = "local" if i == 0 else f"local_{threads}_threads"
        results[name] = rounded_result(aggregate(runs[name]), runs[name], seeds, {"threads": threads})
    for strategy in strategies:
        results[strategy] = rounded_result(aggregate(runs[strategy], runs["local"]), runs[strategy], seeds)
    print(json.dumps({"bench": "distributed", "model": "ctr_dnn", "servers": args.servers, "workers": 2,
                      "worker_threads": args.worker_threads, "lines": args.lines, "epochs": args.epochs,
                      "seeds": seeds, "geo_k": args.geo_k, "train_args": train_args, "results": results, "checks": checks(results),
                      "goal": GOAL}))


if __name__ == "__main__":
    main()
