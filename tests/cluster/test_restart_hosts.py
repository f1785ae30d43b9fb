"""fleetrun --max_restarts across hosts (network namespaces): a server killed with SIGKILL
on one host mid-training, and the job recovers by itself from its checkpoint.

Two ways to run a job on several hosts, each with --max_restarts 2:
- the same fleetrun on each host (no dispatcher): each host's fleetrun restarts its own
  processes once they failed, which they all do within the heartbeat timeout of the loss;
- fleetrun --hosts over ssh: the dispatcher stops every host and starts every host again.
The sync job (one thread per worker) then ends at the test AUC of the same job
undisturbed on one host, within 0.005. The checkpoint directory is one path every
namespace sees (one filesystem).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster import ctr

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--sparse_feature_dim", 100001]
AUC_BOUND = 0.005
# The job's processes notice a lost peer within 3 s (the heartbeat bound).
FAST_LIVENESS = dict(FLEET_HEARTBEAT_MS="500", FLEET_HEARTBEAT_TIMEOUT_MS="3000")


def _server_pid(addr, port):
    """The pid of the job's server whose endpoint is addr:port (read from /proc)."""
    want = {b"TRAINING_ROLE=PSERVER", f"POD_IP={addr}".encode(), f"PADDLE_PORT={port}".encode()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(pid)
    return None


def _kill_server_after_checkpoint(ckpt, addr, alive):
    """Once ckpt holds ckpt-40, SIGKILL the server at addr:6170; returns its pid."""
    deadline = time.monotonic() + 120
    while not (ckpt / "ckpt-40").is_dir():
        assert alive() and time.monotonic() < deadline, "the job wrote no checkpoint ckpt-40"
        time.sleep(0.1)
    pid = _server_pid(addr, ctr.PORT_SERVER)
    assert pid is not None, f"no server of the job at {addr}:{ctr.PORT_SERVER}"
    os.kill(pid, signal.SIGKILL)
    return pid


def _reference_auc(tmp_path, data):
    """The test AUC of the same job undisturbed on one host (2 servers, 3 workers)."""
    model = tmp_path / "one"
    ctr.python("-m", "fleet.launch", "--server_num", 2, "--worker_num", 3, "--log_dir", model / "log",
               *ctr.train_args(data, model, "sync"), *SMALL, cwd=tmp_path, timeout=180)
    return _evaluate(model, data)


def _evaluate(model, data):
    out = ctr.python("infer.py", "--model_dir", ctr.last_epoch(model), "--data_dir", data, *SMALL)
    return float(re.search(r'"auc": ([0-9.]+)', out).group(1))


def test_per_host_fleetruns_restart_together_after_a_server_host_loses_its_server(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    servers = ",".join(f"{h.addr}:{ctr.PORT_SERVER}" for h in (h1, h2))
    workers = ",".join(f"{h.addr}:{ctr.PORT_WORKER}" for h in (h1, h2, h3))
    model, ckpt = tmp_path / "model", tmp_path / "ckpt"
    started = {}
    for host in cluster.hosts:
        work = tmp_path / host.name
        work.mkdir()
        argv = [sys.executable, "-m", "fleet.launch", "--servers", servers, "--workers", workers,
                "--keys_dir", ctr_keys, "--log_dir", work / "log", "--timeout", 400, "--max_restarts", 2,
                *ctr.train_args(ctr_data, model, "sync"), *SMALL, "--checkpoint_dir", ckpt,
                "--checkpoint_steps", 20]
        started[host.name] = host.popen(argv, cwd=work, env=ctr.clean_env(**FAST_LIVENESS),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = _kill_server_after_checkpoint(ckpt, h2.addr, lambda: all(p.poll() is None for p in started.values()))
    results = {name: p.communicate(timeout=300) for name, p in started.items()}
    for name, p in started.items():
        assert p.returncode == 0, f"{name}: {results[name][1][-4000:]}"
    # h2 names the server it lost; h1 and h3 restart after their processes failed on losing it
    h2_err = results["h2"][1]
    assert re.search(rf"fleetrun: restart 1 of 2 \(--max_restarts 2\): server 1 \(pid {pid}\) on host {h2.addr} "
                     rf"was killed by SIGKILL", h2_err), h2_err[-3000:]
    for name in ("h1", "h3"):
        err = results[name][1]
        assert "fleetrun: restart 1 of 2 (--max_restarts 2): " in err, f"{name}: {err[-3000:]}"
        assert "fleetrun: waiting " in err and "before the restart, so that every other host's processes" in err
        assert "fleetrun: done after 1 restart" in err, f"{name}: {err[-3000:]}"
        assert "restart 2 of 2" not in err
    assert "resumed from " in (tmp_path / "h1" / "log" / "workerlog.0").read_text()
    assert cluster.leftovers() == {}
    auc, reference = _evaluate(model, ctr_data), _reference_auc(tmp_path, ctr_data)
    print(f"per-host fleetruns: test AUC {auc:.4f} after the restart, undisturbed {reference:.4f}")
    assert abs(auc - reference) < AUC_BOUND


def test_the_hosts_dispatcher_restarts_every_host_after_a_server_is_killed(
        cluster_factory, tmp_path, ctr_data):
    cluster = cluster_factory(4, sshd=True)
    h1, h2, h3, dispatcher = cluster.hosts
    job = tmp_path / "job"
    job.mkdir()
    for name in os.listdir(ctr.EXAMPLE):
        if name.endswith(".py"):
            shutil.copy(os.path.join(ctr.EXAMPLE, name), job / name)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{h1.addr} servers=1\n{h2.addr} servers=1\n{h3.addr}\n")
    model, ckpt = tmp_path / "model", tmp_path / "ckpt"
    args = ctr.train_args(ctr_data, model, "sync")[1:] + SMALL + ["--checkpoint_dir", ckpt, "--checkpoint_steps", 20]
    argv = [sys.executable, "-m", "fleet.launch", "--hosts", hostfile, "--server_num_per_host", 0,
            "--worker_num_per_host", 1, "--ssh_config", cluster.ssh_config, "--max_restarts", 2,
            "--dispatch", job, "--remote_dir", os.path.join(cluster.tmpdir, "ws", "{host}"),
            "--start_port", ctr.PORT_SERVER, *ctr.same_blas_kernels(), "train.py", *args]
    here = tmp_path / "here"
    here.mkdir()
    proc = dispatcher.popen(argv, cwd=here, env=ctr.clean_env(PYTHONPATH=REPO, **FAST_LIVENESS),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = _kill_server_after_checkpoint(ckpt, h1.addr, lambda: proc.poll() is None)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    assert re.search(rf"fleetrun: restart 1 of 2 \(--max_restarts 2\): server 0 \(pid {pid}\) on host {h1.addr} "
                     rf"was killed by SIGKILL; every process was stopped and starts again with "
                     rf"FLEET_RESTART_COUNT=1, resuming from the newest checkpoint: {ckpt}/ckpt-\d+\n", err), err[-4000:]
    assert err.endswith(f"fleetrun: done after 1 restart; 1 failure, in order:\n    1. attempt 0: server 0 "
                        f"(pid {pid}) on host {h1.addr} was killed by SIGKILL\n"), err[-2000:]
    # the first attempt's logs of every host were kept apart
    for h in (h1, h2, h3):
        assert (here / "log" / "attempt-0" / h.addr / "fleetrun-result.json").is_file()
    assert "resumed from " in out
    assert cluster.leftovers() == {}
    auc, reference = _evaluate(model, ctr_data), _reference_auc(tmp_path, ctr_data)
    print(f"--hosts: test AUC {auc:.4f} after the restart, undisturbed {reference:.4f}")
    assert abs(auc - reference) < AUC_BOUND
