"""The etcd client and the rendezvous against a real etcd on loopback (Debian's etcd-server).

The client: keys, transactions, leases, watches, a call that gets no answer, etcd gone.
The rendezvous: hosts (records with made-up addresses, no processes) register in threads
and all read the same plan; a late host is refused; a member whose lease ends without
saying it is done is a membership change; a host that ends normally is not.
"""
import socket
import threading
import time

import pytest

from fleet.errors import RendezvousError
from fleet.launch.etcd_client import EtcdClient
from fleet.launch.etcd_rendezvous import HostRecord, Rendezvous, host_endpoints
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.slow


def test_keys_are_put_read_by_prefix_created_once_and_deleted(etcd):
    client = EtcdClient(etcd.endpoint, timeout=2)
    first = client.put("/t/a", "1")
    second = client.put("/t/b", "2")
    client.put("/u/c", "3")
    kvs, revision = client.range("/t/", prefix=True)
    assert [(kv.key, kv.value, kv.create_revision) for kv in kvs] == [("/t/a", "1", first),
                                                                     ("/t/b", "2", second)]
    assert revision == second + 1
    assert client.range("/t/a")[0][0].value == "1"
    created, kv = client.put_if_absent("/t/f", "plan A")
    assert created and kv.value == "plan A"
    created, kv = client.put_if_absent("/t/f", "plan B")
    assert not created and kv.value == "plan A"
    assert client.delete("/t/", prefix=True) == 3
    assert client.range("/t/", prefix=True)[0] == []
    assert client.range("/u/c")[0][0].value == "3"


def test_a_lease_keeps_its_key_while_renewed_and_its_end_deletes_it(etcd):
    client = EtcdClient(etcd.endpoint, timeout=2)
    lease = client.grant_lease(5)
    client.put("/l/kept", "x", lease=lease)
    assert client.keepalive(lease) == 5
    assert client.range("/l/kept")[0][0].lease == lease
    client.revoke_lease(lease)
    assert client.range("/l/kept")[0] == []
    assert client.keepalive(lease) == 0  # gone: renewing says so instead of failing
    short = client.grant_lease(1)
    client.put("/l/short", "y", lease=short)
    wait_for(lambda: not client.range("/l/short")[0], 10, "a 1 s lease without keepalive expires")


def test_a_watch_sees_puts_and_deletes_in_order_from_a_revision(etcd):
    client = EtcdClient(etcd.endpoint, timeout=2)
    start = client.put("/w/a", "1")
    client.put("/w/b", "2")
    client.delete("/w/a")
    client.put("/x/other", "3")
    watch = client.watch("/w/", prefix=True, start_revision=start)
    seen = []
    for batch, _ in watch.events():
        seen += [(e.kind, e.kv.key, e.kv.value) for e in batch]
        if len(seen) >= 3:
            break
    assert seen == [("PUT", "/w/a", "1"), ("PUT", "/w/b", "2"), ("DELETE", "/w/a", "")]
    closer = threading.Timer(0.3, watch.close)
    closer.start()
    assert list(watch.events()) == []  # close() from another thread ends a blocked read
    closer.join()


def test_etcd_gone_is_an_error_naming_its_endpoint_and_the_fix(etcd):
    client = EtcdClient(etcd.endpoint, timeout=2)
    watch = client.watch("/g/", prefix=True)
    etcd.kill()
    with pytest.raises(RendezvousError) as e:
        client.range("/g/")
    assert str(e.value) == (
        f"etcd at {etcd.endpoint} did not answer a read of '/g/' (connection refused): check "
        "that etcd runs there and that --elastic_server (or PADDLE_ELASTIC_SERVER) names its "
        "client address (etcd --listen-client-urls), reachable from this host")
    with pytest.raises(RendezvousError, match=f"etcd at {etcd.endpoint} "):
        list(watch.events())


def test_a_call_that_gets_no_answer_ends_at_its_timeout(free_port):
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(RendezvousError) as e:
            EtcdClient(endpoint, timeout=0.5).grant_lease(5)
    assert str(e.value).startswith(f"etcd at {endpoint} did not answer a lease of 5 s (no "
                                   "answer within 0.5 s): check that etcd runs there")


def _host(i, servers=1, workers=1):
    addr = f"10.9.9.{i}"
    return HostRecord(addr, *host_endpoints(addr, servers, workers, 6170), f"node{i}")


def _join_all(etcd, job, records, server_num, worker_num, ttl=5, wait_s=20):
    """Rendezvous of each record in a thread, registering in the given order."""
    rdvs = [Rendezvous(EtcdClient(etcd.endpoint, 2), job, r, server_num, worker_num, ttl, wait_s)
            for r in records]
    plans, errors, threads = {}, {}, []
    for i, rdv in enumerate(rdvs):
        def run(rdv=rdv):
            try:
                plans[rdv.me.addr] = rdv.join()
            except RendezvousError as e:
                errors[rdv.me.addr] = str(e)
        threads.append(threading.Thread(target=run))
        threads[-1].start()
        # registration order = rank order: let each register before the next starts
        wait_for(lambda: rdv.lease or rdv.me.addr in errors, 10, f"host {i} registers")
        time.sleep(0.05)
    for t in threads:
        t.join(30)
    return rdvs, plans, errors


def test_hosts_that_register_in_turn_all_read_the_same_ranks(etcd):
    records = [_host(1), _host(2), _host(3, servers=0)]
    rdvs, plans, errors = _join_all(etcd, "job-a", records, 2, 3)
    try:
        assert errors == {}
        assert len({p for p in plans.values()}) == 1
        plan = plans["10.9.9.1"]
        assert plan.servers == ("10.9.9.1:6170", "10.9.9.2:6170")
        assert plan.workers == ("10.9.9.1:6171", "10.9.9.2:6171", "10.9.9.3:6170")
        assert [plan.ranks_of(f"10.9.9.{i}") for i in (1, 2, 3)] == [
            "server 0, worker 0", "server 1, worker 1", "worker 2"]
        late = Rendezvous(EtcdClient(etcd.endpoint, 2), "job-a", _host(4), 2, 3, 5, 5)
        with pytest.raises(RendezvousError) as e:
            late.join()
        assert str(e.value) == (
            f"job 'job-a' at etcd {etcd.endpoint} is running already with hosts 10.9.9.1, "
            "10.9.9.2, 10.9.9.3 (2 servers, 3 workers), and this host (10.9.9.4 (node4: 1 server, "
            "1 worker)) cannot join a running job (only workers may join an elastic one, formed with --np MIN:MAX: "
            "docs/elastic.md); give a new job another --job_id, or wait until this one ends")
        assert all(r.monitor.poll() is None for r in rdvs)  # the refused host changed nothing
        # host 3 finishes normally: no change; host 2's lease ends unannounced: a change
        rdvs[2].leave(0)
        rdvs[1].monitor.stop()
        rdvs[1].client.revoke_lease(rdvs[1].lease)
        wait_for(lambda: rdvs[0].monitor.poll() is not None, 10, "host 1 sees host 2 lost")
        assert rdvs[0].monitor.poll() == (
            f"host 10.9.9.2 (server 1, worker 1) was lost from job 'job-a' at etcd "
            f"{etcd.endpoint}: its registration expired (no keepalive for 5 s: the host is "
            "down, cut off, or its fleetrun was killed); only --max_restarts re-forms the job "
            "without it")
    finally:
        for r in rdvs:
            r.leave(1)
    client = EtcdClient(etcd.endpoint, 2)
    assert client.range("/fleet/jobs/job-a/", prefix=True)[0] == []  # the last host cleaned up


def test_a_job_that_does_not_gather_names_what_it_has_and_what_it_lacks(etcd):
    rdv = Rendezvous(EtcdClient(etcd.endpoint, 2), "job-b", _host(1), 2, 3, ttl=5, wait_s=1)
    with pytest.raises(RendezvousError) as e:
        rdv.join()
    assert str(e.value) == (
        f"job 'job-b' at etcd {etcd.endpoint} did not form within 1 s (PADDLE_ELASTIC_TIMEOUT): "
        "hosts so far: 10.9.9.1 (node1: 1 server, 1 worker); waiting for 1 server and 2 workers "
        "more (of 2 servers and 3 workers). Start fleetrun on the missing hosts, or check that every "
        "host gives the same --job_id, --server_num and --worker_num")
    assert EtcdClient(etcd.endpoint, 2).range("/fleet/jobs/job-b/hosts/", prefix=True)[0] == []


def test_a_host_that_does_not_fit_is_refused_and_the_others_form_the_job(etcd):
    records = [_host(1, 1, 2), _host(2, 0, 2), _host(3, 1, 1)]  # 2 + 2 workers > 3
    rdvs, plans, errors = _join_all(etcd, "job-c", records, 2, 3)
    try:
        assert "10.9.9.3" in plans and "10.9.9.1" in plans
        assert list(errors) == ["10.9.9.2"]
        assert errors["10.9.9.2"].startswith(
            f"job 'job-c' at etcd {etcd.endpoint} formed without this host (10.9.9.2 (node2: "
            "0 servers, 2 workers)): it has its 2 servers and 3 workers from 10.9.9.1 (node1: 1 "
            "server, 2 workers), 10.9.9.3 (node3: 1 server, 1 worker). Give a new job another --job_id")
    finally:
        for r in rdvs:
            r.leave(0)


def test_etcd_going_away_is_noticed_and_no_membership_change(etcd):
    records = [_host(1), _host(2, 0, 1)]
    rdvs, plans, errors = _join_all(etcd, "job-d", records, 1, 2, ttl=1)
    try:
        assert errors == {}
        etcd.kill()
        wait_for(lambda: rdvs[0].monitor.etcd_down() is not None, 10, "etcd's loss is noticed")
        seconds, error = rdvs[0].monitor.etcd_down()
        assert error.startswith(f"etcd at {etcd.endpoint} did not answer a keepalive of lease")
        assert rdvs[0].monitor.poll() is None  # etcd gone is not a change of membership
    finally:
        for r in rdvs:
            r.leave(0)  # says it could not tell etcd; returns


class _ChangeAfter:
    """A membership monitor that reports a change on its n-th poll."""

    def __init__(self, n, change):
        self.polls, self.n, self.change = 0, n, change

    def poll(self):
        self.polls += 1
        return self.change if self.polls >= self.n else None


def test_a_membership_change_stops_the_job_and_fleetrun_exits_1_naming_it(tmp_path, capsys):
    from fleet.launch.config import LaunchConfig
    from fleet.launch.local import launch
    script = tmp_path / "train.py"
    script.write_text("import time\nprint('training', flush=True)\ntime.sleep(60)\n")
    change = "host 10.9.9.2 (server 1, worker 1) was lost from job 'j' at etcd 10.9.9.1:2379"
    config = LaunchConfig(str(script), log_dir=str(tmp_path / "log"), kill_timeout=5)
    assert launch(config, monitor=_ChangeAfter(10, change)) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"fleetrun: membership change: {change}" in err
    assert f"fleetrun: exit 1: membership change: {change}" in err
    assert any("stopped by fleetrun (SIGTERM) after a membership change of the job" in line
               for line in err), err


def test_a_job_id_left_by_a_failed_run_is_cleared_by_the_next_run(etcd):
    client = EtcdClient(etcd.endpoint, 2)
    old = Rendezvous(client, "job-e", _host(7), 1, 1, 5, 5)
    old.join()
    old.monitor.stop()
    client.revoke_lease(old.lease)  # its hosts are gone; its plan stays behind
    assert [kv.key for kv in client.range("/fleet/jobs/job-e/", prefix=True)[0]] == [
        "/fleet/jobs/job-e/formed"]
    new = Rendezvous(client, "job-e", _host(8), 1, 1, 5, 5)
    try:
        assert new.join().ranks_of("10.9.9.8") == "server 0, worker 0"
    finally:
        new.leave(0)
    assert client.range("/fleet/jobs/job-e/", prefix=True)[0] == []


def test_a_second_fleetrun_on_the_same_address_is_refused(etcd):
    client = EtcdClient(etcd.endpoint, 2)
    first = Rendezvous(client, "job-f", _host(1), 2, 2, 5, 2)
    waiter = threading.Thread(target=lambda: pytest.raises(RendezvousError, first.join))
    waiter.start()
    wait_for(lambda: first.lease, 10, "the first registers")
    time.sleep(0.1)
    try:
        with pytest.raises(RendezvousError) as e:
            Rendezvous(client, "job-f", _host(1), 2, 2, 5, 10).join()
        assert str(e.value) == (
            f"host 10.9.9.1 is registered in job 'job-f' at etcd {etcd.endpoint} already (10.9.9.1 "
            "(node1: 1 server, 1 worker)): one fleetrun per host and job; stop the other, or give "
            "this one --host with another address")
    finally:
        waiter.join(30)  # the first gives up after its 2 s wait


RESTART_SCRIPT = """\
import os, sys, time
import fleet
fleet.CheckpointConfig(sys.argv[1], step_interval=10)
attempt = int(os.environ["FLEET_RESTART_COUNT"])
print("attempt", attempt, os.environ.get("TRAINING_ROLE"), os.environ.get("PADDLE_TRAINER_ID"),
      os.environ["PADDLE_PSERVERS_IP_PORT_LIST"], flush=True)
if os.environ.get("PADDLE_TRAINER_ID") == "1" and attempt == 0:
    time.sleep(0.3)
    raise RuntimeError("lost the data at attempt 0")
time.sleep(1 if attempt else 30)
"""


def test_a_restart_under_etcd_reuses_the_formed_plan(etcd, fleetrun, tmp_path):
    """--max_restarts with --elastic_server: the job forms once in etcd; the restarted
    processes get the same ranks and endpoints, and the last host leaves nothing in etcd."""
    (tmp_path / "job.py").write_text(RESTART_SCRIPT)
    r = fleetrun("--elastic_server", etcd.endpoint, "--job_id", "j-restart", "--server_num", 1, "--worker_num", 2,
                 "--server_num_per_host", 1, "--worker_num_per_host", 2, "--host", "127.0.0.1",
                 "--max_restarts", 1, "--failure_grace", 0, "--log_dir", "log", "job.py", tmp_path / "ckpt",
                 timeout=90)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("job 'j-restart' at etcd") == 2  # registering, formed: once each
    assert "fleetrun: restart 1 of 1 (--max_restarts 1): worker 1 (pid " in r.stderr
    first = (tmp_path / "log" / "attempt-0" / "workerlog.0").read_text().split()
    again = (tmp_path / "log" / "workerlog.0").read_text().split()
    assert first[:5] == ["attempt", "0", "TRAINER", "0", first[4]] and again[:5] == ["attempt", "1", "TRAINER", "0",
                                                                                   first[4]]
    assert EtcdClient(etcd.endpoint, 2).range("/fleet/jobs/j-restart/", prefix=True)[0] == []
