"""Killed processes under fleetrun: the survivors notice within the heartbeat bound,
each says in its own log what it saw, and fleetrun names the killed process as the cause.

Jobs run tests/integration/scripts/live_model.py with short heartbeats (200 ms, timeout
2 s) and train until something fails (--forever); a process is killed with SIGKILL once
every worker has trained a step.
"""
import os
import re
import signal
import time

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "live_model.py")
HEARTBEAT_MS, TIMEOUT_MS = 200, 2000
BOUND_S = TIMEOUT_MS / 1000 + 6.0  # the timeout, a few heartbeats and a loaded machine's margin


@pytest.fixture
def env(clean_env):
    return dict(clean_env, FLEET_HEARTBEAT_MS=str(HEARTBEAT_MS), FLEET_HEARTBEAT_TIMEOUT_MS=str(TIMEOUT_MS))


class Job:
    """A live_model.py job started by fleetrun, with the pids its processes recorded."""

    def __init__(self, tmp_path, start_fleetrun, env, mode, servers, workers, *script_args):
        self.out = tmp_path / "out"
        self.log = tmp_path / "log"
        self.out.mkdir()
        # A grace longer than the heartbeat timeout: these tests watch the processes stop by
        # themselves (as they must without fleetrun), not fleetrun stopping them.
        self.launcher = start_fleetrun("--server_num", servers, "--worker_num", workers, "--log_dir", self.log,
                                       "--failure_grace", 10, SCRIPT, mode, self.out, 8, 4, *script_args, env=env)

    def pid(self, tag):
        return int((self.out / f"{tag}.pid").read_text())

    def training(self, workers):
        return all((self.out / f"worker{i}.training").exists() for i in range(workers))

    def worker_log(self, i):
        return (self.log / f"workerlog.{i}").read_text()

    def server_log(self, i):
        return (self.log / f"serverlog.{i}").read_text()


def _kill_and_time_the_others(victim_pid, others, pid_alive, limit):
    """SIGKILLs victim_pid; returns {pid: seconds from the kill until it exited}."""
    os.kill(victim_pid, signal.SIGKILL)
    killed = time.monotonic()
    exited = {}
    while len(exited) < len(others):
        now = time.monotonic()
        for pid in others:
            if pid not in exited and not pid_alive(pid):
                exited[pid] = now - killed
        assert now - killed < limit, f"still running {limit} s after the kill: {set(others) - set(exited)}"
        time.sleep(0.02)
    return exited


@pytest.mark.parametrize("mode, servers", [("async", 1), ("sync", 2)])
def test_a_server_killed_mid_training_is_named_by_every_worker_within_the_bound_and_by_fleetrun(
        tmp_path, start_fleetrun, procs, wait_for, pid_alive, env, mode, servers):
    job = Job(tmp_path, start_fleetrun, env, mode, servers, 2, "--forever", "--step-sleep", "0.01")
    wait_for(lambda: job.training(2), 90, "both workers to train a step")
    victim = job.pid("server0")
    workers = [job.pid("worker0"), job.pid("worker1")]
    seconds = _kill_and_time_the_others(victim, workers, pid_alive, BOUND_S)
    out, err = procs.communicate(job.launcher, 60)
    assert job.launcher.returncode == 1, err
    endpoint = re.search(r"started \d servers? \((127\.0\.0\.1:\d+)", err).group(1)
    for i, pid in enumerate(workers):
        log = job.worker_log(i)
        assert (f"fleet.errors.ServerLostError: server {endpoint} stopped answering heartbeats: none for "
                in log), log[-3000:]
        assert f"(FLEET_HEARTBEAT_TIMEOUT_MS={TIMEOUT_MS})" in log
        # it exited because of the heartbeat timeout, not at once and not at the RPC timeout
        assert TIMEOUT_MS / 1000 - 0.5 <= seconds[pid] < BOUND_S, seconds
    assert (f"the root cause: server 0 (pid {victim}) was killed by SIGKILL, the first process to "
            "fail") in err
    assert f"exit 1: server 0 (pid {victim}) was killed by SIGKILL; full log:" in err
    consequences = err.split("failed after the root cause (consequences, not the cause):\n")[1]
    for i, pid in enumerate(workers):
        assert re.search(rf"    worker {i} \(pid {pid}\) exited with code 1 \d+\.\d s later: "
                         rf"fleet.errors.ServerLostError: server {endpoint} stopped answering heartbeats",
                         consequences), consequences
    if servers == 2:  # the surviving server lost both workers: it ends by itself, with an error
        assert "fleet.errors.FleetTimeoutError: server 127.0.0.1:" in job.server_log(1)
        assert "was lost: it stopped sending heartbeats" in job.server_log(1)
        assert f"server 1 (pid {job.pid('server1')}) exited with code 1" in consequences


def test_a_worker_killed_in_sync_mode_fails_the_step_of_the_other_naming_it_and_the_servers_exit(
        tmp_path, start_fleetrun, procs, wait_for, pid_alive, env):
    job = Job(tmp_path, start_fleetrun, env, "sync", 2, 2, "--forever", "--step-sleep", "0.01")
    wait_for(lambda: job.training(2), 90, "both workers to train a step")
    victim = job.pid("worker1")
    others = {"worker0": job.pid("worker0"), "server0": job.pid("server0"), "server1": job.pid("server1")}
    seconds = _kill_and_time_the_others(victim, list(others.values()), pid_alive, BOUND_S)
    out, err = procs.communicate(job.launcher, 60)
    assert job.launcher.returncode == 1, err
    assert TIMEOUT_MS / 1000 - 0.5 <= seconds[others["worker0"]] < BOUND_S, seconds
    log = job.worker_log(0)
    assert "fleet.errors.ServerError: server 127.0.0.1:" in log, log[-3000:]
    assert re.search(r"failed: worker 1 was lost: it stopped sending heartbeats \d+\.\d s ago "
                     rf"\(FLEET_HEARTBEAT_TIMEOUT_MS={TIMEOUT_MS}\) without calling fleet.stop_worker\(\)", log)
    for i in range(2):
        server_log = job.server_log(i)
        assert "fleet.errors.FleetTimeoutError: server 127.0.0.1:" in server_log, server_log[-3000:]
        assert "stopped: worker 1 was lost: it stopped sending heartbeats" in server_log
    assert (f"the root cause: worker 1 (pid {victim}) was killed by SIGKILL, the first process to "
            "fail") in err
    assert f"exit 1: worker 1 (pid {victim}) was killed by SIGKILL; full log:" in err
    consequences = err.split("failed after the root cause (consequences, not the cause):\n")[1]
    for name, role in (("worker0", "worker 0"), ("server0", "server 0"), ("server1", "server 1")):
        assert f"{role} (pid {others[name]}) exited with code 1" in consequences


def test_a_port_taken_when_the_server_starts_is_named_by_the_server_and_by_fleetrun(
        tmp_path, start_fleetrun, procs, env):
    env = dict(env, FLEET_CONNECT_TIMEOUT_MS="3000")
    job = Job(tmp_path, start_fleetrun, env, "sync", 1, 1, "--occupy-own-port")
    out, err = procs.communicate(job.launcher, 60)
    assert job.launcher.returncode == 1, err
    endpoint = re.search(r"started 1 server \((127\.0\.0\.1:(\d+))", err)
    host_port, port = endpoint.group(1), endpoint.group(2)
    message = (f"fleet.errors.TransportError: cannot bind {host_port}: port {port} is already in use. Stop the "
               f"process holding it")
    assert message in job.server_log(0)
    assert f"exit 1: server 0 (pid {job.pid('server0')}) exited with code 1: {message}" in err
    # the worker gave up waiting for it, naming it, and is listed as a consequence
    assert f"servers ['{host_port}'] did not answer within 3000 ms" in job.worker_log(0)
    assert f"worker 0 (pid {job.pid('worker0')}) exited with code 1" in err.split("after the root cause")[1]
