"""Worker slots of an elastic job formed through etcd, without etcd: when the job forms,
which slots count as live, a host's slot endpoints, fleetrun's --np --elastic_server
arguments."""
from fleet.launch import build_parser
from fleet.launch.etcd_launch import rendezvous_from_args
from fleet.launch.config import LaunchConfig, process_environment
from fleet.launch.etcd_rendezvous import HostRecord, derive_plan, host_endpoints
from fleet.launch.etcd_slots import DONE, FREE, LIVE, Slot, below_min, claimable, slot_endpoints


def _rec(addr, revision, servers=1, workers=1):
    return HostRecord(addr, *host_endpoints(addr, servers, workers, 6170), "", revision)


def test_an_elastic_job_forms_with_its_servers_and_min_workers_and_takes_at_most_max():
    server_host, one_worker = _rec("10.0.0.1", 1, 1, 1), _rec("10.0.0.2", 2, 0, 1)
    plan, complete = derive_plan([server_host], 1, 4, min_workers=2)
    assert not complete  # 1 worker of at least 2
    plan, complete = derive_plan([server_host, one_worker], 1, 4, min_workers=2)
    assert complete and plan.workers == ("10.0.0.1:6171", "10.0.0.2:6170")
    big = _rec("10.0.0.3", 3, 0, 3)  # 2 + 3 > MAX 4: skipped, joins later in free slots
    plan, complete = derive_plan([server_host, one_worker, big], 1, 4, min_workers=2)
    assert complete and [m.addr for m in plan.members] == ["10.0.0.1", "10.0.0.2"]
    plan, complete = derive_plan([_rec("10.0.0.2", 2, 0, 2)], 1, 4, min_workers=2)
    assert not complete  # no server yet


def test_min_counts_live_and_pending_slots_until_a_slot_is_done():
    slots = [Slot(0, "a", LIVE, 5), Slot(1, "b", "pending"), Slot(2, "b", FREE, 7), Slot(3)]
    assert below_min(slots, 2) is None
    assert below_min(slots, 3) == 2
    assert below_min(slots + [Slot(4, "c", DONE, 9)], 3) is None  # the data is done: no minimum
    assert [s.index for s in slots if claimable(s)] == [2, 3]


def test_a_host_keeps_its_plan_slots_endpoints_and_gets_fresh_ports_for_the_others():
    me, other = _rec("10.0.0.1", 1, 1, 1), _rec("10.0.0.2", 2, 0, 1)
    plan = derive_plan([me, other], 1, 4, min_workers=2)[0]
    assert slot_endpoints(me, plan, 4, 6170) == ("10.0.0.1:6171", "10.0.0.1:6172", "10.0.0.1:6173",
                                                 "10.0.0.1:6174")
    late = _rec("10.0.0.3", 3, 0, 2)
    assert slot_endpoints(late, plan, 4, 6170) == tuple(f"10.0.0.3:{p}" for p in (6172, 6173, 6174, 6175))


def test_the_processes_of_slots_across_hosts_get_max_and_no_worker_endpoint_list(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    config = LaunchConfig(str(script), server_endpoints=("10.0.0.1:6170",),
                          worker_endpoints=tuple(f"10.0.0.3:{p}" for p in range(6172, 6176)),
                          local_servers=(), local_workers=(), host="10.0.0.3", elastic=(2, 4))
    env = process_environment(config, "worker", 2, base={})
    assert "PADDLE_TRAINER_ENDPOINTS" not in env
    assert (env["PADDLE_TRAINERS_NUM"], env["PADDLE_TRAINER_ID"], env["FLEET_ELASTIC"]) == ("4", "2", "2:4")
    assert (env["POD_IP"], env["PADDLE_PORT"]) == ("10.0.0.3", "6174")


def test_np_with_elastic_server_makes_an_elastic_rendezvous_of_max_workers(monkeypatch):
    monkeypatch.delenv("PADDLE_ELASTIC_JOB_ID", raising=False)
    args = build_parser().parse_args(["--elastic_server", "127.0.0.1:2379", "--job_id", "j", "--server_num", "1",
                                      "--np", "2:4", "--server_num_per_host", "0", "--worker_num_per_host", "2",
                                      "--host", "10.0.0.3", "--insecure", "train.py"])
    rdv = rendezvous_from_args(args)
    assert (rdv.elastic, rdv.server_num, rdv.worker_num) == ((2, 4), 1, 4)
    assert rdv.me.workers == ("10.0.0.3:6170", "10.0.0.3:6171") and rdv.me.servers == ()
