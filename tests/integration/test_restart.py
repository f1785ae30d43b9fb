"""fleetrun --max_restarts: a job that loses a process restarts from its newest checkpoint
and ends as an undisturbed run would; the messages of a job that cannot restart.

The CTR-DNN jobs are sync with one thread and one reader per worker, so a resumed job
trains exactly the batches an undisturbed one does after the checkpoint, and the test
AUC is compared with the undisturbed run's (bound 0.005).
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn")
FLEETRUN = (sys.executable, "-m", "fleet.launch")
CTR = ("--epochs", "1", "--strategy", "sync", "--threads", "1", "--print_period", "0",
       "--sparse_feature_dim", "100001", "--batch_size", "500")
AUC_BOUND = 0.005

pytestmark = pytest.mark.slow


def _clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_", "FLEET_RESTART"))}


def _run(args, cwd=EXAMPLE, timeout=120):
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return proc.stdout


def _test_auc(model_dir, data):
    out = _run(["infer.py", "--model_dir", str(model_dir / "epoch_0"), "--data_dir", str(data),
                "--sparse_feature_dim", "100001"])
    return json.loads(out.strip().splitlines()[-1])["auc"]


def job_process(log_dir, role, index):
    """The pid of a running process of the fleetrun job writing to log_dir (found by the
    FLEET_RESTART_STATE_DIR fleetrun gives it), or None."""
    state = f"FLEET_RESTART_STATE_DIR={os.path.abspath(log_dir)}/.restart".encode()
    want = b"TRAINING_ROLE=PSERVER" if role == "server" else f"PADDLE_TRAINER_ID={index}".encode()
    servers = None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if state not in env or want not in env:
            continue
        if role == "worker":
            return int(pid)
        values = dict(e.split(b"=", 1) for e in env if b"=" in e)
        servers = servers or values[b"PADDLE_PSERVERS_IP_PORT_LIST"].decode().split(",")
        if servers.index(f"{values[b'POD_IP'].decode()}:{values[b'PADDLE_PORT'].decode()}") == index:
            return int(pid)
    return None


@pytest.fixture(scope="module")
def ctr_data(tmp_path_factory):
    """Generated data and the test AUC of an undisturbed 2-server x 2-worker sync run."""
    work = tmp_path_factory.mktemp("restart")
    data = work / "data"
    _run(["generate_data.py", "--out_dir", str(data), "--train_lines", "40000", "--test_lines", "10000"])
    _run([*FLEETRUN[1:], "--server_num", "2", "--worker_num", "2", "--log_dir", str(work / "ref" / "log"),
          "train.py", "--data_dir", str(data), "--model_dir", str(work / "ref"), *CTR])
    return data, _test_auc(work / "ref", data)


def _kill_mid_training(procs, tmp_path, data, role, index):
    """Run the CTR job under --max_restarts 2 checkpointing every 10 steps; once the
    second checkpoint exists, kill -9 the process. Returns (fleetrun's stderr, model dir)."""
    model, log = tmp_path / "model", tmp_path / "log"
    launcher = procs.start([*FLEETRUN, "--server_num", "2", "--worker_num", "2", "--max_restarts", "2", "--failure_grace", "0",
                            "--log_dir", str(log), "train.py", "--data_dir", str(data), "--model_dir", str(model),
                            *CTR, "--checkpoint_dir", str(tmp_path / "ckpt"), "--checkpoint_steps", "10"],
                           cwd=EXAMPLE, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ckpt" / "ckpt-20").is_dir():
        assert launcher.poll() is None and time.monotonic() < deadline, "the job wrote no second checkpoint"
        time.sleep(0.05)
    pid = job_process(log, role, index)
    assert pid is not None, f"{role} {index} not found"
    os.kill(pid, signal.SIGKILL)
    out, err = procs.communicate(launcher, 120)
    assert launcher.returncode == 0, err[-4000:]
    return err, model, log, pid


@pytest.mark.parametrize("role,index", [("server", 0), ("worker", 1)])
def test_a_killed_process_restarts_the_job_from_its_checkpoint_to_the_undisturbed_auc(
        procs, tmp_path, ctr_data, role, index):
    data, reference_auc = ctr_data
    err, model, log, pid = _kill_mid_training(procs, tmp_path, data, role, index)
    cause = f"{role} {index} (pid {pid}) on host "
    assert re.search(rf"fleetrun: restart 1 of 2 \(--max_restarts 2\): {re.escape(cause)}\S+ was killed by "
                     rf"SIGKILL[^\n]*; every process was stopped and starts again with FLEET_RESTART_COUNT=1, "
                     rf"resuming from the newest checkpoint: \S+/ckpt/ckpt-\d+\n", err), err[-3000:]
    assert re.search(rf"fleetrun: done after 1 restart; 1 failure, in order:\n    1\. attempt 0: "
                     rf"{re.escape(cause)}", err), err[-2000:]
    events = (log / "restarts.log").read_text().splitlines()
    assert len(events) == 2 and f"restart 1 of 2: {cause}" in events[0] and "done after 1 restart" in events[1]
    # the first attempt's logs were kept; the second one resumed inside the epoch, skipping what it had trained
    assert (log / "attempt-0" / "workerlog.0").is_file()
    resumed = (log / "workerlog.1").read_text()
    skipped = re.search(r"worker 1 of 2: resuming the epoch after the (\d+) batches trained before the checkpoint",
                        resumed)
    assert skipped and int(skipped.group(1)) >= 20, resumed[-2000:]
    auc = _test_auc(model, data)
    assert abs(auc - reference_auc) < AUC_BOUND, (auc, reference_auc)


SCRIPT = textwrap.dedent('''\
    import os, sys, time
    import fleet
    if sys.argv[1] == "checkpoints":
        fleet.CheckpointConfig(sys.argv[2], step_interval=10)
    attempt = int(os.environ["FLEET_RESTART_COUNT"])
    print("attempt", attempt, "of at most", os.environ["FLEET_MAX_RESTARTS"], "restarts", flush=True)
    if os.environ.get("PADDLE_TRAINER_ID") == "1":
        time.sleep(0.3)
        raise RuntimeError("lost the data at attempt %d" % attempt)
    time.sleep(60)
''')


def test_a_script_without_checkpoints_is_told_how_to_checkpoint_at_its_first_failure(fleetrun, tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    r = fleetrun("--server_num", "1", "--worker_num", "2", "--max_restarts", "3", "--failure_grace", "0",
                 "job.py", "none", timeout=60)
    assert r.returncode == 1
    pid = re.search(r"worker 1 \(pid (\d+)\) exited with code 1", r.stderr).group(1)
    assert (f"fleetrun: --max_restarts 3: no process of this job made a fleet.CheckpointConfig before it failed, "
            f"so a restart would train from scratch and redo everything. Make the script checkpoint and resume: "
            f"cfg = fleet.CheckpointConfig(DIR, step_interval=N or seconds_interval=S), servers "
            f"fleet.init_server(fleet.latest_checkpoint(DIR)), workers fleet.load_checkpoint(exe, cfg) and "
            f"train_from_dataset(..., checkpoint=cfg) (the idiom in fleet/checkpoint.py); or give "
            f"--restart_from_scratch to restart from the start anyway\n") in r.stderr
    assert r.stderr.endswith(f"fleetrun: exit 1: no restart (no checkpoint); the failure:\n    1. attempt 0: "
                             f"worker 1 (pid {pid}) on host {os.uname().nodename} exited with code 1: "
                             f"RuntimeError: lost the data at attempt 0\n"), r.stderr[-1500:]
    assert "restart 1" not in r.stderr


@pytest.mark.parametrize("how", ["checkpoints", "--restart_from_scratch"])
def test_after_k_restarts_fleetrun_gives_up_listing_every_failure_in_order(fleetrun, tmp_path, how):
    (tmp_path / "job.py").write_text(SCRIPT)
    args = ["job.py", "checkpoints", str(tmp_path / "ckpt")] if how == "checkpoints" else \
        ["--restart_from_scratch", "job.py", "none"]
    r = fleetrun("--server_num", "1", "--worker_num", "2", "--max_restarts", "2", "--failure_grace", "0",
                 "--log_dir", "log", *args, timeout=90)
    assert r.returncode == 1
    pids = re.findall(r"worker 1 \(pid (\d+)\) exited with code 1, the first process to fail", r.stderr)
    assert len(pids) == 3
    host = os.uname().nodename
    source = ("resuming from the newest checkpoint: " + str(tmp_path / "ckpt") + ": none yet, so from the start"
              if how == "checkpoints" else "from scratch (--restart_from_scratch: the script makes no checkpoint)")
    for n in (1, 2):
        assert (f"fleetrun: restart {n} of 2 (--max_restarts 2): worker 1 (pid {pids[n - 1]}) on host {host} "
                f"exited with code 1: RuntimeError: lost the data at attempt {n - 1}; every process was stopped and "
                f"starts again with FLEET_RESTART_COUNT={n}, {source}\n") in r.stderr
    listed = "".join(f"    {n + 1}. attempt {n}: worker 1 (pid {pids[n]}) on host {host} exited with code 1: "
                     f"RuntimeError: lost the data at attempt {n}\n" for n in range(3))
    assert r.stderr.endswith("fleetrun: exit 1: gave up after 2 restarts (--max_restarts 2); 3 failures, in order:\n"
                             + listed), r.stderr[-2000:]
    # each attempt saw its number; its logs were kept
    for n in range(3):
        log = tmp_path / "log" / (f"attempt-{n}" if n < 2 else "") / "workerlog.0"
        assert f"attempt {n} of at most 2 restarts" in log.read_text()
    events = (tmp_path / "log" / "restarts.log").read_text().splitlines()
    assert [e.split(" ", 1)[1].split(":")[0] for e in events] == [
        "restart 1 of 2", "restart 2 of 2", "exit 1"]
