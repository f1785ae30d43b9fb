"""What fleetrun --hosts sends to its hosts before the job starts: the job's CURVE keys and
the workspace.

Unless --insecure, the dispatcher makes the job's CURVE keys (kept in the --dispatch
directory and reused while usable, or made anew for a --workspace job); then it copies
the --dispatch directory, or only the keys, to every host at once: rsync over ssh (only
what changed; the local log directory left out when it lies inside), or scp -r when
rsync is missing on either side.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile

from fleet.errors import FleetError
from fleet.launch.config import EXIT_PROCESS_FAILED
from fleet.launch.report import plural, say
from fleet.launch.ssh import in_parallel, last_line, run_bounded

KEYS_DIR_NAME = ".fleet_keys"
COPY_SECONDS = 600.0


def make_keys(config):
    """Make the job's CURVE keys, or reuse usable ones in the --dispatch directory.

    Args:
        config: the job (a HostsConfig).

    Returns:
        (keys_dir, temp_dir): the local keys directory, and the temporary directory that
        holds it for a --workspace job (the caller removes it after the job), else None.
    """
    from fleet.transport.curve import generate_keys
    c = config
    if c.dispatch is not None:
        keys = os.path.join(c.dispatch, KEYS_DIR_NAME)
        if _usable_keys(keys):
            say(f"CURVE keys: reusing {keys} (delete it to make new ones)")
        else:
            shutil.rmtree(keys, ignore_errors=True)
            generate_keys(keys)
            say(f"CURVE keys: made {keys} (owner-only); it goes with the workspace")
        return keys, None
    temp_keys = tempfile.mkdtemp(prefix="fleet-keys-")
    keys = os.path.join(temp_keys, KEYS_DIR_NAME)
    try:
        generate_keys(keys)
    except BaseException:
        shutil.rmtree(temp_keys, ignore_errors=True)
        raise
    say("CURVE keys: made new ones for this job; copying them to "
        f"{c.workspace}/{KEYS_DIR_NAME} on every host")
    return keys, temp_keys


def copy_workspace(config, ssh, remotes, keys_dir):
    """Copy the --dispatch directory (or, for a --workspace job, only the keys) to every host.

    Args:
        config: the job (a HostsConfig).
        ssh: the Ssh that reaches the hosts.
        remotes: the hosts' Remote objects (their preflight info names the workspace and
            whether rsync is there).
        keys_dir: the local keys directory, or None (--insecure).

    Returns:
        True when every host has it (or there was nothing to copy); False after saying
        which host failed.

    Blocks at most COPY_SECONDS (+ the poll); the hosts are copied to at once.
    """
    c = config
    rsync_local = shutil.which("rsync") is not None
    if c.dispatch is not None:
        source = os.path.abspath(c.dispatch)
        what = f"--dispatch {c.dispatch}"
    elif keys_dir is not None:
        source = keys_dir
        what = "the job's keys"
    else:
        return True
    exclude = _excluded_log_dir(source, c.log_dir) if c.dispatch is not None else None

    def copy(remote):
        ws = remote.info["workspace"]
        dest = ws if c.dispatch is not None else os.path.join(ws, KEYS_DIR_NAME)
        use_rsync = rsync_local and remote.info.get("rsync")
        return _copy_one(ssh, remote, source, dest, use_rsync, exclude)

    missing = [r.name for r in remotes if not r.info.get("rsync")]
    if not rsync_local or missing:
        where = "here" if not rsync_local else "on " + ", ".join(missing)
        say(f"rsync is missing {where}: copying {what} with scp -r (everything, every run)")
    say(f"copying {what} to every host")
    results = in_parallel(remotes, copy, COPY_SECONDS, f"copying {what}")
    failed = False
    for r in remotes:
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


def _copy_one(ssh, remote, source, dest, use_rsync, exclude):
    """(error or None, summary) of copying source's contents to dest on the host."""
    h = remote.host
    if use_rsync:
        # --rsync-path makes the destination first (rsync's --mkpath needs 3.2.3).
        argv = ["rsync", "-a", "--itemize-changes", "-e", ssh.rsh(h),
                "--rsync-path", f"mkdir -p {shlex.quote(dest)} && rsync"]
        if exclude:
            argv += ["--exclude", exclude]
        argv += [source.rstrip("/") + "/", ssh.remote_spec(h, dest.rstrip("/") + "/")]
        code, out, err = run_bounded(argv, COPY_SECONDS)
        if code != 0:
            return (f"rsync exited with code {code}: {last_line(err)}", "")
        changed = [l for l in out.splitlines() if re.match(r"[<>c][fL]", l)]
        return None, f"{plural(len(changed), 'file')} copied (rsync; unchanged files skipped)"
    code, _, err = run_bounded(ssh.command(h, f"mkdir -p {shlex.quote(dest)}"), 30)
    if code != 0:
        return f"mkdir -p {dest} failed ({code}): {last_line(err)}", ""
    entries = [os.path.join(source, n) for n in sorted(os.listdir(source))
               if not (exclude and "/" + n + "/" == exclude)]
    if not entries:
        return None, "nothing to copy"
    code, _, err = run_bounded(ssh.scp(h, entries, ssh.remote_spec(h, dest + "/")),
                               COPY_SECONDS)
    if code != 0:
        return f"scp exited with code {code}: {last_line(err)}", ""
    return None, f"{plural(len(entries), 'entry', )} copied (scp -r)"


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
