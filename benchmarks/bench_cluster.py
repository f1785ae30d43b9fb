"""CTR-DNN across three hosts (network namespaces on a bridge, tests/cluster/netns.py) with
the links uncapped and capped by tc tbf: examples/s and bytes on the wire per example, per
strategy.

    python benchmarks/bench_cluster.py [--lines 60000] [--caps none,1gbit,100mbit]
                                       [--strategies sync,async,half_async,geo]

Layout: servers on h1 and h2, workers on h1, h2 and h3 (one training thread each), the
same fleetrun command on each host, CURVE on (the multi-host default). Every figure is
from this run:

- ``job_examples_per_sec``: every worker's examples over the wall-clock span from the first
  worker's pass start to the last worker's pass end (one machine's clock);
- ``wire_bytes_per_example``: bytes every host's link sent (its veth's tx_bytes counter,
  read before and after the run: protocol headers, CURVE and heartbeats included) over the
  examples trained; traffic between a worker and the server of its own host never crosses
  a link and is not counted;
- ``vs_uncapped``: a capped run's examples/s over the uncapped run of the same strategy.

The hosts share this machine's cores (2 on the reference machine), so uncapped runs are
CPU-bound and say nothing about a real network; the capped ones show which strategy the
bandwidth limits, and by how much. Needs root, iproute2 and tc (tbf); prints one JSON line.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import _jobs  # noqa: E402
from tests.cluster.netns import Cluster, missing_requirements  # noqa: E402

PORT_SERVER, PORT_WORKER = 6170, 6171


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=60_000, help="train lines (6 files, 2 per worker)")
    p.add_argument("--caps", default="none,1gbit,100mbit", help="link caps (tc rate syntax); none: uncapped")
    p.add_argument("--strategies", default="sync,async,half_async,geo")
    p.add_argument("--batch_size", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    return p.parse_args(argv)


def tx_bytes(cluster):
    total = 0
    for h in cluster.hosts:
        r = h.run(["cat", f"/sys/class/net/{h.dev}/statistics/tx_bytes"], 10)
        total += int(r.stdout)
    return total


def env():
    e = _jobs.child_env()
    e.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return e


def run_job(cluster, work, data, keys, strategy, batch_size, timeout):
    h1, h2, h3 = cluster.hosts
    servers = ",".join(f"{h.addr}:{PORT_SERVER}" for h in (h1, h2))
    workers = ",".join(f"{h.addr}:{PORT_WORKER}" for h in (h1, h2, h3))
    model = os.path.join(work, "model")
    before = tx_bytes(cluster)
    procs = []
    for h in cluster.hosts:
        log_dir = os.path.join(work, h.name)
        argv = [sys.executable, "-m", "fleet.launch", "--servers", servers, "--workers", workers,
                "--keys_dir", keys, "--log_dir", log_dir, "--timeout", str(timeout),
                os.path.join(_jobs.EXAMPLE, "train.py"), "--data_dir", data, "--model_dir", model,
                "--strategy", strategy, "--batch_size", str(batch_size), "--threads", "1",
                "--print_period", "0", "--geo_k", "20"]
        procs.append(h.popen(argv, cwd=work, env=env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True))
    t0 = time.perf_counter()
    errors = []
    for h, p in zip(cluster.hosts, procs):
        out, err = p.communicate(timeout=timeout + 60)
        if p.returncode != 0:
            errors.append(f"{h.name}: exit {p.returncode}: {err[-1500:]}")
    wall = time.perf_counter() - t0
    sent = tx_bytes(cluster) - before
    if errors:
        raise _jobs.RunFailed(f"{strategy}: " + "; ".join(errors))
    logs = [open(os.path.join(work, h.name, f"workerlog.{i}")).read()
            for i, h in enumerate(cluster.hosts)]
    result = _jobs.summarize(strategy, logs, 0.0, wall)
    result.pop("cpu_seconds"), result.pop("cpu_s_per_1k_examples")
    result["wire_bytes"] = sent
    result["wire_bytes_per_example"] = sent / max(result["examples"], 1)
    return result


def main(argv=None):
    args = parse_args(argv)
    missing = missing_requirements(sshd=False)
    if missing:
        print(json.dumps({"error": "cannot make the cluster: " + "; ".join(missing)}))
        return 1
    caps = [c.strip() for c in args.caps.split(",") if c.strip()]
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        data = os.path.join(tmp, "data")
        _jobs.run("generate_data", [sys.executable, "generate_data.py", "--out_dir", data,
                                    "--train_lines", str(args.lines), "--test_lines", "1000",
                                    "--train_files", "6"], 600)
        keys = os.path.join(tmp, "keys")
        _jobs.run("make_keys", [sys.executable, "-m", "fleet.launch", "--make_keys", keys], 60)
        with Cluster(3) as cluster:
            for cap in caps:
                cluster.shape(None if cap == "none" else cap)
                for strategy in strategies:
                    work = os.path.join(tmp, f"{strategy}-{cap}")
                    os.makedirs(work)
                    try:
                        r = run_job(cluster, work, data, keys, strategy, args.batch_size, args.timeout)
                    except (_jobs.RunFailed, subprocess.TimeoutExpired) as e:
                        r = {"error": str(e)[-2000:]}
                    results.setdefault(strategy, {})[cap] = r
                    print(f"{strategy:10s} {cap:8s} "
                          + (f"{r['job_examples_per_sec']:10,.0f} ex/s  "
                             f"{r['wire_bytes_per_example']:10,.0f} B/example" if "error" not in r
                             else r["error"][:200]), file=sys.stderr, flush=True)
                    if cluster.leftovers():
                        print(json.dumps({"error": f"processes left after {strategy} {cap}: "
                                                   f"{cluster.leftovers()}"}))
                        return 1
            cluster.shape(None)
    for strategy, per_cap in results.items():
        base = (per_cap.get("none") or {}).get("job_examples_per_sec")
        for cap, r in per_cap.items():
            if cap != "none" and base and r.get("job_examples_per_sec"):
                r["vs_uncapped"] = r["job_examples_per_sec"] / base
    print(json.dumps({"lines": args.lines, "batch_size": args.batch_size, "caps": caps,
                      "layout": "servers on h1, h2; workers on h1, h2, h3; 1 thread each; CURVE on",
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
