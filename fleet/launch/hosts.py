"""fleetrun --hosts: one job on many hosts over ssh, from any machine.

The dispatcher (this module) never starts a training process itself. It

1. parses the hosts (``[user@]host[:sshport]``, from ``--hosts`` or a hostfile, whose
   lines may add ``servers=N`` / ``workers=M`` for that host);
2. runs a preflight on every host at once, bounded at PREFLIGHT_SECONDS: one ssh that
   runs a short remote python printing what it found (python and fleet versions, the
   workspace, the NIC's address); a failure is named per host with the fix, and nothing
   starts unless every host passed;
3. computes every endpoint: host i's servers get ports start_port.., its workers the next
   ones; global indexes go host by host, so worker 0 is on the first host with workers (a
   collective job, ``--collective``, has workers only);
4. makes the job's CURVE keys (unless --insecure) and copies the workspace (rsync over
   ssh: only what changed; scp -r if rsync is missing on either side);
5. runs on every host, over one ssh each, the per-host form of fleetrun
   (``python -m fleet.launch --servers ALL --workers ALL --host ADDR ...
   --stop_on_stdin_eof --result_json ...``; ``--collective --workers ALL ...`` for a
   collective job), whose stdin is a pipe it keeps open: when the
   dispatcher or its ssh dies, the remote fleetrun sees EOF and stops its processes;
6. streams worker 0's output, copies every host's stderr prefixed ``[host] ``, and watches:
   the first host whose remote fleetrun fails (or whose ssh dies) ends the job; the others
   are stopped by closing their stdin, their ssh killed after --kill_timeout;
7. sweeps every host over a fresh ssh for processes still carrying the job's
   FLEET_JOB_ID (killing and reporting them), fetches every host's logs into
   ``LOG_DIR/<host>/`` and names the root cause: the earliest failure in the hosts'
   result files;
8. with --max_restarts K, runs the preflight again on every host still in the job and
   starts them all again (``_run_with_restarts``); a host that fails it leaves the job
   and its servers and workers move to the others (`fleet.launch.hosts_heal`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

from fleet.checkpoint import RESTART_STATE_ENV, noted_checkpoint_dirs
from fleet.errors import ConfigError, FleetError
from fleet.launch.config import (BLAS_THREAD_VARIABLES, EXIT_OK, EXIT_PROCESS_FAILED,
                                 EXIT_TIMEOUT, EXIT_USAGE, MAX_RESTARTS_ENV, RESTART_COUNT_ENV,
                                 check_restart_options)
from fleet.launch.hosts_heal import JobLayout, describe_moves, drop_hosts, first_shares, indexes_text
from fleet.launch.local import SignalCatcher, die_with_parent, signal_group
from fleet.launch.restart import Failure, conclude, decide_restart, log_event
from fleet.launch.report import SAY_LOGGER, plural, say, signal_name, write_stdout
from fleet.logs import WaitLog

PREFLIGHT_SECONDS = 10.0
CONNECT_TIMEOUT = 5
DEFAULT_REMOTE_DIR = "~/fleet_jobs/{name}"
KEYS_DIR_NAME = ".fleet_keys"
RESULT_NAME = "fleetrun-result.json"
JOB_ID_VARIABLE = "FLEET_JOB_ID"
SWEEP_SECONDS = 10.0
FETCH_SECONDS = 60.0
COPY_SECONDS = 600.0
# Variables of the dispatcher's environment that every remote fleetrun gets (besides
# --env): fleet's and Paddle's settings, Python's (PYTHONPATH, as DeepSpeed's launcher
# forwards), numba's and the BLAS thread counts. CURVE variables are not forwarded: the
# job's keys go with --keys_dir.
FORWARDED_PREFIXES = ("FLEET_", "FLAGS_", "PYTHON", "NUMBA_")
FORWARDED_NAMES = ("CPU_NUM",) + BLAS_THREAD_VARIABLES
NOT_FORWARDED_PREFIXES = ("FLEET_CURVE_",)
NOT_FORWARDED_NAMES = (JOB_ID_VARIABLE, "PYTHONHOME", "PYTHONSTARTUP")
_POLL_SECONDS = 0.05
_SSH_BASE = ("-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}")

_HOST_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
                      r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*))"
                      r"(?::(?P<port>[0-9]+))?$")


@dataclasses.dataclass(frozen=True)
class HostEntry:
    """One host of a --hosts job.

    Attributes:
        host: the host name or address as written (an IPv6 address without brackets).
        user: the ssh user, or None for ssh's default (ssh_config, then the local user).
        port: the ssh port, or None for ssh's default.
        where: where it was written, for messages ("hostfile line 3", "--hosts entry 2").
        servers, workers: this host's process counts from its hostfile line
            (``servers=N workers=M``), or None for --server_num_per_host /
            --worker_num_per_host.
    """

    host: str
    user: str | None = None
    port: int | None = None
    where: str = ""
    servers: int | None = None
    workers: int | None = None

    @property
    def name(self) -> str:
        """The name of its log directory and of its lines in messages: the host as written."""
        return self.host

    @property
    def target(self) -> str:
        """What ssh is given: ``user@host`` or ``host``."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_options(self) -> list[str]:
        return ["-p", str(self.port)] if self.port else []

    def __str__(self):
        port = f":{self.port}" if self.port else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}{port}"


def parse_host_entry(text: str, where: str, counts: bool = False) -> HostEntry:
    """Parse ``[user@]host[:sshport]`` (an IPv6 host in brackets), and with ``counts`` (a
    hostfile line) optional ``servers=N`` and ``workers=M`` after it.

    Raises:
        ConfigError: malformed; the message names where it was written.
    """
    words = text.split()
    given = {}
    for word in words[1:] if counts else ():
        key, sep, value = word.partition("=")
        if key not in ("servers", "workers") or not sep or not value.isdigit() or key in given:
            raise ConfigError(f"{where}: {word!r} after the host is not servers=N or workers=N "
                              "(each at most once, N >= 0); write e.g. 'node1 servers=2 workers=0'")
        given[key] = int(value)
    text = words[0] if counts and words else text
    m = _HOST_RE.match(text.strip())
    if m is None:
        raise ConfigError(f"{where}: {text.strip()!r} is not a host; write [user@]host[:sshport], "
                          "e.g. node1, root@10.0.0.2 or node3:2222 (an IPv6 address in brackets)")
    port = m.group("port")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ConfigError(f"{where}: ssh port {port} of {text.strip()!r} is out of range; give "
                          "a port in 1..65535")
    return HostEntry(host=m.group("v6") or m.group("host"), user=m.group("user"),
                     port=int(port) if port is not None else None, where=where,
                     servers=given.get("servers"), workers=given.get("workers"))


def parse_hosts(spec: str) -> list[HostEntry]:
    """The hosts of ``--hosts``: a comma list (``h1,h2``) or the path of a hostfile.

    A value with a comma is a list; otherwise, a value naming an existing file is a
    hostfile (one ``[user@]host[:sshport]`` per line, ``#`` starts a comment, blank
    lines are skipped), and anything else is a single host.

    Raises:
        ConfigError: an entry is malformed, a host is given twice, the file cannot be
            read or lists no host; the message names the line or entry.
    """
    if spec is None or not spec.strip():
        raise ConfigError("--hosts is empty; give h1,h2,... or a hostfile with one "
                          "[user@]host[:sshport] per line")
    entries = []
    if "," not in spec and os.path.isfile(spec):
        try:
            with open(spec, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the hostfile {spec!r} ({e}); give a readable "
                              "file or h1,h2,...") from e
        for number, line in enumerate(lines, 1):
            text = line.split("#", 1)[0].strip()
            if text:
                entries.append(parse_host_entry(text, f"hostfile {spec} line {number}", counts=True))
        if not entries:
            raise ConfigError(f"hostfile {spec} lists no host (only blank lines and comments); "
                              "write one [user@]host[:sshport] per line")
    else:
        for number, text in enumerate(spec.split(","), 1):
            if not text.strip():
                raise ConfigError(f"--hosts {spec!r}: entry {number} is empty; write "
                                  "h1,h2,... without empty entries")
            entries.append(parse_host_entry(text, f"--hosts entry {number}"))
    seen = {}
    for e in entries:
        if e.host in seen:
            raise ConfigError(f"{e.where}: host {e.host} is already given at {seen[e.host]}; "
                              "list each host once (--server_num_per_host and "
                              "--worker_num_per_host say how many processes each runs)")
        seen[e.host] = e.where
    return entries


@dataclasses.dataclass(frozen=True)
class HostsConfig:
    """A --hosts job. Validated on construction.

    Attributes:
        hosts: the hosts, in order (the first host with workers runs worker 0).
        training_script: the script, relative to the workspace.
        script_args: its arguments.
        server_num_per_host, worker_num_per_host: processes per host.
        dispatch: a local directory copied to every host, or None.
        workspace: a directory already on every host, or None (exactly one of the two).
        remote_dir: where dispatch goes on each host; "~" is the remote home, "{host}"
            the host's name, "{name}" the dispatch directory's base name.
        python: the remote python.
        ssh_config: an ssh_config file (ssh -F), or None for ssh's default.
        nic: a network interface whose address is each host's endpoint host, or None
            for the host as written.
        start_port: the first port of each host.
        insecure: no CURVE keys.
        log_dir: the local directory of the hosts' log directories.
        env: extra NAME=VALUE variables for the remote processes.
        kill_timeout, server_exit_timeout, failure_grace, timeout: passed to each host's
            fleetrun (kill_timeout also bounds the dispatcher's stop of each host).
        collective: a collective job (each host's fleetrun runs with --collective):
            workers only; server_num_per_host must be 0 and no hostfile line may give
            servers.
        max_restarts, restart_from_scratch: ``fleetrun --max_restarts`` for the whole
            job: after a failure on any host the dispatcher stops every host and starts
            every host's fleetrun again (see `fleet.launch.restart`).
    """

    hosts: tuple[HostEntry, ...]
    training_script: str
    script_args: tuple[str, ...] = ()
    server_num_per_host: int = 1
    worker_num_per_host: int = 1
    dispatch: str | None = None
    workspace: str | None = None
    remote_dir: str = DEFAULT_REMOTE_DIR
    python: str = sys.executable
    ssh_config: str | None = None
    nic: str | None = None
    start_port: int = 6170
    insecure: bool = False
    log_dir: str = "log"
    env: tuple[str, ...] = ()
    kill_timeout: float = 10.0
    server_exit_timeout: float = 30.0
    failure_grace: float | None = None
    timeout: float | None = None
    collective: bool = False
    max_restarts: int = 0
    restart_from_scratch: bool = False

    def __post_init__(self):
        check_restart_options(self.max_restarts, self.restart_from_scratch)
        for name in ("hosts", "script_args", "env"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.hosts:
            raise ConfigError("no host given; give --hosts h1,h2,... or a hostfile")
        if (self.dispatch is None) == (self.workspace is None):
            raise ConfigError("give exactly one of --dispatch DIR (copy this directory to "
                              "every host) and --workspace DIR (already on every host)")
        if self.dispatch is not None and not os.path.isdir(self.dispatch):
            raise ConfigError(f"--dispatch {self.dispatch!r} is not a directory here; give the "
                              "local directory to copy to every host")
        if self.dispatch is not None:
            local = os.path.join(self.dispatch, self.training_script)
            if not os.path.isfile(local):
                raise ConfigError(f"training script {self.training_script!r} is not a file in "
                                  f"--dispatch {self.dispatch} ({local}); the script path is "
                                  "relative to the workspace")
        if os.path.isabs(self.training_script):
            raise ConfigError(f"training script {self.training_script!r} is absolute; give "
                              "its path relative to the workspace")
        if self.server_num_per_host < 0 or self.worker_num_per_host < 0:
            raise ConfigError(f"--server_num_per_host {self.server_num_per_host} / "
                              f"--worker_num_per_host {self.worker_num_per_host}: give counts "
                              "of 0 or more")
        if self.collective:
            if self.server_num_per_host:
                raise ConfigError(f"--server_num_per_host {self.server_num_per_host} with --collective: a "
                                  "collective job has no servers (the workers all-reduce among themselves); "
                                  "leave out --server_num_per_host, or drop --collective and use "
                                  "DistributedStrategyFactory.create_hybrid_strategy() to keep tables on servers")
            for host in self.hosts:
                if host.servers:
                    raise ConfigError(f"{host.where}: servers={host.servers} in a collective job (--collective), "
                                      "which has no servers; remove servers=N from the hostfile, or drop "
                                      "--collective")
        counts = [self.counts(i) for i in range(len(self.hosts))]
        if self.collective and sum(w for _, w in counts) == 0:
            raise ConfigError("a collective --hosts job needs workers: give --worker_num_per_host 1 or "
                              "more, or workers=N on hostfile lines")
        if not self.collective and (sum(s for s, _ in counts) == 0 or sum(w for _, w in counts) == 0):
            raise ConfigError("a --hosts job needs servers and workers: give "
                              "--server_num_per_host 1 or more and --worker_num_per_host 1 "
                              "or more, or servers=N / workers=N on hostfile lines (local "
                              "training runs on one machine: fleetrun --server_num 0)")
        count = max(s + w for s, w in counts)
        if not 1 <= self.start_port <= 65536 - count:
            raise ConfigError(f"--start_port {self.start_port} leaves no room for {count} "
                              f"consecutive ports; give a port in 1..{65536 - count}")
        for item in self.env:
            name, sep, _ = item.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ConfigError(f"--env {item!r}: write NAME=VALUE")
        if self.nic is not None and not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", self.nic):
            raise ConfigError(f"--nic {self.nic!r} is not an interface name (such as eth0)")
        if self.ssh_config is not None and not os.path.isfile(self.ssh_config):
            raise ConfigError(f"--ssh_config {self.ssh_config!r} is not a file; give an "
                              "ssh_config file (as for ssh -F)")

    def counts(self, index):
        """(servers, workers) host ``index`` runs: its hostfile line's, else the per-host options."""
        host = self.hosts[index]
        return (self.server_num_per_host if host.servers is None else host.servers,
                self.worker_num_per_host if host.workers is None else host.workers)

    def remote_dir_of(self, host: HostEntry) -> str:
        """The workspace path on host as given (may start with ~)."""
        if self.workspace is not None:
            return self.workspace
        name = os.path.basename(os.path.abspath(self.dispatch))
        return self.remote_dir.replace("{host}", host.name).replace("{name}", name)


def plan_endpoints(addresses, servers_per_host, workers_per_host, start_port):
    """Every endpoint of the job.

    Args:
        addresses: each host's endpoint host, in host order.
        servers_per_host, workers_per_host: processes per host: one count for every host,
            or a list with one count per host.
        start_port: the first port of each host: its servers take start_port.., its
            workers the ports after them.

    Returns:
        (servers, workers): lists of "host:port", host by host: with the same counts S and
        W everywhere, host i has servers i*S .. i*S+S-1 and workers i*W .. i*W+W-1.
    """
    def per_host(count):
        return list(count) if isinstance(count, (list, tuple)) else [count] * len(addresses)

    servers, workers = [], []
    for addr, s, w in zip(addresses, per_host(servers_per_host), per_host(workers_per_host)):
        host = f"[{addr}]" if ":" in addr else addr
        servers += [f"{host}:{start_port + k}" for k in range(s)]
        workers += [f"{host}:{start_port + s + k}" for k in range(w)]
    return servers, workers


def forwarded_environment(environ=None, extra=()):
    """The NAME=VALUE pairs every remote fleetrun gets: see FORWARDED_PREFIXES; --env last."""
    environ = os.environ if environ is None else environ
    pairs = {}
    for name, value in sorted(environ.items()):
        if name in NOT_FORWARDED_NAMES or name.startswith(NOT_FORWARDED_PREFIXES):
            continue
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES):
            pairs[name] = value
    for item in extra:
        name, _, value = item.partition("=")
        pairs[name] = value
    return pairs


# -- ssh ----------------------------------------------------------------------------------

class Ssh:
    """How the dispatcher runs ssh, scp and rsync to the hosts (the system's OpenSSH)."""

    def __init__(self, config_file=None):
        self.config_file = config_file

    def base(self, host, extra=()):
        argv = ["ssh"]
        if self.config_file:
            argv += ["-F", self.config_file]
        return argv + list(_SSH_BASE) + list(extra) + host.ssh_options()

    def command(self, host, remote, extra=()):
        """argv of ``ssh HOST REMOTE`` (remote: one shell command line)."""
        return self.base(host, extra) + [host.target, remote]

    def rsh(self, host):
        """The -e of rsync: the ssh command without the host."""
        return shlex.join(self.base(host))

    def scp(self, host, sources, dest, recursive=True):
        argv = ["scp", "-q", "-p"] + (["-r"] if recursive else [])
        if self.config_file:
            argv += ["-F", self.config_file]
        argv += list(_SSH_BASE)
        if host.port:
            argv += ["-P", str(host.port)]
        return argv + list(sources) + [dest]

    @staticmethod
    def remote_spec(host, path):
        user = f"{host.user}@" if host.user else ""
        h = f"[{host.host}]" if ":" in host.host else host.host
        return f"{user}{h}:{path}"


def run_bounded(argv, timeout, stdin=subprocess.DEVNULL, input_=None):
    """Run argv with captured text output; (returncode, stdout, stderr), returncode None on
    timeout (the process group was killed)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input_ is not None else stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
    try:
        out, err = proc.communicate(input_, timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def in_parallel(hosts, work, timeout, what):
    """Run work(host) for every host in threads; {host.name: result or None if unfinished}.

    Blocks at most timeout seconds; a WaitLog names the hosts that have not answered.
    """
    results = {}
    threads = []
    for h in hosts:
        t = threading.Thread(target=lambda h=h: results.__setitem__(h.name, work(h)),
                             name=f"fleetrun-{what} {h.name}", daemon=True)
        t.start()
        threads.append((h, t))
    deadline = time.monotonic() + timeout
    wait = WaitLog(f"{what} of every host", limit=f"giving up after {timeout:g} s",
                   logger=SAY_LOGGER)
    while any(t.is_alive() for _, t in threads) and time.monotonic() < deadline:
        wait.tick("not yet: " + ", ".join(h.name for h, t in threads if t.is_alive()))
        for _, t in threads:
            t.join(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
    return {h.name: results.get(h.name) for h in hosts}


# -- preflight ----------------------------------------------------------------------------

# Runs on each host: prints one line "FLEET-PREFLIGHT {json}" saying what it found.
_PREFLIGHT = r"""
import json, os, shutil, sys
r = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import fleet, fleet.launch.cli as cli
    try:
        from importlib.metadata import version
        r["fleet"] = version("fleet")
    except Exception:
        r["fleet"] = "unknown"
    r["fleet_path"] = os.path.dirname(fleet.__file__)
    opts = {o for a in cli.build_parser()._actions for o in a.option_strings}
    r["per_host"] = all(o in opts for o in ("--host", "--stop_on_stdin_eof", "--result_json"))
except Exception as e:
    r["fleet_error"] = "%s: %s" % (type(e).__name__, e)
ws = os.path.expanduser(sys.argv[1])
r["workspace"] = os.path.abspath(ws)
r["workspace_exists"] = os.path.isdir(ws)
r["rsync"] = shutil.which("rsync") is not None
conn = os.environ.get("SSH_CONNECTION", "").split()
r["address"] = conn[2] if len(conn) > 2 else None
nic = sys.argv[2]
if nic:
    try:
        from fleet.launch.this_host import interface_addresses
        found = sorted(interface_addresses(nic), key=lambda a: (":" in a, a))  # IPv4 first
        r["nic_address"] = found[0]
    except Exception as e:
        r["nic_error"] = str(e)
print("FLEET-PREFLIGHT " + json.dumps(r), flush=True)
"""


@dataclasses.dataclass
class Preflight:
    """What the preflight found on one host (problem is None when it passed)."""

    host: HostEntry
    problem: str | None = None
    info: dict = dataclasses.field(default_factory=dict)


def classify_ssh_failure(host, returncode, stderr, python):
    """The message of a failed preflight ssh, naming the host and the fix."""
    text = " ".join((stderr or "").split())
    line = _last_line(stderr)
    where = f"host {host.name}"
    if returncode is None:
        return (f"{where}: no answer within {PREFLIGHT_SECONDS:g} s (ssh {host.target}); is "
                "the host up and reachable from here?")
    if "Connection refused" in text:
        return (f"{where}: connection refused ({line}); is sshd running there and listening "
                f"on port {host.port or 22}?")
    if "Permission denied" in text:
        return (f"{where}: ssh authentication refused ({line}); install your public key in "
                f"{host.user or 'the user'}'s ~/.ssh/authorized_keys there (ssh-copy-id "
                f"{host.target}), load it into ssh-agent, or name it in --ssh_config")
    if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (f"{where}: host key verification failed; add its key to known_hosts "
                f"(ssh {host.target} once interactively, or ssh-keyscan), or check that "
                "it is the machine you mean")
    if any(s in text for s in ("No route to host", "Network is unreachable", "timed out",
                               "Connection timed out", "Could not resolve hostname",
                               "Name or service not known", "Temporary failure in name")):
        return f"{where}: unreachable ({line}); check its name/address and the network"
    if returncode == 127 or re.search(r"(not found|No such file or directory)", text):
        return (f"{where}: python {python!r} not found there ({line}); give --python the "
                "path of a python with fleet installed on every host")
    if returncode == 255:
        return f"{where}: ssh failed ({line or 'exit 255'}); try ssh {host.target} by hand"
    return f"{where}: the preflight python exited with code {returncode}: {line}"


def preflight(config: HostsConfig, ssh: Ssh, hosts=None) -> list[Preflight]:
    """Check every host at once, bounded at PREFLIGHT_SECONDS in total.

    Args:
        config: the job.
        ssh: how to reach the hosts.
        hosts: the HostEntry objects to check (default: every host of config).

    Returns:
        one Preflight per host, in order (problem None when it passed).

    Blocks at most PREFLIGHT_SECONDS + 1 s.
    """
    hosts = config.hosts if hosts is None else tuple(hosts)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in forwarded_environment(extra=config.env).items())

    def check(host):
        # The same environment as the job's, so the fleet found is the one that will run.
        remote = (f"env {env} {shlex.quote(config.python)} -c {shlex.quote(_PREFLIGHT)} "
                  f"{shlex.quote(config.remote_dir_of(host))} {shlex.quote(config.nic or '')}")
        code, out, err = run_bounded(ssh.command(host, remote), PREFLIGHT_SECONDS)
        return _judge_preflight(config, host, code, out, err)

    found = in_parallel(hosts, check, PREFLIGHT_SECONDS + 1, "the preflight")
    return [found[h.name] or Preflight(h, classify_ssh_failure(h, None, "", config.python))
            for h in hosts]


def _judge_preflight(config, host, code, out, err):
    info = None
    for line in (out or "").splitlines():
        if line.startswith("FLEET-PREFLIGHT "):
            try:
                info = json.loads(line[len("FLEET-PREFLIGHT "):])
            except ValueError:
                info = None
    if code != 0 or info is None:
        if code == 0:
            return Preflight(host, f"host {host.name}: the preflight printed no report "
                                   f"(stdout: {_last_line(out)!r}); does the login shell "
                                   "there run the command?")
        return Preflight(host, classify_ssh_failure(host, code, err, config.python))
    where = f"host {host.name}"
    if "fleet_error" in info:
        return Preflight(host, f"{where}: fleet is not importable by {info['executable']} "
                               f"(python {info['python']}): {info['fleet_error']}; install "
                               f"fleet there (pip install fleet) or give --python a python "
                               "that has it", info)
    if not info.get("per_host"):
        return Preflight(host, f"{where}: fleet {info.get('fleet')} at {info.get('fleet_path')} "
                               "has no per-host fleetrun (--host, --stop_on_stdin_eof, "
                               "--result_json); install this fleet version there", info)
    if config.workspace is not None and not info.get("workspace_exists"):
        return Preflight(host, f"{where}: --workspace {config.workspace} does not exist there "
                               f"({info.get('workspace')}); copy it there or use --dispatch", info)
    if config.nic and "nic_address" not in info:
        return Preflight(host, f"{where}: {info.get('nic_error')}; give an "
                               "interface every host has, or leave --nic out", info)
    return Preflight(host, None, info)


def _last_line(text):
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1] if lines else ""


# -- the job ------------------------------------------------------------------------------

class _Remote:
    """The ssh session running one host's fleetrun, and what came back from it."""

    def __init__(self, host, index, info, endpoint_host, log_dir):
        self.host = host
        self.index = index
        self.info = info
        self.endpoint_host = endpoint_host
        self.log_dir = log_dir                   # local LOG_DIR/<host>
        self.proc = None
        self.exit_time = None                    # time.time() when ssh exited
        self.stopped = False                     # the dispatcher stopped it
        self.stop_reason = None
        self.last_stderr = ""
        self.result = None                       # the parsed result JSON, once fetched
        self.unreachable = None                  # (code, stderr) of a sweep ssh that found no way to it
        self.threads = []

    @property
    def name(self):
        return self.host.name

    @property
    def label(self):
        if self.endpoint_host and self.endpoint_host != self.host.name:
            return f"host {self.name} ({self.endpoint_host})"
        return f"host {self.name}"

    @property
    def returncode(self):
        return self.proc.returncode if self.proc is not None else None


def run_hosts(config: HostsConfig) -> int:
    """Run a --hosts job; blocks until it is over and returns fleetrun's exit code.

    Raises:
        ConfigError: bad settings found before anything started (exit 2).
    """
    with SignalCatcher() as signals:
        return _HostsJob(config, signals).run()


class _HostsJob:
    def __init__(self, config, signals):
        self.config = config
        self.signals = signals
        self.ssh = Ssh(config.ssh_config)
        self.job_id = uuid.uuid4().hex
        self.remotes = []
        self.layout = None                       # hosts_heal.JobLayout, set after the preflight
        self.keys_dir_local = None
        self.temp_keys = None

    # -- phases ------------------------------------------------------------------------
    def run(self):
        c = self.config
        say(f"preflight of {plural(len(c.hosts), 'host')} over ssh "
            f"(at most {PREFLIGHT_SECONDS:g} s): {', '.join(h.name for h in c.hosts)}")
        checks = preflight(c, self.ssh)
        problems = [p.problem for p in checks if p.problem]
        if problems:
            say(f"preflight failed on {plural(len(problems), 'host')}; nothing was started:")
            for p in problems:
                print(f"    {p}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        if self.signals.received:
            return 128 + self.signals.received
        addresses = [p.info["nic_address"] if c.nic else p.host.host for p in checks]
        for i, p in enumerate(checks):
            shown = p.info.get("nic_address") if c.nic else p.info.get("address")
            self.remotes.append(_Remote(p.host, i, p.info, shown,
                                        os.path.join(c.log_dir, p.host.name)))
        versions = sorted({p.info.get("fleet") for p in checks})
        say(f"preflight passed: python {', '.join(sorted({p.info['python'] for p in checks}))}, "
            f"fleet {', '.join(versions)} on every host")
        counts = [c.counts(i) for i in range(len(c.hosts))]
        self.addresses = addresses
        servers, workers = plan_endpoints(addresses, [s for s, _ in counts], [w for _, w in counts],
                                          c.start_port)
        self._set_layout(JobLayout(first_shares([h.name for h in c.hosts], counts), tuple(servers),
                                   tuple(workers)))
        try:
            for r in self.remotes:
                os.makedirs(r.log_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create the log directory {c.log_dir!r} ({e.strerror}); "
                              "give a writable --log_dir") from e
        try:
            if not c.insecure:
                self._make_keys()
            if not self._copy_workspace(checks):
                return EXIT_PROCESS_FAILED if not self.signals.received else 128 + self.signals.received
            code = self._start_and_watch() if not c.max_restarts else self._run_with_restarts()
        finally:
            if self.temp_keys:
                shutil.rmtree(self.temp_keys, ignore_errors=True)
        return code

    def _run_with_restarts(self):
        """Attempts of the whole job: after a failure on any host, every host is stopped
        (as without restarts), its logs fetched into LOG_DIR/attempt-N/, and every host's
        fleetrun started again with FLEET_RESTART_COUNT=N+1, up to max_restarts times."""
        c = self.config
        failures = []
        while True:
            attempt = len(failures)
            code = self._start_and_watch(attempt)
            failure = self._root_failure(attempt) if code == EXIT_PROCESS_FAILED else None
            if failure is None or self.signals.received:
                return conclude(c.log_dir, code, failures, c.max_restarts)
            lost = self._preflight_again(attempt)
            if self.signals.received:
                return conclude(c.log_dir, 128 + self.signals.received, failures + [failure], c.max_restarts)
            if lost:
                failure = _host_failure(attempt, lost, time.time())
            failures.append(failure)
            if lost and len(lost) == len(self.remotes):
                self._keep_attempt_logs(attempt)
                return conclude(c.log_dir, EXIT_PROCESS_FAILED, failures, c.max_restarts,
                                gave_up="no host is left: " + "; ".join(p.problem for _, p in lost))
            decision = decide_restart(c.log_dir, failures, c.max_restarts, c.restart_from_scratch,
                                      self._noted_checkpoint_dirs())
            self._keep_attempt_logs(attempt)
            if decision is not None:
                return decision
            if lost:
                self._drop(lost)
            self.remotes = [_Remote(r.host, r.index, r.info, r.endpoint_host, r.log_dir) for r in self.remotes]

    def _preflight_again(self, attempt):
        """Run the preflight on every host still in the job; [(remote, Preflight)] of those
        that failed it (they leave the job). A host the sweep just found unreachable (no
        route, connect timeout, refused) fails it with that answer, without waiting for
        ssh's connect timeout once more. Blocks at most PREFLIGHT_SECONDS + 1 s."""
        gone = [r for r in self.remotes if r.unreachable is not None]
        asked = [r for r in self.remotes if r.unreachable is None]
        known = f"; {', '.join(r.name for r in gone)}: unreachable by the sweep a moment ago" if gone else ""
        say(f"preflight of the {plural(len(self.remotes), 'host')} of the job before restart "
            f"{attempt + 1} (at most {PREFLIGHT_SECONDS:g} s{known}): a host that fails it leaves the job "
            "and its ranks move to the others")
        found = {r.name: Preflight(r.host, classify_ssh_failure(r.host, *r.unreachable, self.config.python))
                 for r in gone}
        if asked:
            found.update((p.host.name, p) for p in preflight(self.config, self.ssh, [r.host for r in asked]))
        return [(r, found[r.name]) for r in self.remotes if found[r.name].problem]

    def _drop(self, lost):
        """Take the lost remotes out of the job: their ranks move to the others (say and log
        each move); the whole job's endpoint lists are rebuilt."""
        c = self.config
        names = [r.name for r, _ in lost]
        addresses = {r.name: self.addresses[r.index] for r in self.remotes}
        layout, placed = drop_hosts(self.layout, names, addresses, c.start_port)
        for r, p in lost:
            say(f"{r.label} leaves the job: {p.problem}")
        moves = describe_moves(placed)
        for line in moves:
            say(line)
        log_event(c.log_dir, f"{plural(len(names), 'host')} left the job ({', '.join(names)}): "
                             + "; ".join(moves))
        for r, _ in lost:
            try:
                os.rmdir(r.log_dir)  # its logs stay in LOG_DIR/attempt-N/<host>/
            except OSError:
                pass
        self.remotes = [r for r in self.remotes if r.name not in names]
        self._set_layout(layout)

    def _set_layout(self, layout):
        self.layout = layout
        self.servers, self.workers = list(layout.servers), list(layout.workers)

    def _noted_checkpoint_dirs(self):
        """The checkpoint directories the processes of every host noted (fetched with the logs)."""
        found = set()
        for r in self.remotes:
            found.update(noted_checkpoint_dirs(os.path.join(r.log_dir, ".restart")))
        return sorted(found)

    def _keep_attempt_logs(self, attempt):
        folder = os.path.join(self.config.log_dir, f"attempt-{attempt}")
        os.makedirs(folder, exist_ok=True)
        for r in self.remotes:
            if os.path.isdir(r.log_dir):
                os.replace(r.log_dir, os.path.join(folder, r.name))
            os.makedirs(r.log_dir, exist_ok=True)

    def _make_keys(self):
        from fleet.transport.curve import generate_keys
        c = self.config
        if c.dispatch is not None:
            keys = os.path.join(c.dispatch, KEYS_DIR_NAME)
            if _usable_keys(keys):
                say(f"CURVE keys: reusing {keys} (delete it to make new ones)")
            else:
                shutil.rmtree(keys, ignore_errors=True)
                generate_keys(keys)
                say(f"CURVE keys: made {keys} (owner-only); it goes with the workspace")
            self.keys_dir_local = keys
        else:
            import tempfile
            self.temp_keys = tempfile.mkdtemp(prefix="fleet-keys-")
            keys = os.path.join(self.temp_keys, KEYS_DIR_NAME)
            generate_keys(keys)
            self.keys_dir_local = keys
            say("CURVE keys: made new ones for this job; copying them to "
                f"{c.workspace}/{KEYS_DIR_NAME} on every host")

    def _copy_workspace(self, checks):
        c = self.config
        rsync_local = shutil.which("rsync") is not None
        if c.dispatch is not None:
            source = os.path.abspath(c.dispatch)
            what = f"--dispatch {c.dispatch}"
        elif self.keys_dir_local is not None:
            source = self.keys_dir_local
            what = "the job's keys"
        else:
            return True
        exclude = _excluded_log_dir(source, c.log_dir) if c.dispatch is not None else None

        def copy(remote):
            ws = remote.info["workspace"]
            dest = ws if c.dispatch is not None else os.path.join(ws, KEYS_DIR_NAME)
            use_rsync = rsync_local and remote.info.get("rsync")
            return self._copy_one(remote, source, dest, use_rsync, exclude)

        missing = [r.name for r in self.remotes if not r.info.get("rsync")]
        if not rsync_local or missing:
            where = "here" if not rsync_local else "on " + ", ".join(missing)
            say(f"rsync is missing {where}: copying {what} with scp -r (everything, every run)")
        say(f"copying {what} to every host")
        results = in_parallel(self.remotes, copy, COPY_SECONDS, f"copying {what}")
        failed = False
        for r in self.remotes:
            res = results[r.name]
            if res is None:
                say(f"host {r.name}: copying {what} did not finish within {COPY_SECONDS:g} s")
                failed = True
            elif res[0] is not None:
                say(f"host {r.name}: copying {what} failed: {res[0]}")
                failed = True
            else:
                print(f"    {r.name}: {res[1]}", file=sys.stderr, flush=True)
        if failed:
            say(f"exit {EXIT_PROCESS_FAILED}: the workspace could not be copied; nothing was started")
        return not failed

    def _copy_one(self, remote, source, dest, use_rsync, exclude):
        """(error or None, summary) of copying source's contents to dest on the host."""
        h = remote.host
        if use_rsync:
            # --rsync-path makes the destination first (rsync's --mkpath needs 3.2.3).
            argv = ["rsync", "-a", "--itemize-changes", "-e", self.ssh.rsh(h),
                    "--rsync-path", f"mkdir -p {shlex.quote(dest)} && rsync"]
            if exclude:
                argv += ["--exclude", exclude]
            argv += [source.rstrip("/") + "/", self.ssh.remote_spec(h, dest.rstrip("/") + "/")]
            code, out, err = run_bounded(argv, COPY_SECONDS)
            if code != 0:
                return (f"rsync exited with code {code}: {_last_line(err)}", "")
            changed = [l for l in out.splitlines() if re.match(r"[<>c][fL]", l)]
            return None, f"{plural(len(changed), 'file')} copied (rsync; unchanged files skipped)"
        code, _, err = run_bounded(self.ssh.command(h, f"mkdir -p {shlex.quote(dest)}"), 30)
        if code != 0:
            return f"mkdir -p {dest} failed ({code}): {_last_line(err)}", ""
        entries = [os.path.join(source, n) for n in sorted(os.listdir(source))
                   if not (exclude and "/" + n + "/" == exclude)]
        if not entries:
            return None, "nothing to copy"
        code, _, err = run_bounded(self.ssh.scp(h, entries, self.ssh.remote_spec(h, dest + "/")),
                                   COPY_SECONDS)
        if code != 0:
            return f"scp exited with code {code}: {_last_line(err)}", ""
        return None, f"{plural(len(entries), 'entry', )} copied (scp -r)"

    # -- starting and watching ---------------------------------------------------------
    def _remote_command(self, remote, attempt=0):
        c = self.config
        ws = remote.info["workspace"]
        log = f"log/{remote.name}"
        env = forwarded_environment(extra=c.env)
        env[JOB_ID_VARIABLE] = self.job_id
        if c.max_restarts:
            env.update({RESTART_COUNT_ENV: str(attempt), MAX_RESTARTS_ENV: str(c.max_restarts),
                        RESTART_STATE_ENV: f"{ws.rstrip('/')}/{log}/.restart"})
        argv = [c.python, "-m", "fleet.launch",
                *(["--collective"] if c.collective else ["--servers", ",".join(self.servers)]),
                "--workers", ",".join(self.workers), "--host", self.addresses[remote.index],
                "--log_dir", log, "--stop_on_stdin_eof",
                "--result_json", f"{log}/{RESULT_NAME}",
                "--kill_timeout", f"{c.kill_timeout:g}",
                "--server_exit_timeout", f"{c.server_exit_timeout:g}"]
        if c.insecure:
            argv += ["--insecure"]
        else:
            argv += ["--keys_dir", os.path.join(ws, KEYS_DIR_NAME)]
        if c.failure_grace is not None:
            argv += ["--failure_grace", f"{c.failure_grace:g}"]
        if c.timeout is not None:
            argv += ["--timeout", f"{c.timeout:g}"]
        argv += [c.training_script, *c.script_args]
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"cd {shlex.quote(ws)} && exec env {assignments} {shlex.join(argv)}"

    def _start_and_watch(self, attempt=0):
        c = self.config
        what = (f"a collective job of {plural(len(self.workers), 'worker')}" if c.collective else
                f"{plural(len(self.servers), 'server')} and {plural(len(self.workers), 'worker')}")
        say(f"starting {what} on {plural(len(self.remotes), 'host')} "
            f"(job {self.job_id}); logs in {c.log_dir}/<host>/")
        for r in self.remotes:
            share = self.layout.shares[r.name]
            mine = ",".join(self.servers[i] for i in share.servers)
            servers = ("" if c.collective else f"servers {indexes_text(share.servers)}"
                       f"{f' ({mine})' if share.servers else ''}, ")
            mine = ",".join(self.workers[i] for i in share.workers)
            workers = f" ({mine})" if c.collective and share.workers else ""
            print(f"    {r.name}: {servers}workers {indexes_text(share.workers)}{workers}",
                  file=sys.stderr, flush=True)
        exited = threading.Event()
        code = None
        try:
            for r in self.remotes:
                if self.signals.received:
                    break
                self._start(r, exited, attempt)
            code = self._watch(exited)
        finally:
            self._stop_all("fleetrun ended" if code is None else None)
            for r in self.remotes:
                for t in r.threads:
                    t.join(5.0)
            self._sweep()
            self._fetch_logs()
        return self._conclude(code)

    def _start(self, remote, exited, attempt=0):
        argv = self.ssh.command(remote.host, self._remote_command(remote, attempt),
                                ["-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"])
        log = open(os.path.join(remote.log_dir, "fleetrun.log"), "a", encoding="utf-8")
        remote.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True,
                                       preexec_fn=die_with_parent(os.getpid()))
        streams_stdout = 0 in self.layout.shares[remote.name].workers
        lock = threading.Lock()

        def copy_stdout():
            with remote.proc.stdout:
                for chunk in iter(lambda: remote.proc.stdout.read1(1 << 16), b""):
                    if streams_stdout:
                        write_stdout(chunk)
                    else:
                        with lock:
                            log.write(chunk.decode("utf-8", "replace"))
                            log.flush()

        def copy_stderr():
            with remote.proc.stderr:
                for raw in iter(remote.proc.stderr.readline, b""):
                    line = raw.decode("utf-8", "replace").rstrip("\n")
                    if line.strip():
                        remote.last_stderr = line
                    print(f"[{remote.name}] {line}", file=sys.stderr, flush=True)
                    with lock:
                        log.write(line + "\n")
                        log.flush()

        def wait():
            for t in remote.threads[:2]:
                t.join()
            remote.proc.wait()
            remote.exit_time = time.time()
            log.close()
            exited.set()

        remote.threads = [threading.Thread(target=f, daemon=True, name=f"fleetrun-{f.__name__} {remote.name}")
                          for f in (copy_stdout, copy_stderr)]
        for t in remote.threads:
            t.start()
        waiter = threading.Thread(target=wait, daemon=True, name=f"fleetrun-wait {remote.name}")
        waiter.start()
        remote.threads.append(waiter)

    def _watch(self, exited):
        c = self.config
        started = time.monotonic()
        while True:
            if self.signals.received:
                name = signal.Signals(self.signals.received).name
                say(f"received {name}; stopping every host")
                self._stop_all(f"fleetrun got {name}")
                return 128 + self.signals.received
            done = [r for r in self.remotes if r.exit_time is not None]
            failed = [r for r in done if r.returncode != 0 and not r.stopped]
            if failed:
                first = min(failed, key=lambda r: r.exit_time)
                say(f"host {first.name}: {self._describe_ssh_exit(first)}; stopping every "
                    "other host")
                self._stop_all(f"host {first.name}'s failure")
                return EXIT_PROCESS_FAILED
            if len(done) == len(self.remotes):
                return EXIT_OK
            if c.timeout is not None and time.monotonic() - started >= c.timeout + c.kill_timeout + 30:
                say(f"the hosts did not end within --timeout {c.timeout:g} s and their own "
                    "stop; stopping every host")
                self._stop_all(f"--timeout {c.timeout:g} s")
                return EXIT_TIMEOUT
            exited.wait(_POLL_SECONDS)
            exited.clear()

    def _describe_ssh_exit(self, r):
        if r.returncode == 255:
            line = r.last_stderr or "no message"
            if re.search(r"^(ssh|client_loop|Connection|Timeout|Read from remote)|closed by|"
                         r"not responding|Broken pipe", line):
                return f"ssh exited 255 (connection lost: {line})"
            return f"ssh exited 255 (its fleetrun was killed, or the connection lost: {line})"
        return f"its fleetrun exited with code {r.returncode}"

    def _stop_all(self, reason):
        """Close every running host's stdin (its fleetrun stops its processes), kill the
        ssh clients still there after kill_timeout + 5 s. Blocks at most that long."""
        running = [r for r in self.remotes if r.proc is not None and r.exit_time is None]
        if not running:
            return
        for r in running:
            r.stopped = True
            r.stop_reason = r.stop_reason or reason
            try:
                r.proc.stdin.close()
            except OSError:
                pass
        limit = self.config.kill_timeout + 5.0
        deadline = time.monotonic() + limit
        wait = WaitLog(", ".join(f"host {r.name}" for r in running) + " to stop its processes",
                       limit=f"killing the ssh clients after {limit:g} s (--kill_timeout + 5)",
                       logger=SAY_LOGGER)
        while time.monotonic() < deadline and any(r.exit_time is None for r in running):
            if self.signals.hurry:
                break
            wait.tick("not yet: " + ", ".join(r.name for r in running if r.exit_time is None))
            time.sleep(_POLL_SECONDS)
        for r in running:
            if r.exit_time is None:
                say(f"host {r.name}: its fleetrun did not end within {limit:g} s of its stdin "
                    "closing; killing its ssh")
                signal_group(r.proc.pid, signal.SIGKILL)
        for r in running:
            r.threads[-1].join(5.0)

    # -- after the job -----------------------------------------------------------------
    def _sweep(self):
        """Kill and report any process of this job left on each host (FLEET_JOB_ID)."""
        if not self.remotes or all(r.proc is None for r in self.remotes):
            return
        script = _SWEEP.replace("JOB_ID", self.job_id)

        def sweep(r):
            remote = f"{shlex.quote(self.config.python)} -c {shlex.quote(script)}"
            return run_bounded(self.ssh.command(r.host, remote), SWEEP_SECONDS)

        results = in_parallel(self.remotes, sweep, SWEEP_SECONDS + 1,
                              "the check for leftover processes")
        for r in self.remotes:
            res = results[r.name]
            if res is None or res[0] is None:
                r.unreachable = (None, "")
                say(f"host {r.name}: could not check for leftover processes of job "
                    f"{self.job_id} (no answer within {SWEEP_SECONDS:g} s)")
            elif res[0] != 0:
                # No route to it: fetching its logs would wait for ssh's connect timeout again.
                if _UNREACHABLE.search(res[2] or ""):
                    r.unreachable = (res[0], res[2])
                say(f"host {r.name}: could not check for leftover processes: "
                    f"{_last_line(res[2])}")
            elif res[1].strip():
                say(f"host {r.name}: killed processes of this job still running there:")
                for line in res[1].strip().splitlines():
                    print(f"    {line}", file=sys.stderr, flush=True)

    def _fetch_logs(self):
        if not any(r.proc is not None for r in self.remotes):
            return
        rsync = shutil.which("rsync") is not None

        def fetch(r):
            src = os.path.join(r.info["workspace"], "log", r.name)
            if rsync and r.info.get("rsync"):
                argv = ["rsync", "-a", "-e", self.ssh.rsh(r.host),
                        self.ssh.remote_spec(r.host, src + "/"), r.log_dir + "/"]
            else:
                argv = self.ssh.scp(r.host, [self.ssh.remote_spec(r.host, src)],
                                    os.path.dirname(r.log_dir.rstrip("/")) or ".")
            return run_bounded(argv, FETCH_SECONDS)

        reachable = [r for r in self.remotes if r.unreachable is None]
        results = in_parallel(reachable, fetch, FETCH_SECONDS + 1, "fetching the logs")
        for r in self.remotes:
            res = results.get(r.name)
            if r.unreachable is not None:
                say(f"host {r.name}: its logs were not fetched (unreachable a moment ago); they stay "
                    f"in {r.info['workspace']}/log/{r.name} there")
            elif res is None or res[0] is None:
                say(f"host {r.name}: fetching its logs did not finish within "
                    f"{FETCH_SECONDS:g} s; they stay in {r.info['workspace']}/log/{r.name} there")
            elif res[0] != 0:
                say(f"host {r.name}: could not fetch its logs ({_last_line(res[2])}); they stay "
                    f"in {r.info['workspace']}/log/{r.name} there")
            path = os.path.join(r.log_dir, RESULT_NAME)
            try:
                with open(path, encoding="utf-8") as f:
                    r.result = json.load(f)
            except (OSError, ValueError):
                r.result = None

    def _conclude(self, code):
        self._report_hosts()
        if code == EXIT_OK:
            say(f"done: every host's fleetrun exited 0; logs in {self.config.log_dir}/<host>/")
            return EXIT_OK
        cause = self._root_cause()
        if code == EXIT_PROCESS_FAILED and self.config.max_restarts:
            say(f"the root cause: {cause}")  # fleet.launch.restart says whether the job restarts
        elif code == EXIT_PROCESS_FAILED:
            say(f"exit {EXIT_PROCESS_FAILED}: {cause}")
        elif cause and code is not None and code >= 128:
            say(f"exit {code}: stopped by {signal.Signals(code - 128).name}")
        return code if code is not None else EXIT_PROCESS_FAILED

    def _root_cause(self):
        """The earliest failure over every host's result file that is not a consequence of
        another (see below), or the first host seen to fail without a result."""
        found = self._root_candidate()
        return found[2] if found else "no host reported a cause; see the hosts' fleetrun.log files"

    def _root_failure(self, attempt):
        """The root cause of an attempt as a restart.Failure, or None when no host failed."""
        found = self._root_candidate()
        return None if found is None else found[3](attempt)

    def _root_candidate(self):
        candidates = []
        for r in self.remotes:
            cause = (r.result or {}).get("cause")
            if cause:
                log = os.path.join(self.config.log_dir, r.name, os.path.basename(cause.get("log") or ""))
                code = cause.get("exit_code")
                how = (f"was killed by {signal_name(-code)}" if isinstance(code, int) and code < 0
                       else f"exited with code {code}")
                error = cause.get("error")
                candidates.append((_is_consequence(error), cause.get("exit_time") or float("inf"),
                                   f"{r.label} {cause.get('role')} {cause.get('index')} (pid "
                                   f"{cause.get('pid')}) {how}{': ' + error if error else ''}; "
                                   f"log: {log}",
                                   lambda attempt, r=r, cause=cause, how=how, error=error: Failure(
                                       attempt, cause.get("role"), cause.get("index"), r.endpoint_host or r.name,
                                       cause.get("pid"), how, error or "", cause.get("exit_time") or time.time())))
            elif r.returncode not in (0, None) and not r.stopped:
                what = self._describe_ssh_exit(r)
                if r.returncode != 255 and r.last_stderr:
                    what += f": {r.last_stderr}"
                candidates.append((False, r.exit_time or float("inf"), f"{r.label}: {what}",
                                   lambda attempt, r=r, what=what: Failure(
                                       attempt, "host", r.index, r.name, None, f"failed ({what})", "",
                                       r.exit_time or time.time())))
        if not candidates:
            return None
        # Earliest first, but an error that says it follows another process's loss comes
        # after every other: a failing worker tells the servers before its own process has
        # exited, so a worker on another host told of it may exit first.
        return min(candidates, key=lambda c: c[:2])

    def _report_hosts(self):
        say("how each host ended:")
        for r in self.remotes:
            if r.proc is None:
                print(f"    {r.label}: not started", file=sys.stderr, flush=True)
                continue
            end = "fleetrun exited 0" if r.returncode == 0 else self._describe_ssh_exit(r)
            if r.stopped:
                end += f" (stopped by the dispatcher after {r.stop_reason})"
            procs = (r.result or {}).get("processes") or []
            detail = "; ".join(f"{p.get('role')} {p.get('index')}: {p.get('end')}" for p in procs)
            print(f"    {r.label}: {end}{' -- ' + detail if detail else ''}", file=sys.stderr,
                  flush=True)


# Runs on each host after the job: kills (SIGKILL) every process of this network namespace
# whose environment holds FLEET_JOB_ID=<this job> and prints "pid cmdline" of each.
_SWEEP = r"""
import os, signal
marker = b"FLEET_JOB_ID=JOB_ID"
def netns(pid):
    try:
        return os.readlink("/proc/%s/ns/net" % pid)
    except OSError:
        return None
mine = netns("self")
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = f.read().split(b"\0")
        if marker not in env or netns(pid) != mine:
            continue
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        os.kill(int(pid), signal.SIGKILL)
        print(pid, cmd, flush=True)
    except (OSError, ProcessLookupError):
        pass
"""


def _host_failure(attempt, lost, when):
    """The failure of an attempt after which hosts failed the preflight: role "host", the
    first lost host's index; every lost host and its problem in ``how``."""
    first = lost[0][0]
    names = ", ".join(r.endpoint_host or r.name for r, _ in lost)
    problems = "; ".join(p.problem for _, p in lost)
    return Failure(attempt, "host", first.index, names, None,
                   f"was lost (failed the preflight before the restart: {problems})", "", when)


_UNREACHABLE = re.compile(r"Connection timed out|No route to host|Network is unreachable|"
                          r"Could not resolve hostname|Connection refused")
_CONSEQUENCE = re.compile(r"\bwas lost\b|^fleet\.errors\.(ServerLostError|PeerLostError)\b")


def _is_consequence(error):
    """True for an error line that names another process's loss as its reason."""
    return bool(error) and _CONSEQUENCE.search(error) is not None


def _usable_keys(path):
    try:
        from fleet.transport.curve import CurveConfig
        keys = CurveConfig.from_dir(path)
        return keys.server_secret is not None and keys.client_secret is not None
    except (FleetError, OSError):
        return False


def _excluded_log_dir(source, log_dir):
    """The rsync --exclude of the local log directory when it lies inside source."""
    log = os.path.abspath(log_dir)
    rel = os.path.relpath(log, source)
    if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
        return None
    return "/" + rel.strip(os.sep) + "/"
