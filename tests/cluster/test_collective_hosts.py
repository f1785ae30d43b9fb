"""CTR-DNN in collective mode (no servers) on three hosts, one worker each, started (a) by
the same `fleetrun --collective --workers ...` command on each host and (b) by
`fleetrun --hosts ... --collective` over ssh from a fourth host: both end with the dense
parameters of the same job on one host (`fleetrun --collective --worker_num 3`) to float
tolerance, and every worker's parameters identical (the CRC32 check of stop_worker). A host
cut off mid-training is named by the others within the heartbeat bound, every fleetrun
ends non-zero and nothing is left running on any host."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.cluster import ctr

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IDENTICAL = re.compile(r"the (\d+) all-reduced parameters are identical on every worker \(CRC32 ([0-9a-f]{8})\)")


def _crc_of(log_path):
    """The CRC32 the worker's stop_worker logged after checking every worker had it."""
    found = IDENTICAL.findall(log_path.read_text())
    assert len(found) == 1, f"{log_path}: no (or more than one) CRC32 check line"
    return found[0][1]


def _per_host(cluster, tmp_path, data, keys, model):
    """(a): the same fleetrun --collective command on h1, h2 and h3; returns each host's
    (code, stdout, stderr, work dir)."""
    workers = ",".join(f"{h.addr}:{ctr.PORT_WORKER}" for h in cluster.hosts[:3])
    started = {}
    for host in cluster.hosts[:3]:
        work = tmp_path / host.name
        work.mkdir()
        argv = [sys.executable, "-m", "fleet.launch", "--collective", "--workers", workers,
                "--keys_dir", keys, "--log_dir", work / "log", "--timeout", 240,
                *ctr.train_args(data, model, "collective")]
        started[host.name] = (host.popen(argv, cwd=work, env=ctr.clean_env(), stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True), work)
    results, deadline = {}, time.monotonic() + 200
    for name, (proc, work) in started.items():
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        results[name] = (proc.returncode, out, err, work)
    return results


class Dispatch:
    """(b): fleetrun --hosts h1,h2,h3 --collective from h4, the CTR-DNN example as workspace."""

    def __init__(self, cluster, tmp_path, name):
        self.cluster = cluster
        self.job = tmp_path / "job"
        if not self.job.exists():
            self.job.mkdir()
            for entry in os.listdir(ctr.EXAMPLE):
                if entry.endswith(".py"):
                    shutil.copy(os.path.join(ctr.EXAMPLE, entry), self.job / entry)
        self.here = tmp_path / name
        self.here.mkdir()
        self.remote = os.path.join(cluster.tmpdir, name, "{host}")

    def argv(self, data, model, epochs=None):
        hosts = ",".join(h.addr for h in self.cluster.hosts[:3])
        args = ctr.train_args(data, model, "collective", epochs)[1:]  # the script is job/train.py
        return [sys.executable, "-m", "fleet.launch", "--hosts", hosts, "--collective",
                "--worker_num_per_host", 1, "--ssh_config", self.cluster.ssh_config, "--kill_timeout", 3,
                "--dispatch", self.job, "--remote_dir", self.remote, "--start_port", ctr.PORT_WORKER,
                *ctr.same_blas_kernels(), "train.py", *args]

    def workspace_log(self, host):
        """The log directory of the host's fleetrun, in its copy of the workspace."""
        return os.path.join(self.remote.replace("{host}", host.addr), "log", host.addr)


def test_collective_ctr_dnn_on_three_hosts_per_host_and_dispatched_matches_one_host(
        cluster_factory, tmp_path, ctr_data, ctr_keys):
    cluster = cluster_factory(4, sshd=True)
    h1, h2, h3, h4 = cluster.hosts

    per_host = tmp_path / "model-per-host"
    results = _per_host(cluster, tmp_path, ctr_data, ctr_keys, per_host)
    for name, (code, out, err, work) in results.items():
        assert code == 0, f"{name}: {err[-3000:]}"
    for i, h in enumerate((h1, h2, h3)):
        assert (f"started worker {i} on this host ({h.addr}) of a collective job of 3 workers on several "
                "hosts") in results[h.name][2]
    assert "epoch 0: 20000 examples" in results["h1"][1]  # worker 0's output, streamed on h1
    assert results["h2"][1] == "" and results["h3"][1] == ""
    crcs = {_crc_of(tmp_path / h.name / "log" / f"workerlog.{i}") for i, h in enumerate((h1, h2, h3))}
    assert len(crcs) == 1, crcs
    assert cluster.leftovers() == {}

    dispatch = Dispatch(cluster, tmp_path, "dispatched")
    dispatched = tmp_path / "model-dispatched"
    r = h4.run(dispatch.argv(ctr_data, dispatched), 240, cwd=dispatch.here,
               env=ctr.clean_env(PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-4000:]
    assert "fleetrun: starting a collective job of 3 workers on 3 hosts" in r.stderr
    for i, h in enumerate((h1, h2, h3)):
        assert f"    {h.addr}: workers {i} ({h.addr}:{ctr.PORT_WORKER})" in r.stderr
        logs = dispatch.here / "log" / h.addr
        assert sorted(os.listdir(logs)) == ["fleetrun-result.json", "fleetrun.log", f"workerlog.{i}"]
        crcs.add(_crc_of(logs / f"workerlog.{i}"))
    assert "epoch 0: 20000 examples" in r.stdout  # worker 0's output, from h1
    assert "fleetrun: done: every host's fleetrun exited 0" in r.stderr
    print("CRC32 of the parameters (per-host run, dispatched run):", sorted(crcs))
    assert cluster.leftovers() == {}

    one = ctr.one_host(tmp_path, ctr_data, "collective")
    ctr.assert_matches_one_host(per_host, one, ctr_data, "collective", "3 hosts, fleetrun on each")
    ctr.assert_matches_one_host(dispatched, one, ctr_data, "collective", "3 hosts over ssh")


def test_a_host_cut_off_from_a_collective_job_is_named_and_every_fleetrun_ends(
        cluster_factory, tmp_path, ctr_data):
    cluster = cluster_factory(4, sshd=True)
    h1, h2, h3, h4 = cluster.hosts
    dispatch = Dispatch(cluster, tmp_path, "cut")
    env = ctr.clean_env(PYTHONPATH=REPO, FLEET_HEARTBEAT_MS="500", FLEET_HEARTBEAT_TIMEOUT_MS="3000",
                        FLEET_RPC_TIMEOUT_MS="20000")  # FLEET_* go to every host
    out_path, err_path = tmp_path / "dispatcher.out", tmp_path / "dispatcher.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = h4.popen(dispatch.argv(ctr_data, tmp_path / "model", epochs=400), cwd=dispatch.here,
                        env=env, stdout=out, stderr=err)
    deadline = time.monotonic() + 90
    while "batch 10," not in out_path.read_text():
        assert time.monotonic() < deadline, f"worker 0 did not reach batch 10: {err_path.read_text()[-3000:]}"
        assert proc.poll() is None, f"the dispatcher ended early: {err_path.read_text()[-3000:]}"
        time.sleep(0.2)
    cut = time.monotonic()
    h2.link_down()
    named = None  # seconds from the cut until the dispatcher saw a survivor's fleetrun fail
    while proc.poll() is None:
        assert time.monotonic() - cut < 60, f"the dispatcher did not end within 60 s of the cut"
        if named is None and "; stopping every other host" in err_path.read_text():
            named = time.monotonic() - cut
        time.sleep(0.2)
    stderr = err_path.read_text()
    if named is None and "; stopping every other host" in stderr:
        named = time.monotonic() - cut
    print(stderr[-3000:])
    assert proc.returncode == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("fleetrun: exit 1: host ") and f"({h2.addr}:{ctr.PORT_WORKER}) of the worker group " \
        "is lost" in last, last
    # the survivors (workers 0 and 2): the first to notice names rank 1 on h2 as lost, bounded
    # by the heartbeat timeout; the dispatcher may stop the other before it notices too
    named = 0
    for i, h in ((0, h1), (2, h3)):
        log = (dispatch.here / "log" / h.addr / f"workerlog.{i}").read_text()
        result = json.loads((dispatch.here / "log" / h.addr / "fleetrun-result.json").read_text())
        assert result["exit_code"] != 0, result
        if re.search(rf"rank 1 \({re.escape(h2.addr)}:{ctr.PORT_WORKER}\) of the worker group is lost: .*"
                     r"FLEET_HEARTBEAT_TIMEOUT_MS=3000", log):
            named += 1
        else:
            ends = [p["end"] for p in result["processes"] if p["role"] == "worker"]
            assert ends and all("stopped by fleetrun" in e for e in ends), (ends, log[-2000:])
    assert named >= 1
    # h2's own fleetrun (unreachable now: its result stays there) ends non-zero by itself
    h2_result = os.path.join(dispatch.workspace_log(h2), "fleetrun-result.json")
    deadline = time.monotonic() + 30
    while not os.path.exists(h2_result):
        assert time.monotonic() < deadline, "h2's fleetrun did not end within 30 s of the dispatcher"
        time.sleep(0.2)
    with open(h2_result) as f:
        assert json.load(f)["exit_code"] != 0
    # the heartbeat timeout (3 s) and the survivor's failure grace (3 s): generous for a busy CI
    assert named is not None and named < 20, f"a survivor's failure was seen {named} s after the cut"
    deadline = time.monotonic() + 15  # h2's sshd drops the session of the dead client (ClientAlive)
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.leftovers() == {}
