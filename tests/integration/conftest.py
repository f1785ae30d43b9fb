"""Fixtures for integration tests: run fleetrun, wait for conditions, check processes.

Every process goes through the ``procs`` fixture of tests/conftest.py, so it is killed
and reaped at teardown whatever the test did; every wait has a timeout that says what
was being waited for.
"""
import dataclasses
import os
import subprocess
import sys
import time

import pytest

from tests import etcd_server

FLEETRUN = (sys.executable, "-m", "fleet.launch")


@dataclasses.dataclass
class RunResult:
    """What a finished fleetrun printed and returned."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def pid_alive(pid):
    """True if pid is a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate, timeout, what):
    """Poll predicate every 20 ms until it is true.

    Raises:
        AssertionError: not true after timeout seconds; the message says what.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def fleetrun(procs, tmp_path):
    """run(*args, timeout=30, env=None) -> RunResult of `python -m fleet.launch *args`.

    Runs in tmp_path with output captured; fails the test if it outlives the timeout.
    """
    def run(*args, timeout=30, env=None):
        started = time.monotonic()
        proc = procs.start([*FLEETRUN, *map(str, args)], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = procs.communicate(proc, timeout)
        return RunResult(proc.returncode, out, err, time.monotonic() - started)

    return run


@pytest.fixture
def start_fleetrun(procs, tmp_path):
    """start(*args, env=None) -> Popen of `python -m fleet.launch *args` in tmp_path.

    stdout and stderr are pipes (text); the caller waits with procs.communicate.
    """
    def start(*args, env=None):
        return procs.start([*FLEETRUN, *map(str, args)], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    return start


@pytest.fixture(name="wait_for")
def wait_for_fixture():
    """The wait_for(predicate, timeout, what) helper."""
    return wait_for


@pytest.fixture(name="pid_alive")
def pid_alive_fixture():
    """The pid_alive(pid) helper."""
    return pid_alive


@pytest.fixture
def clean_env():
    """os.environ without any role variable, for starting launchers deterministically."""
    names = ("TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINER_ENDPOINTS",
             "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT",
             "PADDLE_TRAINING_ROLE", "PADDLE_CURRENT_ENDPOINT", "PADDLE_PSERVER_ID")
    return {k: v for k, v in os.environ.items() if k not in names}

# tests/integration/scripts holds the scripts the tests run (one is named test_dist_fleet_base.py
# after Paddle's module it rebuilds): not test modules.
collect_ignore = ["scripts"]


@pytest.fixture
def etcd(tmp_path, free_port):
    """A real etcd (Debian's etcd-server, /usr/bin/etcd) on loopback at free ports, stopped
    at teardown; a machine without it fails the test saying how to install it."""
    problem = etcd_server.missing()
    if problem:
        pytest.fail(problem, pytrace=False)
    server = etcd_server.EtcdServer("127.0.0.1", free_port(), free_port(), tmp_path / "etcd")
    try:
        yield server.start()
    finally:
        server.stop()
