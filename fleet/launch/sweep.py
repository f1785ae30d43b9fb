"""After a fleetrun --hosts job (or an attempt of it): the sweep and the logs.

Every host is swept over a fresh ssh for processes still carrying the job's FLEET_JOB_ID
(killed and reported); a host that turns out unreachable is marked so that nothing waits
for ssh's connect timeout again. Then every reachable host's logs are fetched into
``LOG_DIR/<host>/`` (rsync, or scp -r) with its result file, from which the dispatcher
names the root cause.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys

from fleet.launch.remote import RESULT_NAME
from fleet.launch.report import say
from fleet.launch.ssh import in_parallel, last_line, run_bounded

SWEEP_SECONDS = 10.0
FETCH_SECONDS = 60.0


def sweep_hosts(remotes, ssh, python, job_id):
    """Kill and report any process of this job left on each host (FLEET_JOB_ID).

    Args:
        remotes: the job's Remote objects; one that cannot be reached gets ``unreachable``.
        ssh: the Ssh that reaches the hosts.
        python: the remote python (--python).
        job_id: the job's FLEET_JOB_ID.

    Blocks at most SWEEP_SECONDS + 1 s; the hosts are swept at once.
    """
    if not remotes or all(r.proc is None for r in remotes):
        return
    script = _SWEEP.replace("JOB_ID", job_id)

    def sweep(r):
        remote = f"{shlex.quote(python)} -c {shlex.quote(script)}"
        return run_bounded(ssh.command(r.host, remote), SWEEP_SECONDS)

    results = in_parallel(remotes, sweep, SWEEP_SECONDS + 1, "the check for leftover processes")
    for r in remotes:
        res = results[r.name]
        if res is None or res[0] is None:
            r.unreachable = (None, "")
            say(f"host {r.name}: could not check for leftover processes of job "
                f"{job_id} (no answer within {SWEEP_SECONDS:g} s)")
        elif res[0] != 0:
            # No route to it: fetching its logs would wait for ssh's connect timeout again.
            if _UNREACHABLE.search(res[2] or ""):
                r.unreachable = (res[0], res[2])
            say(f"host {r.name}: could not check for leftover processes: "
                f"{last_line(res[2])}")
        elif res[1].strip():
            say(f"host {r.name}: killed processes of this job still running there:")
            for line in res[1].strip().splitlines():
                print(f"    {line}", file=sys.stderr, flush=True)


def fetch_logs(remotes, ssh):
    """Fetch every reachable host's logs into its LOG_DIR/<host>/ and read its result file.

    Args:
        remotes: the job's Remote objects; ``result`` is set on each (None when missing).
        ssh: the Ssh that reaches the hosts.

    Blocks at most FETCH_SECONDS + 1 s; the hosts are fetched from at once.
    """
    if not any(r.proc is not None for r in remotes):
        return
    rsync = shutil.which("rsync") is not None

    def fetch(r):
        src = os.path.join(r.info["workspace"], "log", r.name)
        if rsync and r.info.get("rsync"):
            argv = ["rsync", "-a", "-e", ssh.rsh(r.host),
                    ssh.remote_spec(r.host, src + "/"), r.log_dir + "/"]
        else:
            argv = ssh.scp(r.host, [ssh.remote_spec(r.host, src)],
                           os.path.dirname(r.log_dir.rstrip("/")) or ".")
        return run_bounded(argv, FETCH_SECONDS)

    reachable = [r for r in remotes if r.unreachable is None]
    results = in_parallel(reachable, fetch, FETCH_SECONDS + 1, "fetching the logs")
    for r in remotes:
        res = results.get(r.name)
        if r.unreachable is not None:
            say(f"host {r.name}: its logs were not fetched (unreachable a moment ago); they stay "
                f"in {r.info['workspace']}/log/{r.name} there")
        elif res is None or res[0] is None:
            say(f"host {r.name}: fetching its logs did not finish within "
                f"{FETCH_SECONDS:g} s; they stay in {r.info['workspace']}/log/{r.name} there")
        elif res[0] != 0:
            say(f"host {r.name}: could not fetch its logs ({last_line(res[2])}); they stay "
                f"in {r.info['workspace']}/log/{r.name} there")
        path = os.path.join(r.log_dir, RESULT_NAME)
        try:
            with open(path, encoding="utf-8") as f:
                r.result = json.load(f)
        except (OSError, ValueError):
            r.result = None


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


_UNREACHABLE = re.compile(r"Connection timed out|No route to host|Network is unreachable|"
                          r"Could not resolve hostname|Connection refused")
