"""fleetrun --hosts without ssh: host lists, endpoints, the forwarded environment, messages."""
import os
import pytest

from fleet.errors import ConfigError
from fleet.launch import build_parser
from fleet.launch import hosts as H
from fleet.launch.hostfile import (HostEntry, HostsConfig, forwarded_environment, parse_host_entry,
                                   parse_hosts, plan_endpoints)
from fleet.launch.cli import hosts_config_from_args
from fleet.launch.hosts_heal import first_shares, indexes_text
from fleet.launch.preflight import classify_ssh_failure
from fleet.launch.remote import Remote
from fleet.launch.replacement import Share


def test_host_entries_take_user_host_and_port():
    entries = parse_hosts("node1,root@10.0.0.2,node3:2222,me@[fe80::1]:22")
    assert [(e.user, e.host, e.port) for e in entries] == [
        (None, "node1", None), ("root", "10.0.0.2", None), (None, "node3", 2222),
        ("me", "fe80::1", 22)]
    assert [e.target for e in entries] == ["node1", "root@10.0.0.2", "node3", "me@fe80::1"]
    assert entries[2].ssh_options() == ["-p", "2222"] and entries[0].ssh_options() == []


def test_hostfile_skips_comments_and_blank_lines(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the cluster\nnode1\n\n  root@node2:2200   # second\n")
    assert [str(e) for e in parse_hosts(str(f))] == ["node1", "root@node2:2200"]


@pytest.mark.parametrize("text, message", [
    ("node1\nnode 2\n", "hostfile {f} line 2: '2' after the host is not servers=N or workers=N"),
    ("node1\nnode@@2\n", "hostfile {f} line 2: 'node@@2' is not a host; write [user@]host[:sshport]"),
    ("node1\n# x\nnode1:2222\n", "hostfile {f} line 3: host node1 is already given at hostfile {f} line 1"),
    ("a:70000\n", "hostfile {f} line 1: ssh port 70000 of 'a:70000' is out of range"),
    ("# nothing\n\n", "hostfile {f} lists no host"),
])
def test_hostfile_errors_name_the_line(tmp_path, text, message):
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        parse_hosts(str(f))
    assert str(e.value).startswith(message.format(f=f))


def test_host_list_errors_name_the_entry():
    with pytest.raises(ConfigError, match=r"^--hosts 'a,,b': entry 2 is empty"):
        parse_hosts("a,,b")
    with pytest.raises(ConfigError, match=r"^--hosts entry 2: 'b@@c' is not a host"):
        parse_hosts("a,b@@c")
    with pytest.raises(ConfigError, match=r"^--hosts entry 3: host a is already given at --hosts entry 1"):
        parse_hosts("a,b,x@a")


def test_each_host_gets_its_servers_then_its_workers_from_start_port():
    servers, workers = plan_endpoints(["10.0.0.1", "10.0.0.2", "fe80::2"], 2, 1, 6170)
    assert servers == ["10.0.0.1:6170", "10.0.0.1:6171", "10.0.0.2:6170", "10.0.0.2:6171",
                       "[fe80::2]:6170", "[fe80::2]:6171"]
    assert workers == ["10.0.0.1:6172", "10.0.0.2:6172", "[fe80::2]:6172"]


def test_hostfile_lines_may_give_their_own_process_counts(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# servers on the big-memory nodes\nnode1 servers=1\nroot@node2:2222 servers=1\n"
                        "node3 servers=0 workers=2\n")
    hosts = parse_hosts(str(hostfile))
    assert [(h.host, h.servers, h.workers) for h in hosts] == [
        ("node1", 1, None), ("node2", 1, None), ("node3", 0, 2)]
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text("")
    config = HostsConfig(hosts=hosts, training_script="train.py", dispatch=str(job),
                           server_num_per_host=0, worker_num_per_host=1)
    assert [config.counts(i) for i in range(3)] == [(1, 1), (1, 1), (0, 2)]
    servers, workers = plan_endpoints(["10.0.0.1", "10.0.0.2", "10.0.0.3"], [1, 1, 0], [1, 1, 2], 6170)
    assert servers == ["10.0.0.1:6170", "10.0.0.2:6170"]
    assert workers == ["10.0.0.1:6171", "10.0.0.2:6171", "10.0.0.3:6170", "10.0.0.3:6171"]
    assert first_shares(["a", "b", "c"], [(1, 1), (1, 1), (0, 2)]) == {
        "a": Share((0,), (0,)), "b": Share((1,), (1,)), "c": Share((), (2, 3))}
    assert [indexes_text(x) for x in ((), (2, 3), (1,), (0, 2, 5, 6))] == ["none", "2-3", "1", "0,2,5-6"]
    hostfile.write_text("node1 slots=2\n")
    with pytest.raises(ConfigError) as info:
        parse_hosts(str(hostfile))
    assert str(info.value) == (f"hostfile {hostfile} line 1: 'slots=2' after the host is not servers=N or "
                               "workers=N (each at most once, N >= 0); write e.g. 'node1 servers=2 workers=0'")
    with pytest.raises(ConfigError, match="a --hosts job needs servers and workers"):
        HostsConfig(hosts=[HostEntry("a", servers=0), HostEntry("b", servers=0)],
                      training_script="train.py", dispatch=str(job))


def test_the_forwarded_environment():
    env = {"FLEET_WAIT_LOG_MS": "100", "FLAGS_rpc_deadline": "9", "PYTHONPATH": "/src",
           "CPU_NUM": "2", "OMP_NUM_THREADS": "1", "NUMBA_CACHE_DIR": "/c", "HOME": "/root",
           "FLEET_CURVE_KEYS_DIR": "/mine", "FLEET_JOB_ID": "old", "PYTHONSTARTUP": "x.py",
           "PATH": "/bin"}
    assert forwarded_environment(env, ["PYTHONPATH=", "EXTRA=a=b"]) == {
        "CPU_NUM": "2", "FLAGS_rpc_deadline": "9", "FLEET_WAIT_LOG_MS": "100",
        "NUMBA_CACHE_DIR": "/c", "OMP_NUM_THREADS": "1", "PYTHONPATH": "", "EXTRA": "a=b"}


def _args(*argv):
    return build_parser().parse_args(list(argv))


def test_config_from_the_command_line(tmp_path):
    (tmp_path / "train.py").write_text("")
    c = hosts_config_from_args(_args("--hosts", "a,b", "--dispatch", str(tmp_path),
                                     "--worker_num_per_host", "2", "--env", "X=1",
                                     "train.py", "--epochs", "3"))
    assert [h.host for h in c.hosts] == ["a", "b"] and c.worker_num_per_host == 2
    assert c.start_port == 6170 and c.script_args == ("--epochs", "3") and c.env == ("X=1",)
    assert c.remote_dir_of(c.hosts[1]) == f"~/fleet_jobs/{tmp_path.name}"
    c2 = hosts_config_from_args(_args("--hosts", "a", "--workspace", "/srv/ws",
                                      "--remote_dir", "/x/{host}", "train.py"))
    assert c2.remote_dir_of(c2.hosts[0]) == "/srv/ws"


@pytest.mark.parametrize("argv, message", [
    (["--hosts", "a", "--servers", "a:1", "--workspace", "/w", "t.py"],
     "--servers cannot be used with --hosts"),
    (["--hosts", "a", "t.py"], "give exactly one of --dispatch DIR"),
    (["--hosts", "a", "--workspace", "/w", "--dispatch", "/w", "t.py"], "give exactly one of"),
    (["--hosts", "a", "--workspace", "/w", "--worker_num_per_host", "0", "t.py"],
     "a --hosts job needs servers and workers"),
    (["--hosts", "a", "--workspace", "/w", "--env", "1X=2", "t.py"], "--env '1X=2': write NAME=VALUE"),
    (["--hosts", "a", "--workspace", "/w", "/abs/t.py"], "training script '/abs/t.py' is absolute"),
])
def test_bad_hosts_options_are_usage_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        hosts_config_from_args(_args(*argv))


def test_the_dispatched_script_must_be_in_the_dispatched_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"training script 'train.py' is not a file in --dispatch"):
        hosts_config_from_args(_args("--hosts", "a", "--dispatch", str(tmp_path), "train.py"))


def test_hosts_options_without_hosts_are_usage_errors():
    from fleet.launch.cli import _check_no_hosts_options
    with pytest.raises(ConfigError, match=r"^--dispatch only work with --hosts"):
        _check_no_hosts_options(_args("--dispatch", ".", "t.py"))


@pytest.mark.parametrize("code, stderr, message", [
    (255, "ssh: connect to host 10.0.0.9 port 22: Connection refused",
     "host n1: connection refused (ssh: connect to host 10.0.0.9 port 22: Connection refused); "
     "is sshd running there and listening on port 22?"),
    (255, "root@n1: Permission denied (publickey).", "host n1: ssh authentication refused"),
    (255, "Host key verification failed.", "host n1: host key verification failed"),
    (255, "ssh: connect to host n1 port 22: No route to host", "host n1: unreachable"),
    (255, "ssh: Could not resolve hostname n1: Name or service not known", "host n1: unreachable"),
    (127, "bash: line 1: /opt/py: No such file or directory",
     "host n1: python '/opt/py' not found there"),
    (None, "", "host n1: no answer within 10 s"),
])
def test_ssh_failures_are_classified_per_host(code, stderr, message):
    host = parse_host_entry("n1", "--hosts entry 1")
    assert classify_ssh_failure(host, code, stderr, "/opt/py").startswith(message)


def test_the_root_cause_is_the_earliest_failure_over_the_hosts(tmp_path):
    config = HostsConfig(hosts=parse_hosts("a,b,c"), training_script="t.py", workspace="/w",
                           log_dir="log")
    job = H._HostsJob(config, signals=None)
    for i, h in enumerate(config.hosts):
        r = Remote(h, i, {"workspace": "/w"}, f"10.0.0.{i + 1}", f"log/{h.name}")
        job.remotes.append(r)
    a, b, c = job.remotes
    a.result = {"cause": {"role": "server", "index": 0, "pid": 7, "exit_code": 1, "log":
                          "log/a/serverlog.0", "error": "FleetTimeoutError: worker 1 was lost",
                          "exit_time": 1000.5}}
    b.result = {"cause": {"role": "worker", "index": 1, "pid": 8, "exit_code": -9, "log":
                          "log/b/workerlog.1", "error": "", "exit_time": 1000.2}}
    assert job._root_cause() == ("host b (10.0.0.2) worker 1 (pid 8) was killed by SIGKILL; "
                                 "log: log/b/workerlog.1")
    # a failure that says it follows another's loss is not the cause, even when earlier
    a.result["cause"]["exit_time"] = 1000.0
    assert job._root_cause().startswith("host b (10.0.0.2) worker 1 (pid 8)")
    b.result = None
    c.proc = type("P", (), {"returncode": 255})()
    c.exit_time, c.last_stderr = 1000.1, "Connection to 10.0.0.3 closed by remote host."
    assert job._root_cause() == ("host c (10.0.0.3): ssh exited 255 (connection lost: "
                                 "Connection to 10.0.0.3 closed by remote host.)")


def test_a_restart_of_a_hosts_job_names_the_failed_process_and_its_host(tmp_path):
    config = HostsConfig(hosts=parse_hosts("a,b"), training_script="t.py", workspace="/w",
                           log_dir=str(tmp_path), max_restarts=2)
    job = H._HostsJob(config, signals=None)
    job.remotes = [Remote(h, i, {"workspace": "/w"}, f"10.0.0.{i + 1}", str(tmp_path / h.name))
                   for i, h in enumerate(config.hosts)]
    job.servers, job.workers, job.addresses = ["10.0.0.1:6170"], ["10.0.0.1:6171", "10.0.0.2:6171"], \
        ["10.0.0.1", "10.0.0.2"]
    assert job._root_failure(0) is None
    job.remotes[1].result = {"cause": {"role": "server", "index": 0, "pid": 9, "exit_code": -9, "error": "",
                                       "log": "log/b/serverlog.0", "exit_time": 5.0}}
    failure = job._root_failure(1)
    assert failure.describe() == "server 0 (pid 9) on host 10.0.0.2 was killed by SIGKILL"
    assert failure.attempt == 1
    # every host's fleetrun learns the attempt and where to note its checkpoint directory
    command = job._remote_command(job.remotes[1], attempt=1)
    assert "FLEET_RESTART_COUNT=1 FLEET_MAX_RESTARTS=2 FLEET_RESTART_STATE_DIR=/w/log/b/.restart" in command
    (tmp_path / "a" / ".restart").mkdir(parents=True)
    (tmp_path / "a" / ".restart" / "checkpoint_dir.1.0").write_text("/mnt/nfs/ckpt")
    assert job._noted_checkpoint_dirs() == ["/mnt/nfs/ckpt"]
    job._keep_attempt_logs(0)
    assert (tmp_path / "attempt-0" / "a" / ".restart" / "checkpoint_dir.1.0").is_file()
    assert sorted(os.listdir(tmp_path / "a")) == []
    with pytest.raises(ConfigError, match=r"--max_restarts -1 must be a whole number >= 0"):
        HostsConfig(hosts=parse_hosts("a"), training_script="t.py", workspace="/w", max_restarts=-1)
