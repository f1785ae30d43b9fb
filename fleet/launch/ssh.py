"""How the dispatcher of fleetrun --hosts reaches its hosts: ssh, scp and rsync (the
system's OpenSSH, never asking for a password), bounded runs, and work on every host at once."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time

from fleet.launch.local import die_with_parent, signal_group
from fleet.launch.report import SAY_LOGGER
from fleet.logs import WaitLog

CONNECT_TIMEOUT = 5
_POLL_SECONDS = 0.05
_SSH_BASE = ("-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}")


class Ssh:
    """How the dispatcher runs ssh, scp and rsync to the hosts (the system's OpenSSH).

    Its methods only build argv lists (BatchMode, so never a password prompt; a connect
    timeout of CONNECT_TIMEOUT s); they do not block and are thread-safe.
    """

    def __init__(self, config_file=None):
        self.config_file = config_file

    def base(self, host, extra=()):
        """argv of ssh to host without the remote command (extra: more ssh options)."""
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
        """argv of scp copying sources to dest (either side may be a remote_spec of host)."""
        argv = ["scp", "-q", "-p"] + (["-r"] if recursive else [])
        if self.config_file:
            argv += ["-F", self.config_file]
        argv += list(_SSH_BASE)
        if host.port:
            argv += ["-P", str(host.port)]
        return argv + list(sources) + [dest]

    @staticmethod
    def remote_spec(host, path):
        """``[user@]host:path`` as scp and rsync take it (an IPv6 host in brackets)."""
        user = f"{host.user}@" if host.user else ""
        h = f"[{host.host}]" if ":" in host.host else host.host
        return f"{user}{h}:{path}"


def run_bounded(argv, timeout, stdin=subprocess.DEVNULL, input_=None):
    """Run argv with captured text output; (returncode, stdout, stderr), returncode None on
    timeout (the process group was killed).

    Blocks at most timeout seconds (then until the killed group's output ends); thread-safe.
    """
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



def last_line(text):
    """The last non-blank line of a command's output (stripped), or "" when there is none."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1] if lines else ""
