"""``fleetrun --max_restarts K``: after a failure, stop every process and start the job again.

One attempt is one run of the job (`fleet.launch.local` for this host's processes, the
dispatcher of `fleet.launch.hosts` for every host's). When a process of an attempt fails,
the attempt ends as without restarts (root cause named, the others stopped), then:

- the failure is recorded: attempt, role, index, host, pid, exit code or signal, the
  error its log ends with; on stderr and in LOG_DIR/restarts.log;
- on the first failure, if no process of the job made a ``fleet.CheckpointConfig`` (each
  one notes its directory in FLEET_RESTART_STATE_DIR), fleetrun stops and says so: a
  restart would train from scratch. ``--restart_from_scratch`` restarts anyway;
- else, while fewer than K restarts were made, the attempt's logs move to
  LOG_DIR/attempt-N/ and every process starts again with FLEET_RESTART_COUNT=N+1; a
  script that follows the resume idiom of `fleet.checkpoint` resumes from the newest
  valid checkpoint;
- fleetrun's last lines list every failure in order, whether the job then succeeded or
  fleetrun gave up (exit 1).

Under ``--elastic_server`` a host lost from the job (a membership change in etcd) is a
failure too (role "host"): the surviving hosts form a new round of the job without it
(`fleet.launch.etcd_rounds`) instead of restarting with the same plan. In an elastic job
(``--np MIN:MAX``, `fleet.launch.etcd_slot_rounds`) every restart is a round, its worker
slots re-made.

A failure is a process that exited non-zero or was killed, seen by this fleetrun. A
timeout, a signal to fleetrun, a process that could not be started and bad arguments end
the job without a restart.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import sys
import time

from fleet.checkpoint import latest_checkpoint, noted_checkpoint_dirs
from fleet.errors import FleetError
from fleet.launch.config import EXIT_OK, EXIT_PROCESS_FAILED, restart_state_dir
from fleet.launch.report import plural, say
from fleet.transport.settings import heartbeat_timeout_ms

RESTARTS_LOG = "restarts.log"


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failure that ended an attempt.

    Attributes:
        attempt: 0 for the first run, N for the N-th restart.
        role, index: the process ("worker", 1), or ("host", i) when a whole host failed.
        host: the host it ran on.
        pid: its process id (None when unknown).
        how: "was killed by SIGKILL", "exited with code 1", ...
        error: the error its log ends with, or "".
        time: when it ended (Unix time).
    """

    attempt: int
    role: str
    index: int
    host: str
    pid: int | None
    how: str
    error: str
    time: float

    @classmethod
    def of_child(cls, attempt, child, host):
        """The Failure of a failed process of this host (a ``fleet.launch.local._Child``)."""
        return cls(attempt, child.role, child.index, host, child.popen.pid, child.describe_exit(),
                   child.error_line(), child.exit_wall_time or time.time())

    def describe(self):
        """"worker 1 (pid 4242) on host h1 was killed by SIGKILL: <error>" (no index when < 0)."""
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        who = self.role if self.index < 0 else f"{self.role} {self.index}"
        return f"{who}{pid} on host {self.host} {self.how}{': ' + self.error if self.error else ''}"


NO_CHECKPOINT = (
    "--max_restarts {k}: no process of this job made a fleet.CheckpointConfig before it failed, so a "
    "restart would train from scratch and redo everything. Make the script checkpoint and resume: "
    "cfg = fleet.CheckpointConfig(DIR, step_interval=N or seconds_interval=S), servers "
    "fleet.init_server(fleet.latest_checkpoint(DIR)), workers fleet.load_checkpoint(exe, cfg) and "
    "train_from_dataset(..., checkpoint=cfg) (the idiom in fleet/checkpoint.py); or give "
    "--restart_from_scratch to restart from the start anyway")


def run_with_restarts(config, make_job, signals, regroup=None):
    """Run attempts of a job until one ends without a failure or K restarts were made.

    Args:
        config: the LaunchConfig (max_restarts >= 1).
        make_job: ``make_job(attempt, started)`` -> an object with ``run()`` (returns the
            exit code), ``cause`` (the failed _Child, or None), ``children`` and
            ``membership_change`` (the sentence that ended it, or None).
        signals: the SignalCatcher of this fleetrun (a signal ends the job, no restart).
        regroup: under --elastic_server, the job's `fleet.launch.etcd_rounds.Regroup`: a
            lost host then starts a new round instead of ending the job.

    Returns:
        fleetrun's exit code: the last attempt's (EXIT_PROCESS_FAILED when fleetrun gave up).

    Blocks until the job is over.
    """
    started = time.monotonic()
    state = restart_state_dir(config)
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(state, exist_ok=True)
    host = config.host or socket.gethostname()
    failures = []
    attempt = 0
    while True:
        job = make_job(attempt, started)
        code = job.run()
        cause = job.cause
        change = getattr(job, "membership_change", None)
        if getattr(regroup, "remakes_slots", False):
            code = _slot_round(config, regroup, job, code, attempt, failures, state, signals)
            if code is not None:
                return code
            attempt += 1
            continue
        if regroup is not None and change and not signals.received:
            code = _heal(config, regroup, job, attempt, failures, state, signals)
            if code is not None:
                return code
            attempt += 1
            continue
        if code != EXIT_PROCESS_FAILED or cause is None or signals.received:
            return conclude(config.log_dir, code, failures, config.max_restarts)
        decision = _count_restart(config, Failure.of_child(attempt, cause, host), failures, state, job)
        if decision is not None:
            return decision
        monitor = regroup.monitor if regroup is not None else None
        if config.multi_host and not settle_other_hosts(config, failures[-1].time, signals, monitor):
            return conclude(config.log_dir, 128 + signals.received, failures, config.max_restarts)
        attempt += 1
        change = monitor.poll() if monitor is not None else None
        if change:
            # The host whose loss failed the processes is gone: this restart becomes the new round.
            code = _end_on_cut_off(config, regroup, change, failures)
            if code is None:
                say(f"membership change during the wait: {change}; restart {len(failures)} "
                    f"becomes round {regroup.round + 1} of the job, without the lost host")
                code = _next_round(config, regroup, change, failures, signals)
            if code is not None:
                return code


def _count_restart(config, failure, failures, state, job):
    """Records ``failure``, says and logs the restart (decide_restart) and keeps the ended
    attempt's logs. Returns None to restart, else fleetrun's exit code."""
    failures.append(failure)
    decision = decide_restart(config.log_dir, failures, config.max_restarts,
                              config.restart_from_scratch, noted_checkpoint_dirs(state))
    if decision is None:
        keep_attempt_logs(config.log_dir, failure.attempt, [ch.log_path for ch in job.children])
    return decision


def _heal(config, regroup, job, attempt, failures, state, signals):
    """An attempt ended by a membership change under --elastic_server: count it, keep the
    logs, start the next round. Returns None to run it, else fleetrun's exit code."""
    change = job.membership_change
    code = _end_on_cut_off(config, regroup, change, failures)
    if code is not None:
        return code
    failure = regroup.loss_failure(attempt, failures, _loss_window(config, regroup))
    if failure is None:
        say(f"the restart for {failures[-1].describe()} stands for this membership change: {change}")
        log_event(config.log_dir, f"attempt {attempt} ended by a membership change within "
                                  f"{_loss_window(config, regroup):g} s of the failure it restarted "
                                  f"for (counted once): {change}")
        keep_attempt_logs(config.log_dir, attempt, [ch.log_path for ch in job.children])
    else:
        decision = _count_restart(config, failure, failures, state, job)
        if decision is not None:
            return decision
    return _next_round(config, regroup, change, failures, signals)


def _slot_round(config, regroup, job, code, attempt, failures, state, signals):
    """An attempt of an elastic etcd job (--np, ``regroup.remakes_slots``) ended: a failure
    that ends the job becomes a round with its worker slots re-made; a host of workers
    only whose workers were lost, with no change of the job seen meanwhile, leaves as
    without restarts. Returns None to run the next round, else fleetrun's exit code."""
    if signals.received or code != EXIT_PROCESS_FAILED:
        return conclude(config.log_dir, code, failures, config.max_restarts)
    change, cause = job.membership_change, job.cause
    if regroup.monitor.cut_off():
        return _end_on_cut_off(config, regroup, change or regroup.monitor.poll(), failures)
    host = config.host or socket.gethostname()
    failure = Failure.of_child(attempt, cause, host) if cause is not None else None
    if change is None and (cause is None or cause.role != "server"):
        change = _wait_for_round(config, regroup, signals)
        if signals.received:
            return conclude(config.log_dir, 128 + signals.received, failures, config.max_restarts)
        if change is None:
            say(f"exit {code}: every worker of this host was lost and the job did not change within "
                f"{_loss_window(config, regroup):g} s (no round began, its servers' hosts live, MIN workers "
                "live): the job goes on on the other hosts without this one, so no restart (--max_restarts "
                "restarts the job only when it fails as a whole)")
            log_event(config.log_dir, f"no round: {failure.describe() if failure else 'this host ended'}; "
                                      "the job goes on without this host")
            return conclude(config.log_dir, code, failures, config.max_restarts)
        say(f"membership change: {change}; restart {len(failures) + 1} becomes round {regroup.round + 1} "
            "of the job, its worker slots re-made")
    if failure is None:
        lost = regroup.monitor.lost_hosts()
        failure = (regroup.loss_failure(attempt, failures, 0.0) if lost else
                   Failure(attempt, "job", -1, host, None, "must re-form", change, time.time()))
    decision = _count_restart(config, failure, failures, state, job)
    if decision is not None:
        return decision
    return _next_round(config, regroup, change or failure.describe(), failures, signals)


def _wait_for_round(config, regroup, signals):
    """After a failure of a worker here: wait up to the loss window for a change of the
    job (a lost server host, fewer than MIN slots, a round begun elsewhere). Returns its
    sentence, or None (also on a signal). Blocks."""
    window = _loss_window(config, regroup)
    say(f"waiting up to {window:g} s for a change of the job (a lost server host, a round begun "
        "elsewhere, fewer than MIN workers) before leaving it")
    deadline = time.monotonic() + window
    while time.monotonic() < deadline and not signals.received:
        change = regroup.monitor.poll()
        if change:
            return change
        time.sleep(0.05)
    return None


def _end_on_cut_off(config, regroup, change, failures):
    """This host's own lease expired (cut off from etcd): end the job as without restarts
    (the others re-form without it). Returns the exit code, or None if another host is lost."""
    if not regroup.monitor.cut_off() and regroup.monitor.lost_hosts():
        return None
    say(f"exit {EXIT_PROCESS_FAILED}: membership change: {change}")
    return conclude(config.log_dir, EXIT_PROCESS_FAILED, failures, config.max_restarts)


def _loss_window(config, regroup):
    """How long after a process failure a membership change still counts as its cause:
    the lease's TTL (the loss is seen at most that late) plus settle_seconds."""
    return regroup.rdv.ttl + settle_seconds(config)


def _next_round(config, regroup, change, failures, signals):
    """Regroup without the lost host(s). Returns None, or the exit code if it failed."""
    log_event(config.log_dir, f"round {regroup.round + 1} of the job: {regroup.describe_loss() or change}")
    try:
        if not regroup.next_round(signals):
            return conclude(config.log_dir, 128 + signals.received, failures, config.max_restarts)
    except FleetError as e:
        say(f"exit {EXIT_PROCESS_FAILED}: the job could not re-form without the lost host: {e}")
        log_event(config.log_dir, f"no round {regroup.round + 1}: {e}")
        return conclude(config.log_dir, EXIT_PROCESS_FAILED, failures, config.max_restarts,
                        gave_up="the job could not re-form")
    regroup.covered = len(failures)
    log_event(config.log_dir, f"round {regroup.round} formed: "
                              + "; ".join(f"{m.addr}: {regroup.plan.ranks_of(m.addr)}"
                                          for m in regroup.plan.members))
    return None


def settle_seconds(config):
    """How long a per-host fleetrun waits after a failure before its restart: the
    heartbeat timeout (by then every process of the job on every host has noticed the
    loss and failed), --failure_grace (by then every host's fleetrun has stopped its
    processes) and 2 s."""
    return heartbeat_timeout_ms() / 1000.0 + config.failure_grace + 2.0


def settle_other_hosts(config, failed_at, signals, monitor=None):
    """Per-host fleetruns (no dispatcher) agree on a restart without talking to each
    other: a failure anywhere ends every process of the job on every host within the
    heartbeat timeout (liveness), so each host's fleetrun restarts its own processes once
    its own failed, and starts them only settle_seconds after that failure, when no old
    process of the job is left on any host to talk to the new ones. The new processes
    then wait for each other up to FLEET_CONNECT_TIMEOUT_MS. Blocks; returns False when
    fleetrun got a signal meanwhile. With an etcd ``monitor`` the wait ends early (True)
    once its ``poll()`` reports a membership change: a host is gone, so the caller starts
    a new round instead of this restart."""
    wait = failed_at + settle_seconds(config) - time.time()
    if wait > 0:
        say(f"waiting {wait:.1f} s before the restart, so that every other host's processes of the "
            f"job have ended too (FLEET_HEARTBEAT_TIMEOUT_MS {heartbeat_timeout_ms()} ms + "
            f"--failure_grace {config.failure_grace:g} s + 2 s after the failure)")
    deadline = time.monotonic() + max(0.0, wait)
    while time.monotonic() < deadline:
        if signals.received:
            return False
        if monitor is not None and monitor.poll():
            return True
        time.sleep(0.05)
    return not signals.received


def decide_restart(log_dir, failures, max_restarts, from_scratch, checkpoint_dirs):
    """After the failure ``failures[-1]``: say and log the restart and return None, or say
    why there is none and return the exit code (EXIT_PROCESS_FAILED).

    Args:
        log_dir: where restarts.log goes.
        failures: every failure so far, the newest last.
        max_restarts: K.
        from_scratch: --restart_from_scratch.
        checkpoint_dirs: the checkpoint directories the job's processes noted.
    """
    last = failures[-1]
    k = max_restarts
    if len(failures) == 1 and not checkpoint_dirs and not from_scratch:
        say(NO_CHECKPOINT.format(k=k))
        log_event(log_dir, f"no restart: {last.describe()}; no process made a fleet.CheckpointConfig "
                           "(give --restart_from_scratch to restart anyway)")
        return conclude(log_dir, EXIT_PROCESS_FAILED, failures, k, gave_up="no checkpoint")
    if len(failures) > k:
        return conclude(log_dir, EXIT_PROCESS_FAILED, failures, k, gave_up="max_restarts")
    n = len(failures)
    source = resume_point(checkpoint_dirs)
    say(f"restart {n} of {k} (--max_restarts {k}): {last.describe()}; every process was stopped "
        f"and starts again with FLEET_RESTART_COUNT={n}, {source}")
    log_event(log_dir, f"restart {n} of {k}: {last.describe()}; {source}")
    return None


def resume_point(checkpoint_dirs):
    """A phrase saying what the restarted job resumes from."""
    if not checkpoint_dirs:
        return "from scratch (--restart_from_scratch: the script makes no checkpoint)"
    found = []
    for d in checkpoint_dirs:
        try:
            path = latest_checkpoint(d)
        except FleetError as e:
            found.append(f"{d}: no valid checkpoint ({e})")
            continue
        found.append(path if path else f"{d}: none yet, so from the start")
    return "resuming from the newest checkpoint: " + "; ".join(found)


def conclude(log_dir, code, failures, max_restarts, gave_up=None):
    """Say (and log) how the job ended after restarts, listing every failure; returns code."""
    if not failures:
        return code
    if gave_up == "max_restarts":
        head = (f"exit {EXIT_PROCESS_FAILED}: gave up after {plural(max_restarts, 'restart')} "
                f"(--max_restarts {max_restarts}); {plural(len(failures), 'failure')}, in order:")
    elif gave_up is not None:
        head = f"exit {EXIT_PROCESS_FAILED}: no restart ({gave_up}); the failure:"
    elif code == EXIT_OK:
        head = (f"done after {plural(len(failures), 'restart')}; "
                f"{plural(len(failures), 'failure')}, in order:")
    else:
        head = f"exit {code} after {plural(len(failures), 'restart')}; the failures before, in order:"
    say(head)
    lines = [f"{i}. attempt {f.attempt}: {f.describe()}" for i, f in enumerate(failures, 1)]
    for line in lines:
        print(f"    {line}", file=sys.stderr, flush=True)
    log_event(log_dir, head + " " + " ".join(lines))
    return code


def log_event(log_dir, text):
    """Append one line, stamped with UTC time, to LOG_DIR/restarts.log."""
    try:
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, RESTARTS_LOG), "a", encoding="utf-8") as f:
            f.write(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z "
                    f"{text}\n")
    except OSError as e:
        say(f"could not write {os.path.join(log_dir, RESTARTS_LOG)} ({e.strerror})")


def keep_attempt_logs(log_dir, attempt, paths):
    """Move an attempt's process logs into LOG_DIR/attempt-N/ before the next one starts
    (the next attempt writes serverlog.N / workerlog.N afresh)."""
    folder = os.path.join(log_dir, f"attempt-{attempt}")
    os.makedirs(folder, exist_ok=True)
    for path in paths:
        try:
            os.replace(path, os.path.join(folder, os.path.basename(path)))
        except FileNotFoundError:
            pass
