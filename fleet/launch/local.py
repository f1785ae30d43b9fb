"""The processes of one host: start them, watch them, stop them all, report how each ended."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from fleet.endpoints import join_endpoint, parse_endpoint
from fleet.errors import ConfigError, FleetError
from fleet.launch.config import (EXIT_OK, EXIT_PROCESS_FAILED, EXIT_TIMEOUT, LaunchConfig,
                                 binds_any, process_environment, restart_environment)
from fleet.launch.report import (SAY_LOGGER, TAIL_LINES, last_error, plural, say, signal_name,
                                 tail, write_stdout)
from fleet.launch.summary import LiveSummary
from fleet.logs import WaitLog, wait_log_ms

_POLL_SECONDS = 0.05
_LOST = re.compile(r"\b(worker|server) (\d+) was lost\b")  # a process told of another's failure says so
_REAP_SECONDS = 10.0
_PR_SET_PDEATHSIG = 1
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def launch(config: LaunchConfig, monitor=None, regroup=None) -> int:
    """Start every process of the job, watch them, stop them all, return the exit code.

    Blocks until the job is over. Installs handlers for SIGINT, SIGTERM and SIGHUP while
    it runs when called from the main thread (restored on return). Not re-entrant.

    Args:
        config: the job.
        monitor: None, or an object whose ``poll()`` (called every 50 ms, must not block)
            returns None or a sentence saying why the job must end, e.g. the etcd
            rendezvous's membership change: the job then stops and fleetrun exits 1 with it.
        regroup: under --elastic_server with --max_restarts, the job's
            `fleet.launch.etcd_rounds.Regroup`: a lost host then starts a new round with
            ``regroup.config`` and ``regroup.monitor`` instead of ending the job.

    Returns:
        EXIT_OK, EXIT_PROCESS_FAILED, EXIT_TIMEOUT, or 128 + the signal fleetrun received.

    Raises:
        ConfigError: the script is missing, a port is taken or the log directory cannot
            be made; nothing was started.
        FleetError: a process could not be started (those already started are stopped).
    """
    _check_ready(config)
    with SignalCatcher() as signals:
        if config.max_restarts:
            # Each attempt is a new _Job: under --elastic_server with the current round's
            # plan (ranks, endpoints) and monitor; a lost host starts a new round.
            from fleet.launch.restart import run_with_restarts

            def make_job(attempt, started):
                if regroup is None:
                    return _Job(config, signals, monitor, attempt, started)
                return _Job(regroup.config, signals, regroup.monitor, attempt, started)
            if regroup is None:
                return run_with_restarts(config, make_job, signals)
            return run_with_restarts(config, make_job, signals, regroup)
        return _Job(config, signals, monitor).run()


def _check_ready(config):
    wait_log_ms()  # a malformed FLEET_WAIT_LOG_MS is a usage error now, not a crash mid-job
    if not os.path.isfile(config.training_script):
        raise ConfigError(f"training script {config.training_script!r} is not a file (looked "
                          f"from {os.getcwd()}); give the path of the Python script to run")
    problems = []
    for role, endpoints in (("server", config.server_endpoints),
                            ("worker", config.worker_endpoints)):
        for i in config.here(role) if endpoints else ():
            endpoint = endpoints[i]
            host, port = parse_endpoint(endpoint, f"{role} {i}'s endpoint")
            if binds_any(config, role, i):
                host = "::" if ":" in host else "0.0.0.0"
            problem = probe_port(host, port)
            if problem:
                problems.append(f"{role} {i}'s endpoint {endpoint}: {problem}")
    for role, i in _processes_here(config):
        port = config.metrics_port_of(role, i)
        if port is not None:
            host = _metrics_bind_host(config, role, i)
            problem = probe_port(host, port)
            if problem:
                problems.append(f"{role} {i}'s metrics port {port} (--metrics_port "
                                f"{config.metrics_port} + {port - config.metrics_port}): {problem}")
    if problems:
        other = " (or --metrics_port)" if any("metrics port" in p for p in problems) else ""
        fix = (f"Free the port, choose another --start_port{other}, or leave out "
               "--start_port/--servers/--workers to get free ports"
               if any("already in use" in p for p in problems) else
               "Give endpoints this machine can bind, such as 127.0.0.1:PORT")
        raise ConfigError("; ".join(problems) + ". " + fix)
    try:
        os.makedirs(config.log_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the log directory {config.log_dir!r} "
                          f"({e.strerror}); give a writable --log_dir") from e


def _processes_here(config):
    return [("server", i) for i in config.here("server")] + [("worker", i) for i in config.here("worker")]


def _metrics_bind_host(config, role, index):
    """The address a process's metrics endpoint binds (as ``fleet.telemetry.start``
    chooses it): the wildcard for processes of ``bind_any`` / ``bind_any_workers`` and in
    local training, else its endpoint's host."""
    endpoints = config.server_endpoints if role == "server" else config.worker_endpoints
    if index >= len(endpoints) or binds_any(config, role, index):
        return "0.0.0.0"
    return parse_endpoint(endpoints[index], f"{role} {index}'s endpoint")[0]


def metrics_url(config, role, index):
    """Where fleetrun reads a process's metrics (loopback for a wildcard binding)."""
    host = _metrics_bind_host(config, role, index)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{join_endpoint(host, config.metrics_port_of(role, index))}/metrics"


def probe_port(host, port):
    """None if a server could bind host:port now (as servers do, with SO_REUSEADDR), else
    what is wrong, as a phrase. Never blocks."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        return f"host {host!r} does not resolve ({e.strerror})"
    with socket.socket(family, kind, proto) as s:
        # Servers (ZeroMQ) set SO_REUSEADDR too, so a port in TIME_WAIT is not "taken".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} is already in use"
            if e.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this machine, and fleetrun starts " \
                       "every process here"
            return f"cannot bind port {port} ({e.strerror})"
    return None


class SignalCatcher:
    """Records SIGINT/SIGTERM/SIGHUP instead of dying, so the job loop can stop children.

    A second signal sets ``hurry``: stop at once with SIGKILL instead of waiting.
    """

    def __init__(self):
        self.received = None
        self.hurry = False
        self.stdin_closed = False  # set by the --stop_on_stdin_eof watcher
        self._previous = {}

    def watch_stdin(self, wake):
        """Sets ``stdin_closed`` (and ``wake``) once standard input reaches end of file."""
        def read_to_eof():
            # os.read on the descriptor, not sys.stdin's buffered reader: a daemon thread
            # blocked inside the reader holds its lock, and Python aborts at exit ("could
            # not acquire lock for <stdin> at interpreter shutdown", SIGABRT) when the main
            # thread's shutdown touches stdin.
            try:
                fd = sys.stdin.fileno()
                while os.read(fd, 4096):
                    pass
            except (OSError, ValueError, AttributeError):
                pass
            self.stdin_closed = True
            wake.set()

        threading.Thread(target=read_to_eof, name="fleetrun-stdin", daemon=True).start()

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
        else:
            self.hurry = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in _HANDLED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _Child:
    """One started process: its role, index, Popen and log.

    A thread per child waits for it, so ``exit_time`` is when it exited (to the
    millisecond), not when the launcher next looked: the first failure is the first by time.
    """

    def __init__(self, role, index, popen, log_path, endpoint=None, exited=None):
        self.role = role
        self.index = index
        self.popen = popen
        self.log_path = log_path
        self.endpoint = endpoint
        self.exit_time = None        # time.monotonic() of its exit, once it exited
        self.exit_wall_time = None   # time.time() of its exit (compared across hosts)
        self.stopped_by_us = False   # its exit is the launcher's doing, not a failure
        self.stop_signal = None      # the last signal the launcher sent it ("SIGTERM", "SIGKILL")
        self.stop_reason = None      # why the launcher stopped it, e.g. "worker 1's failure"
        self.tolerated = False       # elastic jobs: a lost worker the job goes on without
        self._exited = exited        # a threading.Event the job loop waits on
        self._waiter = threading.Thread(target=self._wait, name=f"fleetrun-wait {self.name}",
                                        daemon=True)
        self._waiter.start()

    def _wait(self):
        self.popen.wait()
        self.exit_wall_time = time.time()
        self.exit_time = time.monotonic()
        if self._exited is not None:
            self._exited.set()  # the job loop sees the exit now, not at its next look

    @property
    def name(self):
        return f"{self.role} {self.index}"

    @property
    def label(self):
        return f"{self.name} (pid {self.popen.pid})"

    @property
    def returncode(self):
        """The exit code once the process has exited (negative: killed by that signal), else None."""
        return self.popen.returncode if self.exit_time is not None else None

    def wait(self, timeout):
        """Waits up to timeout seconds; True once the process has exited."""
        self._waiter.join(timeout)
        return self.exit_time is not None

    def failed(self):
        return self.returncode not in (None, 0) and not self.stopped_by_us and not self.tolerated

    def describe_exit(self):
        code = self.returncode
        if code is None:
            return "is still running"
        if code < 0:
            return f"was killed by {signal_name(-code)}"
        return f"exited with code {code}"

    def error_line(self):
        """The error the log ends with (a Python exception's last traceback line), or ''."""
        return last_error(tail(self.log_path, TAIL_LINES))

    def describe_end(self, cause=None):
        """How it ended, for the final report: "exited 0", "exited with code 3 (the root
        cause)", "stopped by fleetrun (SIGTERM) after worker 1's failure", ..."""
        code = self.returncode
        if code is None:
            return "is still running (it did not die after SIGKILL)"
        if self.stopped_by_us:
            sent = self.stop_signal or "SIGTERM"
            why = f" after {self.stop_reason}" if self.stop_reason else ""
            if code < 0 and signal_name(-code) == sent:
                return f"stopped by fleetrun ({sent}){why}"
            return f"{self.describe_exit()} when fleetrun stopped it ({sent}){why}"
        if code == 0:
            return "exited 0"
        text = self.describe_exit()
        if cause is self:
            return text + " (the root cause)"
        if cause is not None and cause.exit_time is not None and self.exit_time is not None:
            text += f" {self.exit_time - cause.exit_time:.1f} s after {cause.name}"
        error = self.error_line()
        return text + (f": {error}" if error else "")


class _LogStreamer(threading.Thread):
    """Copies a log file to fleetrun's stdout as it grows (tail -f), until finish()."""

    def __init__(self, path):
        super().__init__(name=f"fleetrun-stream {path}", daemon=True)
        self._path = path
        self._done = threading.Event()

    def run(self):
        with open(self._path, "rb") as f:
            while True:
                chunk = f.read(1 << 16)
                if chunk:
                    if not self._write(chunk):
                        return
                elif self._done.is_set():
                    # The writer has exited; one last read catches its final bytes.
                    chunk = f.read()
                    if chunk:
                        self._write(chunk)
                    return
                else:
                    self._done.wait(_POLL_SECONDS)

    def _write(self, chunk):
        error = write_stdout(chunk)
        if error is not None:
            # stdout closed (e.g. piped into `head`): keep the job running, say where the
            # output still is.
            say(f"stopped copying {self._path} to stdout ({error}); the full log is in that file")
            return False
        return True

    def finish(self, timeout):
        """Copy what is left and stop. Blocks up to timeout seconds."""
        self._done.set()
        self.join(timeout)


class _Job:
    """Starts, watches and stops the processes of one LaunchConfig. Main-thread only."""

    def __init__(self, config, signals, monitor=None, attempt=0, started=None):
        self.config = config
        self.signals = signals
        self.monitor = monitor
        self.attempt = attempt           # 0, then 1.. for each restart (--max_restarts)
        self.started = started           # time.monotonic() the job (its first attempt) started
        self.children = []
        self.exited = threading.Event()  # set by a child's waiter thread when it exits
        self.cause = None                # the first process to fail, once one did
        self.membership_change = None    # the monitor's sentence, once it ended the job
        self.elastic = None              # an ElasticPolicy (--np MIN:MAX) while the job runs
        if config.elastic is not None:
            from fleet.launch.elastic import ElasticPolicy

            self.elastic = ElasticPolicy(self)

    def run(self):
        streamer = None
        summary = None
        code = None
        try:
            if self.config.stop_on_stdin_eof:
                self.signals.watch_stdin(self.exited)
            self._start_all()
            if self.elastic is not None:
                self.elastic.start()
            first = [ch for ch in self.children if ch.role == "worker" and ch.index == 0]
            if first:
                streamer = _LogStreamer(first[0].log_path)
                streamer.start()
            if self.config.live_summary is not None:
                summary = LiveSummary(self._summary_targets, self.config.live_summary)
                summary.start()
            code = self._watch()
            return code
        finally:
            if self.elastic is not None:
                self.elastic.stop()
            if summary is not None:
                summary.stop()
            self._stop(self._running(), "fleetrun ended")
            self._kill_leftover_groups()
            if streamer is not None:
                streamer.finish(timeout=5.0)
            self._report_every_end()
            if self.config.result_json:
                self._write_result(EXIT_PROCESS_FAILED if code is None else code)

    def _write_result(self, code):
        cause = self.cause
        result = {
            "exit_code": code,
            "host": self.config.host,
            "cause": None if cause is None else {
                "role": cause.role, "index": cause.index, "pid": cause.popen.pid,
                "exit_code": cause.returncode, "error": cause.error_line(),
                "log": cause.log_path, "exit_time": cause.exit_wall_time,
            },
            "processes": [{
                "role": ch.role, "index": ch.index, "pid": ch.popen.pid,
                "endpoint": ch.endpoint, "returncode": ch.returncode,
                "end": ch.describe_end(cause), "error": ch.error_line(), "log": ch.log_path,
            } for ch in self.children],
        }
        path = self.config.result_json
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
            os.replace(path + ".tmp", path)
        except OSError as e:
            say(f"could not write --result_json {path} ({e.strerror})")

    def _report_every_end(self):
        if not self.children:
            return
        say("how each process ended:")
        for ch in self.children:
            where = f", {ch.endpoint}" if ch.role == "server" and ch.endpoint else ""
            print(f"    {ch.name} (pid {ch.popen.pid}{where}): {ch.describe_end(self.cause)}",
                  file=sys.stderr, flush=True)

    # -- starting ----------------------------------------------------------------------
    def _start_all(self):
        c = self.config
        plan = [("server", i) for i in c.here("server")]
        plan += [("worker", i) for i in c.here("worker")]
        command = [sys.executable, "-u", c.training_script, *c.script_args]
        preexec = die_with_parent(os.getpid())
        for role, index in plan:
            if self.signals.received:
                return
            self.start_process(role, index, command=command, preexec=preexec)
        if c.is_local:
            say(f"started {c.training_script} for local training (no servers); "
                 f"log in {self.children[0].log_path}")
        elif c.multi_host:
            here = (", ".join(ch.name for ch in self.children)
                    or "no process yet (its workers join in worker slots taken through etcd)")
            zero = ("" if 0 in c.here("worker") else
                    "; worker 0 runs on another host, so its output is not copied here")
            job = (f"a collective job of {plural(len(c.worker_endpoints), 'worker')}" if c.collective else
                   f"a job of {plural(len(c.server_endpoints), 'server')} and "
                   f"{plural(len(c.worker_endpoints), 'worker')}")
            say(f"started {here} on this host ({c.host}) of {job} on several hosts; logs in "
                f"{c.log_dir}/{zero}")
        else:
            say(f"started {plural(len(c.server_endpoints), 'server')} "
                 f"({','.join(c.server_endpoints)}) and "
                 f"{plural(len(c.here('worker')), 'worker')}"
                 + (f" of {len(c.worker_endpoints)} slots (--np {c.elastic[0]}:{c.elastic[1]})" if c.elastic else "")
                 + f"; logs in {c.log_dir}/")

    def start_process(self, role, index, append=False, command=None, preexec=None, extra_env=None):
        """Starts one process of the job (its log LOG_DIR/<role>log.<index>, appended to
        with ``append``: a replacement in an elastic job) and returns its _Child.
        ``extra_env`` is added to its environment (e.g. FLEET_ELASTIC_JOINING for a
        worker admitted into a running elastic job).

        Raises:
            FleetError: it could not be started.
        """
        c = self.config
        command = command or [sys.executable, "-u", c.training_script, *c.script_args]
        log_path = os.path.join(c.log_dir, f"{role}log.{index}")
        env = process_environment(c, role, index)
        if c.max_restarts:
            env.update(restart_environment(c, self.attempt))
        env.update(extra_env or {})
        with open(log_path, "ab" if append else "wb") as log:
            if append:
                log.write(f"---- fleetrun: a new process for {role} {index} ----\n".encode())
                log.flush()
            try:
                popen = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         preexec_fn=preexec or die_with_parent(os.getpid()))
            except OSError as e:
                raise FleetError(f"could not start {role} {index} ({' '.join(command)}): "
                                 f"{e}") from e
        endpoints = c.server_endpoints if role == "server" else c.worker_endpoints
        child = _Child(role, index, popen, log_path, endpoints[index] if index < len(endpoints) else None,
                       self.exited)
        self.children.append(child)
        return child

    # -- watching ----------------------------------------------------------------------
    def _watch(self):
        c = self.config
        started = time.monotonic() if self.started is None else self.started  # --timeout spans every attempt
        servers_deadline = None
        servers_wait = None
        while True:
            now = time.monotonic()
            if self.signals.received:
                return self._on_signal(self.signals.received)
            if self.signals.stdin_closed:
                return self._on_stdin_eof()
            change = self.monitor.poll() if self.monitor is not None else None
            if change:
                return self._on_membership_change(change)
            if self.elastic is not None:
                self.elastic.tick()
            first = self._first_failure()
            if first is not None:
                return self._on_failure(first)
            workers = [ch for ch in self.children if ch.role == "worker"]
            if (self.elastic.workers_done() if self.elastic is not None
                    else all(ch.returncode == 0 for ch in workers)):
                servers = self._running()
                if not servers:
                    if c.multi_host:
                        done = [f"{plural(len(workers), 'worker')} exited 0"] if workers else []
                        count = len(c.here("server"))
                        if count:
                            done.append(f"{plural(count, 'server')} exited by "
                                        f"{'itself' if count == 1 else 'themselves'}")
                        say(f"done on this host: {' and '.join(done)}")
                    else:
                        ok = [ch for ch in workers if ch.returncode == 0]
                        lost = [ch.name for ch in workers if ch.tolerated]
                        say("done: the script exited 0" if c.is_local else
                            f"done: {plural(len(ok), 'worker')} exited 0 and every "
                            "server exited by itself"
                            + (f"; lost on the way (elastic job): {', '.join(lost)}" if lost else ""))
                    return EXIT_OK
                if c.multi_host:
                    # Other hosts' workers may still train: servers here are never
                    # terminated on a timer; they exit once every worker of the job
                    # stopped, or fail when a worker's heartbeats stop.
                    if servers_wait is None:
                        servers_wait = WaitLog(
                            f"{', '.join(ch.name for ch in servers)} to exit by "
                            f"{'itself' if len(servers) == 1 else 'themselves'} (this host's "
                            "workers exited 0; servers exit once the workers of every host "
                            "called fleet.stop_worker())",
                            limit="a lost worker fails them within FLEET_HEARTBEAT_TIMEOUT_MS; "
                                  "--timeout bounds the whole job", logger=SAY_LOGGER)
                elif servers_deadline is None:
                    servers_deadline = now + c.server_exit_timeout
                    servers_wait = WaitLog(
                        f"{', '.join(ch.name for ch in servers)} to exit by "
                        f"{'itself' if len(servers) == 1 else 'themselves'} (every worker exited 0)", limit=f"terminating {'it' if len(servers) == 1 else 'them'} after "
                        f"--server_exit_timeout {c.server_exit_timeout:g} s", logger=SAY_LOGGER)
                elif now >= servers_deadline:
                    return self._on_servers_lingering(servers)
                servers_wait.tick()
            if c.timeout is not None and now - started >= c.timeout:
                return self._on_timeout()
            self.exited.wait(_POLL_SECONDS)
            self.exited.clear()

    def _first_failure(self):
        """The root cause when a process failed, else None. Processes that exited at about
        the same time: every waiter thread gets to record its exit, then the earliest is
        the root cause, unless its error says it was told of another failed process's
        failure ("worker 1 was lost: it failed: ..."): that one failed first, even if it
        took longer to exit (reporting its failure to the servers, then tearing down). In
        an elastic job, exits recorded since the loop's tick (a worker may die between the
        tick and this check) go through the elastic policy first, so a worker it
        tolerates is reported as lost, not as the job's failure."""
        if not any(ch.failed() for ch in self.children):
            return None
        time.sleep(2 * _POLL_SECONDS)
        if self.elastic is not None:
            self.elastic.tick()
        failed = sorted((ch for ch in self.children if ch.failed()), key=lambda ch: ch.exit_time)
        if not failed:
            return None
        told = _LOST.search(failed[0].error_line())
        if told:
            role, index = told.group(1), int(told.group(2))
            named = [ch for ch in failed[1:] if ch.role == role and ch.index == index]
            if named:
                return named[0]
        return failed[0]

    def _running(self):
        return [ch for ch in self.children if ch.returncode is None]

    def _summary_targets(self):
        """(name, role, metrics url) of the processes still running (--live_summary)."""
        return [(ch.name, ch.role, metrics_url(self.config, ch.role, ch.index)) for ch in self._running()]

    # -- ending ------------------------------------------------------------------------
    def _on_failure(self, first):
        self.cause = first
        lines = tail(first.log_path, TAIL_LINES)
        cause = f"the root cause: {first.label} {first.describe_exit()}, the first process to fail"
        if lines:
            say(f"{cause}; last {len(lines)} lines of {first.log_path}:")
        else:
            say(f"{cause}; its log {first.log_path} is empty")
        for line in lines:
            print(f"    | {line}", file=sys.stderr)
        self._wait_for_the_others(first)
        self._stop_with_notice("the others", f"{first.name}'s failure")
        later = sorted((ch for ch in self.children if ch is not first and ch.failed()),
                       key=lambda ch: ch.exit_time)
        if later:
            say("failed after the root cause (consequences, not the cause):")
            for ch in later:
                error = ch.error_line()
                print(f"    {ch.label} {ch.describe_exit()} "
                      f"{ch.exit_time - first.exit_time:.1f} s later{f': {error}' if error else ''}",
                      file=sys.stderr)
        error = first.error_line()
        if not self.config.max_restarts:  # else fleet.launch.restart decides and says how fleetrun exits
            say(f"exit {EXIT_PROCESS_FAILED}: {first.label} {first.describe_exit()}"
                f"{f': {error}' if error else ''}; full log: {first.log_path}")
        return EXIT_PROCESS_FAILED

    def _wait_for_the_others(self, first):
        grace = self.config.failure_grace
        running = self._running()
        if not running or grace <= 0:
            return
        say(f"waiting up to {grace:g} s (--failure_grace) for {', '.join(ch.name for ch in running)} "
             f"to exit by themselves; Ctrl-C stops {'it' if len(running) == 1 else 'them'} now")
        deadline = first.exit_time + grace
        wait = WaitLog(", ".join(ch.name for ch in running)
                       + (" to exit by itself" if len(running) == 1 else " to exit by themselves"),
                       limit=f"stopping them {grace:g} s after the failure (--failure_grace)",
                       logger=SAY_LOGGER)
        while self._running() and time.monotonic() < deadline and not self.signals.received:
            if self.monitor is not None and self.monitor.poll():
                # The job's membership changed (a host lost): nothing is left to wait for;
                # the restart (a new round under --max_restarts) should begin at once.
                say(f"not waiting longer: membership change: {self.monitor.poll()}")
                break
            wait.tick(", ".join(ch.name for ch in self._running()) + " still running")
            self.exited.wait(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            self.exited.clear()

    def _on_servers_lingering(self, servers):
        names = ", ".join(ch.name for ch in servers)
        say(f"every worker exited 0, but {names} did not exit within --server_exit_timeout "
             f"{self.config.server_exit_timeout:g} s (does every worker call "
             f"fleet.stop_worker()?); terminating {'it' if len(servers) == 1 else 'them'}")
        self._stop(servers, "every worker exited 0 (--server_exit_timeout)")
        say("done: every worker exited 0")
        return EXIT_OK

    def _on_timeout(self):
        say(f"the job did not finish within --timeout {self.config.timeout:g} s")
        self._stop_with_notice("every process still running", f"--timeout {self.config.timeout:g} s")
        say(f"exit {EXIT_TIMEOUT}: timed out")
        return EXIT_TIMEOUT

    def _on_stdin_eof(self):
        say("standard input was closed (--stop_on_stdin_eof: the fleetrun that dispatched this "
            "job, or its ssh connection, is gone)")
        self._stop_with_notice("every process still running", "fleetrun's standard input closed")
        return 128 + signal.SIGHUP

    def _on_membership_change(self, change):
        self.membership_change = change
        say(f"membership change: {change}")
        self._stop_with_notice("every process still running", "a membership change of the job")
        if not self.config.max_restarts:  # else fleet.launch.restart regroups or says how fleetrun exits
            say(f"exit {EXIT_PROCESS_FAILED}: membership change: {change}")
        return EXIT_PROCESS_FAILED

    def _on_signal(self, signum):
        say(f"received {signal.Signals(signum).name}")
        self._stop_with_notice("every process still running", f"fleetrun got {signal.Signals(signum).name}")
        return 128 + signum

    def _stop_with_notice(self, who, reason):
        running = self._running()
        if running:
            say(f"stopping {who}: {', '.join(ch.name for ch in running)} (SIGTERM, then "
                 f"SIGKILL after {self.config.kill_timeout:g} s)")
            self._stop(running, reason)

    def _stop(self, children, reason):
        """SIGTERM each child's process group, SIGKILL what is left after kill_timeout.

        Blocks up to kill_timeout + _REAP_SECONDS.
        """
        for ch in children:
            ch.stopped_by_us = True
            ch.stop_reason = ch.stop_reason or reason
            ch.stop_signal = "SIGTERM"
            signal_group(ch.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.kill_timeout
        while (any(ch.returncode is None for ch in children)
               and time.monotonic() < deadline and not self.signals.hurry):
            time.sleep(_POLL_SECONDS)
        for ch in children:
            if ch.returncode is None:
                ch.stop_signal = "SIGKILL"
                signal_group(ch.popen.pid, signal.SIGKILL)
        for ch in children:
            if not ch.wait(_REAP_SECONDS):
                say(f"{ch.label} did not die {_REAP_SECONDS:g} s after SIGKILL (stuck in the "
                     "kernel?); it may outlive fleetrun")

    def _kill_leftover_groups(self):
        # A child that exited may have left processes of its group behind (a pipe
        # command, a helper): they must not outlive the job.
        for ch in self.children:
            if ch.returncode is not None and not _pid_exists(ch.popen.pid):
                signal_group(ch.popen.pid, signal.SIGKILL)


def signal_group(pgid, sig):
    """Send sig to a process group; a group already gone (or not ours) is left alone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is gone already


def _pid_exists(pid):
    # After a reaped child's pid is taken by an unrelated process, its number may name an
    # unrelated group: only signal the old group while the pid itself is unused.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(parent_pid):
    """A preexec_fn that makes the child get SIGKILL if fleetrun dies (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec():
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # fleetrun died before prctl took effect
            os._exit(1)

    return preexec
