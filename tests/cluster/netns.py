"""A cluster on one machine: N hosts as network namespaces joined by a bridge.

Each host is a network namespace ``PREFIX-hI`` with one veth (``host.dev``) whose peer
(``host.peer``) is a port of a bridge living in a namespace of its own, ``PREFIX-br``.
Nothing is created in the root namespace: no link, no address, no route, so the
subnet (10.R1.R2.0/24, R1 and R2 random per run) exists only inside these namespaces and
the root namespace cannot reach it. PREFIX is random per run ("fc" + 4 hex digits), so
several test runs on one machine never collide; interface names stay within Linux's 15
characters.

With ``sshd=True`` every host runs its own OpenSSH server (Debian's openssh-server) on
``host.addr:22``, with a host key, a client key and an authorized_keys made for this run
in a temporary directory; ``cluster.ssh_config`` is an ssh_config with which
``ssh -F CONFIG ADDR`` logs in as root with StrictHostKeyChecking (the per-run host keys
are in its known_hosts file). The root namespace cannot reach the hosts, so ssh runs in
a host: ``cluster.hosts[0].run(["ssh", "-F", cluster.ssh_config, addr, "true"], 10)``.

Teardown (leaving the ``with`` block, the ``cluster_factory`` fixture's teardown, exit of
the interpreter, SIGTERM) kills every process of every namespace (``ip netns pids``),
then deletes the namespaces, which deletes their links; a second Ctrl-C cannot interrupt
it. A cluster left behind by a process killed with SIGKILL is removed by the next
``Cluster`` on this machine (each run records its owner's pid under
``/run/fleet-test-cluster/``).

Needs root, iproute2 (``ip``, ``tc``) and, for ``sshd=True``, openssh-server and
openssh-client; :func:`missing_requirements` says what is missing and how to get it.
"""
from __future__ import annotations

import atexit
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SSHD = "/usr/sbin/sshd"
_REGISTRY_DIR = "/run/fleet-test-cluster"
_INSTALL_HINT = "apt-get install openssh-server openssh-client rsync iproute2"
_SSHD_WAIT_SECONDS = 10.0
_CMD_SECONDS = 10.0

_live = []                    # clusters not torn down yet, for atexit and SIGTERM
_live_lock = threading.RLock()
_handlers_installed = False


class ClusterError(RuntimeError):
    """The cluster could not be made or a command on it failed; the message says which."""


def missing_requirements(sshd: bool = True) -> list[str]:
    """What this machine lacks for a Cluster, each as "what: how to get it" ([] if nothing).

    Args:
        sshd: also check what the per-host sshd needs (sshd, ssh, ssh-keygen).
    """
    missing = []
    if os.geteuid() != 0:
        missing.append(f"root (this runs as uid {os.geteuid()}): network namespaces need "
                       "root; run the cluster tests as root (CI machines do)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            missing.append(f"the '{tool}' command: apt-get install iproute2")
    if sshd:
        if not os.access(SSHD, os.X_OK):
            missing.append(f"{SSHD}: {_INSTALL_HINT}")
        for tool in ("ssh", "ssh-keygen"):
            if shutil.which(tool) is None:
                missing.append(f"the '{tool}' command: {_INSTALL_HINT}")
    return missing


def _run(argv, timeout=_CMD_SECONDS, check=True, **kw):
    """Run a command of the root namespace (ip, tc, ssh-keygen), bounded."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    try:
        r = subprocess.run(argv, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{shlex.join(map(str, argv))} did not finish within {timeout} s") from None
    if check and r.returncode != 0:
        raise ClusterError(f"{shlex.join(map(str, argv))} exited with code {r.returncode}: "
                           f"{(r.stderr or '').strip()}")
    return r


def _kill_group(pgid, sig=signal.SIGKILL):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _rate_bits(rate):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)\s*", rate.lower())
    if m is None:
        raise ValueError(f"rate {rate!r}: give a number followed by bit, kbit, mbit or gbit, "
                         "e.g. '100mbit' (tc's units)")
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    return float(m.group(1)) * scale


class Host:
    """One host of a Cluster: a network namespace with one address.

    Attributes:
        name: "h1", "h2", ...
        ns: the network namespace's name.
        addr: its IPv4 address, e.g. "10.213.47.1".
        dev: the veth inside the namespace that carries addr.
        peer: the veth's bridge-side peer (in the bridge's namespace).
        cluster: the Cluster it belongs to.
        ssh_dir: with sshd, the directory of its sshd's config, host key, log and
            authorized_keys (``authorized_keys``: tests may rewrite it).
        sshd: with sshd, the Popen of its sshd (None while stopped).
    """

    def __init__(self, cluster, index):
        self.cluster = cluster
        self.name = f"h{index + 1}"
        self.ns = f"{cluster.prefix}-{self.name}"
        self.addr = f"{cluster.net}.{index + 1}"
        self.dev = f"{cluster.prefix}-{self.name}"
        self.peer = f"{cluster.prefix}-{self.name}b"
        self.ssh_dir = None
        self.sshd = None

    def __repr__(self):
        return f"Host({self.name}, {self.addr}, ns={self.ns})"

    @property
    def authorized_keys(self):
        """Path of the authorized_keys file its sshd reads (with sshd=True)."""
        return os.path.join(self.ssh_dir, "authorized_keys") if self.ssh_dir else None

    def popen(self, argv, **kw) -> subprocess.Popen:
        """Start argv inside the namespace (``ip netns exec``), in its own process group.

        The process is tracked: teardown SIGKILLs its whole group. stdin defaults to
        /dev/null.

        Args:
            argv: the command and its arguments.
            **kw: passed to subprocess.Popen (not start_new_session).
        """
        kw.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *map(str, argv)],
                                start_new_session=True, **kw)
        self.cluster._track(proc)
        return proc

    def run(self, argv, timeout, **kw) -> subprocess.CompletedProcess:
        """Run argv inside the namespace and wait for it, at most timeout seconds.

        stdout and stderr are captured as text unless given in kw.

        Raises:
            TimeoutError: it ran longer than timeout (its process group was killed); the
                message names the host and the command.
        """
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        if "text" not in kw and "encoding" not in kw and "universal_newlines" not in kw:
            kw["text"] = True
        input_ = kw.pop("input", None)
        if input_ is not None:
            kw["stdin"] = subprocess.PIPE
        proc = self.popen(argv, **kw)
        try:
            out, err = proc.communicate(input_, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise TimeoutError(f"host {self.name} ({self.addr}): {shlex.join(map(str, argv))} "
                               f"did not finish within {timeout} s; killed it") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def link_down(self):
        """Cut the host off: its veth goes down (``ip link set DEV down`` in its namespace)."""
        _run(["ip", "-n", self.ns, "link", "set", self.dev, "down"])

    def link_up(self, timeout=10.0):
        """Bring its veth back up (undo link_down) and wait until it carries traffic again
        (``wait_link``)."""
        _run(["ip", "-n", self.ns, "link", "set", self.dev, "up"])
        self.wait_link(timeout)

    def wait_link(self, timeout=10.0):
        """Wait until the host's link carries traffic: both veth ends operationally up
        (the kernel reports a carrier change up to a second after 'ip link set up') and
        the bridge port forwarding. Raises RuntimeError naming what is not up after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            states = {
                f"{self.dev} in {self.ns}": "state UP" in _run(["ip", "-n", self.ns, "-o", "link", "show", "dev",
                                                               self.dev]).stdout,
                f"{self.peer} in {self.cluster.bridge_ns}": "state UP" in _run(
                    ["ip", "-n", self.cluster.bridge_ns, "-o", "link", "show", "dev", self.peer]).stdout,
                f"bridge port {self.peer}": "state forwarding" in _run(
                    ["bridge", "-n", self.cluster.bridge_ns, "link", "show", "dev", self.peer]).stdout,
            }
            if all(states.values()):
                return
            if time.monotonic() >= deadline:
                down = ", ".join(name for name, up in states.items() if not up)
                raise RuntimeError(f"{self.name}'s link is not up after {timeout:g} s: {down} not up/forwarding")
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """Every process in the namespace (``ip netns pids``), its sshd included."""
        r = _run(["ip", "netns", "pids", self.ns], check=False)
        return sorted(int(p) for p in r.stdout.split() if p.isdigit())

    def stop_sshd(self):
        """Kill this host's sshd (connections to host.addr:22 are then refused)."""
        if self.sshd is not None:
            _kill_group(self.sshd.pid)
            self.sshd.wait(10)
            self.sshd = None

    def start_sshd(self, wait=True):
        """(Re)start this host's sshd; with wait, until it accepts a login (10 s at most)."""
        self.cluster._start_sshd(self)
        if wait:
            self.cluster._wait_sshd([self])


class Cluster:
    """N hosts as network namespaces on one bridge; a context manager.

    Args:
        n_hosts: number of hosts (1..250).
        sshd: run an sshd in every host (see the module docstring).

    Attributes:
        hosts: list[Host], hosts[i].name == f"h{i+1}".
        prefix: the per-run name prefix of namespaces and links.
        subnet: e.g. "10.213.47.0/24".
        bridge: the bridge's name (in namespace ``bridge_ns``).
        ssh_config: path of the ssh_config (sshd=True), else None.
        ssh_key: path of the client's private key (sshd=True), else None.
        known_hosts: path of the known_hosts file with every host's key (sshd=True).
    """

    def __init__(self, n_hosts: int, sshd: bool = False):
        if not isinstance(n_hosts, int) or not 1 <= n_hosts <= 250:
            raise ValueError(f"n_hosts={n_hosts!r}: give 1 to 250 hosts")
        self.n_hosts = n_hosts
        self.with_sshd = sshd
        rng = random.SystemRandom()
        self.prefix = f"fc{rng.randrange(16 ** 4):04x}"
        self.net = f"10.{rng.randrange(16, 250)}.{rng.randrange(0, 256)}"
        self.subnet = f"{self.net}.0/24"
        self.bridge_ns = f"{self.prefix}-br"
        self.bridge = f"{self.prefix}-br"
        self.hosts = [Host(self, i) for i in range(n_hosts)]
        self.tmpdir = None
        self.ssh_config = None
        self.ssh_key = None
        self.known_hosts = None
        self._procs = []
        self._made_ns = []
        self._closed = False

    def __repr__(self):
        return f"Cluster({self.n_hosts} hosts, {self.subnet}, prefix {self.prefix})"

    # -- life cycle --------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        """Make the namespaces, links and (sshd=True) the sshds. Cleans up if it fails."""
        missing = missing_requirements(self.with_sshd)
        if missing:
            raise ClusterError("cannot make a cluster of network namespaces; missing: "
                               + "; ".join(missing))
        _install_cleanup_handlers()
        sweep_stale()
        with _live_lock:
            _live.append(self)
        try:
            self._register_owner()
            self.tmpdir = tempfile.mkdtemp(prefix=f"fleet-cluster-{self.prefix}-")
            self._make_network()
            if self.with_sshd:
                self._make_ssh()
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Kill every process in every namespace, delete namespaces and links. Idempotent.

        Ctrl-C is blocked while it runs, so an impatient second Ctrl-C cannot leave half a
        cluster behind.
        """
        if self._closed:
            return
        blocked = threading.current_thread() is threading.main_thread()
        if blocked:
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._closed = True
            for proc in self._procs:
                _kill_group(proc.pid)
            namespaces = [h.ns for h in self.hosts] + [self.bridge_ns]
            _teardown_namespaces(namespaces)
            for proc in self._procs:
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        try:
                            stream.close()
                        except OSError:
                            pass
            if self.tmpdir:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
            try:
                os.unlink(os.path.join(_REGISTRY_DIR, self.prefix))
            except OSError:
                pass
            with _live_lock:
                if self in _live:
                    _live.remove(self)
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _register_owner(self):
        os.makedirs(_REGISTRY_DIR, exist_ok=True)
        with open(os.path.join(_REGISTRY_DIR, self.prefix), "w") as f:
            f.write(f"{os.getpid()}\n")

    def _track(self, proc):
        self._procs.append(proc)

    # -- network -----------------------------------------------------------------------
    def _add_ns(self, name):
        _run(["ip", "netns", "add", name])
        self._made_ns.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _make_network(self):
        self._add_ns(self.bridge_ns)
        _run(["ip", "-n", self.bridge_ns, "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "-n", self.bridge_ns, "link", "set", self.bridge, "up"])
        for h in self.hosts:
            self._add_ns(h.ns)
            # Made inside the bridge's namespace, its other end moved straight into the
            # host's: the root namespace never sees either.
            _run(["ip", "-n", self.bridge_ns, "link", "add", h.peer, "type", "veth",
                  "peer", "name", h.dev, "netns", h.ns])
            _run(["ip", "-n", self.bridge_ns, "link", "set", h.peer, "master", self.bridge])
            _run(["ip", "-n", self.bridge_ns, "link", "set", h.peer, "up"])
            _run(["ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.dev])
            _run(["ip", "-n", h.ns, "link", "set", h.dev, "up"])
        for h in self.hosts:
            h.wait_link()

    def shape(self, rate: str | None = "100mbit", hosts=None):
        """Limit every host's link (or those of ``hosts``) to rate in both directions (tc
        tbf), or None to unlimit.

        The tbf qdisc goes on the egress of each host's veth (what it sends) and of its
        bridge-side peer (what it receives).

        Args:
            rate: tc's rate syntax ("100mbit", "1gbit", "500kbit"), or None.
            hosts: the Hosts to shape (default: all).

        Raises:
            ValueError: rate is not of that form.
        """
        hosts = self.hosts if hosts is None else list(hosts)
        devices = [(h.ns, h.dev) for h in hosts] + [(self.bridge_ns, h.peer) for h in hosts]
        if rate is None:
            for ns, dev in devices:
                _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            return
        bits = _rate_bits(rate)
        # Bucket: 10 ms at the rate, at least 64 KB so one GSO packet passes whole.
        burst = max(64 * 1024, int(bits / 8 / 100))
        for ns, dev in devices:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                  "burst", str(burst), "latency", "100ms"])

    # -- processes ---------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[str]]:
        """Per namespace with any, "pid cmdline" of every process still there.

        The cluster's own sshd daemons do not count (a session an sshd still serves
        does: it is a separate process).
        """
        daemons = {h.sshd.pid for h in self.hosts if h.sshd is not None}
        found = {}
        for ns in [h.ns for h in self.hosts] + [self.bridge_ns]:
            r = _run(["ip", "netns", "pids", ns], check=False)
            rows = [f"{p} {_cmdline(int(p))}" for p in r.stdout.split()
                    if p.isdigit() and int(p) not in daemons and _alive(int(p))]
            if rows:
                found[ns] = rows
        return found

    def leftovers_after(self, seconds=10.0) -> dict[str, list[str]]:
        """``leftovers()`` once none are left, or after ``seconds``: processes whose parent
        was just killed die by their parent-death signal, which takes a moment on a busy
        machine."""
        deadline = time.monotonic() + seconds
        while True:
            found = self.leftovers()
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.1)

    # -- ssh ---------------------------------------------------------------------------
    def _make_ssh(self):
        d = self.tmpdir
        self.ssh_key = os.path.join(d, "id_ed25519")
        _keygen(self.ssh_key, f"fleet-test-client@{self.prefix}")
        with open(self.ssh_key + ".pub") as f:
            client_public = f.read()
        self.known_hosts = os.path.join(d, "known_hosts")
        known = []
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        for h in self.hosts:
            h.ssh_dir = os.path.join(d, h.name)
            os.makedirs(h.ssh_dir)
            key = os.path.join(h.ssh_dir, "ssh_host_ed25519_key")
            _keygen(key, f"root@{h.name}")
            with open(key + ".pub") as f:
                kind, blob = f.read().split()[:2]
            known.append(f"{h.addr} {kind} {blob}\n")
            with open(h.authorized_keys, "w") as f:
                f.write(client_public)
            with open(os.path.join(h.ssh_dir, "sshd_config"), "w") as f:
                f.write(_SSHD_CONFIG.format(addr=h.addr, key=key, auth=h.authorized_keys,
                                            sftp=_sftp_server()))
        with open(self.known_hosts, "w") as f:
            f.writelines(known)
        self.ssh_config = os.path.join(d, "ssh_config")
        with open(self.ssh_config, "w") as f:
            f.write(_SSH_CONFIG.format(hosts=" ".join(h.addr for h in self.hosts),
                                       key=self.ssh_key, known=self.known_hosts))
        for h in self.hosts:
            self._start_sshd(h)
        self._wait_sshd(self.hosts)

    def _start_sshd(self, host):
        config = os.path.join(host.ssh_dir, "sshd_config")
        log = open(os.path.join(host.ssh_dir, "sshd.log"), "ab")
        try:
            host.sshd = host.popen([SSHD, "-D", "-e", "-f", config], stdout=log,
                                   stderr=subprocess.STDOUT)
        finally:
            log.close()

    def _wait_sshd(self, hosts):
        """Until each host's sshd accepts a login (one ssh from the host to itself)."""
        deadline = time.monotonic() + _SSHD_WAIT_SECONDS
        pending = list(hosts)
        while pending:
            probes = [(h, h.popen(["ssh", "-F", self.ssh_config, "-o", "ConnectTimeout=2",
                                   h.addr, "true"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)) for h in pending]
            failed = []
            for h, p in probes:
                try:
                    _, err = p.communicate(timeout=max(0.5, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill_group(p.pid)
                    err = p.communicate()[1]
                if p.returncode != 0:
                    failed.append((h, (err or "").strip()))
            for h, err in failed:
                if h.sshd is None or h.sshd.poll() is not None:
                    raise ClusterError(f"the sshd of host {h.name} ({h.addr}) exited with code "
                                       f"{None if h.sshd is None else h.sshd.returncode}; its "
                                       f"log:\n{_tail(os.path.join(h.ssh_dir, 'sshd.log'))}")
            pending = [h for h, _ in failed]
            if pending and time.monotonic() >= deadline:
                raise TimeoutError("sshd did not accept a login within "
                                   f"{_SSHD_WAIT_SECONDS:g} s on " + "; ".join(
                                       f"host {h.name} ({h.addr}): {err}" for h, err in failed))
            if pending:
                time.sleep(0.1)


# StrictModes no: the per-run files live in a temporary directory under /tmp, which is
# world-writable (sticky), and sshd's StrictModes refuses an authorized_keys below it.
# ClientAlive: a session whose client is gone (a host cut off with link_down) ends within
# about 6 s, as on a cluster's sshd, instead of waiting for TCP to give up.
_SSHD_CONFIG = """\
ListenAddress {addr}:22
ClientAliveInterval 2
ClientAliveCountMax 3
HostKey {key}
AuthorizedKeysFile {auth}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
PrintMotd no
Subsystem sftp {sftp}
"""

_SSH_CONFIG = """\
Host {hosts}
    User root
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {known}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 5
    LogLevel ERROR
"""


def _sftp_server():
    for path in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                 "/usr/libexec/sftp-server"):
        if os.path.exists(path):
            return path
    return "internal-sftp"


def _keygen(path, comment):
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])


def _tail(path, count=20):
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-count:])
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"


def _teardown_namespaces(namespaces):
    """SIGKILL every process of each namespace (until none is left), then delete them."""
    existing = set(_list_namespaces())
    namespaces = [ns for ns in namespaces if ns in existing]
    deadline = time.monotonic() + 10.0
    while True:
        left = []
        for ns in namespaces:
            r = _run(["ip", "netns", "pids", ns], check=False)
            for p in r.stdout.split():
                if p.isdigit() and int(p) != os.getpid():
                    try:
                        os.kill(int(p), signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    if _alive(int(p)):
                        left.append(int(p))
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], check=False)


def _list_namespaces():
    r = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def sweep_stale():
    """Remove the namespaces of clusters whose owning process is gone (killed by SIGKILL).

    Returns:
        The prefixes removed.
    """
    try:
        names = os.listdir(_REGISTRY_DIR)
    except OSError:
        return []
    removed = []
    for prefix in names:
        path = os.path.join(_REGISTRY_DIR, prefix)
        try:
            with open(path) as f:
                owner = int(f.read().strip() or 0)
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            continue
        _teardown_namespaces([ns for ns in _list_namespaces() if ns.startswith(prefix + "-")])
        try:
            os.unlink(path)
        except OSError:
            pass
        removed.append(prefix)
    return removed


def close_all():
    """Tear down every cluster of this process that is still up (atexit, SIGTERM)."""
    with _live_lock:
        clusters = list(_live)
    for c in clusters:
        c.close()


def _install_cleanup_handlers():
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(close_all)
    if threading.current_thread() is not threading.main_thread():
        return
    # SIGTERM's default ends the process without atexit: clean up first, then do what
    # was to be done. SIGINT raises KeyboardInterrupt, which unwinds `with` blocks and
    # fixtures, and atexit covers the rest.
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        close_all()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


if __name__ == "__main__":  # python tests/cluster/netns.py --sweep: remove stale clusters
    if sys.argv[1:] == ["--sweep"]:
        print("removed:", " ".join(sweep_stale()) or "nothing")
    else:
        sys.exit("usage: python tests/cluster/netns.py --sweep")
