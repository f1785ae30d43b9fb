"""fleetrun --hosts --max_restarts: a host that fails the preflight before a restart leaves
the job and its ranks move to the others (no ssh: the preflight and the attempts are faked)."""
import os

import pytest

from fleet.errors import ConfigError
from fleet.launch import hosts as H
from fleet.launch import sweep
from fleet.launch.hostfile import HostsConfig, parse_hosts, plan_endpoints
from fleet.launch.config import EXIT_OK, EXIT_PROCESS_FAILED
from fleet.launch.hosts_heal import JobLayout, describe_moves, drop_hosts, first_shares
from fleet.launch.preflight import Preflight
from fleet.launch.remote import Remote
from fleet.launch.replacement import Move, Share
from fleet.launch.restart import Failure

ADDRS = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}


def _layout():
    """h1 and h2: a server and a worker each; h3: a worker (the cluster test's job)."""
    counts = [(1, 1), (1, 1), (0, 1)]
    servers, workers = plan_endpoints(list(ADDRS.values()), [s for s, _ in counts],
                                        [w for _, w in counts], 6170)
    return JobLayout(first_shares(list(ADDRS), counts), tuple(servers), tuple(workers))


def test_a_lost_hosts_server_and_worker_move_to_the_next_free_ports_of_their_new_host():
    layout, placed = drop_hosts(_layout(), ["b"], ADDRS, 6170)
    assert layout.shares == {"a": Share((0, 1), (0, 1)), "c": Share((), (2,))}
    assert layout.servers == ("10.0.0.1:6170", "10.0.0.1:6172")
    assert layout.workers == ("10.0.0.1:6171", "10.0.0.1:6173", "10.0.0.3:6170")
    assert placed == [(Move("server", 1, "b", "a"), "10.0.0.1:6172"), (Move("worker", 1, "b", "a"), "10.0.0.1:6173")]
    assert describe_moves(placed) == ["server 1 moves from b to a (10.0.0.1:6172)",
                                      "worker 1 moves from b to a (10.0.0.1:6173)"]


def test_a_second_loss_keeps_every_endpoint_that_stays_and_packs_after_the_used_ports():
    layout, _ = drop_hosts(_layout(), ["b"], ADDRS, 6170)
    layout, placed = drop_hosts(layout, ["a"], ADDRS, 6170)
    # h3 ran no server: the servers go to the host with the fewest processes, h3 itself
    assert layout.shares == {"c": Share((0, 1), (0, 1, 2))}
    assert layout.servers == ("10.0.0.3:6171", "10.0.0.3:6172")
    assert layout.workers == ("10.0.0.3:6173", "10.0.0.3:6174", "10.0.0.3:6170")
    assert [m.describe() for m, _ in placed] == ["server 0 from a to c", "server 1 from a to c",
                                                 "worker 0 from a to c", "worker 1 from a to c"]


def test_an_ipv6_target_gets_a_bracketed_endpoint():
    addrs = {"a": "fe80::1", "b": "10.0.0.2"}
    layout = JobLayout(first_shares(["a", "b"], [(1, 1), (1, 1)]), ("[fe80::1]:6170", "10.0.0.2:6170"),
                       ("[fe80::1]:6171", "10.0.0.2:6171"))
    layout, _ = drop_hosts(layout, ["b"], addrs, 6170)
    assert layout.servers == ("[fe80::1]:6170", "[fe80::1]:6172")


def test_a_collective_job_moves_its_workers_only():
    layout = JobLayout(first_shares(["a", "b"], [(0, 2), (0, 2)]), (),
                       ("10.0.0.1:6170", "10.0.0.1:6171", "10.0.0.2:6170", "10.0.0.2:6171"))
    layout, placed = drop_hosts(layout, ["a"], ADDRS, 6170)
    assert layout.shares == {"b": Share((), (0, 1, 2, 3))} and layout.servers == ()
    assert layout.workers == ("10.0.0.2:6172", "10.0.0.2:6173", "10.0.0.2:6170", "10.0.0.2:6171")
    assert describe_moves(placed) == ["worker 0 moves from a to b (10.0.0.2:6172)",
                                      "worker 1 moves from a to b (10.0.0.2:6173)"]


def test_losing_every_host_is_an_error_naming_them():
    with pytest.raises(ConfigError, match=r"^every host of the job is lost \(a, b, c\)"):
        drop_hosts(_layout(), ["a", "b", "c"], ADDRS, 6170)


class _FakeJob:
    """Drives _HostsJob._run_with_restarts: attempt 0 fails, the preflight then fails on the
    hosts in ``unreachable``, later attempts succeed."""

    def __init__(self, tmp_path, monkeypatch, unreachable, max_restarts=2):
        self.config = HostsConfig(hosts=parse_hosts("a,b,c"), training_script="t.py", workspace="/w",
                                    log_dir=str(tmp_path / "log"), max_restarts=max_restarts,
                                    insecure=True)
        job = self.job = H._HostsJob(self.config, signals=type("S", (), {"received": 0})())
        job.addresses = list(ADDRS.values())
        job.remotes = [Remote(h, i, {"workspace": "/w"}, ADDRS[h.name], str(tmp_path / "log" / h.name))
                       for i, h in enumerate(self.config.hosts)]
        for r in job.remotes:
            os.makedirs(r.log_dir)
        job._set_layout(_layout())
        self.attempts = []
        self.checked = []

        def start_and_watch(attempt):
            self.attempts.append({r.name: job._remote_command(r, attempt) for r in job.remotes})
            return EXIT_PROCESS_FAILED if attempt == 0 else EXIT_OK

        def fake_preflight(config, ssh, hosts):
            self.checked.append([h.name for h in hosts])
            return [Preflight(h, f"host {h.name}: unreachable (ssh: connect to host {h.name} port 22: "
                                   "Connection timed out)" if h.name in unreachable else None) for h in hosts]

        monkeypatch.setattr(job, "_start_and_watch", start_and_watch)
        monkeypatch.setattr(job, "_root_failure", lambda attempt: Failure(
            attempt, "worker", 0, "10.0.0.1", 41, "exited with code 1", "ServerLostError: server 1 was lost", 5.0))
        monkeypatch.setattr(job, "_noted_checkpoint_dirs", lambda: [str(tmp_path / "ckpt")])
        monkeypatch.setattr(H, "preflight", fake_preflight)


def test_a_host_that_fails_the_preflight_leaves_and_the_others_restart_with_its_ranks(
        tmp_path, monkeypatch, capsys):
    fake = _FakeJob(tmp_path, monkeypatch, unreachable={"b"})
    assert fake.job._run_with_restarts() == EXIT_OK
    assert fake.checked == [["a", "b", "c"]]
    first, second = fake.attempts
    assert sorted(first) == ["a", "b", "c"] and sorted(second) == ["a", "c"]
    for command in second.values():
        assert ("--servers 10.0.0.1:6170,10.0.0.1:6172 --workers 10.0.0.1:6171,10.0.0.1:6173,10.0.0.3:6170 "
                in command)
        assert "FLEET_RESTART_COUNT=1 " in command
    err = capsys.readouterr().err
    lost = ("host 1 on host 10.0.0.2 was lost (failed the preflight before the restart: host b: unreachable "
            "(ssh: connect to host b port 22: Connection timed out))")
    assert f"fleetrun: restart 1 of 2 (--max_restarts 2): {lost}; every process was stopped" in err
    assert "fleetrun: host b (10.0.0.2) leaves the job: host b: unreachable" in err
    assert "fleetrun: server 1 moves from b to a (10.0.0.1:6172)\nfleetrun: worker 1 moves from b to a " \
           "(10.0.0.1:6173)\n" in err
    assert err.endswith(f"fleetrun: done after 1 restart; 1 failure, in order:\n    1. attempt 0: {lost}\n")
    log = (tmp_path / "log" / "restarts.log").read_text()
    assert ("Z 1 host left the job (b): server 1 moves from b to a (10.0.0.1:6172); worker 1 moves from b to a "
            "(10.0.0.1:6173)\n") in log
    assert f"restart 1 of 2: {lost};" in log
    # the lost host's logs of attempt 0 were kept; it has no log directory of its own any more
    assert (tmp_path / "log" / "attempt-0" / "b").is_dir() and not (tmp_path / "log" / "b").exists()


def test_a_restart_where_every_host_passes_keeps_the_hosts_and_the_endpoints(tmp_path, monkeypatch):
    fake = _FakeJob(tmp_path, monkeypatch, unreachable=set())
    assert fake.job._run_with_restarts() == EXIT_OK
    first, second = fake.attempts
    assert sorted(second) == ["a", "b", "c"]
    assert first["b"].replace("FLEET_RESTART_COUNT=0", "FLEET_RESTART_COUNT=1") == second["b"]
    assert "left the job" not in (tmp_path / "log" / "restarts.log").read_text()


def test_when_no_host_passes_the_preflight_the_job_gives_up_naming_every_host(tmp_path, monkeypatch, capsys):
    fake = _FakeJob(tmp_path, monkeypatch, unreachable={"a", "b", "c"})
    assert fake.job._run_with_restarts() == EXIT_PROCESS_FAILED
    assert len(fake.attempts) == 1
    err = capsys.readouterr().err
    assert ("fleetrun: exit 1: no restart (no host is left: host a: unreachable (ssh: connect to host a port 22: "
            "Connection timed out); host b: unreachable") in err
    assert "1. attempt 0: host 0 on host 10.0.0.1, 10.0.0.2, 10.0.0.3 was lost (failed the preflight" in err


def test_the_lost_host_counts_against_max_restarts(tmp_path, monkeypatch, capsys):
    fake = _FakeJob(tmp_path, monkeypatch, unreachable={"c"}, max_restarts=1)
    fake.job._start_and_watch = lambda attempt: (fake.attempts.append(attempt), EXIT_PROCESS_FAILED)[1]
    assert fake.job._run_with_restarts() == EXIT_PROCESS_FAILED
    assert fake.attempts == [0, 1]
    err = capsys.readouterr().err
    assert "fleetrun: worker 2 moves from c to a (10.0.0.1:6172)" in err
    assert "fleetrun: exit 1: gave up after 1 restart (--max_restarts 1); 2 failures, in order:" in err


def test_np_with_hosts_is_refused_naming_the_elastic_server_way():
    from fleet.launch import build_parser
    from fleet.launch.cli import hosts_config_from_args
    args = build_parser().parse_args(["--hosts", "a,b", "--np", "2:4", "--workspace", "/w", "t.py"])
    with pytest.raises(ConfigError) as info:
        hosts_config_from_args(args)
    assert str(info.value) == (
        "--np 2:4 cannot be used with --hosts: the dispatcher runs a fixed set of workers on its hosts (with "
        "--max_restarts a lost host's ranks move to the others). For workers that come and go across hosts run "
        "the same fleetrun on each host with --elastic_server HOST:PORT --job_id ID; for an elastic job on one "
        "host, fleetrun --np MIN:MAX there (docs/elastic.md)")


def test_a_host_the_sweep_cannot_reach_is_not_waited_for_again_to_fetch_its_logs_or_for_the_preflight(tmp_path, monkeypatch, capsys):
    config = HostsConfig(hosts=parse_hosts("a,b"), training_script="t.py", workspace="/w",
                           log_dir=str(tmp_path))
    job = H._HostsJob(config, signals=None)
    job.remotes = [Remote(h, i, {"workspace": "/w", "rsync": True}, None, str(tmp_path / h.name))
                   for i, h in enumerate(config.hosts)]
    for r in job.remotes:
        r.proc = object()
    calls = []

    def run_bounded(argv, timeout):
        calls.append(argv)
        if "b" in argv or any(a.startswith("b:") for a in argv):
            return 255, "", "ssh: connect to host b port 22: Connection timed out"
        return 0, "", ""

    monkeypatch.setattr(sweep, "run_bounded", run_bounded)
    sweep.sweep_hosts(job.remotes, job.ssh, config.python, job.job_id)
    assert [r.unreachable for r in job.remotes] == [None, (255, "ssh: connect to host b port 22: Connection timed out")]
    calls.clear()
    sweep.fetch_logs(job.remotes, job.ssh)
    assert len(calls) == 1 and calls[0][0] == "rsync" and calls[0][-2] == "a:/w/log/a/"
    err = capsys.readouterr().err
    assert ("fleetrun: host b: its logs were not fetched (unreachable a moment ago); they stay in /w/log/b there"
            in err)
    # the restart preflight asks only the hosts the sweep reached; b fails it with the sweep's answer
    asked = []
    monkeypatch.setattr(H, "preflight", lambda config, ssh, hosts: asked.extend(h.name for h in hosts) or
                        [Preflight(h) for h in hosts])
    lost = job._preflight_again(0)
    assert asked == ["a"]
    assert [(r.name, p.problem) for r, p in lost] == [
        ("b", "host b: unreachable (ssh: connect to host b port 22: Connection timed out); check its name/address "
              "and the network")]
    assert ("fleetrun: preflight of the 2 hosts of the job before restart 1 (at most 10 s; b: unreachable by the "
            "sweep a moment ago): a host that fails it leaves the job") in capsys.readouterr().err
