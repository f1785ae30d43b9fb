"""Rendezvous through etcd: hosts of a job find each other without a static list.

``fleetrun --elastic_server HOST:PORT --job_id ID`` on each host registers the host under
the job (a key with a lease that fleetrun keeps alive), waits until the job's servers and
workers are all offered, and takes its ranks from a plan every host reads alike. In etcd,
under ``/fleet/jobs/ID/``:

    hosts/ADDR  one per host, attached to its lease: {"addr", "servers", "workers",
                "hostname"}; its create revision orders the hosts
    formed      the plan, written once (a transaction) by the first host that sees the
                job complete: the member hosts in registration order
    done/ADDR   written by a host whose fleetrun ended: its exit code
    rounds/R/   the plans of later rounds (--max_restarts: fleet.launch.etcd_rounds)

Ranks: the hosts in order of registration (etcd's create revision of their key), each
bringing its servers and workers in turn; server i and worker j of the job are the i-th
and j-th in that order. Hosts are taken while their sum fits the job's totals; the job
forms when it matches them exactly (an elastic job, ``--np MIN:MAX``: the servers and at
least MIN workers). A host that registered too late to fit, or arrives after the job
formed, is refused, except a host of workers only joining an elastic job: it takes free
worker slots (``fleet.launch.etcd_slots``).

While the job runs, each host renews its lease every TTL/3 s and watches the job's keys:
a member whose key disappears without its done/ record (lease expired: host lost or
fleetrun killed) or whose done/ record says it failed is a membership change, which ends
the job naming the host. Nothing in the training processes talks to etcd: if etcd becomes
unreachable, training goes on; a membership change then ends the job through the
processes' own heartbeats, and fleetrun adds that etcd was unreachable, naming it.

Thread-safety: a :class:`Rendezvous` is driven by one thread; its
:class:`MembershipMonitor`'s ``poll`` may be called from any thread.
"""
from __future__ import annotations

import dataclasses
import json
import socket
import time

from fleet.endpoints import join_endpoint, parse_endpoint
from fleet.envvars import env_int
from fleet.errors import RendezvousError
from fleet.launch.etcd_client import EtcdClient
from fleet.launch.etcd_membership import TTL_ENV, KeepAlive, MembershipMonitor
from fleet.launch.report import SAY_LOGGER, plural, say
from fleet.logs import WaitLog

SERVER_ENV = "PADDLE_ELASTIC_SERVER"
JOB_ID_ENV = "PADDLE_ELASTIC_JOB_ID"
TIMEOUT_ENV = "PADDLE_ELASTIC_TIMEOUT"
CALL_TIMEOUT_ENV = "FLEET_ETCD_TIMEOUT_MS"
DEFAULT_TIMEOUT_S = 120      # Paddle's PADDLE_ELASTIC_TIMEOUT default
DEFAULT_TTL_S = 10           # Paddle's is 60; 10 notices a lost host within the heartbeat bound
DEFAULT_CALL_TIMEOUT_MS = 5000
KEY_ROOT = "/fleet/jobs/"
_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class HostRecord:
    """One host's offer to a job: its address and the endpoints of its processes.

    Attributes:
        addr: the address the other hosts reach it at.
        servers: "addr:port" of each server it runs.
        workers: "addr:port" of each worker it runs.
        hostname: its name, for messages.
        revision: etcd's create revision of its key (0 before it registered).
    """

    addr: str
    servers: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()
    hostname: str = ""
    revision: int = 0

    def to_json(self):
        """The record as stored in etcd (without the revision, which etcd keeps)."""
        return json.dumps({"addr": self.addr, "servers": list(self.servers),
                           "workers": list(self.workers), "hostname": self.hostname})

    @classmethod
    def from_json(cls, text, revision=0):
        """Parse a stored record. Raises RendezvousError for one fleet did not write."""
        try:
            d = json.loads(text)
            return cls(str(d["addr"]), tuple(d["servers"]), tuple(d["workers"]),
                       str(d.get("hostname", "")), revision)
        except (ValueError, KeyError, TypeError) as e:
            raise RendezvousError(f"a host record {text[:200]!r} of this job in etcd is not "
                                  "fleet's: use a --job_id of its own for each job") from e

    def describe(self):
        """E.g. "10.0.0.2 (node2: 1 server, 2 workers)"."""
        parts = [plural(len(self.servers), "server"), plural(len(self.workers), "worker")]
        return f"{self.addr} ({self.hostname + ': ' if self.hostname else ''}{', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """Who is in a formed job and every process's rank.

    Attributes:
        members: the member hosts in rank order.
        servers: every server endpoint; server i is servers[i].
        workers: every worker endpoint; worker j is workers[j].
    """

    members: tuple[HostRecord, ...]
    servers: tuple[str, ...]
    workers: tuple[str, ...]

    def to_json(self):
        """The plan as stored under formed."""
        return json.dumps({"members": [json.loads(m.to_json()) | {"revision": m.revision}
                                       for m in self.members]})

    @classmethod
    def from_json(cls, text):
        """Parse a stored plan. Raises RendezvousError for one fleet did not write."""
        try:
            rows = json.loads(text)["members"]
            members = [HostRecord.from_json(json.dumps(r), int(r["revision"])) for r in rows]
        except (ValueError, KeyError, TypeError) as e:
            raise RendezvousError(f"the job's plan {text[:200]!r} in etcd is not fleet's: use "
                                  "a --job_id of its own for each job") from e
        return plan_of(members)

    def ranks_of(self, addr):
        """E.g. "server 0, worker 0" for the host with that address ("" if none)."""
        names = [f"server {i}" for i, e in enumerate(self.servers) if _addr(e) == addr]
        names += [f"worker {j}" for j, e in enumerate(self.workers) if _addr(e) == addr]
        return ", ".join(names)


def _addr(endpoint):
    return parse_endpoint(endpoint)[0]


def plan_of(members):
    """The plan of these member hosts, taken in the given order."""
    return JobPlan(tuple(members), tuple(e for m in members for e in m.servers),
                   tuple(e for m in members for e in m.workers))


def derive_plan(records, server_num, worker_num, min_workers=None):
    """Which registered hosts make the job, in rank order, and whether they complete it.

    Hosts are ordered by registration (create revision, then address for equal ones) and
    taken while the servers and workers they offer fit within the job's totals; a host
    that does not fit is skipped (it is refused once the job forms).

    Args:
        records: HostRecord of every registered host, any order.
        server_num: the job's number of servers.
        worker_num: the job's number of workers (an elastic job's MAX).
        min_workers: an elastic job's MIN (``--np MIN:MAX``): complete with MIN..MAX
            workers; None: exactly worker_num.

    Returns:
        (JobPlan of the hosts taken, True if they offer exactly server_num servers and
        worker_num workers, or min_workers..worker_num of them).
    """
    taken, servers, workers = [], 0, 0
    for r in sorted(records, key=lambda r: (r.revision, r.addr)):
        if servers + len(r.servers) <= server_num and workers + len(r.workers) <= worker_num:
            taken.append(r)
            servers += len(r.servers)
            workers += len(r.workers)
    low = worker_num if min_workers is None else min_workers
    return plan_of(taken), servers == server_num and low <= workers <= worker_num


def host_endpoints(addr, server_count, worker_count, start_port):
    """This host's server and worker endpoints: ports start_port.. for its servers, then
    the next ones for its workers (as ``fleetrun --hosts`` gives each host)."""
    ports = range(start_port, start_port + server_count + worker_count)
    endpoints = [join_endpoint(addr, p) for p in ports]
    return tuple(endpoints[:server_count]), tuple(endpoints[server_count:])


def address_towards(endpoint):
    """This host's address on the route to endpoint (no packet is sent): what the other
    hosts of a job that share this etcd can reach it at."""
    host, port = parse_endpoint(endpoint, "--elastic_server")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise RendezvousError(f"this host has no route to etcd at {endpoint} ({e.strerror}): "
                              "check --elastic_server, or give --host ADDR") from e


def call_timeout_s():
    """Seconds each etcd call may take (FLEET_ETCD_TIMEOUT_MS, default 5000 ms)."""
    return env_int(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_MS,
                   meaning="milliseconds each call to etcd may take") / 1000.0


class Rendezvous:
    """One host's part in a job's rendezvous: register, wait for the job, leave.

    Args:
        client: the EtcdClient of the job's etcd.
        job_id: the job's name (--job_id); hosts with the same job_id form one job.
        me: this host's record (revision 0).
        server_num, worker_num: the job's totals.
        ttl: the lease's seconds (PADDLE_ELASTIC_TTL).
        wait_s: how long to wait for the job to form (PADDLE_ELASTIC_TIMEOUT).
        host_source: where me.addr came from, for messages ("--host", "POD_IP", ...).
        elastic: (MIN, MAX) of an elastic job (``--np``; worker_num is then MAX): it forms
            with MIN..MAX workers, and a host of workers only may join it while it runs
            (``fleet.launch.etcd_slots``); None: a fixed job.

    Attributes:
        late: True once a host joined a job that had formed without it (elastic only).
    """

    def __init__(self, client: EtcdClient, job_id: str, me: HostRecord, server_num: int,
                 worker_num: int, ttl: int = DEFAULT_TTL_S, wait_s: float = DEFAULT_TIMEOUT_S,
                 host_source: str = "--host", elastic=None):
        self.host_source = host_source
        self.elastic = elastic
        self.late = False
        self.client = client
        self.job_id = job_id
        self.me = me
        self.server_num = server_num
        self.worker_num = worker_num
        self.ttl = ttl
        self.wait_s = wait_s
        self.prefix = f"{KEY_ROOT}{job_id}/"
        self.lease = 0
        self.monitor = None
        self.seconds = None  # how long the rendezvous took, once formed

    @property
    def where(self):
        """E.g. "job J at etcd 10.0.0.1:2379", for messages."""
        return f"job {self.job_id!r} at etcd {self.client.endpoint}"

    def join(self) -> JobPlan:
        """Register this host, wait until the job is complete, return its plan.

        Blocks up to wait_s (plus the calls' timeouts). On success the lease is kept
        alive and the job's keys watched by a MembershipMonitor (``self.monitor``) until
        ``leave``; on failure this host's registration is removed.

        Raises:
            RendezvousError: etcd unreachable, the job is running already, this host is
                registered twice or does not fit, or the job did not form in time.
        """
        started = time.monotonic()
        self._clear_stale_job()
        self.lease = self.client.grant_lease(self.ttl)
        try:
            created, kv = self.client.put_if_absent(self.prefix + "hosts/" + self.me.addr,
                                                    self.me.to_json(), self.lease)
            if not created:
                raise RendezvousError(
                    f"host {self.me.addr} is registered in {self.where} already "
                    f"({HostRecord.from_json(kv.value).describe()}): one fleetrun per host and "
                    "job; stop the other, or give this one --host with another address")
            keepalive = KeepAlive(self.client, self.lease, self.ttl, self.where)
            keepalive.start()
            try:
                plan, revision = self._wait_formed(started)
                self.seconds = time.monotonic() - started
                self.monitor = MembershipMonitor(self, plan, revision, keepalive)
            except BaseException:
                keepalive.stop()
                raise
        except BaseException:
            self._revoke_quietly()
            raise
        return plan

    def _clear_stale_job(self):
        """Refuse a job that runs; delete the keys of one whose hosts are all gone."""
        formed, _ = self.client.range(self.prefix + "formed")
        if not formed:
            return
        plan = JobPlan.from_json(formed[0].value)
        hosts, _ = self.client.range(self.prefix + "hosts/", prefix=True)
        alive = {HostRecord.from_json(kv.value).addr for kv in hosts}
        if not alive:
            self._delete_job_records()
            return
        if self.elastic is not None and not self.me.servers:
            return  # a host of workers only joins the running elastic job (etcd_slots)
        names = ", ".join(m.addr for m in plan.members)
        if self.elastic is not None:
            raise RendezvousError(
                f"{self.where} is running already with hosts {names}, and this host ({self.me.describe()}) "
                f"offers {plural(len(self.me.servers), 'server')}: an elastic job's servers are fixed when it "
                "forms, only workers may join it; give this host --server_num_per_host 0")
        raise RendezvousError(
            f"{self.where} is running already with hosts {names} ({plural(len(plan.servers), 'server')}, "
            f"{plural(len(plan.workers), 'worker')}), and this host ({self.me.describe()}) "
            "cannot join a running job (only workers may join an elastic one, formed with --np MIN:MAX: docs/elastic.md); "
            "give a new job another --job_id, or wait until this one ends")

    def _wait_formed(self, started):
        """Until the plan exists: form it when complete. Returns (plan, revision read at)."""
        wait = WaitLog(f"the hosts of {self.where}",
                       limit=f"giving up after {self.wait_s:g} s ({TIMEOUT_ENV})", logger=SAY_LOGGER)
        while True:
            formed, revision = self.client.range(self.prefix + "formed")
            if formed:
                plan = JobPlan.from_json(formed[0].value)
                self._check_member(plan)
                return plan, revision
            kvs, _ = self.client.range(self.prefix + "hosts/", prefix=True)
            records = [HostRecord.from_json(kv.value, kv.create_revision) for kv in kvs]
            plan, complete = derive_plan(records, self.server_num, self.worker_num,
                                         None if self.elastic is None else self.elastic[0])
            if complete:
                self.client.put_if_absent(self.prefix + "formed", plan.to_json())
                continue  # read back whichever plan won
            progress = self._progress(records, plan)
            if time.monotonic() - started > self.wait_s:
                raise RendezvousError(f"{self.where} did not form within {self.wait_s:g} s "
                                      f"({TIMEOUT_ENV}): {progress}. Start fleetrun on the missing "
                                      "hosts, or check that every host gives the same --job_id, "
                                      "--server_num and --worker_num")
            wait.tick(progress)
            time.sleep(_POLL_S)

    def _progress(self, records, plan):
        have = ", ".join(r.describe() for r in plan.members) or "none"
        lacking = [plural(n, role) for n, role in ((self.server_num - len(plan.servers), "server"),
                                                   (self.worker_num - len(plan.workers), "worker")) if n]
        extra = [r.addr for r in records if r not in plan.members]
        return (f"hosts so far: {have}; waiting for {' and '.join(lacking)} more (of "
                f"{plural(self.server_num, 'server')} and {plural(self.worker_num, 'worker')})"
                + (f"; not fitting: {', '.join(extra)}" if extra else ""))

    def _check_member(self, plan):
        if any(m.addr == self.me.addr for m in plan.members):
            return
        if self.elastic is not None and not self.me.servers:
            self.late = True  # it takes free worker slots (etcd_slots)
            return
        raise RendezvousError(
            f"{self.where} formed without this host ({self.me.describe()}): it has its "
            f"{plural(len(plan.servers), 'server')} and {plural(len(plan.workers), 'worker')} from "
            f"{', '.join(m.describe() for m in plan.members)}. Give a new job another --job_id")

    def leave(self, exit_code: int) -> None:
        """Tell the job this host is done (its exit code), drop its registration, and
        delete the job's plan and records if it was the last host. Bounded by the calls' timeouts;
        never raises (an unreachable etcd is reported: the lease then expires by itself)."""
        down = self.monitor.etcd_down() if self.monitor is not None else None
        if self.monitor is not None:
            self.monitor.stop()
        if down is not None:
            say(f"etcd at {self.client.endpoint} is still unreachable, so this host's registration "
                f"expires by itself within {self.ttl} s ({TTL_ENV})")
            return
        try:
            self.client.put(self.prefix + "done/" + self.me.addr, str(exit_code))
            self.client.revoke_lease(self.lease)
            hosts, _ = self.client.range(self.prefix + "hosts/", prefix=True)
            if not hosts:
                self._delete_job_records()
        except RendezvousError as e:
            say(f"could not tell etcd that this host is done ({e}); its registration expires "
                f"within {self.ttl} s ({TTL_ENV}) by itself")

    def _delete_job_records(self):
        """Delete the plan and the done/ records of a job without hosts. Never the hosts/
        keys: they go with their leases, and a host of a new job with the same id may be
        registering right now."""
        self.client.delete(self.prefix + "formed")
        self.client.delete(self.prefix + "done/", prefix=True)
        self.client.delete(self.prefix + "rounds/", prefix=True)
        self.client.delete(self.prefix + "slots/", prefix=True)
        self.client.delete(self.prefix + "np")

    def _revoke_quietly(self):
        try:
            if self.lease:
                self.client.revoke_lease(self.lease)
        except RendezvousError:
            pass  # it expires within ttl by itself
