"""Rounds of an etcd job without etcd: the next round's plan, its stored form, and how
run_with_restarts counts a lost host against --max_restarts in every order of events."""
import time
import types

import pytest

from fleet.errors import RendezvousError
from fleet.launch import restart
from fleet.launch.etcd_rendezvous import HostRecord, JobPlan, host_endpoints, plan_of
from fleet.launch.etcd_rounds import (Regroup, max_port, next_plan, plan_from_json, plan_to_json,
                                      shares_of)
from fleet.launch.replacement import Share


def _plan(*layout):
    """plan_of hosts 10.0.0.1.. with (servers, workers) each, ports from 6170."""
    return plan_of([HostRecord(f"10.0.0.{i}", *host_endpoints(f"10.0.0.{i}", s, w, 6170), f"n{i}", i)
                    for i, (s, w) in enumerate(layout, 1)])


def test_shares_follow_the_ranks_of_each_member():
    plan = _plan((1, 1), (1, 1), (0, 1))
    assert shares_of(plan) == [("10.0.0.1", Share((0,), (0,))), ("10.0.0.2", Share((1,), (1,))),
                               ("10.0.0.3", Share((), (2,)))]


def test_a_lost_hosts_ranks_move_to_the_survivors_on_their_offered_ports_and_the_rest_stay():
    plan = _plan((1, 1), (1, 1), (0, 1))
    new, moves = next_plan(plan, ["10.0.0.2"], {"10.0.0.1": [6180, 6181], "10.0.0.3": [6190]})
    assert [m.describe() for m in moves] == ["server 1 from 10.0.0.2 to 10.0.0.1",
                                             "worker 1 from 10.0.0.2 to 10.0.0.1"]
    assert new.servers == ("10.0.0.1:6170", "10.0.0.1:6180")
    assert new.workers == ("10.0.0.1:6171", "10.0.0.1:6181", "10.0.0.3:6170")
    assert [m.addr for m in new.members] == ["10.0.0.1", "10.0.0.3"]
    assert new.members[0].servers == ("10.0.0.1:6170", "10.0.0.1:6180")
    assert new.members[0].hostname == "n1" and new.members[1].revision == 3
    assert new.ranks_of("10.0.0.1") == "server 0, server 1, worker 0, worker 1"
    assert new.ranks_of("10.0.0.3") == "worker 2"


def test_ranks_keep_their_index_when_a_later_host_takes_an_earlier_rank():
    # 10.0.0.3 has the fewest workers, so worker 0 goes behind its worker 3: the plan
    # keeps index order (concatenating the members' endpoints would not)
    plan = _plan((1, 1), (1, 2), (0, 1))
    new, moves = next_plan(plan, ["10.0.0.1"], {"10.0.0.2": [6200], "10.0.0.3": [6300]})
    assert [m.describe() for m in moves] == ["server 0 from 10.0.0.1 to 10.0.0.2",
                                             "worker 0 from 10.0.0.1 to 10.0.0.3"]
    assert new.servers == ("10.0.0.2:6200", "10.0.0.2:6170")
    assert new.workers == ("10.0.0.3:6300", "10.0.0.2:6171", "10.0.0.2:6172", "10.0.0.3:6170")
    assert plan_from_json(plan_to_json(new, moves)) == (new, [m.describe() for m in moves])


def test_a_survivor_without_free_ports_is_named():
    plan = _plan((1, 1), (1, 1))
    with pytest.raises(RendezvousError) as e:
        next_plan(plan, ["10.0.0.2"], {"10.0.0.1": []})
    assert str(e.value) == ("host 10.0.0.1 offered no free port for server 1; free ports on it "
                            "above 6171")
    assert max_port(plan, "10.0.0.9") == 0


def test_a_stored_plan_that_is_not_fleets_is_refused_with_the_fix():
    with pytest.raises(RendezvousError) as e:
        plan_from_json('{"members": 3}')
    assert str(e.value) == ("a round plan '{\"members\": 3}' of this job in etcd is not fleet's: "
                            "use a --job_id of its own for each job")


# -- run_with_restarts with a Regroup: the order of events -------------------------------

LOST = "host 10.0.0.2 (server 1, worker 1) was lost from job 'j' at etcd e:2379"


class _Monitor:
    def __init__(self, change=None, lost=("10.0.0.2",), cut_off=False):
        self.change, self.lost, self.expired = change, list(lost), cut_off

    def poll(self):
        return self.change

    def lost_hosts(self):
        return self.lost

    def cut_off(self):
        return self.expired

    def why_lost(self, addr):
        return "its registration expired (no keepalive for 3 s)" if addr in self.lost else ""


class _Regroup(Regroup):
    """A Regroup whose rounds form at once (no etcd); monitors handed out in turn."""

    def __init__(self, monitors, ttl=3):
        self.rdv = types.SimpleNamespace(ttl=ttl, monitor=monitors[0])
        self.monitors = monitors[1:]
        self.round, self.plan, self.config = 0, _plan((1, 1), (1, 1), (0, 1)), "round 0"
        self.covered = 0

    def next_round(self, signals):
        self.round += 1
        self.config = f"round {self.round}"
        self.rdv.monitor = self.monitors.pop(0)
        return True


class _Job:
    """An attempt that ends as scripted: ("ok",), ("fail", seconds ago) or ("change", monitor)."""

    def __init__(self, how, regroup):
        self.how, self.regroup, self.children = how, regroup, []
        self.cause = self.membership_change = None

    def run(self):
        if self.how[0] == "ok":
            return 0
        if self.how[0] == "change":  # the host's loss arrives now
            self.regroup.monitor.change = self.regroup.monitor.change or LOST
            self.membership_change = self.regroup.monitor.poll()
            return 1
        self.cause = types.SimpleNamespace(role="worker", index=2, popen=types.SimpleNamespace(pid=42),
                                           describe_exit=lambda: "exited with code 1",
                                           error_line=lambda: "", exit_wall_time=time.time() - self.how[1])
        return 1


def _run(tmp_path, script, monitors, k=2, ttl=3):
    regroup = _Regroup(monitors, ttl)
    config = types.SimpleNamespace(log_dir=str(tmp_path / "log"), max_restarts=k, host="10.0.0.1",
                                   restart_from_scratch=True, multi_host=True, failure_grace=0.0)
    seen = []

    def make_job(attempt, started):
        seen.append((attempt, regroup.config))
        return _Job(script[attempt], regroup)
    code = restart.run_with_restarts(config, make_job, types.SimpleNamespace(received=0), regroup)
    log = tmp_path / "log" / "restarts.log"
    return code, seen, log.read_text() if log.exists() else ""


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch):
    monkeypatch.setenv("FLEET_HEARTBEAT_MS", "50")
    monkeypatch.setenv("FLEET_HEARTBEAT_TIMEOUT_MS", "100")  # settle_seconds = 0.1 + 0 + 2


def test_a_lost_host_counts_one_restart_and_the_job_goes_on_in_the_next_round(tmp_path, capsys):
    code, seen, log = _run(tmp_path, [("change",), ("ok",)], [_Monitor(LOST), _Monitor()])
    assert code == 0
    assert seen == [(0, "round 0"), (1, "round 1")]
    err = capsys.readouterr().err
    assert ("fleetrun: restart 1 of 2 (--max_restarts 2): host 1 on host 10.0.0.2 was lost from "
            "the job (server 1, worker 1): its registration expired (no keepalive for 3 s); every "
            "process was stopped") in err
    assert ("round 1 of the job: host 10.0.0.2 (server 1, worker 1) lost: its registration "
            "expired (no keepalive for 3 s)\n") in log
    assert "fleetrun: done after 1 restart; 1 failure, in order:" in err


def test_a_change_during_the_wait_after_a_failure_turns_that_restart_into_the_round(tmp_path, capsys):
    # the processes failed through their heartbeats first; the lease expired during the wait
    code, seen, log = _run(tmp_path, [("fail", 0.0), ("ok",)], [_Monitor(LOST), _Monitor()])
    assert code == 0
    assert seen == [(0, "round 0"), (1, "round 1")]  # no same-plan attempt in between
    assert log.count("restart 1 of 2") == 1 and "restart 2" not in log
    assert (f"fleetrun: membership change during the wait: {LOST}; restart 1 becomes round 1 of "
            "the job, without the lost host\n") in capsys.readouterr().err


def test_a_change_ending_the_restarted_attempt_soon_after_the_failure_is_not_counted_again(
        tmp_path, capsys):
    first = _Monitor()
    script = [("fail", 2.2), ("change",), ("ok",)]  # the restart runs when the change arrives
    code, seen, log = _run(tmp_path, script, [first, _Monitor()], k=1)

    assert code == 0  # one restart of --max_restarts 1 was enough
    assert seen == [(0, "round 0"), (1, "round 0"), (2, "round 1")]
    assert "ended by a membership change within 5.1 s of the failure it restarted for (counted once)" in log


def test_a_loss_long_after_the_last_failure_counts_and_k_bounds_it(tmp_path, capsys):
    script = [("fail", 30.0), ("change",)]
    code, seen, log = _run(tmp_path, script, [_Monitor(), _Monitor()], k=1, ttl=1)
    assert code == 1
    assert "gave up after 1 restart (--max_restarts 1); 2 failures, in order:" in log


def test_a_host_cut_off_from_etcd_ends_its_job_as_without_restarts(tmp_path, capsys):
    mine = "this host's registration in job 'j' at etcd e:2379 expired"
    code, seen, log = _run(tmp_path, [("change",)], [_Monitor(mine, lost=(), cut_off=True)])
    assert code == 1 and seen == [(0, "round 0")] and log == ""
    assert capsys.readouterr().err.splitlines()[-1] == f"fleetrun: exit 1: membership change: {mine}"


def test_a_ready_record_that_is_not_fleets_is_refused_with_the_fix():
    from fleet.launch.etcd_rounds import _ready_record
    assert _ready_record('{"addr": "10.0.0.1", "ports": [6172, 6173]}') == (
        "10.0.0.1", {"addr": "10.0.0.1", "ports": [6172, 6173]})
    with pytest.raises(RendezvousError) as e:
        _ready_record('{"addr": "10.0.0.1"}')
    assert str(e.value) == ("a ready record '{\"addr\": \"10.0.0.1\"}' of this job in etcd is not "
                            "fleet's: use a --job_id of its own for each job")


def test_a_second_host_lost_soon_after_a_round_counts_again(tmp_path, capsys):
    # a process failure became round 1 during the wait; another loss right after is new
    script = [("fail", 0.0), ("change",), ("ok",)]
    code, seen, log = _run(tmp_path, script, [_Monitor(LOST), _Monitor(), _Monitor()], k=2)
    assert code == 0
    assert seen == [(0, "round 0"), (1, "round 1"), (2, "round 2")]
    assert "restart 2 of 2: host 1 on host 10.0.0.2" in log
