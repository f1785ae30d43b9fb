"""fleetrun --hosts over ssh on a cluster of network namespaces (tests/cluster/netns.py).

Hosts h1..h3 run the job; h4 runs the dispatcher (the root namespace cannot reach the
hosts). Every host shares this machine's filesystem, so --remote_dir has {host} in it
and each host gets its own copy of the workspace.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(REPO, "tests", "cluster", "job")


def dispatcher_env():
    # The remote processes get PYTHONPATH and NUMBA_* from the dispatcher (forwarded).
    env = dict(os.environ, PYTHONPATH=REPO)
    env.setdefault("NUMBA_CACHE_DIR", "/tmp/numba-cache")
    return env


class Setup:
    def __init__(self, cluster, tmp_path):
        self.cluster = cluster
        self.hosts = cluster.hosts[:3]
        self.dispatcher = cluster.hosts[3]
        self.work = tmp_path / "here"
        self.work.mkdir()
        self.job = tmp_path / "job"
        shutil.copytree(JOB, self.job, ignore=shutil.ignore_patterns(".fleet_keys", "log", "model"))
        self.remote = os.path.join(cluster.tmpdir, "ws", "{host}")

    def argv(self, *options, hosts=None, script_args=("30", "0.02", "-1")):
        hosts = hosts or ",".join(h.addr for h in self.hosts)
        return [sys.executable, "-m", "fleet.launch", "--hosts", hosts,
                "--ssh_config", self.cluster.ssh_config, "--kill_timeout", "3",
                *options, "train.py", *script_args]

    def dispatch(self, *options, timeout=90, **kw):
        argv = self.argv("--dispatch", str(self.job), "--remote_dir", self.remote, *options, **kw)
        started = time.monotonic()
        r = self.dispatcher.run(argv, timeout, cwd=self.work, env=dispatcher_env())
        r.seconds = time.monotonic() - started
        return r

    def workspace_of(self, host):
        return self.remote.replace("{host}", host.addr)


@pytest.fixture
def setup(cluster_factory, tmp_path):
    return Setup(cluster_factory(4, sshd=True), tmp_path)


def wait_empty(cluster, seconds):
    deadline = time.monotonic() + seconds
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    return cluster.leftovers()


def test_preflight_names_every_failing_host_and_starts_nothing(setup):
    c = setup.cluster
    h1, h2, h3 = setup.hosts
    nobody = c.subnet.rsplit(".", 1)[0] + ".200"   # an address of the subnet, no host there
    open(h2.authorized_keys, "w").close()          # h2 refuses the key
    h3.stop_sshd()                                 # h3: connection refused
    r = setup.dispatch(hosts=f"{h1.addr},{nobody},{h2.addr},{h3.addr}")
    assert r.returncode == 2, r.stderr
    assert "preflight failed on 3 hosts; nothing was started" in r.stderr
    assert f"host {nobody}: unreachable" in r.stderr
    assert f"host {h2.addr}: ssh authentication refused" in r.stderr
    assert f"host {h3.addr}: connection refused" in r.stderr
    assert f"host {h1.addr}" not in r.stderr.split("nothing was started")[1]
    assert r.seconds < PREFLIGHT_BOUND, r.seconds
    assert not os.path.exists(setup.workspace_of(h1))   # nothing copied
    h3.start_sshd()

    r = setup.dispatch("--python", "/nonexistent/python", hosts=h1.addr)
    assert r.returncode == 2
    assert f"host {h1.addr}: python '/nonexistent/python' not found there" in r.stderr
    # a python without fleet (the system's; --env clears the forwarded PYTHONPATH)
    r = setup.dispatch("--python", "/usr/bin/python3", "--env", "PYTHONPATH=", hosts=h1.addr)
    assert r.returncode == 2
    assert re.search(rf"host {re.escape(h1.addr)}: fleet is not importable by /usr/bin/python3 "
                     r"\(python [0-9.]+\): ModuleNotFoundError: No module named 'fleet'", r.stderr)
    assert c.leftovers() == {}


# The preflight is bounded at 10 s in total; with ssh's start-up and the dispatcher's
# own python start, the whole refused run ends well within this.
PREFLIGHT_BOUND = 20


def test_a_job_on_three_hosts_dispatched_from_a_fourth(setup):
    r = setup.dispatch()
    assert r.returncode == 0, r.stderr
    # worker 0's output streams to the dispatcher's stdout; the others' stay in their logs
    assert "worker 0 step 29 loss" in r.stdout and "worker 1 step" not in r.stdout
    for i, h in enumerate(setup.hosts):
        logs = setup.work / "log" / h.addr
        assert sorted(os.listdir(logs)) == ["fleetrun-result.json", "fleetrun.log",
                                            f"serverlog.{i}", f"workerlog.{i}"]
        assert f"worker {i} step 29 loss" in (logs / f"workerlog.{i}").read_text()
        assert f"[{h.addr}] fleetrun: started server {i}, worker {i}" in r.stderr
        # the job was encrypted: its keys went with the workspace, owner-only
        keys = os.path.join(setup.workspace_of(h), ".fleet_keys")
        assert os.stat(keys).st_mode & 0o777 == 0o700
        assert os.stat(os.path.join(keys, "server.key_secret")).st_mode & 0o777 == 0o600
    assert os.path.isdir(os.path.join(setup.workspace_of(setup.hosts[0]), "model"))
    assert "fleetrun: done: every host's fleetrun exited 0" in r.stderr
    copied = re.findall(r"(\d+) files? copied \(rsync", r.stderr)
    assert len(copied) == 3 and all(int(n) > 0 for n in copied), r.stderr
    assert wait_empty(setup.cluster, 5) == {}

    # a re-run copies nothing: rsync skips every unchanged file (the keys are reused)
    r = setup.dispatch()
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("0 files copied (rsync") == 3, r.stderr
    assert "CURVE keys: reusing" in r.stderr


def test_a_failing_worker_ends_every_host_and_names_the_cause(setup):
    h2 = setup.hosts[1]
    r = setup.dispatch(script_args=("200", "0.05", "1"))
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"fleetrun: exit 1: host {re.escape(h2.addr)} worker 1 \(pid \d+\) "
                        r"exited with code 1: ValueError: planted failure of worker 1 at step 2; "
                        rf"log: log/{re.escape(h2.addr)}/workerlog\.1", last), last
    assert "ValueError: planted failure" in (setup.work / "log" / h2.addr / "workerlog.1").read_text()
    assert wait_empty(setup.cluster, 5) == {}


def test_ctrl_c_of_the_dispatcher_ends_every_process_on_every_host(setup):
    argv = setup.argv("--dispatch", str(setup.job), "--remote_dir", setup.remote,
                      script_args=("100000", "0.05", "-1"))
    proc = setup.dispatcher.popen(argv, cwd=setup.work, env=dispatcher_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    seen = ""
    while "worker 0 step 5 " not in seen:
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, f"training did not start: {seen[-2000:]}"
        seen += line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "received SIGINT; stopping every host" in err
    for h in setup.hosts:
        assert f"host {h.addr}: its fleetrun exited with code" in err or \
            f"host {h.addr}: ssh exited" in err, err
    # kill_timeout 3 s + a few seconds
    assert wait_empty(setup.cluster, 6) == {}
