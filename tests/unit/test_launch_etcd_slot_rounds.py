"""Rounds of an elastic etcd job (--np MIN:MAX --elastic_server --max_restarts) without etcd:
the worker slots re-made for a round (kept per host, lost ones free), the round's plan,
the order of events on one host, and which failures run_with_restarts turns into rounds."""
import json
import time
import types

import pytest

from fleet.errors import RendezvousError
from fleet.launch import restart
from fleet.launch.etcd_client import KeyValue
from fleet.launch.etcd_rendezvous import HostRecord, host_endpoints, plan_of
from fleet.launch.etcd_slot_rounds import SlotRegroup, describe_slot_plan, remake_slots, slot_plan
from fleet.launch.etcd_slots import SlotRegistry

H1, H2, H3 = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def _plan(*layout):
    """plan_of hosts 10.0.0.1.. with (servers, workers) each, ports from 6170."""
    return plan_of([HostRecord(f"10.0.0.{i}", *host_endpoints(f"10.0.0.{i}", s, w, 6170), f"n{i}", i)
                    for i, (s, w) in enumerate(layout, 1)])


# -- the slots of a round -------------------------------------------------------------------
def test_each_surviving_host_keeps_its_slot_ids_and_the_lost_hosts_ids_are_left_free():
    held = {H1: [0], H2: [1], H3: [2]}
    assert remake_slots([H1, H2, H3], held, {H1: 1, H3: 1}, {H2}, 3) == {0: H1, 2: H3}


def test_a_host_short_of_slots_takes_the_lowest_free_ids_those_of_lost_hosts_last():
    held = {H1: [3], H2: [0, 1], H3: []}  # H3's worker was lost in the failed round
    got = remake_slots([H1, H2, H3], held, {H1: 2, H3: 2}, {H2}, 5)
    assert got == {2: H1, 3: H1, 4: H3, 0: H3}  # 2 and 4 never held, then 0 (H2's) for H3's second


def test_a_host_keeps_at_most_its_worker_num_per_host_and_two_hosts_never_share_an_id():
    got = remake_slots([H1, H3], {H1: [0, 1, 2], H3: [1]}, {H1: 2, H3: 1}, set(), 4)
    assert got == {0: H1, 1: H1, 2: H3}


def test_the_round_plan_moves_the_lost_server_and_re_makes_the_slots():
    plan = _plan((0, 1), (1, 1), (0, 1))  # h2 runs server 0 and a worker (slot 1)
    before = {0: H1, 1: H2, 2: H3}
    ready = {H1: {"ports": [6180, 6181], "slots": [0], "want": 1},
             H3: {"ports": [6190], "slots": [2], "want": 1}}
    new, moves, assigned = slot_plan(plan, before, ready, [H2], 2, 3)
    assert [m.describe() for m in moves] == ["server 0 from 10.0.0.2 to 10.0.0.1"]
    assert new.servers == ("10.0.0.1:6180",) and new.workers == ()
    assert [m.addr for m in new.members] == [H1, H3] and new.members[0].servers == ("10.0.0.1:6180",)
    assert assigned == {0: H1, 2: H3}
    assert describe_slot_plan(new, assigned) == "10.0.0.1: server 0, slot 0; 10.0.0.3: slot 2"


def test_a_round_with_fewer_workers_than_min_is_refused_naming_the_hosts():
    plan = _plan((1, 1), (0, 2))
    with pytest.raises(RendezvousError) as e:
        slot_plan(plan, {0: H1, 1: H2, 2: H2}, {H1: {"ports": [], "slots": [0], "want": 1}}, [H2], 2, 3)
    assert str(e.value) == ("the surviving hosts (10.0.0.1) run 1 workers, fewer than --np 2:3's minimum 2: the "
                            "job cannot re-form; start hosts with more workers (--worker_num_per_host) and a new "
                            "--job_id")


# -- one host's round against an etcd held in memory ------------------------------------------
class _Etcd:
    """The calls a round makes, on a dict; every write is recorded in ``log``."""

    endpoint, timeout = "e:2379", 1.0

    def __init__(self):
        self.kv, self.rev, self.log = {}, 1, []

    def range(self, key, prefix=False):
        found = [KeyValue(k, v, r, r, 0) for k, (v, r) in sorted(self.kv.items())
                 if (k.startswith(key) if prefix else k == key)]
        return found, self.rev

    def _set(self, key, value):
        self.rev += 1
        self.kv[key] = (value, self.rev)

    def put(self, key, value, lease=0):
        self.log.append(("put", key))
        self._set(key, value)
        return self.rev

    def put_if_absent(self, key, value, lease=0, clear_prefix=None):
        if key in self.kv:
            return False, self.range(key)[0][0]
        if clear_prefix:
            self.log.append(("clear", clear_prefix))
            for k in [k for k in self.kv if k.startswith(clear_prefix)]:
                del self.kv[k]
        self.log.append(("plan", key))
        self._set(key, value)
        return True, self.range(key)[0][0]

    def put_if_unchanged(self, key, value, mod_revision, lease=0):
        if self.kv.get(key, (None, 0))[1] != mod_revision:
            return False
        self.log.append(("take", key))
        self._set(key, value)
        return True

    def watch(self, *a, **k):
        raise RendezvousError("no watch in this test")


def test_one_host_stops_its_slot_reader_gets_ready_writes_the_plan_clearing_the_slots_then_takes_its_own(
        tmp_path):
    etcd, prefix = _Etcd(), "/fleet/jobs/j/"
    plan = _plan((0, 1), (1, 1))  # h1: slot 0; h2: server 0 and slot 1
    keepalive = types.SimpleNamespace(expired=False, stop=lambda: None, lock=None)
    old_monitor = types.SimpleNamespace(stop_watching=lambda: etcd.log.append(("stop watching", "")),
                                        keepalive=keepalive)
    rdv = types.SimpleNamespace(client=etcd, prefix=prefix, lease=7, me=plan.members[0], where="job 'j'",
                                elastic=(1, 3), monitor=old_monitor, wait_s=5, ttl=3)
    for j, addr in ((0, H1), (1, H2)):  # round 0's slots, live
        etcd.put(f"{prefix}slots/{j}", json.dumps({"addr": addr, "state": "live"}))
    etcd.put(f"{prefix}hosts/{H1}", plan.members[0].to_json())  # h2's key is gone: lost
    registry = SlotRegistry(rdv, plan)
    registry.stop = lambda: etcd.log.append(("stop slot reader", ""))
    configs = []

    def config_for(p, slots, every_slot):
        configs.append((p.servers, slots))
        return types.SimpleNamespace(server_endpoints=p.servers, worker_endpoints=(f"{H1}:6170", f"{H1}:6171",
                                                                                    f"{H1}:6172"))
    regroup = SlotRegroup(rdv, plan, config_for, registry, 1)
    etcd.log.clear()
    regroup._offer = lambda: {"addr": H1, "ports": [6180], "slots": [0], "want": 1}  # no bind in a unit test
    try:
        assert regroup.next_round(types.SimpleNamespace(received=0)) is True
        assert [e[0] for e in etcd.log] == ["stop slot reader", "stop watching", "put", "clear", "plan", "take"]
        assert etcd.log[2][1] == f"{prefix}rounds/1/ready/{H1}" and etcd.log[3][1] == f"{prefix}slots/"
        assert etcd.log[5][1] == f"{prefix}slots/0"
        assert sorted(k for k in etcd.kv if "/slots/" in k) == [f"{prefix}slots/0"]  # h2's slot 1 cleared
        assert regroup.assigned == {0: H1} and regroup.my_slots() == (0,) and regroup.round == 1
        assert configs[-1] == (("10.0.0.1:6180",), (0,))  # server 0 moved here, slot 0 kept
        assert regroup.registry.round == 1 and regroup.registry.assigned == {0: H1}
    finally:
        regroup.registry.stop()
        regroup.rdv.monitor.stop_watching()


def test_the_slot_reader_ends_the_job_when_another_host_is_ready_for_the_next_round():
    etcd, prefix = _Etcd(), "/fleet/jobs/j/"
    plan = _plan((1, 1), (0, 1))
    rdv = types.SimpleNamespace(client=etcd, prefix=prefix, lease=7, me=plan.members[1], where="job 'j'",
                                elastic=(1, 3))
    etcd.put(f"{prefix}hosts/{H1}", "{}")
    etcd.put(f"{prefix}hosts/{H2}", "{}")
    registry = SlotRegistry(rdv, plan, round=0)
    assert registry.check() is None
    etcd.put(f"{prefix}rounds/1/ready/{H1}", "{}")
    assert registry.check() == ("host 10.0.0.1 began round 1 of job 'j' (it stopped its processes after a "
                                "failure): this host stops its processes and joins the round (--max_restarts)")


# -- which failures become rounds -----------------------------------------------------------------
class _Monitor:
    def __init__(self, change=None, lost=(), cut_off=False, after=0.0):
        self.change, self.lost, self.cut, self.at = change, list(lost), cut_off, time.monotonic() + after

    def poll(self):
        return self.change if time.monotonic() >= self.at else None

    def lost_hosts(self):
        return self.lost if self.poll() else []

    def why_lost(self, addr):
        return "its registration expired (no keepalive for 3 s)"

    def cut_off(self):
        return self.cut


class _Regroup:
    remakes_slots = True

    def __init__(self, monitors):
        self.monitors, self.round, self.covered = monitors, 0, 0
        self.rdv = types.SimpleNamespace(ttl=1)
        self.monitor = monitors.pop(0)
        self.plan = _plan((1, 1), (0, 1))
        self.config = "round 0"

    def loss_failure(self, attempt, failures, window):
        return restart.Failure(attempt, "host", 1, self.monitor.lost[0], None, "was lost from the job",
                               self.monitor.why_lost(""), time.time())

    def describe_loss(self):
        return ""

    def next_round(self, signals):
        self.round += 1
        self.config = f"round {self.round}"
        self.monitor = self.monitors.pop(0) if self.monitors else _Monitor()
        return True


class _Job:
    """An attempt that ends as scripted: ("ok",), ("server",), ("worker",) or ("change",)."""

    def __init__(self, how, regroup):
        self.how, self.children, self.cause, self.membership_change = how, [], None, None
        if how[0] == "change":
            self.membership_change = regroup.monitor.change
        elif how[0] in ("server", "worker"):
            self.cause = types.SimpleNamespace(role=how[0], index=0, popen=types.SimpleNamespace(pid=42),
                                               describe_exit=lambda: "exited with code 1",
                                               error_line=lambda: "", exit_wall_time=time.time())

    def run(self):
        return 0 if self.how[0] == "ok" else 1


def _run(tmp_path, script, monitors, k=1):
    regroup = _Regroup(monitors)
    config = types.SimpleNamespace(log_dir=str(tmp_path / "log"), max_restarts=k, host=H1,
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
    monkeypatch.setenv("FLEET_HEARTBEAT_TIMEOUT_MS", "100")  # loss window = ttl 1 + 0.1 + 0 + 2 = 3.1 s


def test_a_failed_server_starts_a_round_at_once_counting_one_restart(tmp_path, capsys):
    code, seen, log = _run(tmp_path, [("server",), ("ok",)], [_Monitor()])
    assert code == 0 and seen == [(0, "round 0"), (1, "round 1")]
    assert "restart 1 of 1: server 0 (pid 42) on host 10.0.0.1 exited with code 1;" in log
    assert "round 1 formed: " in log and "fleetrun: done after 1 restart" in capsys.readouterr().err


def test_fewer_than_min_slots_is_a_round_counted_once(tmp_path, capsys):
    below = "only 1 worker of job 'j' live, fewer than --np 2:3's minimum 2"
    code, seen, log = _run(tmp_path, [("change",), ("ok",)], [_Monitor(below)])
    assert code == 0 and seen == [(0, "round 0"), (1, "round 1")]
    assert f"restart 1 of 1: job on host 10.0.0.1 must re-form: {below};" in log


def test_lost_workers_of_a_host_become_the_round_when_a_change_comes_during_the_wait(tmp_path, capsys):
    lost = "host 10.0.0.2 (server 0) was lost from job 'j'"
    code, seen, log = _run(tmp_path, [("worker",), ("ok",)], [_Monitor(lost, lost=[H2], after=0.3)])
    assert code == 0 and seen == [(0, "round 0"), (1, "round 1")]
    assert log.count("restart 1 of 1: worker 0 (pid 42) on host 10.0.0.1 exited with code 1") == 1
    assert (f"fleetrun: membership change: {lost}; restart 1 becomes round 1 of the job, its worker slots "
            "re-made\n") in capsys.readouterr().err


def test_lost_workers_of_a_host_with_no_change_of_the_job_leave_as_without_restarts(tmp_path, capsys):
    began = time.monotonic()
    code, seen, log = _run(tmp_path, [("worker",)], [_Monitor()])
    waited = time.monotonic() - began
    assert code == 1 and seen == [(0, "round 0")]
    assert "no round: worker 0 (pid 42) on host 10.0.0.1 exited with code 1; the job goes on without this host" \
        in log and "restart 1" not in log
    assert "no restart (--max_restarts restarts the job only when it fails as a whole)" in capsys.readouterr().err
    print(f"waited {waited:.1f} s for a change (loss window 3.1 s)")


def test_a_host_cut_off_from_etcd_ends_as_without_restarts(tmp_path, capsys):
    mine = "this host's registration in job 'j' at etcd e:2379 expired"
    code, seen, log = _run(tmp_path, [("change",)], [_Monitor(mine, cut_off=True)])
    assert code == 1 and seen == [(0, "round 0")] and log == ""
    assert capsys.readouterr().err.splitlines()[-1] == f"fleetrun: exit 1: membership change: {mine}"


def test_the_k_plus_first_round_gives_up(tmp_path, capsys):
    code, seen, log = _run(tmp_path, [("server",), ("server",)], [_Monitor()], k=1)
    assert code == 1 and seen == [(0, "round 0"), (1, "round 1")]
    assert "gave up after 1 restart (--max_restarts 1); 2 failures, in order:" in log


# -- the servers expect the round's slots ----------------------------------------------------------
def test_a_rounds_processes_are_told_which_workers_the_servers_expect_from_the_start(tmp_path):
    from fleet.launch.config import LaunchConfig, process_environment
    script = tmp_path / "train.py"
    script.write_text("")
    config = LaunchConfig(training_script=str(script), server_endpoints=("10.0.0.1:6170",),
                          worker_endpoints=("10.0.0.1:6171", "10.0.0.1:6172", "10.0.0.1:6173"),
                          local_servers=(0,), local_workers=(0,), host=H1, elastic=(2, 3),
                          expected_workers=(0, 2))
    env = process_environment(config, "server", 0, base={"FLEET_ELASTIC_EXPECTED": "stale"})
    assert env["FLEET_ELASTIC_EXPECTED"] == "0,2" and env["FLEET_ELASTIC"] == "2:3"
    import dataclasses
    assert "FLEET_ELASTIC_EXPECTED" not in process_environment(
        dataclasses.replace(config, expected_workers=None), "server", 0, base={"FLEET_ELASTIC_EXPECTED": "1"})


def test_the_expected_workers_variable_is_a_comma_list_of_ids_or_refused_with_the_fix():
    from fleet.elastic import expected_workers
    from fleet.errors import ConfigError
    assert expected_workers({"FLEET_ELASTIC_EXPECTED": "0,2"}) == (0, 2)
    assert expected_workers({}) is None
    with pytest.raises(ConfigError) as e:
        expected_workers({"FLEET_ELASTIC_EXPECTED": "0,x"})
    assert str(e.value) == ("FLEET_ELASTIC_EXPECTED='0,x' is not a comma list of worker ids >= 0 (e.g. 0,2); "
                            "fleetrun sets it, leave it unset otherwise")
