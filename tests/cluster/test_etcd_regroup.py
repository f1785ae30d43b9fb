"""etcd + --max_restarts across hosts (network namespaces): a host lost mid-training, and
the job re-forms without it and finishes by itself.

Three hosts meet through etcd (in h1) with no endpoint lists: h1 and h2 run a server and a
worker each, h3 a worker; sync CTR-DNN, checkpoints every 20 steps of worker 0 in one
directory every namespace sees, `--max_restarts 2`. After a checkpoint h2's link goes down
and its fleetrun and every process of the job there get SIGKILL. h1 and h3 then start
round 1 of the job:
server 1 and worker 1 move from h2 to h1 (fleet.launch.replacement.reassign), the servers
load the newest checkpoint, the workers resume, and the job ends at the test AUC of the
same job undisturbed on one host, within 0.005. The time from the kill to training again
(the first batch worker 0 logs in round 1) is printed, not asserted.

Two orders of events: the lease (2 s) expires before the processes' heartbeats (3 s) fail
them, or the heartbeats fail them first (lease 6 s) and the restart each host then waits
for turns into the round. Either way the loss counts as one restart on each host.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster import ctr
from tests.cluster.test_etcd_hosts import _etcd_in
from tests.cluster.test_restart_hosts import AUC_BOUND, FAST_LIVENESS, SMALL, _evaluate, _reference_auc

pytestmark = pytest.mark.slow

SHARES = {"h1": (1, 1), "h2": (1, 1), "h3": (0, 1)}


def _fleetrun(host, tmp_path, etcd, data, model, ckpt, keys, env):
    work = tmp_path / host.name
    work.mkdir()
    servers, workers = SHARES[host.name]
    argv = [sys.executable, "-m", "fleet.launch", "--elastic_server", etcd.endpoint,
            "--job_id", "regroup", "--server_num", 2, "--worker_num", 3,
            "--server_num_per_host", servers, "--worker_num_per_host", workers,
            "--keys_dir", keys, "--log_dir", work / "log", "--timeout", 400, "--max_restarts", 2,
            *ctr.train_args(data, model, "sync"), *SMALL, "--checkpoint_dir", ckpt,
            "--checkpoint_steps", 20]
    err = open(work / "stderr", "w")
    proc = host.popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    err.close()
    return proc, work


def _batches(path):
    try:
        return len(re.findall(r"batch \d+,", path.read_text()))
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("ttl", [2, 6], ids=["lease_first", "heartbeats_first"])
def test_a_host_lost_mid_training_moves_its_ranks_to_the_survivors_and_the_job_finishes(
        cluster_factory, tmp_path, ctr_data, ctr_keys, ttl):
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    model, ckpt = tmp_path / "model", tmp_path / "ckpt"
    env = ctr.clean_env(PADDLE_ELASTIC_TTL=str(ttl), **FAST_LIVENESS)
    started = {}
    for h in cluster.hosts:  # in turn: registration order is rank order
        started[h.name] = _fleetrun(h, tmp_path, etcd, ctr_data, model, ckpt, ctr_keys, env)
        # Registered once it says so (then one call to etcd): on a loaded machine a fixed
        # sleep let h3 register before h2, which gave h2 worker 2 instead of worker 1.
        deadline = time.monotonic() + 60
        while "registering this host" not in (tmp_path / h.name / "stderr").read_text():
            assert started[h.name][0].poll() is None, (tmp_path / h.name / "stderr").read_text()
            assert time.monotonic() < deadline, f"{h.name}'s fleetrun did not register within 60 s"
            time.sleep(0.05)
        time.sleep(0.5)
    deadline = time.monotonic() + 150
    while not (ckpt / "ckpt-40").is_dir():
        assert all(p.poll() is None for p, _ in started.values()), "a fleetrun ended early"
        assert time.monotonic() < deadline, "the job wrote no checkpoint ckpt-40"
        time.sleep(0.1)
    h2.link_down()  # h2 is lost: cut off, its fleetrun and every process of the job there killed
    for pid in h2.pids():
        os.kill(pid, signal.SIGKILL)
    lost_at = time.monotonic()
    started.pop("h2")[0].wait(30)
    log0 = tmp_path / "h1" / "log" / "workerlog.0"  # round 1's, once attempt-0's moved away
    again = None
    deadline = time.monotonic() + 300
    while any(p.poll() is None for p, _ in started.values()):
        if again is None and (tmp_path / "h1" / "log" / "attempt-0").is_dir() and _batches(log0):
            again = time.monotonic() - lost_at
        assert time.monotonic() < deadline, "the job did not finish within 300 s of the loss"
        time.sleep(0.1)
    errs = {name: (work / "stderr").read_text() for name, (_, work) in started.items()}
    for name, (proc, _) in started.items():
        assert proc.returncode == 0, f"{name}: {errs[name][-4000:]}"
        err = errs[name]
        assert f"fleetrun: round 1: server 1 moves from {h2.addr} to {h1.addr}" in err, err[-4000:]
        rounds = [line for line in err.splitlines() if "round" in line or "restart" in line]
        assert f"fleetrun: round 1: worker 1 moves from {h2.addr} to {h1.addr}" in err, rounds
        assert re.search(rf"fleetrun: round 1 of job 'regroup' at etcd {etcd.endpoint} formed in "
                         rf"[0-9.]+ s: {h1.addr}: server 0, server 1, worker 0, worker 1; "
                         rf"{h3.addr}: worker 2\n", err), err[-4000:]
        assert "fleetrun: restart 1 of 2 (--max_restarts 2): " in err
        assert "restart 2 of 2" not in err  # the loss counted once on each host
        assert "fleetrun: done after 1 restart; 1 failure, in order:" in err, err[-3000:]
        log = (tmp_path / name / "log" / "restarts.log").read_text()
        assert "round 1 formed: " in log, log
        first = "the lease" if "restart 1 of 2: host 1 on host" in log else "the heartbeats"
        print(f"{name}: {first} came first: {log.splitlines()[0]}")
        if first == "the heartbeats":  # the restart waiting for the other hosts became the round
            assert "fleetrun: membership change during the wait: " in err, err[-3000:]
    assert "resumed from " in log0.read_text()
    assert (tmp_path / "h1" / "log" / "serverlog.1").is_file()  # server 1 ran on h1 in round 1
    etcd.stop()
    assert cluster.leftovers() == {}
    auc, reference = _evaluate(model, ctr_data), _reference_auc(tmp_path, ctr_data)
    print(f"etcd regroup (lease {ttl} s): lost -> training again {again:.1f} s; test AUC {auc:.4f} after the "
          f"loss, undisturbed {reference:.4f}")
    assert abs(auc - reference) < AUC_BOUND
