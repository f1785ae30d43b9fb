"""The hosts of a fleetrun --hosts job and its configuration: what runs where.

- the hosts (``[user@]host[:sshport]``, from ``--hosts`` or a hostfile, whose lines may
  add ``servers=N`` / ``workers=M`` for that host): `parse_hosts`, `HostEntry`;
- the job's settings, validated on construction: `HostsConfig`;
- every endpoint: host i's servers get ports start_port.., its workers the next ones;
  global indexes go host by host, so worker 0 is on the first host with workers (a
  collective job, ``--collective``, has workers only): `plan_endpoints`;
- the environment every remote fleetrun gets: `forwarded_environment`.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys

from fleet.errors import ConfigError
from fleet.launch.config import BLAS_THREAD_VARIABLES, check_restart_options

DEFAULT_REMOTE_DIR = "~/fleet_jobs/{name}"
JOB_ID_VARIABLE = "FLEET_JOB_ID"
# Variables of the dispatcher's environment that every remote fleetrun gets (besides
# --env): fleet's and Paddle's settings, Python's (PYTHONPATH, as DeepSpeed's launcher
# forwards), numba's and the BLAS thread counts. CURVE variables are not forwarded: the
# job's keys go with --keys_dir.
FORWARDED_PREFIXES = ("FLEET_", "FLAGS_", "PYTHON", "NUMBA_")
FORWARDED_NAMES = ("CPU_NUM",) + BLAS_THREAD_VARIABLES
NOT_FORWARDED_PREFIXES = ("FLEET_CURVE_",)
NOT_FORWARDED_NAMES = (JOB_ID_VARIABLE, "PYTHONHOME", "PYTHONSTARTUP")

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
        """ssh's options for this host: ``-p PORT`` when a port was given."""
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
        self._check_counts()
        for item in self.env:
            name, sep, _ = item.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ConfigError(f"--env {item!r}: write NAME=VALUE")
        if self.nic is not None and not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", self.nic):
            raise ConfigError(f"--nic {self.nic!r} is not an interface name (such as eth0)")
        if self.ssh_config is not None and not os.path.isfile(self.ssh_config):
            raise ConfigError(f"--ssh_config {self.ssh_config!r} is not a file; give an "
                              "ssh_config file (as for ssh -F)")

    def _check_counts(self):
        """Checks the process counts (per host and the hostfile's) and the ports they take."""
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

