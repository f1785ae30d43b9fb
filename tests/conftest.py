"""Fixtures shared by every test tier.

- ``free_port`` / ``free_ports``: 127.0.0.1 ports nobody listens on, never the same twice
  in one session.
- ``procs``: starts subprocesses in their own process groups and kills and reaps every one
  of them (and whatever they started) at teardown, pass or fail.
- A watchdog per test: a test that runs longer than FLEET_TEST_TIMEOUT seconds (default
  300) dumps every thread's stack, kills the processes ``procs`` started and ends the
  session, so CI fails with a traceback instead of hanging. Helpers still give every
  wait its own, much shorter, timeout.
"""
import faulthandler
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

_TEST_TIMEOUT = float(os.environ.get("FLEET_TEST_TIMEOUT", "300"))
_handed_out = set()
_live_groups = set()   # process groups started by `procs`, for the watchdog


def pick_free_ports(count, host="127.0.0.1"):
    """count distinct ports free on host now, none handed out before in this session.

    Args:
        count: how many ports.
        host: address to bind.

    Returns:
        A list of port numbers.
    """
    socks, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
            port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                ports.append(port)
        return ports
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def free_port():
    """A function returning one free 127.0.0.1 port per call."""
    return lambda: pick_free_ports(1)[0]


@pytest.fixture
def free_ports():
    """A function: free_ports(n) -> n distinct free 127.0.0.1 ports."""
    return pick_free_ports


class Processes:
    """Subprocesses of one test, each in its own session and process group.

    Not thread-safe: use from the test's thread.
    """

    def __init__(self):
        self._procs = []

    def start(self, args, **popen_kwargs):
        """Start a process (new session, stdin closed unless given). Returns the Popen."""
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(args, start_new_session=True, **popen_kwargs)
        self._procs.append(proc)
        _live_groups.add(proc.pid)
        return proc

    def wait(self, proc, timeout):
        """Wait for proc to exit; returns its exit code.

        Raises:
            AssertionError: it is still running after timeout seconds (it is killed);
                the message names its command line.
        """
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            raise AssertionError(f"process {proc.pid} ({_command(proc)}) did not exit within "
                                 f"{timeout} s; killed it") from None

    def communicate(self, proc, timeout, input=None):
        """proc.communicate with a timeout; returns (stdout, stderr).

        Raises:
            AssertionError: still running after timeout seconds (killed); the message
                names the command and holds what it printed so far.
        """
        try:
            return proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            out, err = proc.communicate()
            raise AssertionError(f"process {proc.pid} ({_command(proc)}) did not exit within "
                                 f"{timeout} s; killed it.\nstdout:\n{out}\nstderr:\n{err}"
                                 ) from None

    def kill(self, proc):
        """SIGKILL proc's whole process group and reap proc. Blocks up to 10 s."""
        _kill_group(proc.pid)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel; nothing more a test can do
        _live_groups.discard(proc.pid)

    def stop_all(self):
        """SIGTERM every group, SIGKILL after 3 s, reap everything."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and any(p.poll() is None for p in self._procs):
            time.sleep(0.02)
        for proc in self._procs:
            self.kill(proc)
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream is not None:
                    stream.close()


def _command(proc):
    args = proc.args
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture
def procs():
    """A Processes whose every process (and process group) is gone after the test."""
    p = Processes()
    try:
        yield p
    finally:
        p.stop_all()


def _on_hung_test(item):
    # Output is captured by pytest: release it so the report reaches the terminal / CI log.
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=False)
    sys.stderr.write(f"\n\nTEST TIMEOUT: {item.nodeid} ran longer than {_TEST_TIMEOUT:g} s "
                     "(FLEET_TEST_TIMEOUT); stacks of every thread:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    for pgid in list(_live_groups):
        _kill_group(pgid)
    sys.stderr.flush()
    os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # A thread, not an alarm signal, so it fires even while the test blocks in C code
    # that released the GIL; faulthandler's timer ends the session if the GIL is held.
    timer = threading.Timer(_TEST_TIMEOUT, _on_hung_test, args=(item,))
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(_TEST_TIMEOUT + 30, exit=True)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


# Property tests: the same examples on every run (a CI failure reproduces locally), and no
# health check that depends on how loaded the machine is.
from hypothesis import HealthCheck, settings as _hsettings  # noqa: E402

_hsettings.register_profile(
    "fleet", derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
_hsettings.load_profile("fleet")
