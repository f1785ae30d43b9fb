"""CTR-DNN on three namespace hosts that find each other through etcd: every host runs
`fleetrun --elastic_server ETCD --job_id J --server_num 2 --worker_num 3` with its own
share and no endpoint list; etcd runs in h1.

Sync: the hosts form one plan, train, and end with the dense parameters of the same job
on one host to float tolerance, although etcd was killed mid-training (nothing in training
talks to etcd). Async with etcd killed: training goes on; a fourth host that wants to join
is refused naming etcd's endpoint; a host lost then ends the job on every survivor, whose
last line names the lost host's address and etcd's endpoint. Nothing is left running.
"""
import re
import subprocess
import sys
import time

import pytest

from tests import etcd_server
from tests.cluster import ctr

pytestmark = pytest.mark.slow

ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
# server and worker counts of h1, h2, h3: the layout of test_per_host's static lists
SHARES = {"h1": (1, 1), "h2": (1, 1), "h3": (0, 1)}
PROBE = """
import json, sys, urllib.request
request = urllib.request.Request(f"http://{sys.argv[1]}/v3/kv/range", method="POST",
                                 data=json.dumps({"key": "AA=="}).encode())
urllib.request.urlopen(request, timeout=1)
"""
FORMED = re.compile(r"fleetrun: job '[^']+' at etcd \S+ formed in ([0-9.]+) s: (.*)")


def _etcd_in(host, tmp_path):
    problem = etcd_server.missing()
    if problem:
        pytest.fail(problem, pytrace=False)

    def probe(endpoint):
        try:
            return host.run([sys.executable, "-c", PROBE, endpoint], 5).returncode
        except TimeoutError:
            return 1
    return etcd_server.EtcdServer(host.addr, ETCD_PORT, ETCD_PEER_PORT, tmp_path / "etcd",
                                  popen=host.popen, probe=probe).start()


def _fleetrun(host, tmp_path, etcd, job_id, data, model, strategy, keys, env, epochs=None):
    """Start this host's fleetrun; its stderr goes to work/stderr (read while it runs)."""
    work = tmp_path / host.name
    work.mkdir(exist_ok=True)
    servers, workers = SHARES.get(host.name, (0, 1))
    argv = [sys.executable, "-m", "fleet.launch", "--elastic_server", etcd.endpoint,
            "--job_id", job_id, "--server_num", 2, "--worker_num", 3,
            "--server_num_per_host", servers, "--worker_num_per_host", workers,
            "--keys_dir", keys, "--log_dir", work / "log", "--timeout", 240,
            *ctr.train_args(data, model, strategy, epochs)]
    with open(work / "stderr", "w") as err:
        proc = host.popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    return proc, work


def _stderr(work):
    return (work / "stderr").read_text()


def _worker0_log(tmp_path):
    """workerlog.0 of whichever host got worker 0 (the first to register), once it exists."""
    for path in tmp_path.glob("h*/log/workerlog.0"):
        return path
    return None


def _wait_for(condition, seconds, what, started=()):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        for proc, work in started:
            assert proc.poll() is None, f"{work.name}'s fleetrun ended early:\n{_stderr(work)[-3000:]}"
        time.sleep(0.2)


def _batches(path):
    return len(re.findall(r"batch \d+,", path.read_text())) if path else 0


def _finish(started, timeout):
    results, deadline = {}, time.monotonic() + timeout
    for name, (proc, work) in started.items():
        out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        results[name] = (proc.returncode, out, _stderr(work), work)
    return results


def test_three_hosts_meet_through_etcd_and_train_on_when_it_is_killed(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    cluster = cluster_factory(3)
    etcd = _etcd_in(cluster.hosts[0], tmp_path)
    model = tmp_path / "multi-sync"
    env = ctr.clean_env(PADDLE_ELASTIC_TTL="3")
    started = {h.name: _fleetrun(h, tmp_path, etcd, "ctr-sync", ctr_data, model, "sync",
                                 ctr_keys, env) for h in cluster.hosts}
    _wait_for(lambda: _batches(_worker0_log(tmp_path)) >= 2, 90, "worker 0 trains",
              started.values())
    assert "epoch 0:" not in _worker0_log(tmp_path).read_text()  # mid-job
    etcd.kill()
    _wait_for(lambda: all("did not answer a keepalive" in _stderr(w) for _, w in started.values()),
              20, "every host notices etcd's loss")
    results = _finish(started, 200)
    for name, (code, out, err, work) in results.items():
        assert code == 0, f"{name}: {err[-3000:]}"
        assert f"etcd at {etcd.endpoint} did not answer a keepalive of lease" in err
        assert "Training goes on (nothing in training talks to etcd)" in err
    formed = {name: FORMED.search(err) for name, (_, _, err, _) in results.items()}
    assert all(formed.values()), {n: r[2][-2000:] for n, r in results.items()}
    plans = {m.group(2) for m in formed.values()}
    assert len(plans) == 1, plans  # every host read the same ranks
    plan = dict(part.split(": ", 1) for part in plans.pop().split("; "))
    ranks = sorted(r for value in plan.values() for r in value.split(", "))
    assert ranks == ["server 0", "server 1", "worker 0", "worker 1", "worker 2"]
    for h in cluster.hosts:  # each host got the share it offered, in registration order
        shape = ["server" if r.startswith("server") else "worker" for r in plan[h.addr].split(", ")]
        assert shape == ["server"] * SHARES[h.name][0] + ["worker"] * SHARES[h.name][1]
        assert f"started {plan[h.addr]} on this host ({h.addr})" in results[h.name][2]
    print("rendezvous seconds per host:", {n: float(m.group(1)) for n, m in formed.items()})
    assert cluster.leftovers() == {}
    one = ctr.one_host(tmp_path, ctr_data, "sync")
    ctr.assert_matches_one_host(model, one, ctr_data, "sync", "3 hosts through etcd")


def test_with_etcd_gone_a_new_host_is_refused_and_a_lost_host_ends_the_job_naming_etcd(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    cluster = cluster_factory(4)
    h1, h2, h3, h4 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    env = ctr.clean_env(PADDLE_ELASTIC_TTL="3", FLEET_HEARTBEAT_MS="500",
                        FLEET_HEARTBEAT_TIMEOUT_MS="3000", FLEET_RPC_TIMEOUT_MS="20000",
                        FLEET_ETCD_TIMEOUT_MS="2000")
    model = tmp_path / "multi-async"
    started = {h.name: _fleetrun(h, tmp_path, etcd, "ctr-async", ctr_data, model, "async",
                                 ctr_keys, env, epochs=400) for h in (h1, h2, h3)}
    _wait_for(lambda: _batches(_worker0_log(tmp_path)) >= 2, 90, "worker 0 trains",
              started.values())
    etcd.kill()
    _wait_for(lambda: all("did not answer a keepalive" in _stderr(w) for _, w in started.values()),
              20, "every host notices etcd's loss", started.values())
    log0 = _worker0_log(tmp_path)
    before = _batches(log0)
    _wait_for(lambda: _batches(log0) >= before + 3, 60, "training goes on without etcd",
              started.values())
    # a fourth host cannot join: it names etcd's endpoint and the fix
    newcomer, work4 = _fleetrun(h4, tmp_path, etcd, "ctr-async", ctr_data, model, "async",
                                ctr_keys, env, epochs=400)
    newcomer.communicate(timeout=60)
    assert newcomer.returncode == 1
    error = _stderr(work4).strip().splitlines()[-1]
    print(error)
    assert error.startswith(f"fleetrun: error: etcd at {etcd.endpoint} did not answer a read "
                            "of '/fleet/jobs/ctr-async/formed' (connection refused): check that "
                            "etcd runs there"), error
    assert all(proc.poll() is None for proc, _ in started.values())  # the job still trains
    h2.link_down()
    results = _finish({n: started[n] for n in ("h1", "h3")}, 60)
    for name, (code, out, err, work) in results.items():
        lines = [line for line in err.splitlines() if line.startswith("fleetrun: exit 1: ")]
        print(name, lines)
        assert code == 1, f"{name} exited {code}: {err[-2000:]}"
        assert len(lines) == 2 and h2.addr in lines[0], f"{name}:\n{err[-3000:]}"
        assert lines[1].startswith(f"fleetrun: exit 1: the job failed while etcd at "
                                   f"{etcd.endpoint} was unreachable (for "), lines[1]
        assert err.strip().splitlines()[-1] == lines[1]
    started["h2"][0].kill()
    started["h2"][0].communicate(timeout=30)
    assert cluster.leftovers_after(10) == {}  # h2's processes die with their fleetrun


def test_a_host_lost_while_etcd_runs_ends_the_job_as_a_membership_change(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    """h3's fleetrun is SIGKILLed (its processes die with it): its lease (2 s) expires long
    before the heartbeats' 15 s, and h1 and h2 end the job naming h3 and etcd."""
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    etcd = _etcd_in(h1, tmp_path)
    env = ctr.clean_env(PADDLE_ELASTIC_TTL="2", FLEET_HEARTBEAT_TIMEOUT_MS="15000")
    started = {h.name: _fleetrun(h, tmp_path, etcd, "ctr-lost", ctr_data, tmp_path / "model",
                                 "async", ctr_keys, env, epochs=400) for h in cluster.hosts}
    _wait_for(lambda: _batches(_worker0_log(tmp_path)) >= 2, 90, "worker 0 trains",
              started.values())
    lost = started.pop("h3")[0]
    lost.kill()  # fleetrun only: its processes get SIGKILL from the kernel (PDEATHSIG)
    lost.communicate(timeout=30)
    results = _finish(started, 60)
    for name, (code, out, err, work) in results.items():
        lines = [line for line in err.splitlines() if line.startswith("fleetrun: exit 1: ")]
        print(name, lines)
        assert code == 1, f"{name} exited {code}: {err[-2000:]}"
        assert lines and lines[-1].startswith(
            f"fleetrun: exit 1: membership change: host {h3.addr} (worker "), err[-3000:]
        assert lines[-1].endswith(
            f") was lost from job 'ctr-lost' at etcd {etcd.endpoint}: its registration expired "
            "(no keepalive for 2 s: the host is down, cut off, or its fleetrun was killed); "
            "only --max_restarts re-forms the job without it"), lines[-1]
        assert "stopped by fleetrun (SIGTERM) after a membership change of the job" in err
    etcd.stop()
    assert cluster.leftovers() == {}
