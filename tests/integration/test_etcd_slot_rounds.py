"""Rounds of an elastic etcd job (--np 2:3 --max_restarts) against a real etcd on loopback:
hosts 127.0.0.1-3 (records and slots, no processes) form the job, h2 (server 0 and slot 1)
is lost, and h1 and h3 re-form: server 0 moves to h1, each host takes back its own slot id,
the lost host's slot is free for a host that joins later, and no slot freed while the
hosts restarted apart counts against MIN."""
import threading
import time
import types

import pytest

from fleet.errors import RendezvousError
from fleet.launch.etcd_client import EtcdClient
from fleet.launch.etcd_rendezvous import HostRecord, Rendezvous, host_endpoints
from fleet.launch.etcd_slot_rounds import SlotRegroup, join_newest_round
from fleet.launch.etcd_slots import SlotRegistry, describe_slots, read_slots, slot_endpoints
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.slow

SHARES = {1: (0, 1), 2: (1, 1), 3: (0, 1)}  # the cluster test's layout
NO_SIGNAL = types.SimpleNamespace(received=0)


def _rdv(etcd, job, i, servers, workers):
    addr = f"127.0.0.{i}"
    me = HostRecord(addr, *host_endpoints(addr, servers, workers, 16170), f"node{i}")
    return Rendezvous(EtcdClient(etcd.endpoint, 2), job, me, 1, 3, ttl=2, wait_s=10, elastic=(2, 3))


def _form(etcd, job):
    rdvs = [_rdv(etcd, job, i, s, w) for i, (s, w) in SHARES.items()]
    threads = [threading.Thread(target=r.join) for r in rdvs]
    for t, r in zip(threads, rdvs):
        t.start()
        wait_for(lambda: r.lease, 10, "the host registers")  # registration order = rank order
    for t in threads:
        t.join(30)
    assert all(r.monitor is not None for r in rdvs)
    return rdvs


def _regroup(rdv):
    """A host as fleetrun runs it: its plan slots taken, its slot reader started."""
    plan = rdv.monitor.plan
    registry = SlotRegistry(rdv, plan)
    if rdv.late:  # the job formed with MIN workers before this host registered
        registry.join_slots = tuple(registry.claim(len(rdv.me.workers)))
    else:
        registry.take_plan_slots()
    registry.start()
    endpoints = slot_endpoints(rdv.me, plan, 3, 16170)

    def config_for(p, slots, every_slot):
        return types.SimpleNamespace(server_endpoints=p.servers, worker_endpoints=endpoints, slots=slots)
    return SlotRegroup(rdv, plan, config_for, registry, len(rdv.me.workers))


def test_a_lost_server_host_re_forms_the_job_with_the_server_moved_and_the_slots_re_made(etcd, capsys):
    h1, h2, h3 = _form(etcd, "np-round")
    late = None
    regroups = [_regroup(r) for r in (h1, h2, h3)]
    try:
        plan = h1.monitor.plan
        assert plan.servers == ("127.0.0.2:16170",) and regroups[0].assigned == {0: "127.0.0.1", 1: "127.0.0.2"}
        assert h3.late and regroups[2].my_slots() == (2,)  # it joined the job formed with MIN 2 workers
        # h3's worker died with the server before the loss was seen: its slot is freed
        regroups[2].registry.release(2)
        regroups[1].registry.stop()
        h2.monitor.stop()
        h2.client.revoke_lease(h2.lease)  # h2 is lost
        lost_at = time.monotonic()
        wait_for(lambda: regroups[0].monitor.poll() and regroups[2].monitor.poll(), 10, "both survivors see it")
        assert regroups[0].monitor.lost_hosts() == ["127.0.0.2"]
        results = {}

        def run(g, delay):
            time.sleep(delay)  # the hosts restart apart
            try:
                results[g.rdv.me.addr] = g.next_round(NO_SIGNAL)
            except RendezvousError as e:
                results[g.rdv.me.addr] = str(e)
        threads = [threading.Thread(target=run, args=(g, d)) for g, d in ((regroups[0], 0.0), (regroups[2], 1.5))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        print(f"lost -> round 1 formed on both: {time.monotonic() - lost_at:.2f} s")
        assert results == {"127.0.0.1": True, "127.0.0.3": True}
        g1, g3 = regroups[0], regroups[2]
        assert g1.plan == g3.plan and g1.assigned == g3.assigned == {0: "127.0.0.1", 2: "127.0.0.3"}
        assert g1.plan.servers[0].startswith("127.0.0.1:") and int(g1.plan.servers[0].rsplit(":", 1)[1]) > 16172
        assert g1.config.server_endpoints == g1.plan.servers and g1.config.slots == (0,) and g3.config.slots == (2,)
        err = capsys.readouterr().err
        assert "fleetrun: round 1: server 0 moves from 127.0.0.2 to 127.0.0.1" in err
        assert (f"round 1 of job 'np-round' at etcd {etcd.endpoint} formed in " in err
                and " s: 127.0.0.1: server 0, slot 0; 127.0.0.3: slot 2\n" in err), err
        slots, _ = read_slots(h1.client, h1.prefix, g1.plan, 3, g1.assigned)
        assert describe_slots(slots) == "slot 0: live on 127.0.0.1; slot 1: never taken; slot 2: live on 127.0.0.3"
        # the freed slot 2 and the lost slot 1 never counted against MIN 2 in round 1
        assert g1.registry.check() is None and g3.registry.check() is None
        assert g1.monitor.poll() is None
        # a host of workers only that joins now takes the lost host's id
        # a host of workers only that joins now follows round 1 (server 0 on h1) and takes the lost host's id
        late = _rdv(etcd, "np-round", 4, 0, 1)
        formed = late.join()
        assert late.late and formed.servers == ("127.0.0.2:16170",)  # the plan the job formed with
        r, newest, assigned = join_newest_round(late, formed)
        assert (r, newest.servers, assigned) == (1, g1.plan.servers, g1.assigned)
        assert late.monitor.plan == newest
        joined = SlotRegistry(late, newest, assigned, round=r)
        assert joined.claim(1) == [1] and joined.check() is None  # round 1's ready keys are no new round
    finally:
        for g in regroups:
            g.registry.stop()
        for r in (h1, h3, late):
            if r is not None:
                r.leave(0)
        h2.leave(1)
    assert EtcdClient(etcd.endpoint, 2).range("/fleet/jobs/np-round/", prefix=True)[0] == []


def test_a_failed_server_on_a_live_host_is_seen_by_the_others_as_a_round_begun(etcd):
    h1, h2, h3 = _form(etcd, "np-begun")
    regroups = [_regroup(r) for r in (h1, h2, h3)]
    try:
        results = {}
        t = threading.Thread(target=lambda: results.setdefault("h2", regroups[1].next_round(NO_SIGNAL)))
        t.start()  # h2's server failed: it stops and gets ready for round 1
        wait_for(lambda: regroups[0].monitor.poll() and regroups[2].monitor.poll(), 10, "h1 and h3 see the round")
        assert regroups[0].monitor.poll() == (
            f"host 127.0.0.2 began round 1 of job 'np-begun' at etcd {etcd.endpoint} (it stopped its processes "
            "after a failure): this host stops its processes and joins the round (--max_restarts)")
        others = [threading.Thread(target=lambda g=g: results.setdefault(g.rdv.me.addr, g.next_round(NO_SIGNAL)))
                  for g in (regroups[0], regroups[2])]
        for other in others:
            other.start()
        for thread in (t, *others):
            thread.join(30)
        assert results == {"h2": True, "127.0.0.1": True, "127.0.0.3": True}
        assert [g.assigned for g in regroups] == [{0: "127.0.0.1", 1: "127.0.0.2", 2: "127.0.0.3"}] * 3
        assert [m.addr for m in regroups[0].plan.members] == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        assert regroups[1].plan.servers == ("127.0.0.2:16170",)  # nobody lost: nothing moves
    finally:
        for g in regroups:
            g.registry.stop()
        for r in (h1, h2, h3):
            r.leave(0)
