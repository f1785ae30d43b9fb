"""An elastic CTR-DNN job across three namespace hosts that meet through etcd, with restarts
(`fleetrun --np 2:3 --elastic_server ETCD --max_restarts 1`, async, checkpoints in one
directory every namespace sees): h1 runs worker slot 0, h2 server 0 and slot 1 (the job
forms with those two, MIN), h3 joins the running job in slot 2. After a checkpoint h2 is
lost (link down, every process of the job there SIGKILLed). h1 and h3 start round 1:
server 0 moves to h1, each keeps its slot id, the server loads the newest checkpoint and
restores the work units it acknowledged, and the job finishes on both with exit 0: every
work unit of the resumed epoch acknowledged once (restored + trained), every later epoch
whole, the test AUC within 0.01 of the same job undisturbed on one host. The time from
the loss to training again is printed, not asserted.

Two orders of events: the lease (3 s) expires before the heartbeats (3 s) fail the
survivors' workers, or the heartbeats fail them first (lease 6 s): each host's workers are
then all lost, and the host waits for the change (fewer than MIN slots, or the lease)
that turns the failure into the round. Either way the loss counts once on each host.

Also: server 0's process on h2 killed (h2 lives): h2 starts round 1, h1 and h3 see it
begun and join; nothing moves, every host keeps its slot, the job finishes the same way."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster import ctr
from tests.cluster.test_etcd_hosts import _etcd_in
from tests.cluster.test_np_etcd_hosts import _queue_figures
from tests.cluster.test_restart_hosts import FAST_LIVENESS, SMALL, _evaluate

pytestmark = pytest.mark.slow

SHARES = {"h1": (0, 1), "h2": (1, 1), "h3": (0, 1)}
EPOCHS = 2
ENV = dict(FLEET_ELASTIC_UNIT_BYTES=str(128 << 10), **FAST_LIVENESS)


def _train_args(data, model):
    return [*ctr.train_args(data, model, "async", epochs=EPOCHS), *SMALL]


def _fleetrun(host, tmp_path, etcd, data, model, ckpt, keys, ttl):
    work = tmp_path / host.name
    work.mkdir()
    servers, workers = SHARES[host.name]
    argv = [sys.executable, "-m", "fleet.launch", "--elastic_server", etcd.endpoint, "--job_id", "np-round",
            "--server_num", 1, "--np", "2:3", "--server_num_per_host", servers, "--worker_num_per_host", workers,
            "--keys_dir", keys, "--log_dir", work / "log", "--timeout", 400, "--max_restarts", 1,
            *_train_args(data, model), "--checkpoint_dir", ckpt, "--checkpoint_steps", 20]
    with open(work / "stderr", "w") as err:
        proc = host.popen(argv, cwd=work, env=ctr.clean_env(PADDLE_ELASTIC_TTL=str(ttl), **ENV),
                          stdout=subprocess.DEVNULL, stderr=err)
    return proc, work


def _batches(path):
    try:
        return len(re.findall(r"batch \d+,", path.read_text()))
    except FileNotFoundError:
        return 0


def _wait(condition, seconds, what, started):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        for name, (proc, work) in started.items():
            assert proc.poll() is None, f"{name}'s fleetrun ended early:\n{(work / 'stderr').read_text()[-3000:]}"
        time.sleep(0.1)


def _server_pid(host):
    """The pid of the parameter server running in host's namespace, or None."""
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"TRAINING_ROLE=PSERVER" in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    return None


def _start(cluster_factory, tmp_path, ctr_data, ctr_keys, ttl):
    """h1 (slot 0), h2 (server 0, slot 1), then h3 joining in slot 2 once pass 0 is open;
    returns once h3's worker joined and a checkpoint exists."""
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    model, ckpt = tmp_path / "model", tmp_path / "ckpt"
    started = {"h1": _fleetrun(h1, tmp_path, etcd, ctr_data, model, ckpt, ctr_keys, ttl)}
    _wait(lambda: "registering this host" in (tmp_path / "h1" / "stderr").read_text(), 30, "h1 registers", started)
    time.sleep(0.5)  # registration order is slot order: h1 holds slot 0 (the first worker)
    started["h2"] = _fleetrun(h2, tmp_path, etcd, ctr_data, model, ckpt, ctr_keys, ttl)
    server_log = tmp_path / "h2" / "log" / "serverlog.0"
    _wait(lambda: server_log.exists() and "opened pass 0" in server_log.read_text(), 90, "pass 0 opens", started)
    started["h3"] = _fleetrun(h3, tmp_path, etcd, ctr_data, model, ckpt, ctr_keys, ttl)
    _wait(lambda: "worker 2 joined" in server_log.read_text() and (ckpt / "ckpt-20").is_dir(), 120,
          "h3's worker 2 to join and a checkpoint", started)
    return cluster, etcd, started


def _finish(cluster, etcd, started, tmp_path, ctr_data, since, round_text, server_host):
    """Waits for the job to end; checks every host's exit, the round and the work queue of
    round 1's server 0; compares the test AUC with the same job undisturbed. Returns the
    figures to print."""
    log0 = tmp_path / "h1" / "log" / "workerlog.0"  # round 1's, once attempt-0's moved away
    again, deadline = None, time.monotonic() + 300
    while any(p.poll() is None for p, _ in started.values()):
        if again is None and (tmp_path / "h1" / "log" / "attempt-0").is_dir() and _batches(log0):
            again = time.monotonic() - since
        assert time.monotonic() < deadline, "the job did not finish within 300 s of the failure"
        time.sleep(0.1)
    errs = {name: (work / "stderr").read_text() for name, (_, work) in started.items()}
    for name, (proc, _) in started.items():
        err = errs[name]
        assert proc.returncode == 0, f"{name}: {err[-4000:]}"
        assert re.search(rf"fleetrun: round 1 of job 'np-round' at etcd {re.escape(etcd.endpoint)} formed in "
                         rf"[0-9.]+ s: {round_text}\n", err), err[-4000:]
        assert "fleetrun: restart 1 of 1 (--max_restarts 1): " in err, err[-4000:]
        assert "fleetrun: done after 1 restart; 1 failure, in order:" in err, err[-3000:]
        log = (tmp_path / name / "log" / "restarts.log").read_text()
        assert "round 1 formed: " in log and log.count("restart 1 of 1") == 1, log
        print(f"{name}: {log.splitlines()[0][25:200]}")
    assert "joining the running job 'np-round'" in errs["h3"]
    assert re.search(r"resumed from \S+ckpt-\d+", log0.read_text()), log0.read_text()[-2000:]
    figures = _queue_figures((tmp_path / server_host / "log" / "serverlog.0").read_text())  # round 1's server 0
    resumed = min(figures)
    assert sorted(figures) == list(range(resumed, EPOCHS)), figures
    for status in figures.values():  # every unit once: restored from the checkpoint or trained now
        trained = sum(w["units"] for w in status["workers"].values())
        assert status["done"] and status["acked"] == status["units"] == status["restored"]["units"] + trained, status
        assert status["examples"] == 60000 and status["stale_acks"] == 0, status
    etcd.stop()
    assert cluster.leftovers() == {}
    reference = tmp_path / "reference"  # the same job undisturbed, on one host
    ctr.python("-m", "fleet.launch", "--np", "2:2", "--server_num", 1, "--log_dir", reference / "log",
               *_train_args(ctr_data, reference), cwd=tmp_path, timeout=300, env=ctr.clean_env(**ENV))
    auc, undisturbed = _evaluate(tmp_path / "model", ctr_data), _evaluate(reference, ctr_data)
    assert abs(auc - undisturbed) <= 0.01, (auc, undisturbed)
    again = f"{again:.1f} s" if again is not None else "not seen"
    return (f"training again {again}; pass {resumed} resumed with {figures[resumed]['restored']['units']} of "
            f"{figures[resumed]['units']} units restored; test AUC {auc:.4f}, undisturbed {undisturbed:.4f}"), errs


@pytest.mark.parametrize("ttl", [3, 6], ids=["lease_first", "heartbeats_first"])
def test_np_2_3_a_lost_server_host_re_forms_the_job_on_the_others_from_its_checkpoint(
        cluster_factory, tmp_path, ctr_data, ctr_keys, ttl):
    cluster, etcd, started = _start(cluster_factory, tmp_path, ctr_data, ctr_keys, ttl)
    h1, h2, h3 = cluster.hosts
    h2.link_down()  # h2 is lost: cut off, its fleetrun and every process of the job there killed
    for pid in h2.pids():
        os.kill(pid, signal.SIGKILL)
    lost_at = time.monotonic()
    started.pop("h2")[0].wait(30)
    said, errs = _finish(cluster, etcd, started, tmp_path, ctr_data, lost_at,
                         f"{re.escape(h1.addr)}: server 0, slot 0; {re.escape(h3.addr)}: slot 2", "h1")
    for err in errs.values():
        assert f"fleetrun: round 1: server 0 moves from {h2.addr} to {h1.addr}" in err, err[-4000:]
    print(f"np etcd round (lease {ttl} s, heartbeat timeout 3 s): lost -> {said}")


def test_np_2_3_a_failed_server_on_a_live_host_restarts_the_job_as_a_round_with_every_slot_kept(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    cluster, etcd, started = _start(cluster_factory, tmp_path, ctr_data, ctr_keys, 3)
    h1, h2, h3 = cluster.hosts
    server = _server_pid(h2)
    assert server is not None, "server 0's process in h2"
    os.kill(server, signal.SIGKILL)
    killed_at = time.monotonic()
    said, errs = _finish(cluster, etcd, started, tmp_path, ctr_data, killed_at,
                         f"{re.escape(h1.addr)}: slot 0; {re.escape(h2.addr)}: server 0, slot 1; "
                         f"{re.escape(h3.addr)}: slot 2", "h2")
    assert f"restart 1 of 1 (--max_restarts 1): server 0 (pid {server}) on host" in errs["h2"], errs["h2"][-3000:]
    for name, err in errs.items():  # whichever host began the round (the others learn it from etcd)
        assert "fleetrun: ready for round 1 of job 'np-round'" in err, err[-3000:]
    assert not any(" moves from " in err for err in errs.values())
    print(f"np etcd round, server 0 killed on a live host: killed -> {said}")
