"""Recovery of a CTR-DNN job under ``fleetrun --max_restarts``: kill -9 of a server, then of
a worker, mid-training; how long until the job trains again, and what was trained twice.

The job: the CTR-DNN example, 2 servers x 2 workers on this machine, ``--strategy sync
--threads 1`` (deterministic; ``--strategy async`` for the asynchronous job), checkpointing every ``--checkpoint_seconds`` (default 5)
with ``--max_restarts 2``. For each role, ``--kill_after`` seconds (default: half the
undisturbed run's time, at least 1.5 checkpoint intervals) after the first
trained batch (and once a checkpoint exists) the process (server 0 or worker 1) gets
SIGKILL. Measured from this process, polling the logs every 10 ms:

- ``recovery_s``: from the kill to the first batch trained after the restart (the first
  ``batch N`` line of the new worker 0 log; ``--print_period 1``), split into
  ``to_restart_s`` (kill to fleetrun's restart decision, LOG_DIR/restarts.log: the
  failure seen, --failure_grace, the others stopped) and ``restart_to_training_s``
  (processes started, servers loading the checkpoint, workers connecting, skipping the
  batches trained before it, the first step);
- ``redone_batches`` / ``redone_examples``: batches worker 0 had trained when the job
  failed minus those the checkpoint held (its last ``batch N`` line before the kill and
  the resumed pass's ``resuming the epoch after the K batches``), examples: that times
  the per-thread batch times 2 workers; at most one checkpoint interval of training;
- ``test_auc`` of the final model and its difference from an undisturbed run of the
  same job (``auc_minus_undisturbed``; sync resumes exactly, so 0 is expected; with
  ``--undisturbed_runs N`` the mean of N runs, and each run's AUC is listed).

Prints one JSON line. The machine's load shifts every time: run it on an idle machine.

    python benchmarks/bench_recovery.py [--lines 200000] [--checkpoint_seconds 5] [--kill_after S]
        [--strategy sync|async]
"""
import argparse
import calendar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from _jobs import EXAMPLE, RunFailed, child_env, generate_data, rounded, run, say

GOAL_S = 20.0
_BATCH = re.compile(r"^batch (\d+),", re.M)
_RESUMED = re.compile(r"resuming the epoch after the (\d+) batches")
_THREAD_BATCH = re.compile(r"each thread reads batch (\d+)")


def _train_args(args, data, model, extra=()):
    return ["train.py", "--data_dir", data, "--model_dir", model, "--strategy", args.strategy, "--threads", "1",
            "--epochs", "1", "--batch_size", str(args.batch_size), "--sparse_feature_dim", "100001", *extra]


def test_auc(name, model_dir, data, timeout=600):
    """Test AUC (infer.py) of a saved model of this benchmark's table size."""
    out, _, _ = run(f"{name} (infer.py)", [sys.executable, "infer.py", "--model_dir", model_dir, "--data_dir", data,
                                           "--sparse_feature_dim", "100001"], timeout)
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])["auc"]


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _job_pid(log_dir, role, index):
    """The pid of the job's server ``index`` or worker ``index`` (found by the
    FLEET_RESTART_STATE_DIR fleetrun gives the processes of this log directory)."""
    state = f"FLEET_RESTART_STATE_DIR={os.path.abspath(log_dir)}/.restart".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if b"=".join((b"FLEET_RESTART_STATE_DIR", env.get(b"FLEET_RESTART_STATE_DIR", b""))) != state:
            continue
        if role == "worker" and env.get(b"PADDLE_TRAINER_ID") == str(index).encode():
            return int(pid)
        if role == "server" and env.get(b"TRAINING_ROLE") == b"PSERVER":
            me = f"{env[b'POD_IP'].decode()}:{env[b'PADDLE_PORT'].decode()}"
            if env[b"PADDLE_PSERVERS_IP_PORT_LIST"].decode().split(",").index(me) == index:
                return int(pid)
    return None


def _wait(predicate, timeout, what, proc):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise RunFailed(f"fleetrun ended (exit {proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise RunFailed(f"no {what} within {timeout:g} s")
        time.sleep(0.01)


def measure(args, work, data, role, index):
    """Kill -9 ``role index`` of a job mid-training; returns its recovery figures."""
    model, log, ckpt = (os.path.join(work, role, d) for d in ("model", "log", "ckpt"))
    cmd = [sys.executable, "-m", "fleet.launch", "--server_num", "2", "--worker_num", "2", "--max_restarts", "2",
           "--log_dir", log, *_train_args(args, data, model, ["--print_period", "1", "--checkpoint_dir", ckpt,
                                                              "--checkpoint_seconds", str(args.checkpoint_seconds)])]
    proc = subprocess.Popen(cmd, cwd=EXAMPLE, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        worker0 = os.path.join(log, "workerlog.0")
        _wait(lambda: _BATCH.search(_read(worker0)), 300, "first trained batch", proc)
        first = time.monotonic()
        _wait(lambda: time.monotonic() - first >= args.kill_after and os.path.isdir(ckpt)
              and any(n.startswith("ckpt-") for n in os.listdir(ckpt)), 300, "checkpoint", proc)
        pid = _job_pid(log, role, index)
        if pid is None:
            raise RunFailed(f"{role} {index} of the job not found")
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        again = os.path.join(log, "attempt-0")
        _wait(lambda: os.path.isdir(again) and _BATCH.search(_read(worker0)), 300, "batch after the restart", proc)
        training_again = time.time()
        _, err = proc.communicate(timeout=args.timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise RunFailed(f"{role} {index} killed: fleetrun exit {proc.returncode}: {err[-3000:]}")
    events = _read(os.path.join(log, "restarts.log")).splitlines()
    stamp = time.strptime(events[0].split(".", 1)[0], "%Y-%m-%dT%H:%M:%S")  # UTC
    restart_at = calendar.timegm(stamp) + int(events[0].split(".", 1)[1][:3]) / 1000.0
    before = [int(n) for n in _BATCH.findall(_read(os.path.join(log, "attempt-0", "workerlog.0")))]
    resumed_log = _read(worker0)
    resumed = _RESUMED.search(resumed_log)
    said = _THREAD_BATCH.search(resumed_log)  # train.py says so when it is not --batch_size (sync)
    thread_batch = int(said.group(1)) if said else args.batch_size
    redone = before[-1] - int(resumed.group(1)) if before and resumed else None
    auc = test_auc(f"{role} killed", os.path.join(model, "epoch_0"), data)
    return {"pid_killed": pid, "recovery_s": training_again - killed, "to_restart_s": restart_at - killed,
            "restart_to_training_s": training_again - restart_at,
            "batches_before_kill": before[-1] if before else None,
            "resumed_after_batches": int(resumed.group(1)) if resumed else None,
            "redone_batches": redone, "redone_examples": None if redone is None else redone * thread_batch * 2,
            "restart_logged": events[0].split(" ", 1)[1], "test_auc": auc}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=200_000, help="generated train lines (default 200000)")
    p.add_argument("--batch_size", type=int, default=1000)
    p.add_argument("--checkpoint_seconds", type=float, default=5.0)
    p.add_argument("--kill_after", type=float, default=None,
                   help="seconds of training before the kill (default: half the undisturbed run's time, and "
                        "at least 1.5 checkpoint intervals, so the kill falls mid-training on a fast or a "
                        "busy machine)")
    p.add_argument("--strategy", default="sync", choices=["sync", "async"],
                   help="sync (default: resumes exactly) or async (each worker resumes at its own recorded "
                        "place; runs differ by timing, so the AUC difference includes run-to-run noise)")
    p.add_argument("--undisturbed_runs", type=int, default=1,
                   help="undisturbed runs to compare with (their mean; more than one shows async's run-to-run "
                        "spread)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one job may take")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench-recovery-")
    try:
        data = os.path.join(work, "data")
        generate_data(data, args.lines)
        references = []
        durations = []
        for n in range(args.undisturbed_runs):
            say(f"undisturbed run {n + 1}")
            started = time.monotonic()
            reference_model = os.path.join(work, f"undisturbed-{n}")
            run("undisturbed", [sys.executable, "-m", "fleet.launch", "--server_num", "2", "--worker_num", "2",
                                "--log_dir", os.path.join(reference_model, "log"),
                                *_train_args(args, data, reference_model, ["--print_period", "0"])], args.timeout)
            durations.append(time.monotonic() - started)
            references.append(test_auc("undisturbed", os.path.join(reference_model, "epoch_0"), data))
        if args.kill_after is None:
            args.kill_after = max(1.5 * args.checkpoint_seconds, 0.5 * min(durations))
            if args.kill_after > 0.8 * min(durations):
                raise RunFailed(f"the undisturbed job took {min(durations):.1f} s, too short to be killed mid-training "
                                f"after a checkpoint every {args.checkpoint_seconds:g} s: give more --lines")
        reference = sum(references) / len(references)
        result = {"job": f"CTR-DNN {args.strategy}, 2 servers x 2 workers, 1 thread each, 1 epoch", "lines": args.lines,
                  "batch_size": args.batch_size, "checkpoint_seconds": args.checkpoint_seconds,
                  "kill_after_s": round(args.kill_after, 1), "undisturbed_seconds": [round(d, 1) for d in durations],
                  "undisturbed_test_auc": round(reference, 4),
                  "undisturbed_test_aucs": [round(a, 4) for a in references],
                  "goal_recovery_s": GOAL_S, "load_average_1m": round(os.getloadavg()[0], 2)}
        for role, index in (("server", 0), ("worker", 1)):
            say(f"kill -9 of {role} {index}")
            figures = measure(args, work, data, role, index)
            figures["auc_minus_undisturbed"] = figures["test_auc"] - reference
            result[role] = rounded({k: v for k, v in figures.items() if k != "restart_logged"}, 4)
            result[role].update(met=figures["recovery_s"] < GOAL_S, restart_logged=figures["restart_logged"])
        result["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(result), flush=True)
    except RunFailed as e:
        say(str(e))
        sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
