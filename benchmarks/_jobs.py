"""What bench_distributed.py and bench_scaling.py share: running the CTR-DNN example as
local training or as a fleetrun job, and reading its speed, test AUC and CPU time.

Not a benchmark (no ``bench_`` prefix): a helper module imported from the benchmarks
directory.

Figures of one training run (:func:`train_local`, :func:`train_fleet`):

- ``examples_per_sec``: each worker's own ``train_from_dataset`` figure (the mean over its
  epochs), summed over workers.
- ``job_examples_per_sec``: every worker's examples over the wall-clock time from the first
  worker's pass start to the last worker's pass end (summed over epochs; ``train.py``
  prints each pass's span). Workers that start at different moments (8 processes starting
  on 2 cores) make the sum of their own rates larger than what the job achieved; this one
  does not.
- ``cpu_seconds``: user + system CPU of every process of the run: the training process, or
  fleetrun with every server and worker it started. Measured as the change of
  ``getrusage(RUSAGE_CHILDREN)`` of this process around the ``subprocess.run`` that starts
  the run. The kernel adds a process's CPU time (and that of the descendants it waited for)
  to its parent's children totals when the parent waits for it; fleetrun waits for every
  process it starts (one waiting thread per process, also for those it terminates), and
  this process waits for fleetrun, so the change holds the whole job. It holds nothing
  else because runs are started one at a time from one thread. A process fleetrun could not
  reap (it says "may outlive fleetrun") would be missing, so such a run is an error.
- ``cpu_s_per_1k_examples``: ``cpu_seconds`` per 1,000 examples trained (all workers, all
  epochs). Includes each process's start (interpreter, imports, loading numba's cache).
"""
import contextlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "ctr_dnn")
TEST_LINES = 50_000
# fleetrun's own --timeout is this much shorter than the run's (at most a tenth of it), so
# fleetrun stops its processes itself (and says so) before the run's timeout kills fleetrun.
_FLEETRUN_MARGIN_S = 30

_EPOCH_LINE = re.compile(r"epoch (\d+): (\d+) examples, ([\d,.]+) examples/s.*?"
                         r"(?:, pass ([\d.]+)-([\d.]+) \(Unix time\))?$", re.M)
_PASS_LINE = re.compile(r"pass done: (\d+) examples in (\d+) batches")
_THREAD_BATCH_LINE = re.compile(r"\w+: each thread reads batch (\d+) of the (\d+) examples")


class RunFailed(Exception):
    """A run failed or timed out; the message names it."""


def child_env():
    """This environment without role variables (a leftover TRAINING_ROLE would turn local
    training into a worker), with this checkout first on PYTHONPATH so the runs measure
    the fleet the benchmark belongs to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(name, cmd, timeout, cwd=EXAMPLE):
    """Runs cmd to completion; returns (stdout + stderr, CPU seconds of it and every
    descendant it waited for, wall seconds).

    Raises:
        RunFailed: non-zero exit or more than ``timeout`` seconds; names the run.
    """
    cpu0, t0 = children_cpu_seconds(), time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RunFailed(f"{name}: did not finish within {timeout:g} s (--timeout): {' '.join(cmd)}") from e
    cpu, wall = children_cpu_seconds() - cpu0, time.perf_counter() - t0
    if proc.returncode != 0:
        raise RunFailed(f"{name}: exit {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-3000:]}\n"
                        f"{proc.stdout[-2000:]}")
    return proc.stdout + proc.stderr, cpu, wall


def generate_data(out_dir, lines, train_files=4, timeout=600):
    """The example's data (generator seed fixed): ``lines`` train lines in ``train_files``
    files, TEST_LINES test lines."""
    run("generate_data", [sys.executable, "generate_data.py", "--out_dir", out_dir, "--train_lines", str(lines),
                          "--test_lines", str(TEST_LINES), "--train_files", str(train_files)], timeout)


def parse_epochs(text):
    """[{"epoch", "examples", "rate", "start", "end"}] of one process's log ("start" and
    "end" are None for a train.py that does not print the pass's span)."""
    out = []
    for m in _EPOCH_LINE.finditer(text):
        out.append({"epoch": int(m[1]), "examples": int(m[2]), "rate": float(m[3].replace(",", "")),
                    "start": float(m[4]) if m[4] else None, "end": float(m[5]) if m[5] else None})
    return out


def summarize(name, logs, cpu_seconds, wall_seconds):
    """The figures of a run from its processes' logs (one per worker)."""
    epochs = [parse_epochs(text) for text in logs]
    if not all(epochs):
        missing = [i for i, e in enumerate(epochs) if not e]
        raise RunFailed(f"{name}: no 'epoch N: ... examples/s' line in the log of worker(s) {missing}")
    examples = sum(e["examples"] for per in epochs for e in per)
    speed = sum(sum(e["rate"] for e in per) / len(per) for per in epochs)
    spans = []
    for k in range(min(len(per) for per in epochs)):
        starts = [per[k]["start"] for per in epochs]
        ends = [per[k]["end"] for per in epochs]
        if None in starts or None in ends:
            spans = []
            break
        spans.append(max(ends) - min(starts))
    job_speed = examples / sum(spans) if spans and sum(spans) > 0 else None
    return {"examples": examples, "examples_per_sec": speed, "job_examples_per_sec": job_speed,
            "cpu_seconds": cpu_seconds, "cpu_s_per_1k_examples": 1000.0 * cpu_seconds / max(examples, 1),
            "seconds": wall_seconds}


def train_local(name, model_dir, data, threads, train_args=(), timeout=1800):
    """One ``train.py`` process (local training); its figures (see the module's doc)."""
    out, cpu, wall = run(name, [sys.executable, "train.py", "--model_dir", model_dir, "--data_dir", data,
                                "--threads", str(threads), *train_args], timeout)
    result = summarize(name, [out], cpu, wall)
    result["log"] = out
    return result


def train_fleet(name, model_dir, data, strategy, servers, workers, threads=None, train_args=(), timeout=1800):
    """``fleetrun`` with ``servers`` servers and ``workers`` workers (``threads`` training
    threads each; None: train.py's default; the "collective" strategy starts no servers:
    ``fleetrun --collective``); its figures (see the module's doc) and "logs", the
    workers' logs."""
    log_dir = os.path.join(model_dir, "log")
    roles = ["--collective"] if strategy == "collective" else ["--server_num", str(servers)]
    cmd = [sys.executable, "-m", "fleet.launch", *roles, "--worker_num", str(workers),
           "--log_dir", log_dir, "--timeout", str(timeout - min(_FLEETRUN_MARGIN_S, timeout / 10)),
           "train.py", "--model_dir", model_dir, "--data_dir", data, "--strategy", strategy,
           *([] if threads is None else ["--threads", str(threads)]), *train_args]
    out, cpu, wall = run(name, cmd, timeout)
    if "may outlive fleetrun" in out:
        raise RunFailed(f"{name}: fleetrun could not reap a process, so its CPU time is not counted:\n{out[-2000:]}")
    logs = []
    for i in range(workers):
        with open(os.path.join(log_dir, f"workerlog.{i}"), errors="replace") as f:
            logs.append(f.read())
    result = summarize(name, logs, cpu, wall)
    result["logs"] = logs
    return result


def passes(log):
    """[(examples, batches)] of the "pass done" lines of a log (printed when --print_period
    is not 0)."""
    return [(int(m[1]), int(m[2])) for m in _PASS_LINE.finditer(log)]


def geo_exchanges(log, k):
    """GEO exchanges of one worker, from its batches (one step each): after 1, 2, 4, ...
    steps, doubling up to k, then every k steps, plus one at the end of a pass for the steps
    left (the end-of-pass flush). None when the log has no "pass done" line."""
    got = passes(log)
    if not got:
        return None
    exchanges, interval = 0, 1
    for _, batches in got:
        since = 0
        for _ in range(batches):
            since += 1
            if since >= interval:
                exchanges, since, interval = exchanges + 1, 0, min(k, 2 * interval)
        exchanges += since > 0
    return exchanges


def thread_batch(log):
    """The per-thread batch a worker reports when it is not --batch_size (train.py's
    thread_batch_size), or None."""
    m = _THREAD_BATCH_LINE.search(log)
    return int(m[1]) if m else None


def test_auc(name, model_dir, data, timeout=600):
    """Test AUC (infer.py, TEST_LINES lines) of a saved model."""
    out, _, _ = run(f"{name} (infer.py)", [sys.executable, "infer.py", "--model_dir", model_dir,
                                           "--data_dir", data], timeout)
    # the output is stdout then stderr (which holds log lines): take infer.py's JSON line
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])["auc"]


def warm_up(work, strategies, timeout=600):
    """Trains every configuration once on a few lines, so numba has compiled (and cached)
    every kernel before anything is timed; a changed fleet/kernels otherwise compiles
    during the first timed run."""
    data = os.path.join(work, "warmup-data")
    run("warm-up generate_data", [sys.executable, "generate_data.py", "--out_dir", data, "--train_lines", "2000",
                                  "--test_lines", "1000", "--train_files", "2"], timeout)
    args = ["--epochs", "1", "--print_period", "0", "--batch_size", "100"]
    train_local("warm-up local", os.path.join(work, "warmup-local"), data, 2, args, timeout)
    test_auc("warm-up local", os.path.join(work, "warmup-local", "epoch_0"), data, timeout)
    for strategy in strategies:
        train_fleet(f"warm-up {strategy}", os.path.join(work, f"warmup-{strategy}"), data, strategy, 1, 2, 1,
                    [*args, "--geo_k", "5"], timeout)


def spread(values):
    """{"min", "max", "std"} of a list (std: the sample standard deviation; None for one value)."""
    return {"min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else None}


def rounded(value, digits):
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return round(value, digits) if digits else round(value)


def say(message):
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def work_directory(bench, keep=False):
    """A temporary directory for a bench's data, models and logs (they reach gigabytes), removed
    when the bench ends, also on failure or Ctrl-C, unless ``keep`` (the bench's --keep)."""
    work = tempfile.mkdtemp(prefix=f"fleet-{bench}-")
    say(f"{bench}: work directory {work}" + (" (kept: --keep)" if keep else " (removed at the end; --keep keeps it)"))
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
