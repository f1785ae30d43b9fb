"""An elastic CTR-DNN job across three hosts, started without fleetrun (each process with
FLEET_ELASTIC and its role variables, as a scheduler would): a worker joins on a third
host mid-pass, a worker's host (on a slow link, so the pass is still running) is cut off,
and the job finishes with every example of the pass acknowledged by the servers' work
queue."""
import json
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cluster import ctr

pytestmark = pytest.mark.slow

STATUS = textwrap.dedent("""
    import json, sys
    from fleet.transport import Client
    c = Client(sys.argv[1], 999, timeout_ms=3000)
    print(json.dumps(c.request("units_status").meta["passes"]))
    c.close()
""")


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _env(cluster, role, index=None, host=None):
    servers = f"{cluster.hosts[0].addr}:{ctr.PORT_SERVER}"
    workers = ",".join(f"{h.addr}:{ctr.PORT_WORKER}" for h in (cluster.hosts[1], cluster.hosts[2],
                                                                  cluster.hosts[0]))
    env = ctr.clean_env(FLEET_ELASTIC="2:3", FLEET_HEARTBEAT_MS="200", FLEET_HEARTBEAT_TIMEOUT_MS="2000",
                        FLEET_ELASTIC_UNIT_BYTES=str(128 << 10), PADDLE_PSERVERS_IP_PORT_LIST=servers,
                        PADDLE_TRAINER_ENDPOINTS=workers, PADDLE_TRAINERS_NUM="3",
                        TRAINING_ROLE="PSERVER" if role == "server" else "TRAINER")
    if role == "server":
        env.update(POD_IP=cluster.hosts[0].addr, PADDLE_PORT=str(ctr.PORT_SERVER))
    else:
        env.update(PADDLE_TRAINER_ID=str(index), POD_IP=host.addr, PADDLE_PORT=str(ctr.PORT_WORKER))
    return env


def test_a_worker_joins_on_another_host_and_a_cut_off_host_loses_only_its_worker(
        cluster_factory, tmp_path, ctr_data):
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    # h3's worker trains on a slow link (each step moves megabytes), so it still holds a
    # unit when the others are done: uncapped, the whole pass took ~4 s on 2 cores, and it
    # could end before the test, polling through subprocesses, cut h3 off
    cluster.shape("20mbit", hosts=[h3])
    model = tmp_path / "model"
    args = [sys.executable, "-u", *map(str, ctr.train_args(ctr_data, model, "async", 1))]
    procs, logs = {}, {}

    def start(name, host, role, index=None):
        logs[name] = tmp_path / f"{name}.log"
        with open(logs[name], "wb") as out:
            procs[name] = host.popen(args, cwd=ctr.EXAMPLE, env=_env(cluster, role, index, host), stdout=out,
                                     stderr=subprocess.STDOUT)

    def queue():
        r = h1.run([sys.executable, "-c", STATUS, f"{h1.addr}:{ctr.PORT_SERVER}"], timeout=20,
                   env=ctr.clean_env())
        return {int(k): v for k, v in json.loads(r.stdout).items()} if r.returncode == 0 else {}

    start("server", h1, "server")
    start("worker0", h2, "worker", 0)
    start("worker1", h3, "worker", 1)
    _wait_for(lambda: 0 in queue(), 60, "the workers to open the pass")
    start("worker2", h1, "worker", 2)  # a third host's worker joins the running job
    def joined_while_held():
        status = queue().get(0, {})  # one look: the two facts at the same moment
        return "2" in status.get("workers", {}) and status.get("held_by", {}).get("1", 0) >= 1
    _wait_for(joined_while_held, 60, "worker 2 to acknowledge a unit while worker 1 holds one")
    h3.link_down()
    for name in ("server", "worker0", "worker2"):
        assert procs[name].wait(timeout=120) == 0, logs[name].read_text()[-3000:]
    assert procs["worker1"].wait(timeout=30) != 0  # it lost the server: its own failure
    server_log = logs["server"].read_text()
    assert "worker 1 was lost: it stopped sending heartbeats" in server_log
    assert "the servers forget it (elastic job)" in server_log
    status = [json.loads(line.split(" work queue: ", 1)[1]) for line in server_log.splitlines()
              if " work queue: {" in line][0]
    assert status["acked"] == status["units"] and status["examples"] == 60000, status
    assert status["returned_from"] == [1] and 1 <= status["returned_units"] <= 2, status
    assert "worker 2 joined" in server_log
    h3.link_up()
    assert cluster.leftovers() == {}
