"""The etcd rendezvous without etcd: rank derivation, the stored records, fleetrun's
--elastic_server arguments."""
import pytest

from fleet.errors import ConfigError, RendezvousError
from fleet.launch import build_parser
from fleet.launch.etcd_launch import rendezvous_from_args
from fleet.launch.etcd_client import prefix_end
from fleet.launch.etcd_rendezvous import (HostRecord, JobPlan, derive_plan, host_endpoints,
                                          plan_of)


def _rec(addr, revision, servers=1, workers=1):
    return HostRecord(addr, *host_endpoints(addr, servers, workers, 6170), "", revision)


def test_ranks_follow_the_order_of_registration_not_of_addresses():
    records = [_rec("10.0.0.3", 7, 0, 1), _rec("10.0.0.1", 9), _rec("10.0.0.2", 5)]
    plan, complete = derive_plan(records, 2, 3)
    assert complete
    assert [m.addr for m in plan.members] == ["10.0.0.2", "10.0.0.3", "10.0.0.1"]
    assert plan.servers == ("10.0.0.2:6170", "10.0.0.1:6170")
    assert plan.workers == ("10.0.0.2:6171", "10.0.0.3:6170", "10.0.0.1:6171")
    assert plan.ranks_of("10.0.0.1") == "server 1, worker 2"
    assert plan.ranks_of("10.0.0.3") == "worker 1"
    assert plan.ranks_of("10.0.0.9") == ""


def test_every_order_of_the_same_records_gives_the_same_plan():
    records = [_rec(f"10.0.0.{i}", 10 - i, 1, 2) for i in range(1, 5)]
    plans = {derive_plan(order, 4, 8)[0] for order in (records, records[::-1], records[1:] + records[:1])}
    assert len(plans) == 1


def test_a_host_that_does_not_fit_is_skipped_and_later_ones_complete_the_job():
    records = [_rec("a", 1, 1, 2), _rec("b", 2, 0, 2), _rec("c", 3, 1, 1)]
    plan, complete = derive_plan(records, 2, 3)
    assert complete and [m.addr for m in plan.members] == ["a", "c"]


def test_too_few_hosts_are_not_complete():
    plan, complete = derive_plan([_rec("a", 1)], 2, 3)
    assert not complete and plan.servers == ("a:6170",) and plan.workers == ("a:6171",)
    assert derive_plan([], 1, 1) == (plan_of([]), False)


def test_a_collective_job_has_workers_only():
    plan, complete = derive_plan([_rec("a", 1, 0, 2), _rec("b", 2, 0, 2)], 0, 4)
    assert complete and plan.servers == () and plan.workers == ("a:6170", "a:6171", "b:6170", "b:6171")


def test_plans_and_records_read_back_as_written():
    plan, _ = derive_plan([_rec("10.0.0.1", 4, 2, 1), _rec("10.0.0.2", 6, 0, 3)], 2, 4)
    assert JobPlan.from_json(plan.to_json()) == plan
    record = HostRecord("fe80::1", ("[fe80::1]:6170",), (), "node1")
    assert HostRecord.from_json(record.to_json(), 3) == HostRecord("fe80::1", ("[fe80::1]:6170",), (),
                                                                   "node1", 3)


def test_keys_that_are_not_fleets_are_refused_with_the_fix():
    with pytest.raises(RendezvousError) as e:
        HostRecord.from_json("hello")
    assert str(e.value) == ("a host record 'hello' of this job in etcd is not fleet's: use a "
                            "--job_id of its own for each job")
    with pytest.raises(RendezvousError, match="the job's plan '{}' in etcd is not fleet's"):
        JobPlan.from_json("{}")


def test_a_hosts_endpoints_are_servers_then_workers_from_the_start_port():
    assert host_endpoints("10.0.0.1", 2, 1, 7000) == (("10.0.0.1:7000", "10.0.0.1:7001"),
                                                      ("10.0.0.1:7002",))
    assert host_endpoints("::1", 0, 1, 6170) == ((), ("[::1]:6170",))


def test_a_prefix_range_ends_after_the_last_key_starting_with_it():
    assert prefix_end("/fleet/jobs/a/") == "/fleet/jobs/a0"
    assert prefix_end("") == "\0"


def _args(*argv):
    return build_parser().parse_args([*argv, "train.py"])


@pytest.mark.parametrize("argv, message", [
    (["--elastic_server", "e:2379"],
     "--elastic_server e:2379 needs --job_id ID (or PADDLE_ELASTIC_JOB_ID): the name under "
     "which this job's hosts meet in etcd"),
    (["--elastic_server", "e:2379", "--job_id", "j"],
     "--elastic_server needs the job's totals, the same on every host: --server_num N "
     "--worker_num M (the job forms when its hosts offer that many)"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--servers", "a:1", "--worker_num", "1"],
     "--servers/--workers with --elastic_server: etcd hands out the endpoints; give the job's "
     "totals (--server_num N --worker_num M) and this host's share (--server_num_per_host, "
     "--worker_num_per_host)"),
    (["--elastic_server", "e:2379", "--job_id", "a/b", "--server_num", "1", "--worker_num", "1"],
     "--job_id 'a/b' contains '/'; give a name without it"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--server_num", "1", "--worker_num", "2",
      "--worker_num_per_host", "3"],
     "--worker_num_per_host 3 must be in 0..2 (the job's total)"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--server_num", "1", "--worker_num", "2",
      "--server_num_per_host", "0", "--worker_num_per_host", "0"],
     "--server_num_per_host 0 and --worker_num_per_host 0: this host would run nothing; give "
     "it at least one server or worker"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--server_num", "1", "--worker_num", "2",
      "--np", "1:2"],
     "--worker_num 2 with --np 1:2 and --elastic_server: the job forms with 1..2 workers, as its "
     "hosts offer them (--worker_num_per_host); leave out --worker_num"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--server_num", "1", "--worker_num", "2",
      "--worker_replacements", "1"],
     "--worker_replacements 1 is for elastic jobs: give --np MIN:MAX"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--server_num", "1", "--np", "2:3",
      "--worker_num_per_host", "4"],
     "--worker_num_per_host 4 must be in 0..3 (the job's total)"),
    (["--elastic_server", "e:2379", "--job_id", "j", "--server_num", "1", "--np", "3:2"],
     "--np='3:2' is not MIN:MAX with 1 <= MIN <= MAX"),
    (["--elastic_server", "e", "--job_id", "j", "--server_num", "1", "--worker_num", "1"],
     "--elastic_server 'e' is not host:port"),
])
def test_elastic_arguments_that_cannot_work_are_refused_with_the_fix(argv, message, monkeypatch):
    monkeypatch.delenv("PADDLE_ELASTIC_JOB_ID", raising=False)
    with pytest.raises(ConfigError) as e:
        rendezvous_from_args(_args(*argv, "--host", "10.0.0.1", "--insecure"))
    assert str(e.value).startswith(message)


def test_a_host_that_cannot_hold_the_whole_job_needs_keys_or_insecure(monkeypatch):
    monkeypatch.delenv("FLEET_CURVE_KEYS_DIR", raising=False)
    with pytest.raises(ConfigError, match="this job spans several hosts, and fleetrun encrypts"):
        rendezvous_from_args(_args("--elastic_server", "e:2379", "--job_id", "j", "--server_num", "2",
                                   "--worker_num", "2", "--host", "10.0.0.1"))


def test_the_environment_names_etcd_and_the_job_as_paddle_does(monkeypatch):
    monkeypatch.setenv("PADDLE_ELASTIC_JOB_ID", "ctr7")
    monkeypatch.setenv("PADDLE_ELASTIC_TTL", "4")
    rdv = rendezvous_from_args(_args("--elastic_server", "10.0.0.9:2379", "--server_num", "2",
                                     "--worker_num", "3", "--server_num_per_host", "0",
                                     "--host", "10.0.0.1", "--insecure", "--start_port", "7000"))
    assert (rdv.job_id, rdv.ttl, rdv.server_num, rdv.worker_num) == ("ctr7", 4, 2, 3)
    assert rdv.where == "job 'ctr7' at etcd 10.0.0.9:2379"
    assert rdv.me.servers == () and rdv.me.workers == ("10.0.0.1:7000",)
    assert rdv.host_source == "--host"


def test_max_restarts_with_np_and_etcd_is_accepted_and_the_job_is_elastic(monkeypatch):
    monkeypatch.delenv("PADDLE_ELASTIC_JOB_ID", raising=False)
    rdv = rendezvous_from_args(_args("--elastic_server", "10.0.0.9:2379", "--job_id", "j", "--server_num", "1",
                                     "--np", "2:4", "--max_restarts", "1", "--worker_num_per_host", "2",
                                     "--host", "10.0.0.1", "--insecure", "--start_port", "7000"))
    assert (rdv.elastic, rdv.server_num, rdv.worker_num) == ((2, 4), 1, 4)
    assert rdv.me.servers == ("10.0.0.1:7000",) and rdv.me.workers == ("10.0.0.1:7001", "10.0.0.1:7002")
