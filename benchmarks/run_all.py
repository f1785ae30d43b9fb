"""Runs every benchmark and writes benchmarks/RESULTS.md: each figure next to its goal
in DESIGN section 8, the machine (nproc, CPU model), the date, and the raw JSON lines.

    python benchmarks/run_all.py [--quick] [--out benchmarks/RESULTS.md]

Runs one benchmark at a time (they would otherwise compete for the cores); a full run
takes about 10 minutes on 2 cores, ``--quick`` (smaller sizes, no 100M-row table) about
3. The PyTorch comparison runs when torch is installed (``pip install torch``) and is
reported as skipped otherwise. Run it on an otherwise idle machine: every figure is a
speed.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def benchmarks(quick):
    """(name, argv) of every benchmark, in the order they run."""
    return [
        ("reader", ["bench_reader.py", "--lines", "100000" if quick else "200000"]),
        ("kernels", ["bench_kernels.py"]),
        ("transport", ["bench_transport.py"]),
        ("communicator", ["bench_communicator.py"]),
        ("sparse_table", ["bench_sparse_table.py", "--large-rows", "10000000" if quick else "100000000"]),
        ("local_train", ["bench_local_train.py"]),
        ("torch_ctr", ["bench_torch_ctr.py", "--lines", "100000" if quick else "200000"]),
        ("distributed", ["bench_distributed.py", "--epochs", "1" if quick else "3", "--worker_threads", "1",
                         "--local_threads", "2,1"]),
        # AUC parity on data seen once (no over-fitting): the table of examples/ctr_dnn/README.md
        ("distributed_1m", ["bench_distributed.py", "--lines", "200000" if quick else "1000000", "--epochs", "1",
                            "--worker_threads", "1", "--local_threads", "2,1"]),
    ]


def run_one(argv, timeout_s):
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, *argv], cwd=HERE, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"{argv[0]} did not finish within {timeout_s:g} s (run_all.py --timeout); "
                         f"run it alone to see where it stops", "wall_seconds": round(time.time() - t0, 1)}
    seconds = round(time.time() - t0, 1)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}", "wall_seconds": seconds}
    result = json.loads(lines[-1])
    result["wall_seconds"] = seconds
    return result


def get(result, *path):
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def status(value, goal, at_least=True):
    if value is None:
        return "not measured"
    met = value >= goal if at_least else value <= goal
    return "met" if met else "**gap**"


def fmt(value, spec="{:,.0f}"):
    return "n/a" if value is None else spec.format(value)


def figure_rows(r):
    """(figure, goal, measured, status) rows for DESIGN section 8."""
    rows = []
    local = get(r, "local_train", "examples_per_sec")
    torch = get(r, "torch_ctr", "torch", "examples_per_sec")
    ratio = get(r, "torch_ctr", "speed_vs_torch")
    rows.append(("CTR-DNN local training, batch 1000, 2 threads",
                 "≥ PyTorch equivalent (EmbeddingBag sum, sparse grads)",
                 f"{fmt(local)} ex/s (bench_local_train); same-run vs torch: fleet "
                 f"{fmt(get(r, 'torch_ctr', 'fleet', 'examples_per_sec'))}, torch {fmt(torch)} ex/s "
                 f"= {fmt(ratio, '{:.2f}')}x",
                 "skipped: torch not installed" if get(r, "torch_ctr", "skipped") else status(ratio, 1.0)))
    dist = get(r, "distributed", "results") or {}
    for s in ("async", "geo"):
        v = get(dist, s, "speed_vs_local")
        rows.append((f"{s} on loopback (1 server, 2 workers) vs local", "≥ 0.9x local ex/s",
                     f"{fmt(get(dist, s, 'examples_per_sec'))} vs {fmt(get(dist, 'local', 'examples_per_sec'))} "
                     f"ex/s = {fmt(v, '{:.2f}')}x", status(v, 0.9)))
    for name, key in (("transport", "ratio_4mib"), ("communicator", "ratio_4mib")):
        v = get(r, name, key)
        rows.append((f"dense push+pull of a 4 MiB block ({name})", "≥ 0.7 of raw ZeroMQ",
                     f"{fmt(v, '{:.2f}')} of raw (64 MiB: {fmt(get(r, name, 'ratio_64mib'), '{:.2f}')})",
                     status(v, 0.7)))
    v = get(r, "sparse_table", "lookups_updates_rows_per_s")
    rows.append(("sparse table lookups+updates, dim 10, one core", "≥ 10M rows/s",
                 f"{fmt(v)} rows/s", status(v, 10_000_000)))
    v1, v2 = get(r, "reader", "speedup_vs_pandas_1_producer"), get(r, "reader", "speedup_2_vs_1_producers")
    rows.append(("Criteo text -> batches vs pandas.read_csv (C)", "≥ 2x", f"{fmt(v1, '{:.2f}')}x "
                 f"({fmt(get(r, 'reader', 'producers_1', 'lines_per_s'))} lines/s)", status(v1, 2.0)))
    rows.append(("2 producer threads vs 1", "≥ 1.7x", f"{fmt(v2, '{:.2f}')}x", status(v2, 1.7)))
    v = get(r, "sparse_table", "gib_at_100m_rows")
    large = get(r, "sparse_table", "large", "rows")
    how = "built" if large and large >= 100_000_000 else f"extrapolated from {fmt(large)} rows"
    rows.append(("sparse table of 100M rows, dim 10", "≤ 8 GiB", f"{fmt(v, '{:.2f}')} GiB ({how})",
                 status(v, 8.0, at_least=False)))
    d = get(r, "torch_ctr", "auc_minus_torch")
    rows.append(("test AUC, fleet vs PyTorch at equal epochs", "within 0.005",
                 f"fleet {fmt(get(r, 'torch_ctr', 'fleet', 'test_auc'), '{:.4f}')}, torch "
                 f"{fmt(get(r, 'torch_ctr', 'torch', 'test_auc'), '{:.4f}')} ({fmt(d, '{:+.4f}')})",
                 status(None if d is None else -abs(d), -0.005)))
    sync = get(dist, "sync", "test_auc")
    for s in ("async", "geo"):
        a = get(dist, s, "test_auc")
        diff = None if a is None or sync is None else a - sync
        rows.append((f"test AUC, {s} vs sync", "within 0.01",
                     f"{fmt(a, '{:.4f}')} vs {fmt(sync, '{:.4f}')} ({fmt(diff, '{:+.4f}')})",
                     status(None if diff is None else -abs(diff), -0.01)))
    return rows


def strategy_rows(r, name="distributed"):
    dist = get(r, name, "results") or {}
    rows = []
    for s in ("local", "local_1_threads", "sync", "async", "half_async", "geo"):
        if s in dist:
            d = dist[s]
            rows.append((s, fmt(d.get("test_auc"), "{:.4f}"),
                         fmt(d["test_auc"] - dist["local"]["test_auc"], "{:+.4f}") if s != "local" else "",
                         fmt(d.get("examples_per_sec")),
                         fmt(d["examples_per_sec"] / dist["local"]["examples_per_sec"], "{:.2f}x") if s != "local" else ""))
    return rows


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def write_report(path, results, args, started):
    dist = results.get("distributed", {})
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python benchmarks/run_all.py{' --quick' if args.quick else ''}` on "
        f"{started:%Y-%m-%d %H:%M} UTC. Machine: {os.cpu_count()} CPUs (`nproc`), {cpu_model()}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}.",
        "Each figure is measured in that run; ratios compare with a baseline measured in the same run.",
        "",
        "## Goals (DESIGN section 8)",
        "",
        table(("figure", "goal", "measured", "status"), figure_rows(results)),
        "",
        "## CTR-DNN by strategy",
        "",
        f"`bench_distributed.py`: {get(dist, 'lines') or 'n/a'} generated lines, {get(dist, 'epochs') or 'n/a'} "
        f"epoch(s), batch 1000; local = one process with 2 threads (local_1_threads: with 1); distributed = "
        f"{get(dist, 'servers') or 'n/a'} server(s) + 2 workers on this machine (1 thread each). "
        "Test AUC of the model the first worker saved, on 50,000 held-out lines; examples/s summed over workers.",
        "",
        table(("strategy", "test AUC", "vs local", "examples/s", "speed vs local"), strategy_rows(results)),
        "",
        f"The same on {get(results, 'distributed_1m', 'lines') or 'n/a'} lines, 1 epoch (no example seen twice, "
        "so no over-fitting):",
        "",
        table(("strategy", "test AUC", "vs local", "examples/s", "speed vs local"),
              strategy_rows(results, "distributed_1m")),
        "",
        "## Raw results",
        "",
        "One JSON line per benchmark, as printed (plus `wall_seconds`).",
        "",
        "```",
        *[json.dumps({"name": k, **v}) for k, v in results.items()],
        "```",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes: about 3 minutes")
    p.add_argument("--only", help="comma-separated benchmark names to run (default: all)")
    p.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark may take (default 1800)")
    args = p.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {}
    wanted = set(args.only.split(",")) if args.only else None
    for name, argv_ in benchmarks(args.quick):
        if wanted is not None and name not in wanted:
            continue
        print(f"run_all: {name}: {' '.join(argv_)}", flush=True)
        results[name] = run_one(argv_, args.timeout)
        print(json.dumps({"name": name, **results[name]}), flush=True)
    write_report(args.out, results, args, started)
    print(f"run_all: wrote {args.out}")
    failed = [k for k, v in results.items() if "error" in v]
    if failed:
        raise SystemExit(f"run_all: {', '.join(failed)} failed; see {args.out}")


if __name__ == "__main__":
    main()
