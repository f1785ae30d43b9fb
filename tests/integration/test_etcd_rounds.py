"""Rounds of an etcd job against a real etcd on loopback: hosts (records on 127.0.0.1-3, no
processes) form a job, one host's lease ends, and the survivors re-form without it; a
survivor that never gets ready is named; the last host out removes the rounds' keys."""
import threading
import types

import pytest

from fleet.errors import RendezvousError
from fleet.launch.etcd_client import EtcdClient
from fleet.launch.etcd_rendezvous import HostRecord, Rendezvous, host_endpoints
from fleet.launch.etcd_rounds import Regroup
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.slow

SHARES = {1: (1, 1), 2: (1, 1), 3: (0, 1)}  # the cluster tests' layout
NO_SIGNAL = types.SimpleNamespace(received=0)


def _form(etcd, job, wait_s=10):
    """Hosts 127.0.0.1..3 join in turn (ports from 16170); returns their Rendezvous."""
    rdvs = []
    for i, (s, w) in SHARES.items():
        addr = f"127.0.0.{i}"
        me = HostRecord(addr, *host_endpoints(addr, s, w, 16170), f"node{i}")
        rdvs.append(Rendezvous(EtcdClient(etcd.endpoint, 2), job, me, 2, 3, ttl=2, wait_s=wait_s))
    threads = [threading.Thread(target=r.join) for r in rdvs]
    for t, r in zip(threads, rdvs):
        t.start()
        wait_for(lambda: r.lease, 10, "the host registers")  # registration order = rank order
    for t in threads:
        t.join(30)
    assert all(r.monitor is not None for r in rdvs)
    return rdvs


def _lose(rdv):
    """The host's fleetrun is gone without a word: its lease ends."""
    rdv.monitor.stop()
    rdv.client.revoke_lease(rdv.lease)


def _next_rounds(regroups):
    results = {}

    def run(g):
        try:
            results[g.rdv.me.addr] = g.next_round(NO_SIGNAL)
        except RendezvousError as e:
            results[g.rdv.me.addr] = str(e)
    threads = [threading.Thread(target=run, args=(g,)) for g in regroups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.parametrize("how", ["lease expired", "fleetrun exited 1"])
def test_the_survivors_re_form_without_the_lost_host_and_its_ranks_move_by_reassign(etcd, capsys, how):
    h1, h2, h3 = _form(etcd, "round-a")
    try:
        regroups = [Regroup(r, r.monitor.plan, lambda plan: plan) for r in (h1, h3)]
        if how == "lease expired":
            _lose(h2)
        else:
            h2.leave(1)  # its done/ record says it failed; its lease is revoked
        wait_for(lambda: h1.monitor.poll() and h3.monitor.poll(), 10, "both survivors see the loss")
        assert h1.monitor.lost_hosts() == ["127.0.0.2"] and not h1.monitor.cut_off()
        assert h1.monitor.why_lost("127.0.0.2") == (
            "its registration expired (no keepalive for 2 s)" if how == "lease expired"
            else "its fleetrun exited 1")
        results = _next_rounds(regroups)
        assert results == {"127.0.0.1": True, "127.0.0.3": True}
        plan = regroups[0].plan
        assert regroups[1].plan == plan and regroups[0].config == plan  # one plan, read by both
        assert [m.addr for m in plan.members] == ["127.0.0.1", "127.0.0.3"]
        # the survivors keep their endpoints; the moved ranks take 127.0.0.1's next free ports
        assert plan.servers[0] == "127.0.0.1:16170" and plan.servers[1].startswith("127.0.0.1:")
        assert plan.workers[0] == "127.0.0.1:16171" and plan.workers[2] == "127.0.0.3:16170"
        moved = sorted(int(e.rsplit(":", 1)[1]) for e in (plan.servers[1], plan.workers[1]))
        assert moved[0] > 16171 and moved[1] > moved[0]
        assert plan.ranks_of("127.0.0.1") == "server 0, server 1, worker 0, worker 1"
        err = capsys.readouterr().err
        assert "fleetrun: round 1: server 1 moves from 127.0.0.2 to 127.0.0.1" in err
        assert "fleetrun: round 1: worker 1 moves from 127.0.0.2 to 127.0.0.1" in err
        # the new round is watched: host 3 leaving with a failure is the next change
        assert h1.monitor.plan == plan and h1.monitor.poll() is None
        h3.leave(1)
        wait_for(lambda: h1.monitor.poll(), 10, "host 1 sees host 3 leave")
        assert h1.monitor.poll() == (f"host 127.0.0.3 (worker 2) left job 'round-a' at etcd "
                                     f"{etcd.endpoint}: its fleetrun exited 1")
    finally:
        for r in (h1, h2, h3):
            r.leave(0)
    assert EtcdClient(etcd.endpoint, 2).range("/fleet/jobs/round-a/", prefix=True)[0] == []


def test_a_survivor_that_does_not_get_ready_is_named_when_the_round_times_out(etcd):
    h1, h2, h3 = _form(etcd, "round-b", wait_s=2)
    try:
        regroup = Regroup(h1, h1.monitor.plan, lambda plan: plan)
        _lose(h2)
        wait_for(lambda: h1.monitor.poll(), 10, "host 1 sees the loss")
        results = _next_rounds([regroup])  # host 3 never stops its processes
        assert results == {"127.0.0.1": (
            f"round 1 of job 'round-b' at etcd {etcd.endpoint} did not form within 2 s "
            "(PADDLE_ELASTIC_TIMEOUT): 1 surviving host did not get ready: 127.0.0.3 "
            "(registered, but their fleetrun did not stop its processes and come back); "
            "check their fleetrun's stderr")}
    finally:
        for r in (h1, h2, h3):
            r.leave(1)
