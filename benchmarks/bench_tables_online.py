"""Production sparse tables on an online stream: admission and eviction figures.

    python benchmarks/bench_tables_online.py [--quick]

Trains ``examples/ctr_dnn/online.py`` as a job of 1 server and 1 worker (fleetrun; sync
strategy, 1 thread: the runs are deterministic, so two configurations differ only by what
they configure) on the long-tail drifting stream of ``generate_online_data.py``, and prints
one JSON line:

- ``admission``: the same stream (``--admission_passes`` passes) trained with
  ``--entry count:2`` and with ``--entry none`` (no shrink, so rows only come and never
  go): rows of the table at the end (the server's, summed over servers), and the test AUC
  of each pass (held-out lines of the pass). Goals: CountFilterEntry(2) keeps >= 30% fewer
  rows; its mean test AUC over the passes is at most 0.002 below no entry's.
- ``probability``: ``fleet.tables.SparseTable`` with ``ProbabilityEntry(p)``: one training
  lookup of each of ``--probability_ids`` distinct ids, the fraction of rows created, and
  its distance from p in standard deviations of a binomial (goal: within 3).
- ``eviction``: ``--eviction_passes`` passes trained with ``fleet.shrink()`` after every pass
  and without shrink (both with delete_after_unseen_days = ``--delete_after_unseen_passes``,
  8: with a shrink per pass unseen_days counts passes, and the stream's values live 8): per pass, rows, the server's resident memory (its VmRSS, as the
  server reported it just after the pass's save) and test AUC. Goals: with shrink the rows of the last
  half of the run grow by at most 10% of the no-shrink growth (they level off), without it
  they grow linearly (the per-pass growth of the last half is at least half that of the
  first half); each pass's test AUC with shrink is at most 0.002 below without.

Each run's processes, logs and saves are in a temporary directory (``--keep`` keeps it).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from _jobs import EXAMPLE, RunFailed, child_env

FLEETRUN = (sys.executable, "-m", "fleet.launch")


def generate(out_dir, passes, passes_per_day, lines, test_lines, timeout=600):
    """The stream: ``passes`` passes of ``lines`` lines (whole days of ``passes_per_day``)."""
    days = -(-passes // passes_per_day)
    cmd = [sys.executable, "generate_online_data.py", "--out_dir", out_dir, "--days", str(days),
           "--passes_per_day", str(passes_per_day), "--lines_per_pass", str(lines),
           "--test_lines", str(test_lines), "--files_per_pass", "2"]
    proc = subprocess.run(cmd, cwd=EXAMPLE, env=child_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RunFailed(f"generate_online_data.py: exit {proc.returncode}: {proc.stderr[-2000:]}")


def run_online(name, work, data, passes, passes_per_day, online_args, timeout):
    """One online.py job (1 server, 1 worker); returns its per-pass records (online.jsonl's
    "done" events: rows, rss_bytes and table_bytes summed over the servers, test_auc ...).

    Raises:
        RunFailed: the job failed or ran out of time (names it, with the end of its output).
    """
    model_dir = os.path.join(work, name)
    cmd = [*FLEETRUN, "--server_num", "1", "--worker_num", "1", "--log_dir", os.path.join(work, name + "-log"),
           "online.py", "--data_dir", data, "--model_dir", model_dir,
           "--days", str(-(-passes // passes_per_day)), "--passes_per_day", str(passes_per_day),
           "--strategy", "sync", "--threads", "1", "--wait_timeout", "60", *online_args]
    try:
        proc = subprocess.run(cmd, cwd=EXAMPLE, env=child_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RunFailed(f"{name}: did not finish within {timeout:g} s (--timeout): {' '.join(cmd)}") from e
    records = []
    events = os.path.join(model_dir, "online.jsonl")
    if os.path.exists(events):
        with open(events) as f:
            records = [r for r in map(json.loads, f) if r.get("event") == "done"]
    if proc.returncode != 0 or len(records) < passes:
        raise RunFailed(f"{name}: exit {proc.returncode}, {len(records)} of {passes} passes: {' '.join(cmd)}\n"
                        f"{(proc.stdout + proc.stderr)[-3000:]}")
    return records[:passes]


def table_total(record):
    return int(sum((record.get("rows") or {}).values()))


def admission(work, data, args):
    passes = args.admission_passes
    runs = {}
    for name, entry in (("count_2", "count:2"), ("none", "none")):
        runs[name] = run_online(f"admission-{name}", work, data, passes, args.passes_per_day,
                                ["--entry", entry, "--shrink", "never"], args.timeout)
    rows = {k: table_total(v[-1]) for k, v in runs.items()}
    aucs = {k: [r["test_auc"] for r in v] for k, v in runs.items()}
    mean_auc = {k: float(np.mean(v)) for k, v in aucs.items()}
    fewer = 1 - rows["count_2"] / rows["none"] if rows["none"] else None
    return {"passes": passes, "rows": rows, "rows_fewer_fraction": fewer, "test_auc_per_pass": aucs,
            "mean_test_auc": mean_auc, "auc_count_2_minus_none": mean_auc["count_2"] - mean_auc["none"],
            "seconds": {k: round(sum(r["seconds"] for r in v), 1) for k, v in runs.items()}}


def probability(ps, n, seed=7):
    """Created fraction of ``n`` distinct ids, each looked up once, under ProbabilityEntry(p)."""
    import fleet
    from fleet.rules import SGDRule
    from fleet.tables import SparseTable

    out = []
    for p in ps:
        table = SparseTable("t", 4, SGDRule(), ("constant", 0.0), seed=seed,
                            entry=fleet.ProbabilityEntry(p))
        ids = np.arange(1, n + 1, dtype=np.int64) * 7919
        table.pull_train(ids)
        created = len(table)
        sigma = math.sqrt(p * (1 - p) / n) if p < 1 else 0.0
        fraction = created / n
        out.append({"p": p, "ids": n, "created": created, "fraction": fraction, "sigma": sigma,
                    "sigmas_off": (fraction - p) / sigma if sigma else 0.0})
    return out


def eviction(work, data, args):
    passes = args.eviction_passes
    # a shrink per pass makes unseen_days count passes: rows unseen for more than 8 of them
    # (the stream's values live 8 passes) are deleted, as Paddle's 30 days are for daily shrinks
    runs = {name: run_online(f"eviction-{name}", work, data, passes, args.passes_per_day,
                             ["--entry", "none", "--shrink", shrink, "--delete_after_unseen_days",
                              str(args.delete_after_unseen_passes)], args.timeout)
            for name, shrink in (("shrink", "pass"), ("no_shrink", "never"))}
    per_pass = {k: [{"pass": r["name"], "rows": table_total(r), "server_rss_mib": round(r["rss_bytes"] / 2**20, 1),
                     "table_mib": round(r["table_bytes"] / 2**20, 2),
                     "test_auc": r["test_auc"], "deleted": r.get("deleted")} for r in v] for k, v in runs.items()}
    return {"passes": passes, "delete_after_unseen_days": args.delete_after_unseen_passes, "per_pass": per_pass,
            **growth_figures(per_pass)}


def growth_figures(per_pass):
    """Rows growth per pass in the first and last half of each run, and the AUC gap."""
    out = {}
    for k, v in per_pass.items():
        rows = [r["rows"] for r in v]
        h = len(rows) // 2
        out[f"{k}_rows_growth_first_half"] = (rows[h - 1] - rows[0]) / max(h - 1, 1)
        out[f"{k}_rows_growth_last_half"] = (rows[-1] - rows[h]) / max(len(rows) - h - 1, 1)
        rss = [r["server_rss_mib"] for r in v]
        out[f"{k}_rss_mib_first_last"] = [rss[0], rss[h], rss[-1]]
    gaps = [b["test_auc"] - a["test_auc"] for a, b in zip(per_pass["shrink"], per_pass["no_shrink"])]
    out["auc_no_shrink_minus_shrink_max"] = max(gaps)
    out["auc_no_shrink_minus_shrink_mean"] = float(np.mean(gaps))
    return out


def checks(result):
    a, p, e = result.get("admission") or {}, result.get("probability") or [], result.get("eviction") or {}
    out = []
    if a:
        out.append({"figure": "CountFilterEntry(2) rows vs no entry (fewer)", "goal": ">= 30% fewer",
                    "value": a["rows_fewer_fraction"], "met": a["rows_fewer_fraction"] >= 0.30})
        out.append({"figure": "CountFilterEntry(2) mean test AUC minus no entry's", "goal": ">= -0.002",
                    "value": a["auc_count_2_minus_none"], "met": a["auc_count_2_minus_none"] >= -0.002})
    for x in p:
        out.append({"figure": f"ProbabilityEntry({x['p']}) created fraction, sigmas from p", "goal": "within 3",
                    "value": x["sigmas_off"], "met": abs(x["sigmas_off"]) <= 3})
    if e:
        level = e["shrink_rows_growth_last_half"] / max(e["no_shrink_rows_growth_last_half"], 1)
        linear = e["no_shrink_rows_growth_last_half"] / max(e["no_shrink_rows_growth_first_half"], 1)
        out.append({"figure": "rows growth per pass with shrink / without, last half", "goal": "<= 0.10",
                    "value": level, "met": level <= 0.10})
        out.append({"figure": "rows growth per pass without shrink, last half / first half", "goal": ">= 0.5",
                    "value": linear, "met": linear >= 0.5})
        out.append({"figure": "test AUC per pass, without shrink minus with (worst pass)", "goal": "<= 0.002",
                    "value": e["auc_no_shrink_minus_shrink_max"], "met": e["auc_no_shrink_minus_shrink_max"] <= 0.002})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer and smaller passes")
    p.add_argument("--lines_per_pass", type=int, default=40_000)
    p.add_argument("--test_lines", type=int, default=10_000)
    p.add_argument("--passes_per_day", type=int, default=4)
    p.add_argument("--admission_passes", type=int, default=8)
    p.add_argument("--eviction_passes", type=int, default=20)
    p.add_argument("--delete_after_unseen_passes", type=int, default=8,
                   help="eviction: the accessor's delete_after_unseen_days, in passes (one shrink per pass)")
    p.add_argument("--probabilities", default="0.1,0.5,0.9")
    p.add_argument("--probability_ids", type=int, default=200_000)
    p.add_argument("--only", default="admission,probability,eviction")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one training run may take")
    p.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    args = p.parse_args(argv)
    if args.quick:
        args.lines_per_pass, args.test_lines = 8_000, 2_000
        args.admission_passes, args.eviction_passes, args.probability_ids = 4, 12, 50_000
    work = tempfile.mkdtemp(prefix="bench_tables_online-")
    started = time.time()
    result = {"bench": "tables_online", "lines_per_pass": args.lines_per_pass, "test_lines": args.test_lines,
              "passes_per_day": args.passes_per_day, "servers": 1, "workers": 1, "strategy": "sync"}
    try:
        wanted = set(args.only.split(","))
        data = os.path.join(work, "data")
        if wanted & {"admission", "eviction"}:
            generate(data, max(args.admission_passes, args.eviction_passes), args.passes_per_day,
                     args.lines_per_pass, args.test_lines)
        if "probability" in wanted:
            result["probability"] = probability([float(x) for x in args.probabilities.split(",")],
                                                args.probability_ids)
        if "admission" in wanted:
            result["admission"] = admission(work, data, args)
        if "eviction" in wanted:
            result["eviction"] = eviction(work, data, args)
    except RunFailed as e:
        result["error"] = str(e)
    finally:
        if args.keep:
            result["work_dir"] = work
        else:
            shutil.rmtree(work, ignore_errors=True)
    result["checks"] = checks(result)
    result["seconds"] = round(time.time() - started, 1)
    print(json.dumps(result))
    if "error" in result:
        sys.exit(1)


if __name__ == "__main__":
    main()
