"""Runs every benchmark and writes benchmarks/RESULTS.md: each figure next to its goal
(the project's performance goals), the machine (nproc, CPU model), the date, and the raw JSON lines.

    python benchmarks/run_all.py [--quick] [--out benchmarks/RESULTS.md]

Runs one benchmark at a time (they would otherwise compete for the cores); a full run
took about 10 minutes on 2 cores before bench_scaling (1-8 trainers, 200,000 lines) and the
3 seeds of bench_distributed were added, which are estimated at another 10 or so (not yet
timed on the reference machine); ``--quick`` (smaller sizes, no 100M-row table, 1 seed,
1-4 trainers on 50,000 lines) about 7. The PyTorch comparison runs when torch is installed
(``pip install torch``) and is reported as skipped otherwise. Run it on an otherwise idle
machine: every figure is a speed. A benchmark that reports some failed runs but still prints
its JSON line (bench_scaling) keeps its figures, with the error.
"""
import argparse
import datetime
import json
import os
import platform
import re
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
        # the worker group's all_reduce next to raw ZeroMQ and MPI, 2 and 4 processes
        ("collective", ["bench_collective.py"] + (["--seconds", "0.5", "--repeats", "2"] if quick else [])),
        ("sparse_table", ["bench_sparse_table.py", "--large-rows", "10000000" if quick else "100000000"]),
        # admission (CountFilterEntry, ProbabilityEntry) and eviction (shrink) on the online stream
        ("tables_online", ["bench_tables_online.py"] + (["--quick"] if quick else [])),
        ("local_train", ["bench_local_train.py"]),
        ("torch_ctr", ["bench_torch_ctr.py", "--lines", "100000" if quick else "200000"]),
        # data seen once (no over-fitting), 3 seeds of the initial values
        ("distributed", ["bench_distributed.py", "--epochs", "1", "--worker_threads", "1",
                         "--local_threads", "2,1", "--seeds", "1" if quick else "3"]),
        # every thread reads batch 1000 in every strategy (Paddle 1.x's set_batch_size): sync, hybrid and
        # collective updates then average 2 x 1000 examples, as in PERSIA's comparison of hybrid with async
        ("distributed_per_thread", ["bench_distributed.py", "--epochs", "1", "--worker_threads", "1",
                                    "--strategies", "sync,async,hybrid,collective", "--seeds", "1" if quick else "3",
                                    "--batch_per_thread", "1000"]),
        # AUC parity on data seen once (no over-fitting): the table of examples/ctr_dnn/README.md
        ("distributed_1m", ["bench_distributed.py", "--lines", "200000" if quick else "1000000", "--epochs", "1",
                            "--worker_threads", "1", "--local_threads", "2,1"]),
        # --timeout per run: a run that hangs is reported and the others still fit in run_all's --timeout
        ("scaling", ["bench_scaling.py", "--lines", "50000" if quick else "200000",
                     "--trainers", "1,2,4" if quick else "1,2,4,8", "--timeout", "300"]),
        # the same with async / half-async servers merging one push per worker into an update
        ("scaling_merged", ["bench_scaling.py", "--lines", "50000" if quick else "200000",
                            "--trainers", "1,2,4" if quick else "1,2,4,8", "--timeout", "300",
                            "--strategies", "sync,async,half_async", "--merge_pushes", "0"]),
        # async staleness alone, simulated in one process (no communication)
        ("staleness", ["bench_staleness.py", "--lines", "50000" if quick else "200000,1000000",
                       "--seeds", "1" if quick else "1,2,3"]),
        # kill -9 of a server, then of a worker, of a sync job under fleetrun --max_restarts 2
        ("recovery", ["bench_recovery.py", "--lines", "400000" if quick else "1000000"]),
        # three hosts as network namespaces, links uncapped and capped by tc tbf
        ("cluster", ["bench_cluster.py", "--lines", "30000" if quick else "60000",
                     "--caps", "none,100mbit" if quick else "none,1gbit,100mbit"]),
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
    if not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}", "wall_seconds": seconds}
    result = json.loads(lines[-1])
    if proc.returncode != 0:  # a benchmark that reports some failed runs (bench_scaling) still prints its line
        result["error"] = f"exit {proc.returncode}: {proc.stderr[-1500:]}"
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


def cell(text, limit=200):
    """Text as one table cell: one line, no column separators, at most limit characters."""
    return " ".join(str(text).split()).replace("|", "/")[:limit]


def check_status(check):
    """The status of a benchmark's own check ({"figure", "goal", "value", "met"})."""
    return {True: "met", False: "**gap**"}.get(check.get("met"), "not measured")


def figure_rows(r):
    """(figure, goal, measured, status) rows: the project's performance goals."""
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
    rows += distributed_goal_rows(r)
    rows += distributed_goal_rows(r, "distributed_per_thread", "; batch 1000 per thread in every strategy",
                                  only=("hybrid",))
    rows += collective_goal_rows(r)
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
    dist = get(r, "distributed", "results") or {}
    sync = get(dist, "sync", "test_auc")
    for s in ("async", "geo"):
        a = get(dist, s, "test_auc")
        diff = None if a is None or sync is None else a - sync
        rows.append((f"test AUC, {s} vs sync", "within 0.01",
                     f"{fmt(a, '{:.4f}')} vs {fmt(sync, '{:.4f}')} ({fmt(diff, '{:+.4f}')})",
                     status(None if diff is None else -abs(diff), -0.01)))
    rows += scaling_goal_rows(r)
    rows += scaling_goal_rows(r, "scaling_merged", ", merge_async_pushes=0")
    rows += recovery_goal_rows(r)
    rows += tables_online_goal_rows(r)
    return rows


def recovery_goal_rows(r):
    """bench_recovery: kill -9 to training again, per role, goal < 20 s with 5 s checkpoints."""
    rows = []
    for role in ("server", "worker"):
        v = get(r, "recovery", role, "recovery_s")
        rows.append((f"recovery after kill -9 of a {role} (--max_restarts, checkpoint every "
                     f"{fmt(get(r, 'recovery', 'checkpoint_seconds'), '{:g}')} s)", "< 20 s to training again",
                     f"{fmt(v, '{:.1f}')} s; test AUC {fmt(get(r, 'recovery', role, 'auc_minus_undisturbed'), '{:+.4f}')} "
                     f"vs undisturbed", status(v, 20.0, at_least=False)))
    return rows


def recovery_rows(r):
    rows = []
    for role in ("server", "worker"):
        x = get(r, "recovery", role)
        if not x:
            continue
        rows.append((f"{role} {1 if role == 'worker' else 0}", fmt(x.get("recovery_s"), "{:.1f}"),
                     fmt(x.get("to_restart_s"), "{:.1f}"), fmt(x.get("restart_to_training_s"), "{:.1f}"),
                     f"{fmt(x.get('redone_batches'))} ({fmt(x.get('redone_examples'))} examples)",
                     fmt(x.get("test_auc"), "{:.4f}"), fmt(x.get("auc_minus_undisturbed"), "{:+.4f}")))
    return rows


RECOVERY_HEADER = ("killed", "kill to training again (s)", "kill to restart (s)", "restart to first step (s)",
                   "batches trained again", "test AUC", "vs undisturbed")


def tables_online_goal_rows(r):
    """bench_tables_online's checks: admission and eviction on the online stream."""
    t = r.get("tables_online") or {}
    rows = [(f"{c['figure']} (bench_tables_online)", c["goal"], fmt(c["value"], "{:+.4f}" if "AUC" in c["figure"]
                                                                    else "{:.3f}"), check_status(c))
            for c in t.get("checks") or []]
    if not rows:
        rows.append(("admission and eviction on the online stream (bench_tables_online)",
                     "see bench_tables_online.py", cell(t.get("error", "n/a")), "not measured"))
    return rows


def admission_rows(r):
    """(entry, rows at the end, test AUC mean, per pass) of bench_tables_online's admission runs."""
    a = get(r, "tables_online", "admission") or {}
    rows = []
    for name, label in (("none", "none"), ("count_2", "CountFilterEntry(2)")):
        if name in (a.get("rows") or {}):
            aucs = a["test_auc_per_pass"][name]
            rows.append((label, fmt(a["rows"][name]), fmt(a["mean_test_auc"][name], "{:.4f}"),
                         ", ".join(f"{x:.4f}" for x in aucs)))
    for x in get(r, "tables_online", "probability") or []:
        rows.append((f"ProbabilityEntry({x['p']})", f"{fmt(x['created'])} of {fmt(x['ids'])} ids: "
                     f"{x['fraction']:.4f} ({x['sigmas_off']:+.2f} sigma)", "", ""))
    return rows


def eviction_rows(r):
    """(pass, rows / RSS / AUC with shrink, the same without) of bench_tables_online's eviction runs."""
    e = get(r, "tables_online", "eviction", "per_pass") or {}
    rows = []
    for a, b in zip(e.get("shrink") or [], e.get("no_shrink") or []):
        rows.append((a["pass"], fmt(a["rows"]), fmt(a["server_rss_mib"], "{:,.1f}"), fmt(a["test_auc"], "{:.4f}"),
                     fmt(b["rows"]), fmt(b["server_rss_mib"], "{:,.1f}"), fmt(b["test_auc"], "{:.4f}"),
                     fmt(b["test_auc"] - a["test_auc"], "{:+.4f}")))
    return rows


EVICTION_HEADER = ("pass", "rows, shrink", "server RSS MiB, shrink", "test AUC, shrink", "rows, no shrink",
                   "server RSS MiB, no shrink", "test AUC, no shrink", "AUC no shrink - shrink")


def distributed_goal_rows(r, name="distributed", note="", only=None):
    """bench_distributed's checks: examples/s and job CPU per example of each strategy vs local
    (``only``: the checks of these strategies, where the run trained them)."""
    d = r.get(name) or {}
    dist = d.get("results") or {}
    seeds = len(d.get("seeds") or []) or "n/a"
    local = dist.get("local") or {}
    rows = []
    for c in d.get("checks") or []:
        strategy = c["figure"].split()[0]
        s = dist.get(strategy) or {}
        if only is not None and (strategy not in only or c.get("value") is None or not s):
            continue
        if not s:
            measured = "not run"
        elif "AUC" in c["figure"]:
            other = c["figure"].split("minus ")[-1].split("'")[0]
            measured = (f"{fmt(c['value'], '{:+.4f}')}: {fmt(s.get('test_auc'), '{:.4f}')} vs {other} "
                        f"{fmt((dist.get(other) or {}).get('test_auc'), '{:.4f}')}")
        elif "vs async" in c["figure"]:
            a = dist.get("async") or {}
            measured = (f"{fmt(s.get('examples_per_sec'))} vs async {fmt(a.get('examples_per_sec'))} ex/s = "
                        f"{fmt(c['value'], '{:.2f}')}x")
        elif "CPU" in c["figure"]:
            measured = (f"{fmt(c['value'], '{:.2f}')}x: {fmt(s.get('cpu_s_per_1k_examples'), '{:.3f}')} vs "
                        f"{fmt(local.get('cpu_s_per_1k_examples'), '{:.3f}')} CPU s per 1k examples")
        else:
            spread = s.get("examples_per_sec_spread") or {}
            measured = (f"{fmt(s.get('examples_per_sec'))} vs {fmt(local.get('examples_per_sec'))} ex/s = "
                        f"{fmt(c['value'], '{:.2f}')}x ({strategy} {fmt(spread.get('min'))}-{fmt(spread.get('max'))})")
        rows.append((f"{c['figure']} (1 server, 2 workers, mean of {seeds} seeds{note})", c["goal"], measured,
                     check_status(c)))
    if not rows and only is None:
        rows.append(("distributed strategies vs local (bench_distributed)", "see bench_distributed.py",
                     cell(d.get("error", "n/a")), "not measured"))
    return rows


def scaling_goal_rows(r, name="scaling", note=""):
    """bench_scaling's checks: each strategy's test AUC vs sync's at a trainer count."""
    sc = r.get(name) or {}
    rows = []
    for c in sc.get("checks") or []:
        if c.get("value") is None and name != "scaling":
            continue  # a strategy this run left out
        rows.append((f"{c['figure']} (bench_scaling, {sc.get('layout')} layout{note})", c["goal"],
                     fmt(c["value"], "{:+.4f}"), check_status(c)))
    if not rows:
        rows.append(("test AUC vs sync at 4 and 8 trainers (bench_scaling)", "see bench_scaling.py",
                     cell(sc.get("error", "n/a")), "not measured"))
    return rows


def strategy_rows(r, name="distributed"):
    dist = get(r, name, "results") or {}
    rows = []
    base = dist.get("local") or {}
    for s in ("local", "local_1_threads", "sync", "async", "half_async", "geo", "hybrid", "collective"):
        if s in dist:
            d = dist[s]
            spread = d.get("test_auc_spread") or {}
            is_base = s == "local"
            rows.append((s, fmt(d.get("test_auc"), "{:.4f}"),
                         f"{fmt(spread.get('min'), '{:.4f}')}-{fmt(spread.get('max'), '{:.4f}')}"
                         f" (std {fmt(spread.get('std'), '{:.4f}')})" if spread else "",
                         "" if is_base else fmt(d["test_auc"] - base["test_auc"], "{:+.4f}"),
                         fmt(d.get("examples_per_sec")),
                         "" if is_base else fmt(d["examples_per_sec"] / base["examples_per_sec"], "{:.2f}x"),
                         fmt(d.get("cpu_s_per_1k_examples"), "{:.3f}"),
                         "" if is_base else fmt(d.get("cpu_ratio"), "{:.2f}x")))
    return rows


STRATEGY_HEADER = ("strategy", "test AUC", "min-max over seeds", "vs local", "examples/s", "speed vs local",
                   "CPU s / 1k examples", "CPU vs local")


def scaling_rows(r, name="scaling"):
    sc = r.get(name) or {}
    local = sc.get("local") or {}
    rows = [("local", 1, "1 x 1", sc.get("batch_size", "n/a"), fmt(local.get("test_auc"), "{:.4f}"), "", "",
             fmt(local.get("examples_per_sec")), fmt(local.get("job_examples_per_sec")), "", "", "")]
    for strategy, runs in (sc.get("results") or {}).items():
        for x in runs:
            shape = f"{x['workers']} x {x['threads']}"
            if "error" in x:
                rows.append((strategy, x["trainers"], shape, "", "error: " + cell(x["error"], 150),
                             "", "", "", "", "", "", ""))
                continue
            exchanges = x.get("geo_exchanges_per_worker")
            rows.append((strategy, x["trainers"], shape, x.get("batch_per_thread"), fmt(x.get("test_auc"), "{:.4f}"),
                         fmt(x.get("auc_minus_sync"), "{:+.4f}"), fmt(x.get("auc_minus_local"), "{:+.4f}"),
                         fmt(x.get("examples_per_sec")), fmt(x.get("job_examples_per_sec")),
                         fmt(x.get("speed_vs_local"), "{:.2f}x"), fmt(x.get("cpu_ratio"), "{:.2f}x"),
                         "" if exchanges is None else ", ".join(str(e) for e in exchanges)))
    return rows


def staleness_rows(r):
    st = r.get("staleness") or {}
    if "error" in st:
        return [("error: " + cell(st["error"], 150), "", "", "", "")]
    return [(fmt(x["lines"]), x["lag"], fmt(x["updates"]), fmt(x["test_auc"], "{:.4f}"),
             "" if x["lag"] == 0 else fmt(x["auc_minus_lag0"], "{:+.4f}")) for x in st.get("results") or []]


def staleness_compare_rows(r):
    """bench_scaling's async runs next to the simulated lags that bracket them (W workers:
    lag W - 1 to 2W - 1), on the same number of lines."""
    st, sc = r.get("staleness") or {}, r.get("scaling") or {}
    sim = {x["lag"]: x for x in st.get("results") or [] if x["lines"] == sc.get("lines")}
    rows = []
    for x in (sc.get("results") or {}).get("async") or []:
        if "error" in x or x.get("threads") != 1:
            continue
        w = x["workers"]
        lags = [f"lag {lag}: " + (fmt(sim[lag]["auc_minus_lag0"], "{:+.4f}") if lag in sim else "not run")
                for lag in (w - 1, 2 * w - 1)]
        rows.append((w, fmt(x.get("test_auc"), "{:.4f}"), fmt(x.get("auc_minus_local"), "{:+.4f}"), *lags))
    return rows


def collective_goal_rows(r):
    """bench_collective's checks: all_reduce bandwidth vs the raw ZeroMQ bound."""
    co = r.get("collective") or {}
    rows = [(f"{c['figure']} (bench_collective)", c["goal"], fmt(c["value"], "{:.2f}"), check_status(c))
            for c in co.get("checks") or []]
    if not rows:
        rows.append(("all_reduce bandwidth vs raw ZeroMQ (bench_collective)", "see bench_collective.py",
                     cell(co.get("error", "n/a")), "not measured"))
    return rows


def collective_rows(r):
    """(processes, MiB, fleet GB/s, raw, bound, raw ring, ring bound, MPI GB/s) of bench_collective."""
    co = r.get("collective") or {}
    rows = []
    for n, per_size in (co.get("fleet_gbps") or {}).items():
        mpi = (co.get("mpi_gbps") or {}).get(n)
        for mib, gbps in per_size.items():
            raw = (co.get("raw_gbps") or {}).get(mib)
            ring = ((co.get("raw_ring_gbps") or {}).get(n) or {}).get(mib)
            share = 2 * (int(n) - 1) / int(n)
            rows.append((n, mib, fmt(gbps, "{:.2f}"), fmt(raw, "{:.2f}"), fmt(None if raw is None else raw / share,
                                                                              "{:.2f}"),
                         fmt(ring, "{:.2f}"), fmt(None if ring is None else ring / share, "{:.2f}"),
                         cell(mpi) if isinstance(mpi, str) else fmt((mpi or {}).get(mib), "{:.2f}")))
    return rows


COLLECTIVE_HEADER = ("processes", "MiB", "fleet all_reduce GB/s", "raw ZeroMQ GB/s", "bound raw / (2(N-1)/N)",
                     "raw ZeroMQ ring GB/s", "bound ring / (2(N-1)/N)", "MPI Allreduce GB/s")


def collective_sweep_rows(r):
    co = r.get("collective") or {}
    rows = []
    for n, per_size in (co.get("sweep_us") or {}).items():
        for kib, t in per_size.items():
            rows.append((n, kib, fmt(t.get("direct"), "{:,.0f}"), fmt(t.get("ring"), "{:,.0f}")))
    return rows


def cluster_rows(r):
    cl = r.get("cluster") or {}
    rows = []
    for strategy, per_cap in (cl.get("results") or {}).items():
        for cap, x in per_cap.items():
            if "error" in x:
                rows.append((strategy, cap, "error: " + cell(x["error"], 150), "", "", ""))
                continue
            rows.append((strategy, "uncapped" if cap == "none" else cap, fmt(x.get("job_examples_per_sec")),
                         fmt(x.get("vs_uncapped"), "{:.2f}x") if cap != "none" else "",
                         fmt(x.get("wire_bytes_per_example")),
                         fmt(x.get("wire_bytes", 0) / 1e6, "{:,.1f}")))
    return rows


CLUSTER_HEADER = ("strategy", "links", "job examples/s", "vs uncapped", "bytes on the wire / example",
                  "MB on the wire")


SCALING_HEADER = ("strategy", "trainers", "workers x threads", "batch / thread", "test AUC", "vs sync", "vs local",
                  "examples/s", "job examples/s", "speed vs local", "CPU vs local", "GEO exchanges / worker")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def kept_results(path):
    """{name: result} of the raw JSON lines of an earlier RESULTS.md, each with the date of
    the run that measured it ("measured_at": its own, else that report's header date)."""
    try:
        text = open(path).read()
    except OSError:
        return {}
    header = re.search(r" on (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", text)
    raw = text.split("## Raw results", 1)[-1]
    kept = {}
    for line in raw.splitlines():
        if line.startswith('{"name": '):
            result = json.loads(line)
            name = result.pop("name")
            result.setdefault("measured_at", header.group(1) if header else "an earlier run")
            kept[name] = result
    return kept


def write_report(path, results, args, started):
    dist = results.get("distributed", {})
    sc = results.get("scaling", {})
    rerun = sorted(k for k, v in results.items() if v.get("measured_at") == f"{started:%Y-%m-%d %H:%M}")
    older = sorted({v.get("measured_at") for k, v in results.items() if k not in rerun})
    when = (f"{started:%Y-%m-%d %H:%M} UTC" if not older else
            f"{started:%Y-%m-%d %H:%M} UTC, which ran {', '.join(rerun)} (`--only ... --keep_others`); "
            f"the other figures are from the run(s) of {', '.join(f'{d} UTC' for d in older)}, as each raw "
            "line's measured_at says")
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python benchmarks/run_all.py{' --quick' if args.quick else ''}` on {when}. "
        f"Machine: {os.cpu_count()} CPUs (`nproc`), {cpu_model()}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}.",
        "Each figure is measured in one run; ratios compare with a baseline measured in the same run.",
        "",
        "## Goals",
        "",
        table(("figure", "goal", "measured", "status"), figure_rows(results)),
        "",
        "## CTR-DNN by strategy",
        "",
        f"`bench_distributed.py`: {get(dist, 'lines') or 'n/a'} generated lines, {get(dist, 'epochs') or 'n/a'} "
        f"epoch(s), batch 1000; local = one process with 2 threads (local_1_threads: with 1); distributed = "
        f"{get(dist, 'servers') or 'n/a'} server(s) + 2 workers on this machine "
        f"({get(dist, 'worker_threads') or 'the default'} thread(s) each). "
        "Test AUC of the model the first worker saved, on 50,000 held-out lines; examples/s summed over workers; "
        f"means over {len(get(dist, 'seeds') or []) or 'n/a'} seed(s) of the model's initial values (the data "
        "are the same), each ratio to the same seed's local run. CPU: every process of the job (fleetrun, "
        "servers, workers), their start included, per 1,000 examples trained.",
        "",
        table(STRATEGY_HEADER, strategy_rows(results)),
        "",
        "The same with batch 1000 per thread in every strategy (`--batch_per_thread 1000`), as "
        "`dataset.set_batch_size` means in Paddle 1.x, so one script in every strategy: a sync, hybrid or "
        "collective update then averages the 2 workers' batches (2,000 examples, half as many updates), an "
        "async push is one worker's 1,000. This is how "
        "PERSIA compares hybrid with async: the same work per worker step, sync's accuracy at that global "
        "batch. Above, every update averages 1,000 examples in every strategy, so a sync or hybrid worker makes "
        "twice as many steps of half the size as an async one.",
        "",
        table(STRATEGY_HEADER, strategy_rows(results, "distributed_per_thread")),
        "",
        f"The same on {get(results, 'distributed_1m', 'lines') or 'n/a'} lines, 1 epoch (no example seen twice, "
        "so no over-fitting):",
        "",
        table(STRATEGY_HEADER, strategy_rows(results, "distributed_1m")),
        "",
        "## CTR-DNN scaling",
        "",
        f"`bench_scaling.py`: {fmt(get(sc, 'lines'))} generated lines in {get(sc, 'train_files') or 'n/a'} files, "
        f"{get(sc, 'epochs') or 'n/a'} epoch(s), batch {get(sc, 'batch_size') or 'n/a'} per update; "
        f"{get(sc, 'servers') or 'n/a'} server(s); trainers = workers x threads ({get(sc, 'layout') or 'n/a'} "
        f"layout); GEO exchanges every {get(sc, 'geo_k') or 'n/a'} steps per worker. Sync gives each thread "
        "batch / trainers examples. \"vs sync\": test AUC minus sync's at the same trainer count; \"vs local\": "
        "minus local training's with 1 thread. examples/s: each worker's own figure summed; job examples/s: all "
        "examples over the span from the first worker's pass start to the last one's end.",
        "",
        table(SCALING_HEADER, scaling_rows(results)),
        "",
        "The same with `--merge_pushes 0`: async and half-async servers average one push per worker still "
        "training into each update (`DistributeTranspilerConfig.merge_async_pushes = 0`), and each thread reads "
        "batch / pushes merged:",
        "",
        table(SCALING_HEADER, scaling_rows(results, "scaling_merged")),
        "",
        "## Async staleness alone",
        "",
        "`bench_staleness.py`: async training simulated in one process with no communication: update k "
        "applies the gradient of batch k computed on the parameters (dense layers and embedding table) as they "
        "were `lag` updates earlier; lag 0 is local training with 1 thread. Adam 1e-3 (lazy), batch "
        f"{get(results, 'staleness', 'batch_size') or 'n/a'}, seed(s) "
        f"{', '.join(str(s) for s in get(results, 'staleness', 'seeds') or []) or 'n/a'}; generated lines seen "
        "once, test AUC on 50,000 held-out lines.",
        "",
        table(("lines", "lag", "updates", "test AUC", "vs lag 0"), staleness_rows(results)),
        "",
        "An async worker's push meets the updates the other W - 1 workers applied since its parameters were "
        "pulled, and the pipeline can add up to another W: lag W - 1 to 2W - 1. bench_scaling's async runs "
        "(W workers x 1 thread, same lines) next to the simulated loss at those lags:",
        "",
        table(("workers", "async test AUC", "async vs local", "simulated, fewest lag", "simulated, most lag"),
              staleness_compare_rows(results)),
        "",
        "## Worker group all_reduce",
        "",
        "`bench_collective.py`: `fleet.transport.group.WorkerGroup.all_reduce` of float32 arrays, one process "
        "per rank on this machine; GB/s of algorithm bandwidth (array bytes / seconds per all_reduce, the "
        "slowest rank, best of the repeats). Raw ZeroMQ: a DEALER streaming the array to a ROUTER in another "
        "process with copy=False, the same run; a ring moves 2(N-1)/N of the array through each rank, hence "
        "the bound. That raw figure is one direction on an idle pair; in the ring every rank sends and receives "
        "at once and the N processes share this machine's cores, so the raw ZeroMQ ring measures the same "
        "pattern without the reduction (N processes each streaming the array to the next while receiving one), "
        "a bound that holds on this machine. MPI: mpi4py's `Allreduce` under `mpirun --oversubscribe`, the same "
        "run.",
        "",
        table(COLLECTIVE_HEADER, collective_rows(results)),
        "",
        "Microseconds per all_reduce by algorithm (the direct exchange and the ring on the same arrays), which "
        f"places `RING_MIN_BYTES` ({fmt(get(results, 'collective', 'ring_min_bytes'))} bytes):",
        "",
        table(("processes", "KiB", "direct us", "ring us"), collective_sweep_rows(results)),
        "",
        "## Production tables on an online stream",
        "",
        f"`bench_tables_online.py`: `examples/ctr_dnn/online.py` with 1 server and 1 worker (sync, 1 thread, so "
        f"runs are deterministic) on the long-tail drifting stream of `examples/ctr_dnn/generate_online_data.py`, "
        f"{fmt(get(results, 'tables_online', 'lines_per_pass'))} lines per pass, test AUC on "
        f"{fmt(get(results, 'tables_online', 'test_lines'))} held-out lines of each pass. Admission: the same "
        f"{get(results, 'tables_online', 'admission', 'passes') or 'n/a'} passes without shrink, rows of the "
        "table at the end; ProbabilityEntry: one lookup of each of many distinct ids in a table.",
        "",
        table(("entry", "rows at the end", "mean test AUC", "test AUC per pass"), admission_rows(results)),
        "",
        "Eviction: `fleet.shrink()` after every pass vs never, with Paddle's accessor defaults (a row without "
        "clicks is deleted once its decayed shows fall below 8) except delete_after_unseen_days = "
        f"{get(results, 'tables_online', 'eviction', 'delete_after_unseen_days') or 'n/a'} (a shrink per pass counts "
        "passes; the stream's values live 8 passes); rows summed over servers and the server's VmRSS after each "
        "pass's save (about 170 MiB of it is the interpreter, numba and the model):",
        "",
        table(EVICTION_HEADER, eviction_rows(results)),
        "",
        "## CTR-DNN across hosts, links capped",
        "",
        f"`bench_cluster.py`: {fmt(get(results, 'cluster', 'lines'))} generated lines, 1 epoch, batch "
        f"{get(results, 'cluster', 'batch_size') or 'n/a'}; three hosts as network namespaces joined by a "
        f"bridge ({get(results, 'cluster', 'layout') or 'n/a'}), each link capped in both directions by "
        "tc tbf. Bytes on the wire: what every host's link sent (headers, CURVE and heartbeats included) per "
        "example trained; a worker's traffic with the server on its own host stays on that host and is not "
        "counted (CTR-DNN's dense parameters are 1.7 MB: sync pushes and pulls them every step). The hosts share this machine's cores, so the uncapped runs are CPU-bound; the "
        "capped runs show how much each strategy depends on bandwidth.",
        "",
        table(CLUSTER_HEADER, cluster_rows(results)),
        "",
        "## Recovery under fleetrun --max_restarts",
        "",
        f"`bench_recovery.py`: {get(results, 'recovery', 'job') or 'n/a'}, "
        f"{fmt(get(results, 'recovery', 'lines'))} generated lines, a checkpoint every "
        f"{fmt(get(results, 'recovery', 'checkpoint_seconds'), '{:g}')} s, `--max_restarts 2`; the process gets "
        f"SIGKILL {fmt(get(results, 'recovery', 'kill_after_s'), '{:g}')} s after the first trained batch. Kill to "
        "restart: fleetrun sees the exit, waits --failure_grace (3 s) for the others and stops them; restart to "
        "first step: every process started again, the servers load the checkpoint, the workers connect and skip "
        "the batches the checkpoint holds. Batches trained again: worker 0's batches after the checkpoint, "
        f"before the kill. Load average (1 min) at the start: {fmt(get(results, 'recovery', 'load_average_1m'), '{:.1f}')}.",
        "",
        table(RECOVERY_HEADER, recovery_rows(results)),
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
    p.add_argument("--quick", action="store_true", help="smaller sizes: about 7 minutes")
    p.add_argument("--only", help="comma-separated benchmark names to run (default: all)")
    p.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark may take (default 1800)")
    p.add_argument("--keep_others", action="store_true",
                   help="with --only: keep the other benchmarks' results from the existing --out file "
                        "(each keeps the date of the run that measured it)")
    p.add_argument("--report_only", action="store_true",
                   help="run nothing: write --out again from the raw results it holds (after a change "
                        "of this report's layout)")
    args = p.parse_args(argv)
    if args.keep_others and not args.only:
        p.error("--keep_others needs --only (the benchmarks to run again)")
    started = datetime.datetime.now(datetime.timezone.utc)
    if args.report_only:
        results = kept_results(args.out)
        dates = sorted(d for d in {v.get("measured_at") for v in results.values()} if d and d[:1].isdigit())
        if dates:  # the header names the newest run's date and what it measured
            started = datetime.datetime.strptime(dates[-1], "%Y-%m-%d %H:%M")
        write_report(args.out, results, args, started)
        print(f"run_all: wrote {args.out} from its raw results")
        return
    results = kept_results(args.out) if args.keep_others else {}
    wanted = set(args.only.split(",")) if args.only else None
    for name, argv_ in benchmarks(args.quick):
        if wanted is not None and name not in wanted:
            continue
        print(f"run_all: {name}: {' '.join(argv_)}", flush=True)
        results[name] = run_one(argv_, args.timeout)
        results[name]["measured_at"] = f"{started:%Y-%m-%d %H:%M}"
        print(json.dumps({"name": name, **results[name]}), flush=True)
    write_report(args.out, results, args, started)
    print(f"run_all: wrote {args.out}")
    failed = [k for k, v in results.items() if "error" in v]
    if failed:
        raise SystemExit(f"run_all: {', '.join(failed)} failed; see {args.out}")


if __name__ == "__main__":
    main()
