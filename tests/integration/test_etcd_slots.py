"""Worker slots of an elastic job formed through etcd (--np MIN:MAX --elastic_server), against
a real etcd on loopback: hosts (records with made-up addresses, no processes) form the job
with MIN workers, a late host takes free slots, a lost host frees its slots by itself and
is no membership change while it ran workers only, and the job falls below MIN naming
what it lost."""
import threading
import time

import pytest

from fleet.errors import RendezvousError
from fleet.launch.etcd_client import EtcdClient
from fleet.launch.etcd_rendezvous import HostRecord, Rendezvous, host_endpoints
from fleet.launch.etcd_slots import SlotRegistry, describe_slots, read_slots

pytestmark = pytest.mark.slow


def _host(i, servers, workers):
    addr = f"10.9.8.{i}"
    return HostRecord(addr, *host_endpoints(addr, servers, workers, 6170), f"node{i}")


def _rdv(etcd, job, record, np=(2, 4), ttl=5, wait_s=10):
    return Rendezvous(EtcdClient(etcd.endpoint, 2), job, record, 1, np[1], ttl, wait_s, elastic=np)


def _form(etcd, job, records, np=(2, 4)):
    """Join every record in a thread, registering in order; returns (rendezvous, plans)."""
    rdvs, plans = [_rdv(etcd, job, r, np) for r in records], {}
    threads = []
    for rdv in rdvs:
        threads.append(threading.Thread(target=lambda rdv=rdv: plans.__setitem__(rdv.me.addr, rdv.join())))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while not rdv.lease:
            assert time.monotonic() < deadline, "a host registers within 10 s"
            time.sleep(0.02)
    for t in threads:
        t.join(20)
    return rdvs, plans


def _lose(rdv):
    """The host is lost: its keepalive stops and its lease ends without a done/ record."""
    rdv.monitor.stop()
    rdv.client.revoke_lease(rdv.lease)


def _states(rdv, plan):
    return describe_slots(read_slots(rdv.client, rdv.prefix, plan, 4)[0])


def test_the_job_forms_with_min_workers_and_a_late_host_takes_free_slots(etcd):
    rdvs, plans = _form(etcd, "np-a", [_host(1, 1, 1), _host(2, 0, 1)])
    late = _rdv(etcd, "np-a", _host(3, 0, 2))
    later = _rdv(etcd, "np-a", _host(4, 0, 3))
    try:
        assert plans["10.9.8.1"] == plans["10.9.8.2"]
        plan = plans["10.9.8.1"]
        assert plan.workers == ("10.9.8.1:6171", "10.9.8.2:6170") and plan.servers == ("10.9.8.1:6170",)
        regs = [SlotRegistry(r, plan) for r in rdvs]
        assert _states(rdvs[0], plan) == ("slot 0: pending on 10.9.8.1; slot 1: pending on 10.9.8.2; "
                                          "slot 2: never taken; slot 3: never taken")
        assert [reg.take_plan_slots() for reg in regs] == [(0,), (1,)]
        assert late.join() == plan and late.late
        late_reg = SlotRegistry(late, plan)
        assert late_reg.claim(2) == [2, 3]
        assert later.join() == plan and later.late
        later_reg = SlotRegistry(later, plan)
        assert later_reg.claim(3) == []
        assert later_reg.why_none == "every one of the 4 worker slots (--np 2:4) is taken"
        assert _states(rdvs[0], plan) == ("slot 0: live on 10.9.8.1; slot 1: live on 10.9.8.2; "
                                          "slot 2: live on 10.9.8.3; slot 3: live on 10.9.8.3")
        # a worker lost on a live host frees its slot; another host takes it
        late_reg.release(3)
        assert later_reg.claim(3) == [3]
        assert all(reg.check() is None for reg in regs)
    finally:
        for r in (*rdvs, late, later):
            r.leave(0)
    assert EtcdClient(etcd.endpoint, 2).range("/fleet/jobs/np-a/", prefix=True)[0] == []


def test_a_late_host_with_a_server_is_refused_because_servers_are_fixed(etcd):
    rdvs, plans = _form(etcd, "np-b", [_host(1, 1, 1), _host(2, 0, 1)])
    try:
        with pytest.raises(RendezvousError) as e:
            _rdv(etcd, "np-b", _host(3, 1, 1)).join()
        assert str(e.value) == (
            f"job 'np-b' at etcd {etcd.endpoint} is running already with hosts 10.9.8.1, 10.9.8.2, and this "
            "host (10.9.8.3 (node3: 1 server, 1 worker)) offers 1 server: an elastic job's servers are fixed "
            "when it forms, only workers may join it; give this host --server_num_per_host 0")
    finally:
        for r in rdvs:
            r.leave(0)


def test_a_lost_host_of_workers_frees_its_slots_and_is_no_membership_change(etcd):
    rdvs, plans = _form(etcd, "np-c", [_host(1, 1, 1), _host(2, 0, 1)])
    plan = plans["10.9.8.1"]
    late = _rdv(etcd, "np-c", _host(3, 0, 2), ttl=1)
    try:
        regs = [SlotRegistry(r, plan) for r in rdvs]
        for reg in regs:
            reg.take_plan_slots()
        late.join()
        assert SlotRegistry(late, plan).claim(2) == [2, 3]
        assert regs[0].check() is None
        _lose(late)
        deadline = time.monotonic() + 10
        while "slot 3: never taken" not in _states(rdvs[0], plan):
            assert time.monotonic() < deadline, "the lost host's slots are freed within 10 s"
            time.sleep(0.1)
        assert regs[0].check() is None and rdvs[0].monitor.poll() is None  # 2 live >= MIN 2
        assert SlotRegistry(rdvs[1], plan).claim(1) == [2]  # a free slot for anyone
        assert regs[0].check() is None  # seen live on 10.9.8.2
        # a worker-only member lost: below MIN (no slot done), naming the worker and the host
        regs[1].release(2)
        assert regs[0].check() is None  # 2 live: slots 0 and 1
        _lose(rdvs[1])
        deadline = time.monotonic() + 10
        while regs[0].check() is None:
            assert time.monotonic() < deadline, "the job falls below MIN within 10 s"
            time.sleep(0.1)
        assert regs[0].poll() == (
            f"only 1 worker of job 'np-c' at etcd {etcd.endpoint} live, fewer than --np 2:4's minimum 2, and no "
            "worker has finished the data: the job fails. Lost: worker 2 (lost with host 10.9.8.3), worker 3 "
            "(lost with host 10.9.8.3), worker 2 (on host 10.9.8.2), worker 1 (lost with host 10.9.8.2); "
            "lost hosts: 10.9.8.3, 10.9.8.2")
        assert rdvs[0].monitor.poll() is None  # still no membership change: the slots decide
    finally:
        for r in (*rdvs, late):
            r.leave(0)


def test_a_done_slot_stays_ends_admission_and_lifts_the_minimum(etcd):
    rdvs, plans = _form(etcd, "np-d", [_host(1, 1, 1), _host(2, 0, 1)])
    plan = plans["10.9.8.1"]
    try:
        regs = [SlotRegistry(r, plan) for r in rdvs]
        for reg in regs:
            reg.take_plan_slots()
        regs[1].mark_done(1)
        rdvs[1].leave(0)  # its lease ends; the done slot stays
        assert _states(rdvs[0], plan).startswith("slot 0: live on 10.9.8.1; slot 1: done on 10.9.8.2")
        assert regs[0].check() is None and regs[0].data_done()
        assert regs[0].claim(1) == [] and regs[0].why_none == "the data is done: a worker of the job already exited 0"
    finally:
        rdvs[0].leave(0)


def test_a_lost_server_host_is_still_a_membership_change(etcd):
    rdvs, plans = _form(etcd, "np-e", [_host(1, 1, 1), _host(2, 0, 1)])
    try:
        _lose(rdvs[0])
        deadline = time.monotonic() + 10
        while rdvs[1].monitor.poll() is None:
            assert time.monotonic() < deadline, "the server host's loss is seen within 10 s"
            time.sleep(0.1)
        assert rdvs[1].monitor.poll().startswith("host 10.9.8.1 (server 0, worker 0) was lost from job 'np-e'")
    finally:
        rdvs[1].leave(0)


def test_every_host_of_a_job_must_give_the_same_np(etcd):
    rdvs, plans = _form(etcd, "np-f", [_host(1, 1, 1), _host(2, 0, 1)])
    plan = plans["10.9.8.1"]
    late = _rdv(etcd, "np-f", _host(3, 0, 1), np=(2, 3))
    try:
        for r in rdvs:
            SlotRegistry(r, plan).agree_np()
        assert late.join() == plan and late.late
        with pytest.raises(RendezvousError) as e:
            SlotRegistry(late, plan).agree_np()
        assert str(e.value) == (f"job 'np-f' at etcd {etcd.endpoint} runs with --np 2:4, and this host gives "
                                "--np 2:3: give every host of a job the same --np")
    finally:
        for r in (*rdvs, late):
            r.leave(0)
    assert EtcdClient(etcd.endpoint, 2).range("/fleet/jobs/np-f/", prefix=True)[0] == []
