"""An elastic CTR-DNN job across three namespace hosts that meet through etcd
(`fleetrun --np 2:4 --elastic_server ETCD`, async): h1 runs the server and worker 0, h2
worker 1; the job forms with those two. h3 then joins the running job with two workers
(slots 2 and 3, taken in etcd); a request to add one more on h2 is refused (every slot
taken); one of h3's workers is killed with SIGKILL. The job finishes by itself on every
host; the server's work queue acknowledged every unit of every epoch once, the lost
worker's units went back to the queue (at most 2 x threads of them), and the test AUC is
within 0.01 of a fixed two-worker run of the same work units on one host.

Also: a lost host of workers only (every process there SIGKILLed) while MIN workers live
is no membership change, and the job finishes; a lost host that leaves fewer than MIN
workers ends the job on the others, naming the lost worker and host.
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

from tests.cluster import ctr
from tests.cluster.test_etcd_hosts import _etcd_in

pytestmark = pytest.mark.slow

THREADS = 1
UNIT_BYTES = 128 << 10
EPOCHS = 3
TRAIN_ARGS = ("--print_period", "0", "--batch_size", "100", "--lr", "2e-3", "--threads", str(THREADS),
              "--strategy", "async", "--epochs", str(EPOCHS), "--seed", "7")
STATUS = textwrap.dedent("""
    import json, sys
    from fleet.transport import Client
    from fleet.transport.curve import CurveConfig
    c = Client(sys.argv[1], 999, curve=CurveConfig.from_dir(sys.argv[2]), timeout_ms=3000)
    print(json.dumps(c.request("units_status").meta["passes"]))
    c.close()
""")
SHARES = {"h1": (1, 1), "h2": (0, 1), "h3": (0, 2)}


def _env():
    return ctr.clean_env(PADDLE_ELASTIC_TTL="3", FLEET_HEARTBEAT_MS="200", FLEET_HEARTBEAT_TIMEOUT_MS="2000",
                         FLEET_ELASTIC_UNIT_BYTES=str(UNIT_BYTES))


def _fleetrun(host, tmp_path, etcd, data, model, keys, shares=None):
    """Start this host's fleetrun with its share (servers, workers), default SHARES'."""
    work = tmp_path / host.name
    work.mkdir(exist_ok=True)
    servers, workers = shares or SHARES[host.name]
    argv = [sys.executable, "-m", "fleet.launch", "--elastic_server", etcd.endpoint, "--job_id", "np-ctr",
            "--server_num", 1, "--np", "2:4", "--server_num_per_host", servers, "--worker_num_per_host", workers,
            "--keys_dir", keys, "--log_dir", work / "log", "--timeout", 240,
            ctr.TRAIN, "--data_dir", data, "--model_dir", model, *TRAIN_ARGS]
    with open(work / "stderr", "w") as err:
        proc = host.popen(argv, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
    return proc, work


def _wait_for(condition, seconds, what, started=()):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        for proc, work in started:
            assert proc.poll() is None, f"{work.name}'s fleetrun ended early:\n{(work / 'stderr').read_text()[-3000:]}"
        time.sleep(0.2)


def _state(work):
    try:
        return json.loads((work / "log" / "fleetrun.elastic.json").read_text())
    except (OSError, ValueError):
        return None


def _queue_figures(server_log):
    figures = {}
    for line in server_log.splitlines():
        if " work queue: {" in line:
            status = json.loads(line.split(" work queue: ", 1)[1])
            figures[status["pass"]] = status
    return figures


def test_np_2_4_through_etcd_a_third_host_joins_with_two_workers_and_one_is_killed(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    model = tmp_path / "model"
    server = f"{h1.addr}:6170"

    def queue():
        r = h1.run([sys.executable, "-c", STATUS, server, ctr_keys], timeout=20, env=ctr.clean_env())
        return {int(k): v for k, v in json.loads(r.stdout).items()} if r.returncode == 0 else {}

    started = {"h1": _fleetrun(h1, tmp_path, etcd, ctr_data, model, ctr_keys)}
    # h1 registers first, so it holds worker 0 (registration order is rank order)
    _wait_for(lambda: "registering this host" in (tmp_path / "h1" / "stderr").read_text(), 30, "h1 registers")
    time.sleep(1.0)
    started["h2"] = _fleetrun(h2, tmp_path, etcd, ctr_data, model, ctr_keys)
    _wait_for(lambda: 0 in queue(), 90, "the two workers to open epoch 0's pass", started.values())
    started["h3"] = _fleetrun(h3, tmp_path, etcd, ctr_data, model, ctr_keys)
    joined = time.monotonic()
    h3_work = started["h3"][1]
    _wait_for(lambda: (_state(h3_work) or {}).get("running", {}).keys() == {"2", "3"}, 60,
              "h3 to start workers 2 and 3", started.values())
    refused = subprocess.run([sys.executable, "-m", "fleet.launch", "--add_workers", "1", "--log_dir",
                              tmp_path / "h2" / "log"], capture_output=True, text=True, timeout=30, env=_env())
    assert refused.returncode == 1, refused.stderr
    assert "refused 1: every one of the 4 worker slots (--np 2:4) is taken" in refused.stderr

    def worker_3_holds_units():
        passes = queue()
        return any(s["held_by"].get("3", 0) >= 1 and "3" in s["workers"] for s in passes.values())

    _wait_for(worker_3_holds_units, 90, "worker 3 to train and hold units", started.values())
    print(f"h3 started to worker 3 holding units: {time.monotonic() - joined:.1f} s")
    victim = _state(h3_work)["running"]["3"]
    os.kill(victim, signal.SIGKILL)
    results = {}
    for name, (proc, work) in started.items():
        proc.wait(timeout=200)
        results[name] = (proc.returncode, (work / "stderr").read_text())
    for name, (code, err) in results.items():
        assert code == 0, f"{name}: {err[-4000:]}"
    h3_err = results["h3"][1]
    assert re.search(r"fleetrun: joining the running job 'np-ctr' at etcd \S+ in worker slots 2, 3\n", h3_err), h3_err
    assert re.search(r"started worker 2 \(pid \d+\) \(joining the running job through etcd\)", h3_err), h3_err
    assert f"worker 3 (pid {victim}) was killed by SIGKILL: lost (elastic job --np 2:4)" in h3_err
    assert "membership change" not in results["h1"][1] + results["h2"][1]
    server_log = (tmp_path / "h1" / "log" / "serverlog.0").read_text()
    assert "worker 2 joined" in server_log and "worker 3 joined" in server_log
    figures = _queue_figures(server_log)
    assert sorted(figures) == list(range(EPOCHS)), figures
    for status in figures.values():  # every unit acknowledged once, every line counted
        assert status["done"] and status["acked"] == status["units"] and status["examples"] == 60000, status
        assert status["stale_acks"] == 0, status
    returned = {p: s["returned_units"] for p, s in figures.items() if s["returned_from"]}
    assert len(returned) == 1, figures  # the pass worker 3 was killed in
    (lost_pass, units), = returned.items()
    assert figures[lost_pass]["returned_from"] == [3] and 1 <= units <= 2 * THREADS, figures[lost_pass]
    for w in ("2", "3"):  # the joining workers trained
        assert any(w in s["workers"] for s in figures.values()), figures
    joined_log = (h3_work / "log" / "workerlog.2").read_text()
    assert "joining a running elastic job (FLEET_ELASTIC_JOINING=1)" in joined_log or \
        "joined the elastic job" in joined_log, joined_log[-2000:]
    etcd.stop()
    assert cluster.leftovers() == {}
    # the same work units with two workers from start to end, on one host
    fixed = tmp_path / "fixed"
    ctr.python("-m", "fleet.launch", "--np", "2:2", "--server_num", 1, "--log_dir", fixed / "log", ctr.TRAIN,
               "--data_dir", ctr_data, "--model_dir", fixed, *TRAIN_ARGS, cwd=tmp_path, timeout=240, env=_env())
    elastic_auc = ctr.evaluate(model, ctr_data)["auc"]
    fixed_auc = ctr.evaluate(fixed, ctr_data)["auc"]
    print(f"test AUC: elastic across hosts {elastic_auc:.4f}, fixed 2 workers {fixed_auc:.4f}; pass {lost_pass} "
          f"returned {units} units of worker 3")
    assert abs(elastic_auc - fixed_auc) <= 0.01, (elastic_auc, fixed_auc)


def test_np_through_etcd_below_min_after_a_lost_host_ends_the_job_naming_it(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    """--np 2:4 with h1 (server, worker 0) and h2 (worker 1): h2's fleetrun and every process
    of the job there are SIGKILLed. One worker is left, fewer than MIN and none finished:
    h1 ends the job, exit 1, naming the lost worker and host; nothing is left running."""
    cluster = cluster_factory(2)
    h1, h2 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    started = {"h1": _fleetrun(h1, tmp_path, etcd, ctr_data, tmp_path / "model", ctr_keys)}
    _wait_for(lambda: "registering this host" in (tmp_path / "h1" / "stderr").read_text(), 30, "h1 registers")
    time.sleep(1.0)
    started["h2"] = _fleetrun(h2, tmp_path, etcd, ctr_data, tmp_path / "model", ctr_keys)
    server_log = tmp_path / "h1" / "log" / "serverlog.0"
    _wait_for(lambda: server_log.exists() and "opened pass 0" in server_log.read_text(), 90,
              "the workers to open the first pass", started.values())
    time.sleep(2.0)  # training
    assert started["h2"][0].poll() is None and started["h1"][0].poll() is None
    for pid in h2.pids():
        os.kill(pid, signal.SIGKILL)
    lost = time.monotonic()
    started["h1"][0].wait(timeout=60)
    ended = time.monotonic() - lost
    err = (tmp_path / "h1" / "stderr").read_text()
    assert started["h1"][0].returncode == 1, err[-3000:]
    assert re.search(r"fleetrun: exit 1: membership change: only 1 worker of job 'np-ctr' at etcd \S+ live, fewer "
                     r"than --np 2:4's minimum 2, and no worker has finished the data: the job fails\. Lost: worker 1 "
                     rf"\(lost with host {re.escape(h2.addr)}\); lost hosts: {re.escape(h2.addr)}\n", err), err[-3000:]
    print(f"h2 killed to h1's fleetrun ended: {ended:.1f} s (PADDLE_ELASTIC_TTL=3)")
    etcd.stop()
    assert cluster.leftovers() == {}


def test_np_through_etcd_a_lost_host_of_workers_only_is_no_membership_change(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    """--np 2:4: h1 (server, worker 0), h2 (worker 1), h3 joins with one worker (slot 2). Once
    worker 2 holds a unit, h3's fleetrun and every process of the job there are SIGKILLed.
    Two workers remain (MIN): the job goes on; `fleetrun --add_workers 1` on h2 starts a
    worker there in a free slot; h1 and h2 finish the job with exit 0, every unit of every
    epoch acknowledged once, worker 2's units back in the queue."""
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    model = tmp_path / "model"
    started = {"h1": _fleetrun(h1, tmp_path, etcd, ctr_data, model, ctr_keys)}
    _wait_for(lambda: "registering this host" in (tmp_path / "h1" / "stderr").read_text(), 30, "h1 registers")
    time.sleep(1.0)
    started["h2"] = _fleetrun(h2, tmp_path, etcd, ctr_data, model, ctr_keys)
    server_log = tmp_path / "h1" / "log" / "serverlog.0"
    _wait_for(lambda: server_log.exists() and "opened pass 0" in server_log.read_text(), 90,
              "the workers to open the first pass", started.values())
    _, h3_work = _fleetrun(h3, tmp_path, etcd, ctr_data, model, ctr_keys, shares=(0, 1))
    _wait_for(lambda: "worker 2 joined" in server_log.read_text(), 60, "worker 2 to join", started.values())
    time.sleep(2.0)  # it trains and holds units
    for pid in h3.pids():
        os.kill(pid, signal.SIGKILL)
    # a worker added on h2 takes a free slot from etcd (3, or 2 once h3's lease ended)
    added = subprocess.run([sys.executable, "-m", "fleet.launch", "--add_workers", "1", "--log_dir",
                            tmp_path / "h2" / "log"], capture_output=True, text=True, timeout=30, env=_env())
    assert added.returncode == 0, added.stderr
    slot = re.search(r"the job's fleetrun started worker (\d)\n", added.stderr)
    assert slot and slot.group(1) in ("2", "3"), added.stderr
    for name, (proc, work) in started.items():
        proc.wait(timeout=200)
        err = (work / "stderr").read_text()
        assert proc.returncode == 0, f"{name}: {err[-4000:]}"
        assert "membership change" not in err, err[-3000:]
    assert "joining the running job 'np-ctr'" in (h3_work / "stderr").read_text()
    h2_err = started["h2"][1].joinpath("stderr").read_text()
    assert re.search(rf"started worker {slot.group(1)} \(pid \d+\) \(added on request, in a slot taken in etcd\)",
                     h2_err), h2_err[-3000:]
    assert f"worker {slot.group(1)} joined" in server_log.read_text()
    figures = _queue_figures(server_log.read_text())
    assert sorted(figures) == list(range(EPOCHS)), figures
    for status in figures.values():
        assert status["done"] and status["acked"] == status["units"] and status["examples"] == 60000, status
    returned = {p: s for p, s in figures.items() if s["returned_from"]}
    assert [s["returned_from"] for s in returned.values()] == [[2]], figures
    assert all(1 <= s["returned_units"] <= 2 * THREADS for s in returned.values()), figures
    etcd.stop()
    assert cluster.leftovers() == {}
