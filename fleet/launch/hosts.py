"""fleetrun --hosts: one job on many hosts over ssh, from any machine.

The dispatcher (this module) never starts a training process itself. It

1. parses the hosts and the job's settings (`fleet.launch.hostfile`);
2. runs the preflight on every host at once (`fleet.launch.preflight`); nothing starts
   unless every host passed;
3. computes every endpoint (`fleet.launch.hostfile.plan_endpoints`);
4. makes the job's CURVE keys (unless --insecure) and copies the workspace
   (`fleet.launch.dispatch`);
5. runs on every host, over one ssh each, the per-host form of fleetrun
   (`fleet.launch.remote`);
6. streams worker 0's output, copies every host's stderr prefixed ``[host] ``, and watches:
   the first host whose remote fleetrun fails (or whose ssh dies) ends the job; the others
   are stopped by closing their stdin, their ssh killed after --kill_timeout;
7. sweeps every host for processes still carrying the job's FLEET_JOB_ID and fetches
   every host's logs into ``LOG_DIR/<host>/`` (`fleet.launch.sweep`), and names the root
   cause: the earliest failure in the hosts' result files;
8. with --max_restarts K, runs the preflight again on every host still in the job and
   starts them all again (``_run_with_restarts``); a host that fails it leaves the job
   and its servers and workers move to the others (`fleet.launch.hosts_heal`).

How it reaches the hosts (ssh, scp, rsync) is `fleet.launch.ssh`.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import uuid

from fleet.checkpoint import RESTART_STATE_ENV, noted_checkpoint_dirs
from fleet.errors import ConfigError
from fleet.launch.config import (EXIT_OK, EXIT_PROCESS_FAILED, EXIT_TIMEOUT, EXIT_USAGE,
                                 MAX_RESTARTS_ENV, RESTART_COUNT_ENV)
from fleet.launch.dispatch import KEYS_DIR_NAME, copy_workspace, make_keys
from fleet.launch.hostfile import JOB_ID_VARIABLE, HostsConfig, forwarded_environment, plan_endpoints
from fleet.launch.hosts_heal import JobLayout, describe_moves, drop_hosts, first_shares, indexes_text
from fleet.launch.local import SignalCatcher, signal_group
from fleet.launch.preflight import PREFLIGHT_SECONDS, Preflight, classify_ssh_failure, preflight
from fleet.launch.remote import RESULT_NAME, Remote
from fleet.launch.restart import Failure, conclude, decide_restart, log_event
from fleet.launch.report import SAY_LOGGER, plural, say, signal_name
from fleet.launch.ssh import Ssh
from fleet.launch.sweep import fetch_logs, sweep_hosts
from fleet.logs import WaitLog

_POLL_SECONDS = 0.05


def run_hosts(config: HostsConfig) -> int:
    """Run a --hosts job; blocks until it is over and returns fleetrun's exit code.

    Raises:
        ConfigError: bad settings found before anything started (exit 2).
    """
    with SignalCatcher() as signals:
        return _HostsJob(config, signals).run()


class _HostsJob:
    """One --hosts job, phase by phase; driven by one thread (not thread-safe)."""

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
        self._plan(checks)
        try:
            if not c.insecure:
                self.keys_dir_local, self.temp_keys = make_keys(c)
            if not copy_workspace(c, self.ssh, self.remotes, self.keys_dir_local):
                return EXIT_PROCESS_FAILED if not self.signals.received else 128 + self.signals.received
            code = self._start_and_watch() if not c.max_restarts else self._run_with_restarts()
        finally:
            if self.temp_keys:
                shutil.rmtree(self.temp_keys, ignore_errors=True)
        return code

    def _plan(self, checks):
        """After a passed preflight: the remotes, every endpoint and the local log directories.

        Raises:
            ConfigError: a log directory cannot be made.
        """
        c = self.config
        addresses = [p.info["nic_address"] if c.nic else p.host.host for p in checks]
        for i, p in enumerate(checks):
            shown = p.info.get("nic_address") if c.nic else p.info.get("address")
            self.remotes.append(Remote(p.host, i, p.info, shown,
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
            self.remotes = [Remote(r.host, r.index, r.info, r.endpoint_host, r.log_dir) for r in self.remotes]

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
            sweep_hosts(self.remotes, self.ssh, c.python, self.job_id)
            fetch_logs(self.remotes, self.ssh)
        return self._conclude(code)

    def _start(self, remote, exited, attempt=0):
        argv = self.ssh.command(remote.host, self._remote_command(remote, attempt),
                                ["-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"])
        remote.start(argv, 0 in self.layout.shares[remote.name].workers, exited)

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




def _host_failure(attempt, lost, when):
    """The failure of an attempt after which hosts failed the preflight: role "host", the
    first lost host's index; every lost host and its problem in ``how``."""
    first = lost[0][0]
    names = ", ".join(r.endpoint_host or r.name for r, _ in lost)
    problems = "; ".join(p.problem for _, p in lost)
    return Failure(attempt, "host", first.index, names, None,
                   f"was lost (failed the preflight before the restart: {problems})", "", when)


_CONSEQUENCE = re.compile(r"\bwas lost\b|^fleet\.errors\.(ServerLostError|PeerLostError)\b")


def _is_consequence(error):
    """True for an error line that names another process's loss as its reason."""
    return bool(error) and _CONSEQUENCE.search(error) is not None


