"""One CTR-DNN job across three hosts, each started by the same fleetrun command on that
host (servers on two hosts, workers on all three), encrypted with the job's keys.

Sync must equal the same job on one host to float tolerance (same servers, workers, data
shards and seed); async must be within 0.01 test AUC of it. A host whose link is cut mid-
training is named by the survivors within the heartbeat bound, and every fleetrun ends
non-zero with nothing left running in any namespace. A process without the job's keys,
on another host, gets nothing and changes nothing.
"""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.cluster import ctr

pytestmark = pytest.mark.slow


def _endpoints(cluster):
    h1, h2, h3 = cluster.hosts[:3]
    servers = [f"{h.addr}:{ctr.PORT_SERVER}" for h in (h1, h2)]
    workers = [f"{h.addr}:{ctr.PORT_WORKER}" for h in (h1, h2, h3)]
    return ",".join(servers), ",".join(workers)


def _start_on_every_host(cluster, tmp_path, data, strategy, keys, epochs=None, env=None,
                         hosts=None):
    """The same fleetrun command on each host; returns (model dir, {host: (Popen, dir)})."""
    servers, workers = _endpoints(cluster)
    model = tmp_path / f"multi-{strategy}"
    started = {}
    for host in hosts or cluster.hosts:
        work = tmp_path / host.name
        work.mkdir(exist_ok=True)
        argv = [sys.executable, "-m", "fleet.launch", "--servers", servers, "--workers", workers,
                "--keys_dir", keys, "--log_dir", work / "log", "--result_json",
                work / "result.json", "--timeout", 240,
                *ctr.train_args(data, model, strategy, epochs)]
        started[host.name] = (host.popen(argv, cwd=work, env=env or ctr.clean_env(),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True), work)
    return model, started


def _finish(started, timeout):
    results = {}
    deadline = time.monotonic() + timeout
    for name, (proc, work) in started.items():
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        results[name] = (proc.returncode, out, err, work)
    return results


@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_ctr_dnn_across_three_hosts_matches_the_same_job_on_one_host(
        cluster_factory, tmp_path, ctr_data, ctr_keys, strategy):
    cluster = cluster_factory(3)
    model, started = _start_on_every_host(cluster, tmp_path, ctr_data, strategy, ctr_keys)
    results = _finish(started, 200)
    for name, (code, out, err, work) in results.items():
        assert code == 0, f"{name}: {err[-3000:]}"
    h1, h2, h3 = cluster.hosts
    assert f"started server 0, worker 0 on this host ({h1.addr})" in results["h1"][2]
    assert f"started server 1, worker 1 on this host ({h2.addr})" in results["h2"][2]
    assert f"started worker 2 on this host ({h3.addr})" in results["h3"][2]
    assert "epoch 0: 20000 examples" in results["h1"][1]  # worker 0's output, streamed on h1
    assert results["h2"][1] == "" and results["h3"][1] == ""
    # the servers bound the hosts' own addresses, never loopback
    result = json.loads((results["h2"][3] / "result.json").read_text())
    assert [p["endpoint"] for p in result["processes"]] == [f"{h2.addr}:{ctr.PORT_SERVER}",
                                                            f"{h2.addr}:{ctr.PORT_WORKER}"]
    assert cluster.leftovers() == {}
    one = ctr.one_host(tmp_path, ctr_data, strategy)
    ctr.assert_matches_one_host(model, one, ctr_data, strategy, "3 hosts, fleetrun on each")


def test_a_host_cut_off_mid_training_is_named_by_every_survivor(cluster_factory, tmp_path,
                                                                ctr_data, ctr_keys):
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    env = ctr.clean_env(FLEET_HEARTBEAT_MS="500", FLEET_HEARTBEAT_TIMEOUT_MS="3000",
                        FLEET_RPC_TIMEOUT_MS="20000")
    model, started = _start_on_every_host(cluster, tmp_path, ctr_data, "async", ctr_keys,
                                          epochs=400, env=env)
    log0 = tmp_path / "h1" / "log" / "workerlog.0"
    deadline = time.monotonic() + 60
    while "batch 10," not in (log0.read_text() if log0.exists() else ""):
        assert time.monotonic() < deadline, "worker 0 did not reach batch 10 within 60 s"
        assert all(p.poll() is None for p, _ in started.values()), "a fleetrun ended early"
        time.sleep(0.2)
    cut = time.monotonic()
    h2.link_down()
    results = _finish(started, 60)
    took = time.monotonic() - cut
    for name, (code, out, err, work) in results.items():
        assert code == 1, f"{name} exited {code}: {err[-2000:]}"
    # survivors: h1 (server 0, worker 0) and h3 (worker 2) name h2's address
    for name in ("h1", "h3"):
        err = results[name][2]
        exit_line = [line for line in err.splitlines() if line.startswith("fleetrun: exit 1: ")]
        print(name, exit_line)
        assert exit_line and h2.addr in exit_line[0], f"{name} did not name {h2.addr}:\n{err[-3000:]}"
    server0 = (tmp_path / "h1" / "log" / "serverlog.0").read_text()
    assert "worker 1 was lost: it stopped sending heartbeats" in server0
    assert f"it is probably dead, or its host {h2.addr} unreachable" in server0
    # the bound: heartbeat timeout 3 s, failure grace 3 s, SIGTERM; generous for a busy CI
    assert took < 30, f"the job took {took:.1f} s to end after the cut"
    assert cluster.leftovers() == {}


INTRUDER = """
import json, sys, time
import numpy as np
from fleet.errors import FleetTimeoutError, ServerError
from fleet.transport import Client
answers, timeouts = [], 0
deadline = time.monotonic() + float(sys.argv[2])
client = Client(sys.argv[1], 0, timeout_ms=1000)
while time.monotonic() < deadline:
    try:
        big = np.full((273, 400), 1e6, dtype=np.float32)
        answers.append(repr(client.request("push", names=["fc_0.w_0@GRAD"], arrays=[big])))
    except ServerError as e:
        answers.append(str(e))
    except FleetTimeoutError:
        timeouts += 1
print(json.dumps({"answers": answers, "timeouts": timeouts}))
"""


def test_a_process_without_the_keys_gets_nothing_and_changes_nothing(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    """While a sync job trains on h1-h3, h4 (no keys) pushes huge gradients at server 0 for
    6 s and then runs the training script as "worker 0": no request gets an answer, its
    worker fails naming the servers and CURVE, and the job's parameters equal those of the
    same job on one host."""
    cluster = cluster_factory(4)
    intruder_host = cluster.hosts[3]
    servers, workers = _endpoints(cluster)
    model, started = _start_on_every_host(cluster, tmp_path, ctr_data, "sync", ctr_keys,
                                          hosts=cluster.hosts[:3])
    raw = intruder_host.run([sys.executable, "-c", INTRUDER, servers.split(",")[0], 6], 60,
                            env=ctr.clean_env())
    assert raw.returncode == 0, raw.stderr[-2000:]
    seen = json.loads(raw.stdout.strip().splitlines()[-1])
    assert seen["answers"] == [] and seen["timeouts"] >= 3, seen
    intruder_env = ctr.clean_env(TRAINING_ROLE="TRAINER", PADDLE_PSERVERS_IP_PORT_LIST=servers,
                                 PADDLE_TRAINER_ENDPOINTS=workers, PADDLE_TRAINERS_NUM="3",
                                 PADDLE_TRAINER_ID="0", FLEET_CONNECT_TIMEOUT_MS="5000")
    intruder = intruder_host.run([sys.executable, *ctr.train_args(ctr_data, tmp_path / "stolen",
                                                                  "sync")],
                                 60, cwd=tmp_path, env=intruder_env)
    results = _finish(started, 200)
    for name, (code, out, err, work) in results.items():
        assert code == 0, f"{name}: {err[-3000:]}"
    assert intruder.returncode != 0
    error = intruder.stderr.strip().splitlines()[-1]
    print(error)
    assert error.startswith("fleet.errors.FleetTimeoutError: "), intruder.stderr[-2000:]
    assert "CURVE" in error and servers.split(",")[0] in error, error
    assert not (tmp_path / "stolen").exists()
    one = ctr.one_host(tmp_path, ctr_data, "sync")
    ctr.assert_matches_one_host(model, one, ctr_data, "sync", "3 hosts with an intruder")
    assert cluster.leftovers() == {}
