"""The preflight of fleetrun --hosts: every host checked at once over ssh before anything starts.

One ssh a host, bounded at PREFLIGHT_SECONDS, runs a short remote python printing what it
found (python and fleet versions, the workspace, the NIC's address); a failure is named
per host with the fix, and nothing starts unless every host passed. With --max_restarts
it runs again before each restart on the hosts still in the job (`fleet.launch.hosts_heal`).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex

from fleet.launch.hostfile import HostEntry, HostsConfig, forwarded_environment
from fleet.launch.ssh import Ssh, in_parallel, last_line, run_bounded

PREFLIGHT_SECONDS = 10.0

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
    line = last_line(stderr)
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
                                   f"(stdout: {last_line(out)!r}); does the login shell "
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
