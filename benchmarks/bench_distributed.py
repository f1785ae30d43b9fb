"""CTR-DNN with 1 server + 2 workers in each strategy vs local training, same data.

Prints one JSON line: for local and each strategy, examples/s (summed over workers,
each worker's own train_from_dataset figure) and the test AUC of the saved model.

    python benchmarks/bench_distributed.py [--lines 200000] [--epochs 1] [--strategies sync,async,half_async,geo]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "ctr_dnn")


def run(cmd, cwd, env=None, timeout=1800):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}")
    return proc.stdout + proc.stderr


def speed_of(text):
    """Examples/s of one process's log: the mean over its epochs."""
    rates = [float(v.replace(",", "")) for v in re.findall(r"epoch \d+: \d+ examples, ([\d,]+) examples/s", text)]
    return sum(rates) / max(len(rates), 1)


def test_auc(model_dir, data_dir):
    out = run([sys.executable, "infer.py", "--model_dir", model_dir, "--data_dir", data_dir], EXAMPLE)
    return json.loads(out.strip().splitlines()[-1])["auc"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--strategies", default="sync,async,half_async,geo")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--geo_k", type=int, default=20)
    p.add_argument("--local_threads", default="2",
                   help="threads of the local baseline; a list such as 2,1 adds more local runs (the first is "
                        "the baseline of the ratios)")
    p.add_argument("--worker_threads", type=int, default=None,
                   help="training threads per worker (default: train.py's --threads, as local)")
    args, train_args = p.parse_known_args(argv)
    work = tempfile.mkdtemp(prefix="fleet-bench-dist-")
    data = os.path.join(work, "data")
    run([sys.executable, "generate_data.py", "--out_dir", data, "--train_lines", str(args.lines),
         "--test_lines", "50000"], EXAMPLE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    common = ["--data_dir", data, "--epochs", str(args.epochs), "--print_period", "0", *train_args]
    results = {}
    last = f"epoch_{args.epochs - 1}"
    for i, threads in enumerate(int(t) for t in args.local_threads.split(",")):
        name = "local" if i == 0 else f"local_{threads}_threads"
        t0 = time.time()
        out = run([sys.executable, "train.py", "--model_dir", os.path.join(work, name), *common,
                   "--threads", str(threads)], EXAMPLE, env)
        results[name] = {"threads": threads, "examples_per_sec": round(speed_of(out)),
                         "test_auc": round(test_auc(os.path.join(work, name, last), data), 4),
                         "seconds": round(time.time() - t0, 1)}
    threads = [] if args.worker_threads is None else ["--threads", str(args.worker_threads)]
    for strategy in args.strategies.split(","):
        model = os.path.join(work, strategy)
        t0 = time.time()
        run([sys.executable, "-m", "fleet.launch", "--server_num", str(args.servers), "--worker_num", "2",
             "--log_dir", os.path.join(model, "log"), "train.py", "--model_dir", model, "--strategy", strategy,
             "--geo_k", str(args.geo_k), *common, *threads], EXAMPLE, env)
        speed = sum(speed_of(open(os.path.join(model, "log", f"workerlog.{i}")).read()) for i in range(2))
        results[strategy] = {"examples_per_sec": round(speed),
                             "test_auc": round(test_auc(os.path.join(model, last), data), 4),
                             "seconds": round(time.time() - t0, 1)}
        results[strategy]["speed_vs_local"] = round(results[strategy]["examples_per_sec"] / results["local"]["examples_per_sec"], 3)
        results[strategy]["auc_minus_local"] = round(results[strategy]["test_auc"] - results["local"]["test_auc"], 4)
    print(json.dumps({"bench": "distributed", "model": "ctr_dnn", "servers": args.servers, "workers": 2,
                      "lines": args.lines, "epochs": args.epochs, "results": results,
                      "goal": "async/GEO >= 0.9x local examples/s; AUC within 0.01-0.02 of local"}))


if __name__ == "__main__":
    main()
