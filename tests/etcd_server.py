"""A throwaway etcd server for the tests of the etcd rendezvous (Debian's etcd-server).

``EtcdServer(host, client_port, peer_port, data_dir)`` runs a one-member etcd with its data
in data_dir, on loopback or, given ``popen`` (a namespace host's ``popen``), inside a
network namespace. ``start`` waits until it answers; ``kill`` ends it with SIGKILL (the
"etcd lost" case); ``stop`` at teardown. ``missing()`` says what to install if the binary
is not there; the tests then fail with that message (they never skip).
"""
import json
import os
import signal
import subprocess
import time
import urllib.request

ETCD = "/usr/bin/etcd"
_START_SECONDS = 20.0


def missing():
    """None if etcd can run here, else what is missing and how to get it."""
    if os.access(ETCD, os.X_OK):
        return None
    return (f"{ETCD} is missing: the etcd rendezvous tests run a real etcd; install Debian's "
            "etcd-server (apt-get install etcd-server; .ci/run does)")


class EtcdServer:
    """One etcd process; ``endpoint`` is its client "host:port".

    Args:
        host: the address it listens on (client and peer ports).
        client_port, peer_port: its ports.
        data_dir: a fresh directory for its data (removed with the test's tmp_path).
        popen: how to start it (default subprocess.Popen in a new session); a namespace
            host's ``popen`` starts it inside the namespace.
        probe: how to check it answers: a function(argv, timeout) -> returncode, default a
            local HTTP request (inside a namespace, run the probe there).
    """

    def __init__(self, host, client_port, peer_port, data_dir, popen=None, probe=None):
        self.host = host
        self.endpoint = f"{host}:{client_port}"
        self.data_dir = str(data_dir)
        self.log_path = os.path.join(self.data_dir + ".log")
        self.argv = [ETCD, "--name", "fleet-test", "--data-dir", self.data_dir,
                     "--listen-client-urls", f"http://{host}:{client_port}",
                     "--advertise-client-urls", f"http://{host}:{client_port}",
                     "--listen-peer-urls", f"http://{host}:{peer_port}",
                     "--initial-advertise-peer-urls", f"http://{host}:{peer_port}",
                     "--initial-cluster", f"fleet-test=http://{host}:{peer_port}",
                     "--log-level", "warn"]
        self._popen = popen
        self._probe = probe
        self.proc = None

    def start(self):
        """Start etcd and wait (at most 20 s) until it answers a read. Returns self."""
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        log = open(self.log_path, "ab")
        try:
            if self._popen is None:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            else:
                self.proc = self._popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        deadline = time.monotonic() + _START_SECONDS
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with code {self.proc.returncode}: "
                                   f"{self.log()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"etcd at {self.endpoint} did not answer within "
                                   f"{_START_SECONDS:g} s: {self.log()[-2000:]}")
            time.sleep(0.1)
        return self

    def answers(self):
        """True if etcd answers a read now."""
        if self._probe is not None:
            return self._probe(self.endpoint) == 0
        try:
            request = urllib.request.Request(f"http://{self.endpoint}/v3/kv/range",
                                             data=json.dumps({"key": "AA=="}).encode(),
                                             method="POST")
            with urllib.request.urlopen(request, timeout=1):
                return True
        except OSError:
            return False

    def log(self):
        """etcd's output so far."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill(self):
        """SIGKILL etcd (and its process group) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    stop = kill
