"""fleetrun / python -m fleet.launch, with tiny scripts instead of the real trainer.

The script of these tests (BEHAVE) records each process's environment and pid in an
output directory and then does what a JSON spec tells its role or its index to do.
"""
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.launch import (LaunchConfig, build_parser, config_from_args, main,
                          process_environment)

BEHAVE = textwrap.dedent('''\
    import json, os, signal, subprocess, sys, time
    spec, out = json.loads(sys.argv[1]), sys.argv[2]
    role = os.environ.get("TRAINING_ROLE")
    if role == "PSERVER":
        mine = os.environ["POD_IP"] + ":" + os.environ["PADDLE_PORT"]
        me = "server %d" % os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(",").index(mine)
    elif role == "TRAINER":
        me = "worker " + os.environ["PADDLE_TRAINER_ID"]
    else:
        me = "local"

    def record(name, text):
        with open(os.path.join(out, name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))

    def wait_until(done, what):
        deadline = time.monotonic() + 15
        while not done():
            if time.monotonic() > deadline:
                sys.exit(me + " timed out waiting for " + what)
            time.sleep(0.02)

    record(me + ".env", json.dumps(dict(os.environ)))
    record(me + ".pid", str(os.getpid()))
    print("stdout of " + me)
    print("stderr of " + me, file=sys.stderr)
    for action, arg in spec.get(me, spec.get(me.split()[0], [])):
        if action == "wait_started":   # every process of the job has recorded its pid
            wait_until(lambda: len([n for n in os.listdir(out) if n.endswith(".pid")]) >= arg,
                       "%d processes" % arg)
        elif action == "wait_file":
            wait_until(lambda: os.path.exists(os.path.join(out, arg)), arg)
        elif action == "grandchild":
            child = subprocess.Popen(["sleep", "60"])
            record(me + ".grandchild", str(child.pid))
        elif action == "ignore_sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif action == "lines":
            for i in range(arg):
                print("line %d of %s" % (i, me))
        elif action == "sleep":
            time.sleep(arg)
        elif action == "kill":
            os.kill(os.getpid(), getattr(signal, arg))
        elif action == "exit":
            sys.exit(arg)
        elif action == "touch":
            record(arg, "")
        elif action == "raise":
            raise RuntimeError(arg)
''')

FOREVER = ["sleep", 600]
FLEETRUN = (sys.executable, "-m", "fleet.launch")


@pytest.fixture
def job(tmp_path):
    """Writes the script and an output dir; job.args(spec) gives the script's arguments."""
    class Job:
        script = tmp_path / "behave.py"
        out = tmp_path / "out"

        def args(self, spec):
            return [self.script, json.dumps(spec), self.out]

        def env(self, name):
            return json.loads((self.out / f"{name}.env").read_text())

        def pid(self, name, suffix="pid"):
            return int((self.out / f"{name}.{suffix}").read_text())

        def pids(self):
            return {p.name: int(p.read_text()) for p in sorted(self.out.iterdir())
                    if p.suffix in (".pid", ".grandchild")}

    Job.script.write_text(BEHAVE)
    Job.out.mkdir()
    return Job()


def _wait_started(job, count, wait_for):
    wait_for(lambda: len([n for n in os.listdir(job.out) if n.endswith(".pid")]) >= count,
             10, f"{count} processes to record their pids in {job.out}")


# -- the environment of each process ---------------------------------------------------

def test_each_process_sees_the_paddle_role_variables_of_its_role(fleetrun, job, clean_env):
    env = dict(clean_env, FLEET_TEST_MARKER="kept", PADDLE_TRAINER_ID="7",
               PADDLE_CURRENT_ENDPOINT="10.0.0.1:1")
    r = fleetrun("--server_num", 2, "--worker_num", 2, *job.args({}), env=env)
    assert r.returncode == 0, r.stderr
    servers = [job.env(f"server {i}") for i in range(2)]
    workers = [job.env(f"worker {i}") for i in range(2)]
    server_list = servers[0]["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")
    worker_list = workers[0]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert len(set(server_list + worker_list)) == 4
    assert all(e.startswith("127.0.0.1:") for e in server_list + worker_list)
    for i, e in enumerate(servers):
        assert e["TRAINING_ROLE"] == "PSERVER"
        assert f"{e['POD_IP']}:{e['PADDLE_PORT']}" == server_list[i]
        assert "PADDLE_TRAINER_ID" not in e
    for i, e in enumerate(workers):
        assert e["TRAINING_ROLE"] == "TRAINER"
        assert e["PADDLE_TRAINER_ID"] == str(i)
        assert f"{e['POD_IP']}:{e['PADDLE_PORT']}" == worker_list[i]
    for e in servers + workers:
        assert e["PADDLE_PSERVERS_IP_PORT_LIST"] == ",".join(server_list)
        assert e["PADDLE_TRAINER_ENDPOINTS"] == ",".join(worker_list)
        assert e["PADDLE_TRAINERS_NUM"] == "2"
        assert e["FLEET_TEST_MARKER"] == "kept"
        assert "PADDLE_CURRENT_ENDPOINT" not in e


def test_servers_and_workers_options_are_used_as_given(fleetrun, job, free_ports):
    s0, s1, w0 = free_ports(3)
    r = fleetrun("--servers", f"127.0.0.1:{s0},127.0.0.1:{s1}", "--workers",
                 f"127.0.0.1:{w0}", *job.args({}))
    assert r.returncode == 0, r.stderr
    assert job.env("server 1")["PADDLE_PORT"] == str(s1)
    worker = job.env("worker 0")
    assert worker["PADDLE_PSERVERS_IP_PORT_LIST"] == f"127.0.0.1:{s0},127.0.0.1:{s1}"
    assert worker["PADDLE_TRAINER_ENDPOINTS"] == f"127.0.0.1:{w0}"
    assert worker["PADDLE_TRAINERS_NUM"] == "1"


def _free_block(count):
    """A first port of count consecutive free ports, or skip the test."""
    for start in range(20000 + os.getpid() % 20000, 60000, 997):
        socks = []
        try:
            for port in range(start, start + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.skip(f"no {count} consecutive free ports found")


def test_start_port_gives_servers_then_workers_consecutive_ports(fleetrun, job):
    start = _free_block(3)
    r = fleetrun("--server_num", 2, "--worker_num", 1, "--start_port", start, *job.args({}))
    assert r.returncode == 0, r.stderr
    worker = job.env("worker 0")
    assert worker["PADDLE_PSERVERS_IP_PORT_LIST"] == f"127.0.0.1:{start},127.0.0.1:{start + 1}"
    assert worker["PADDLE_TRAINER_ENDPOINTS"] == f"127.0.0.1:{start + 2}"


def test_server_num_0_runs_the_script_once_without_role_variables(fleetrun, job, clean_env,
                                                                 tmp_path):
    env = dict(clean_env, TRAINING_ROLE="PSERVER", PADDLE_TRAINERS_NUM="4")
    r = fleetrun("--server_num", 0, *job.args({}), env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in job.out.iterdir()) == ["local.env", "local.pid"]
    seen = job.env("local")
    assert "TRAINING_ROLE" not in seen and "PADDLE_TRAINERS_NUM" not in seen
    assert sorted(os.listdir(tmp_path / "log")) == ["workerlog.0"]
    assert r.stdout == "stdout of local\nstderr of local\n"


# -- logs and streaming ------------------------------------------------------------------

def test_each_process_logs_stdout_and_stderr_and_only_worker_0_is_streamed(
        fleetrun, job, tmp_path):
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--log_dir", "logs", *job.args({}))
    assert r.returncode == 0, r.stderr
    logs = tmp_path / "logs"
    assert sorted(os.listdir(logs)) == ["serverlog.0", "workerlog.0", "workerlog.1"]
    for name, me in (("serverlog.0", "server 0"), ("workerlog.1", "worker 1")):
        assert (logs / name).read_text() == f"stdout of {me}\nstderr of {me}\n"
    assert r.stdout == "stdout of worker 0\nstderr of worker 0\n"
    assert "started 1 server (" in r.stderr and "logs in logs/" in r.stderr


def test_worker_0_output_reaches_stdout_while_it_is_still_running(start_fleetrun, procs, job):
    spec = {"worker 0": [["lines", 1], ["wait_file", "go"]]}
    launcher = start_fleetrun("--server_num", 1, "--worker_num", 1, *job.args(spec))
    seen = ""
    selector = selectors.DefaultSelector()
    selector.register(launcher.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 10
    while "line 0 of worker 0" not in seen:
        assert time.monotonic() < deadline, f"worker 0's line never streamed; got {seen!r}"
        if selector.select(timeout=0.1):   # raw reads: a text readline would buffer ahead
            seen += os.read(launcher.stdout.fileno(), 1 << 16).decode()
    assert launcher.poll() is None, "fleetrun ended before worker 0 was told to go"
    (job.out / "go").write_text("")
    out, err = procs.communicate(launcher, 15)
    assert launcher.returncode == 0, err


# -- failures ----------------------------------------------------------------------------

def test_a_failing_worker_is_the_root_cause_and_every_other_process_is_stopped(
        fleetrun, job, pid_alive):
    spec = {"server": [["grandchild", None], FOREVER],
            "worker 0": [FOREVER],
            "worker 1": [["wait_started", 4], ["lines", 30], ["exit", 3]]}
    r = fleetrun("--server_num", 2, "--worker_num", 2, "--failure_grace", 0, *job.args(spec))
    assert r.returncode == 1
    pid = job.pid("worker 1")
    assert (f"the root cause: worker 1 (pid {pid}) exited with code 3, the first process to "
            "fail; last 20 lines of log/workerlog.1:") in r.stderr
    assert "    | line 29 of worker 1\n" in r.stderr and "line 10 of worker 1" in r.stderr
    assert "line 9 of worker 1" not in r.stderr
    assert "stopping the others: server 0, server 1, worker 0" in r.stderr
    assert f"exit 1: worker 1 (pid {pid}) exited with code 3; full log: log/workerlog.1" in r.stderr
    assert "after the root cause" not in r.stderr  # the others were stopped, they did not fail
    assert r.seconds < 10, "SIGTERM should have stopped the sleepers at once"
    pids = job.pids()
    assert len(pids) == 6  # 4 processes and the 2 servers' grandchildren
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []


def test_a_process_killed_by_a_signal_is_named_with_the_signal(fleetrun, job):
    spec = {"server 1": [["wait_started", 3], ["kill", "SIGKILL"]],
            "server 0": [FOREVER], "worker": [FOREVER]}
    r = fleetrun("--server_num", 2, "--worker_num", 1, "--failure_grace", 0, *job.args(spec))
    assert r.returncode == 1
    pid = job.pid("server 1")
    assert (f"the root cause: server 1 (pid {pid}) was killed by SIGKILL, the first process "
            "to fail; last 2 lines of log/serverlog.1:") in r.stderr
    assert f"exit 1: server 1 (pid {pid}) was killed by SIGKILL; full log: log/serverlog.1" in r.stderr


def test_the_root_cause_is_the_first_to_exit_by_time_not_by_launch_order(fleetrun, job):
    # server 0 exits a few ms after worker 1 dies: both are seen in the same look, and the
    # server comes first in launch order, yet the worker died first.
    spec = {"worker 1": [["wait_started", 3], ["touch", "dying"], ["kill", "SIGKILL"]],
            "server 0": [["wait_file", "dying"], ["sleep", 0.03], ["exit", 4]],
            "worker 0": [FOREVER]}
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--failure_grace", 0, *job.args(spec))
    assert r.returncode == 1
    worker, server = job.pid("worker 1"), job.pid("server 0")
    assert (f"the root cause: worker 1 (pid {worker}) was killed by SIGKILL, the first process "
            "to fail") in r.stderr
    assert ("fleetrun: failed after the root cause (consequences, not the cause):\n"
            f"    server 0 (pid {server}) exited with code 4 0.") in r.stderr
    assert f"exit 1: worker 1 (pid {worker}) was killed by SIGKILL;" in r.stderr


def test_after_a_failure_the_others_get_the_grace_to_exit_and_report_by_themselves(fleetrun,
                                                                                    job):
    spec = {"worker 0": [["wait_started", 3], ["touch", "dying"], ["raise", "disk on fire"]],
            "server": [["wait_file", "dying"], ["sleep", 0.5], ["raise", "worker 0 was lost"]],
            "worker 1": [FOREVER]}
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--failure_grace", 2, *job.args(spec))
    assert r.returncode == 1
    worker, server = job.pid("worker 0"), job.pid("server 0")
    assert ("waiting up to 2 s (--failure_grace) for server 0, worker 1 to exit by themselves"
            in r.stderr)
    assert "stopping the others: worker 1 (SIGTERM" in r.stderr
    assert ("fleetrun: failed after the root cause (consequences, not the cause):\n"
            f"    server 0 (pid {server}) exited with code 1 0.") in r.stderr
    assert "s later: RuntimeError: worker 0 was lost\n" in r.stderr
    assert (f"exit 1: worker 0 (pid {worker}) exited with code 1: RuntimeError: disk on fire; "
            "full log: log/workerlog.0") in r.stderr
    assert 2 <= r.seconds < 12


def test_a_process_that_ignores_sigterm_is_killed_after_kill_timeout(fleetrun, job, pid_alive):
    spec = {"server": [FOREVER], "worker 0": [["ignore_sigterm", None], FOREVER],
            "worker 1": [["wait_started", 3], ["exit", 5]]}
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--kill_timeout", 0.5,
                 "--failure_grace", 0, *job.args(spec))
    assert r.returncode == 1
    assert f"the root cause: worker 1 (pid {job.pid('worker 1')}) exited with code 5" in r.stderr
    assert "SIGKILL after 0.5 s" in r.stderr
    assert not pid_alive(job.pid("worker 0"))


def test_by_default_survivors_are_stopped_3_s_after_a_failure_and_the_report_says_how_each_ended(
        fleetrun, job):
    spec = {"server": [FOREVER], "worker 0": [FOREVER],
            "worker 1": [["wait_started", 3], ["exit", 3]]}
    r = fleetrun("--server_num", 1, "--worker_num", 2, *job.args(spec))
    assert r.returncode == 1
    assert "waiting up to 3 s (--failure_grace) for server 0, worker 0 to exit by themselves" in r.stderr
    server = job.env("server 0")
    endpoint = f"{server['POD_IP']}:{server['PADDLE_PORT']}"
    report = r.stderr.split("fleetrun: how each process ended:\n")[1]
    assert report == (
        f"    server 0 (pid {job.pid('server 0')}, {endpoint}): stopped by fleetrun (SIGTERM) after worker 1's "
        f"failure\n"
        f"    worker 0 (pid {job.pid('worker 0')}): stopped by fleetrun (SIGTERM) after worker 1's failure\n"
        f"    worker 1 (pid {job.pid('worker 1')}): exited with code 3 (the root cause)\n")


def test_the_report_names_failures_after_the_cause_with_their_error_and_a_sigkill_after_sigterm(
        fleetrun, job):
    spec = {"worker 0": [["wait_started", 3], ["touch", "dying"], ["kill", "SIGKILL"]],
            "server": [["wait_file", "dying"], ["raise", "worker 0 was lost"]],
            "worker 1": [["ignore_sigterm", None], FOREVER]}
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--failure_grace", 1, "--kill_timeout", 0.3,
                 *job.args(spec))
    assert r.returncode == 1
    report = r.stderr.split("fleetrun: how each process ended:\n")[1].splitlines()
    assert re.fullmatch(rf"    server 0 \(pid {job.pid('server 0')}, 127\.0\.0\.1:\d+\): exited with code 1 "
                        r"\d+\.\d s after worker 0: RuntimeError: worker 0 was lost", report[0]), report[0]
    assert report[1:] == [
        f"    worker 0 (pid {job.pid('worker 0')}): was killed by SIGKILL (the root cause)",
        f"    worker 1 (pid {job.pid('worker 1')}): stopped by fleetrun (SIGKILL) after worker 0's failure"]


def test_a_job_that_succeeds_reports_every_process_exited_0(fleetrun, job):
    r = fleetrun("--server_num", 1, "--worker_num", 2, *job.args({}))
    assert r.returncode == 0, r.stderr
    report = r.stderr.split("fleetrun: how each process ended:\n")[1].splitlines()
    assert [line.split("): ")[1] for line in report] == ["exited 0"] * 3
    assert [line.split(" (pid")[0] for line in report] == ["    server 0", "    worker 0", "    worker 1"]


def test_servers_lingering_after_the_workers_are_waited_for_out_loud(fleetrun, job, clean_env):
    env = dict(clean_env, FLEET_WAIT_LOG_MS="100")
    r = fleetrun("--server_num", 1, "--worker_num", 1, "--server_exit_timeout", 1,
                 *job.args({"server": [FOREVER]}), env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"fleetrun: waiting for server 0 to exit by itself \(every worker exited 0\) for 0\.\d s; "
                     r"terminating it after --server_exit_timeout 1 s\n", r.stderr), r.stderr
    assert (f"    server 0 (pid {job.pid('server 0')}, 127.0.0.1:") in r.stderr
    assert "): stopped by fleetrun (SIGTERM) after every worker exited 0 (--server_exit_timeout)" in r.stderr


def test_a_server_crashing_after_the_workers_finished_fails_the_job(fleetrun, job):
    spec = {"server": [["wait_file", "worker 0.pid"], ["sleep", 0.3], ["exit", 7]]}
    r = fleetrun("--server_num", 1, "--worker_num", 1, *job.args(spec))
    assert r.returncode == 1
    assert f"the root cause: server 0 (pid {job.pid('server 0')}) exited with code 7" in r.stderr


# -- how a job ends ----------------------------------------------------------------------

def test_servers_exiting_by_themselves_end_the_job_without_waiting(fleetrun, job):
    r = fleetrun("--server_num", 2, "--worker_num", 2, *job.args({}))
    assert r.returncode == 0, r.stderr
    assert "done: 2 workers exited 0 and every server exited by itself" in r.stderr
    assert "terminating" not in r.stderr
    assert r.seconds < 10


def test_servers_still_running_after_the_workers_finished_are_terminated(fleetrun, job,
                                                                         pid_alive):
    r = fleetrun("--server_num", 2, "--worker_num", 1, "--server_exit_timeout", 0.3,
                 *job.args({"server": [FOREVER]}))
    assert r.returncode == 0, r.stderr
    assert ("every worker exited 0, but server 0, server 1 did not exit within "
            "--server_exit_timeout 0.3 s") in r.stderr
    assert not pid_alive(job.pid("server 0")) and not pid_alive(job.pid("server 1"))


def test_job_timeout_stops_everything_and_exits_124(fleetrun, job, pid_alive):
    r = fleetrun("--server_num", 1, "--worker_num", 2, "--timeout", 1,
                 *job.args({"server": [FOREVER], "worker": [FOREVER]}))
    assert r.returncode == 124
    assert "the job did not finish within --timeout 1 s" in r.stderr
    assert "stopping every process still running: server 0, worker 0, worker 1" in r.stderr
    assert r.seconds < 10
    assert [n for n, pid in job.pids().items() if pid_alive(pid)] == []


@pytest.mark.parametrize("sig, code", [pytest.param(signal.SIGINT, 130, id="SIGINT"),
                                       pytest.param(signal.SIGTERM, 143, id="SIGTERM")])
def test_a_signal_to_fleetrun_stops_everything_it_started(start_fleetrun, procs, job,
                                                         wait_for, pid_alive, sig, code):
    spec = {"server": [["grandchild", None], FOREVER], "worker": [FOREVER]}
    launcher = start_fleetrun("--server_num", 1, "--worker_num", 2, *job.args(spec))
    _wait_started(job, 3, wait_for)
    wait_for(lambda: (job.out / "server 0.grandchild").exists(), 10, "the server's grandchild")
    launcher.send_signal(sig)
    out, err = procs.communicate(launcher, 15)
    assert launcher.returncode == code, err
    assert f"received {sig.name}" in err
    assert [n for n, pid in job.pids().items() if pid_alive(pid)] == []


def test_processes_die_when_fleetrun_itself_is_killed(start_fleetrun, job, wait_for,
                                                      pid_alive):
    launcher = start_fleetrun("--server_num", 1, "--worker_num", 1,
                              *job.args({"server": [FOREVER], "worker": [FOREVER]}))
    _wait_started(job, 2, wait_for)
    os.kill(launcher.pid, signal.SIGKILL)
    pids = job.pids()
    wait_for(lambda: not any(pid_alive(p) for p in pids.values()), 5,
             f"the processes of a killed fleetrun to die: {pids}")


# -- arguments ---------------------------------------------------------------------------

def test_a_taken_start_port_is_named_and_nothing_is_started(fleetrun, job, free_port,
                                                            tmp_path):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        r = fleetrun("--server_num", 1, "--worker_num", 1, "--start_port", port,
                     *job.args({}))
    assert r.returncode == 2
    assert (f"fleetrun: error: server 0's endpoint 127.0.0.1:{port}: port {port} is already "
            "in use. Free the port, choose another --start_port") in r.stderr
    assert list(job.out.iterdir()) == [] and not (tmp_path / "log").exists()


def test_a_missing_training_script_is_an_error_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--server_num", "1", "--worker_num", "1", "nope.py"])
    assert exit_info.value.code == 2
    assert (f"fleetrun: error: training script 'nope.py' is not a file (looked from "
            f"{tmp_path}); give the path of the Python script to run") in capsys.readouterr().err


def test_a_malformed_wait_log_setting_is_a_usage_error_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "-5")
    (tmp_path / "train.py").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["--server_num", "1", "--worker_num", "1", "train.py"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "fleetrun: error: FLEET_WAIT_LOG_MS='-5' is not an integer >= 0; set FLEET_WAIT_LOG_MS to the "
        "milliseconds a wait lasts before it is logged (0: never), or unset it to use the default 5000\n")
    assert not (tmp_path / "log").exists()


def _config(*argv):
    return config_from_args(build_parser().parse_args([*argv, "train.py"]))


@pytest.mark.parametrize("argv, message", [
    (["--server_num", "0", "--worker_num", "2"],
     "--worker_num 2 with --server_num 0: without servers fleetrun runs the script once, "
     "for local training; give --server_num 1 or more to train with several workers"),
    (["--worker_num", "0"],
     "--worker_num 0: servers need at least one worker; give --worker_num 1 or more"),
    (["--server_num", "-1"],
     "--server_num -1 is negative; give a count of 0 or more"),
    (["--server_num", "3", "--servers", "127.0.0.1:7000,127.0.0.1:7001"],
     "--server_num 3 does not match --servers, which lists 2 endpoints; give only one of "
     "them or make them agree"),
    (["--servers", "127.0.0.1"],
     "--servers entry '127.0.0.1' is not host:port: entry '127.0.0.1' must have exactly one ':' "
     "between host and port (an IPv6 host goes in brackets: [fd00::1]:6170); write it like "
     "127.0.0.1:6170"),
    (["--workers", "127.0.0.1:70000"],
     "--workers entry '127.0.0.1:70000' is not host:port: entry '127.0.0.1:70000' has port "
     "'70000', expected an integer in 1..65535; write it like 127.0.0.1:6170"),
    (["--servers", "127.0.0.1:7000", "--workers", "127.0.0.1:7000"],
     "endpoint 127.0.0.1:7000 is given to both server 0 and worker 0; every process needs a "
     "port of its own"),
    (["--server_num", "2", "--worker_num", "2", "--start_port", "65534"],
     "--start_port 65534 leaves no room for 4 consecutive ports; give a port in 1..65532"),
    (["--timeout", "0"], "timeout 0.0 (--timeout) must be a positive number of seconds"),
    (["--kill_timeout", "nan"], "kill_timeout nan (--kill_timeout) must be a positive number "
     "of seconds"),
    (["--failure_grace", "-1"], "failure_grace -1.0 (--failure_grace) must be a number of "
     "seconds >= 0 (0 stops the other processes at once)"),
])
def test_bad_arguments_are_errors_naming_the_value_and_the_fix(argv, message):
    with pytest.raises(ConfigError) as error:
        _config(*argv)
    assert str(error.value) == message


def test_default_is_two_servers_and_two_workers_and_one_process_without_servers():
    config = _config()
    assert len(config.server_endpoints) == 2 and len(config.worker_endpoints) == 2
    local = _config("--server_num", "0")
    assert local.is_local and local.worker_endpoints == ()
    assert _config("--workers", "127.0.0.1:7000").worker_endpoints == ("127.0.0.1:7000",)


def test_process_environment_of_a_server_drops_an_inherited_trainer_id():
    config = LaunchConfig("t.py", server_endpoints=("h:1", "h:2"), worker_endpoints=("h:3",))
    env = process_environment(config, "server", 1, base={"PADDLE_TRAINER_ID": "5", "A": "b"})
    assert env == {"A": "b", "TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": "h:1,h:2",
                   "PADDLE_TRAINER_ENDPOINTS": "h:3", "PADDLE_TRAINERS_NUM": "1",
                   "POD_IP": "h", "PADDLE_PORT": "2",
                   "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def test_workers_share_the_cores_among_their_blas_pools_unless_the_user_set_one(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    config = LaunchConfig("t.py", server_endpoints=("h:1",), worker_endpoints=("h:3", "h:4", "h:5"))
    env = process_environment(config, "worker", 0, base={})
    assert [env[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")] == ["2"] * 3
    assert process_environment(config, "server", 0, base={})["OMP_NUM_THREADS"] == "1"
    mine = process_environment(config, "worker", 1, base={"OPENBLAS_NUM_THREADS": "4"})
    assert mine["OPENBLAS_NUM_THREADS"] == "4" and "OMP_NUM_THREADS" not in mine
    assert "OMP_NUM_THREADS" not in process_environment(LaunchConfig("t.py"), "worker", 0, base={})


def test_help_is_the_manual_of_every_option_variable_log_and_exit_code(fleetrun):
    r = fleetrun("--help")
    assert r.returncode == 0
    for word in ("--server_num", "--worker_num", "--servers", "--workers", "--start_port",
                 "--log_dir", "--timeout", "--server_exit_timeout", "--kill_timeout",
                 "--failure_grace", "--metrics_port", "--live_summary", "FLEET_METRICS_PORT",
                 "TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINER_ENDPOINTS",
                 "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT",
                 "serverlog.N", "workerlog.N", "exit codes:", "124", "130", "143",
                 "examples:", "fleetrun --server_num 2 --worker_num 2 train.py"):
        assert word in r.stdout, word


def test_the_fleetrun_console_script_is_the_launcher():
    script = Path(sys.executable).parent / "fleetrun"
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e . creates it)")
    r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("usage: fleetrun ")


# -- the per-host form's hooks for a dispatcher (fleetrun --hosts) -------------------------

def test_stop_on_stdin_eof_stops_everything_when_stdin_closes(procs, tmp_path, job, wait_for,
                                                              pid_alive, clean_env):
    launcher = procs.start([*FLEETRUN, "--server_num", "1", "--worker_num", "1",
                            "--stop_on_stdin_eof", *map(str, job.args({"server": [FOREVER],
                                                                       "worker": [FOREVER]}))],
                           cwd=tmp_path, env=clean_env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_started(job, 2, wait_for)
    launcher.stdin.close()
    launcher.stdin = None  # closed: communicate must not flush it
    out, err = procs.communicate(launcher, 20)
    assert launcher.returncode == 128 + signal.SIGHUP, err
    assert ("fleetrun: standard input was closed (--stop_on_stdin_eof: the fleetrun that "
            "dispatched this job, or its ssh connection, is gone)") in err
    assert "stopped by fleetrun (SIGTERM) after fleetrun's standard input closed" in err
    assert [n for n, pid in job.pids().items() if pid_alive(pid)] == []


def test_result_json_names_the_root_cause_and_how_each_process_ended(fleetrun, job, tmp_path):
    spec = {"server": [FOREVER], "worker 1": [["raise", "bad shard"]], "worker 0": [FOREVER]}
    before = time.time()
    result = fleetrun("--server_num", 1, "--worker_num", 2, "--failure_grace", 0,
                      "--result_json", "res.json", *job.args(spec))
    assert result.returncode == 1, result.stderr
    data = json.loads((tmp_path / "res.json").read_text())
    cause = data["cause"]
    assert data["exit_code"] == 1 and data["host"] is None
    assert (cause["role"], cause["index"], cause["exit_code"], cause["log"]) == (
        "worker", 1, 1, "log/workerlog.1")
    assert cause["error"] == "RuntimeError: bad shard"
    assert before <= cause["exit_time"] <= time.time()
    ends = {(p["role"], p["index"]): p["end"] for p in data["processes"]}
    assert ends == {("server", 0): "stopped by fleetrun (SIGTERM) after worker 1's failure",
                    ("worker", 0): "stopped by fleetrun (SIGTERM) after worker 1's failure",
                    ("worker", 1): "exited with code 1 (the root cause)"}
