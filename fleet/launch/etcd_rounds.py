"""Rounds of an etcd job: under ``--max_restarts`` a lost host re-forms the job without it.

A job formed through etcd (`fleet.launch.etcd_rendezvous`) runs round 0 with the plan under
``formed``. When a member host is lost (its lease expired) or leaves failing (its ``done/``
record is non-zero) while etcd answers, every surviving host:

1. stops its processes and counts a restart (the same --max_restarts K, restarts.log and
   LOG_DIR/attempt-N/ as a process failure; FLEET_RESTART_COUNT goes on rising);
2. registers as ready for round r+1: ``rounds/R/ready/ADDR`` = {"addr", "ports"} bound to
   its lease, "ports" being free ports of its address above the highest one it used;
3. waits until every surviving member (a member of round r whose ``hosts/`` key lives and
   that left no ``done/`` record) is ready, at most PADDLE_ELASTIC_TIMEOUT s, naming the
   hosts that did not come;
4. writes round r+1's plan by a transaction (``rounds/R/plan``, the first write wins; every
   host computes the same one): round r's ranks, the lost hosts' ranks placed by
   `fleet.launch.replacement.reassign`; a surviving host keeps its endpoints, a moved rank
   takes its new host's next offered port;
5. reads the plan, says each move, and starts its share; servers load the newest
   checkpoint and workers resume as after any restart.

Order of events: the survivors' processes usually fail through their heartbeats before
the lost host's lease expires. The same-plan restart that follows (it waits
``settle_seconds``) turns into the new round when the change arrives meanwhile; if that
restart already started its processes, they are stopped and the restart it counted
stands for the loss (no second count) when the change arrives within the lease TTL plus
``settle_seconds`` of the failure.

A host whose own lease expired (cut off from etcd) ends the job as without restarts.

Thread-safety: a :class:`Regroup` is driven by the thread that runs the job.
"""
from __future__ import annotations

import json
import time

from fleet.endpoints import join_endpoint, parse_endpoint
from fleet.errors import RendezvousError
from fleet.launch.etcd_membership import MembershipMonitor
from fleet.launch.etcd_rendezvous import TIMEOUT_ENV, HostRecord, JobPlan
from fleet.launch.local import probe_port
from fleet.launch.replacement import Share, reassign
from fleet.launch.report import SAY_LOGGER, plural, say
from fleet.launch.restart import Failure
from fleet.logs import WaitLog

_POLL_S = 0.1


def shares_of(plan):
    """[(addr, Share)] of a plan's members, in the plan's order."""
    def indexes(endpoints, addr):
        return tuple(i for i, e in enumerate(endpoints) if parse_endpoint(e)[0] == addr)
    return [(m.addr, Share(indexes(plan.servers, m.addr), indexes(plan.workers, m.addr)))
            for m in plan.members]


def next_plan(plan, lost, ports):
    """Round r+1's plan: the lost hosts' ranks on the survivors by ``reassign``.

    Args:
        plan: round r's JobPlan.
        lost: addresses of the members that are gone.
        ports: addr -> free ports each survivor offered, ascending; a rank moved to a host
            takes its next one.

    Returns:
        (JobPlan over the surviving members in round r's order, list of Move).

    Raises:
        ConfigError: a lost host is not a member, or every member is lost.
        RendezvousError: a survivor offered fewer free ports than ranks move to it.
    """
    shares, moves = reassign(shares_of(plan), set(lost))
    servers, workers = list(plan.servers), list(plan.workers)
    offered = {addr: list(ports.get(addr, ())) for addr in shares}
    for move in moves:
        if not offered[move.target]:
            raise RendezvousError(f"host {move.target} offered no free port for {move.role} "
                                  f"{move.index}; free ports on it above {max_port(plan, move.target)}")
        endpoint = join_endpoint(move.target, offered[move.target].pop(0))
        (servers if move.role == "server" else workers)[move.index] = endpoint
    by_addr = {m.addr: m for m in plan.members}
    members = tuple(HostRecord(addr, tuple(servers[i] for i in share.servers),
                               tuple(workers[j] for j in share.workers),
                               by_addr[addr].hostname, by_addr[addr].revision)
                    for addr, share in shares.items())
    return JobPlan(members, tuple(servers), tuple(workers)), moves


def plan_to_json(plan, moves):
    """A round's plan as stored under rounds/R/plan: members, endpoints by rank, moves."""
    return json.dumps({"members": [json.loads(m.to_json()) | {"revision": m.revision}
                                   for m in plan.members],
                       "servers": list(plan.servers), "workers": list(plan.workers),
                       "moves": [m.describe() for m in moves]})


def plan_from_json(text):
    """(JobPlan, move descriptions) of a stored round plan.

    Raises:
        RendezvousError: the text is not a round plan fleet wrote.
    """
    try:
        d = json.loads(text)
        members = tuple(HostRecord.from_json(json.dumps(r), int(r["revision"]))
                        for r in d["members"])
        return JobPlan(members, tuple(d["servers"]), tuple(d["workers"])), list(d["moves"])
    except (ValueError, KeyError, TypeError) as e:
        raise RendezvousError(f"a round plan {text[:200]!r} of this job in etcd is not "
                              "fleet's: use a --job_id of its own for each job") from e


def max_port(plan, addr):
    """The highest port of addr's endpoints in the plan (0 if none)."""
    ports = [parse_endpoint(e)[1] for e in plan.servers + plan.workers if parse_endpoint(e)[0] == addr]
    return max(ports, default=0)


def free_ports(addr, above, count):
    """count ports above ``above`` that a server could bind on addr now, ascending (the
    check fleetrun makes before it starts processes: ``fleet.launch.local.probe_port``)."""
    found, port = [], above + 1
    while len(found) < count and port < 65536:
        if probe_port(addr, port) is None:
            found.append(port)
        port += 1
    return found


def _ready_record(text):
    """(addr, the record as a dict, "ports" a list of int) of a stored ready/ record.
    Raises RendezvousError for one fleet did not write."""
    try:
        d = json.loads(text)
        return str(d["addr"]), d | {"ports": [int(p) for p in d["ports"]]}
    except (ValueError, KeyError, TypeError) as e:
        raise RendezvousError(f"a ready record {text[:200]!r} of this job in etcd is not fleet's: "
                              "use a --job_id of its own for each job") from e


class Regroup:
    """One host's part in the rounds of an etcd job under --max_restarts.

    Args:
        rendezvous: the joined Rendezvous (its monitor watches round 0).
        plan: round 0's plan.
        config_for: ``config_for(plan)`` -> the LaunchConfig of this host's share of a plan.

    Attributes:
        covered: how many of run_with_restarts' failures a round already followed.
        round: the current round (0 first).
        plan: the current round's plan.
        config: the LaunchConfig of this host's share of it.
        monitor: the MembershipMonitor of the current round.
    """

    def __init__(self, rendezvous, plan, config_for):
        self.rdv = rendezvous
        self.round = 0
        self.plan = plan
        self.config_for = config_for
        self.config = config_for(plan)
        self.seconds = []  # how long each regroup took, change seen -> plan read
        self.covered = 0   # failures (restarts) already followed by a round of their own

    @property
    def monitor(self):
        """The current round's MembershipMonitor (the rendezvous's)."""
        return self.rdv.monitor

    def loss_failure(self, attempt, failures, window_s):
        """The Failure that counts this round's membership change, or None when the newest
        failure is a process's that came within window_s before it and no round followed it
        yet (the loss caused it; its restart stands for the loss)."""
        now = time.time()
        if (len(failures) > self.covered and failures[-1].role != "host"
                and now - failures[-1].time <= window_s):
            return None
        lost = self.monitor.lost_hosts()
        addr = lost[0] if lost else "?"
        index = next((i for i, m in enumerate(self.plan.members) if m.addr == addr), -1)
        ranks = self.plan.ranks_of(addr)
        return Failure(attempt, "host", index, addr, None,
                       f"was lost from the job{f' ({ranks})' if ranks else ''}",
                       self.monitor.why_lost(addr), now)

    def describe_loss(self):
        """E.g. "host 10.0.0.2 (server 1, worker 1) lost: its registration expired (...)"."""
        return "; ".join(f"host {a} ({self.plan.ranks_of(a)}) lost: {self.monitor.why_lost(a)}"
                         for a in self.monitor.lost_hosts())

    def next_round(self, signals):
        """Register ready for round r+1, wait for the survivors, read (or write) its plan.

        Blocks up to PADDLE_ELASTIC_TIMEOUT (plus the calls' timeouts). On return
        ``config``, ``plan``, ``monitor`` and ``round`` are the new round's.

        Returns:
            True, or False when fleetrun got a signal meanwhile.

        Raises:
            RendezvousError: etcd failed, this host is no longer a member, or a surviving
                host did not get ready in time (named).
        """
        began = time.monotonic()
        rdv, r = self.rdv, self.round + 1
        old = self.rdv.monitor
        old.stop_watching()
        base = f"{rdv.prefix}rounds/{r}/"
        rdv.client.put(base + "ready/" + rdv.me.addr, json.dumps(self._offer()), rdv.lease)
        say(f"ready for round {r} of {rdv.where}; waiting for the other surviving hosts "
            f"(at most {rdv.wait_s:g} s, {TIMEOUT_ENV})")
        found = self._wait_plan(base, r, began, signals)
        if found is None:
            return False
        text, revision = found
        plan, moves = self._adopt(text)
        if not any(m.addr == rdv.me.addr for m in plan.members):
            raise RendezvousError(f"round {r} of {rdv.where} formed without this host "
                                  f"({rdv.me.addr}): the others counted it as lost")
        for move in moves:
            say(f"round {r}: {move.replace(' from ', ' moves from ', 1)}")
        self.rdv.monitor = MembershipMonitor(rdv, plan, revision, old.keepalive)
        self.round, self.plan = r, plan
        self._start_round()
        self.config = self.config_for(plan)
        self.seconds.append(time.monotonic() - began)
        say(f"round {r} of {rdv.where} formed in {self.seconds[-1]:.2f} s: {self.describe_plan()}")
        return True

    def describe_plan(self):
        """E.g. "10.0.0.1: server 0, worker 0; 10.0.0.3: worker 1" of the current round."""
        return "; ".join(f"{m.addr}: {self.plan.ranks_of(m.addr)}" for m in self.plan.members)

    # Hooks of a round; `fleet.launch.etcd_slot_rounds.SlotRegroup` re-makes worker slots in them.
    def _offer(self):
        """This host's ready/ record: its address and free ports above those it used."""
        addr = self.rdv.me.addr
        return {"addr": addr, "ports": free_ports(addr, max_port(self.plan, addr),
                                                  len(self.plan.servers) + len(self.plan.workers))}

    def _form(self, ready, lost):
        """The text of the next round's plan, from every survivor's ready/ record."""
        plan, moves = next_plan(self.plan, lost, {a: d["ports"] for a, d in ready.items()})
        return plan_to_json(plan, moves)

    def _write_plan(self, key, text):
        """Writes the plan unless one is there (the first write wins)."""
        self.rdv.client.put_if_absent(key, text)

    def _adopt(self, text):
        """(JobPlan, move descriptions) of the stored plan text."""
        return plan_from_json(text)

    def _start_round(self):
        """Called once the new round's plan and monitor are in place, before its config."""

    def _wait_plan(self, base, r, began, signals):
        rdv = self.rdv
        wait = WaitLog(f"the surviving hosts of {rdv.where} for round {r}",
                       limit=f"giving up after {rdv.wait_s:g} s ({TIMEOUT_ENV})", logger=SAY_LOGGER)
        while not signals.received:
            stored, revision = rdv.client.range(base + "plan")
            if stored:
                return stored[0].value, revision
            survivors = self._survivors()
            if rdv.me.addr not in survivors:
                raise RendezvousError(f"this host's registration in {rdv.where} is gone (its lease "
                                      "expired), so the other hosts count it as lost")
            kvs, _ = rdv.client.range(base + "ready/", prefix=True)
            ready = dict(_ready_record(kv.value) for kv in kvs)
            missing = [a for a in survivors if a not in ready]
            if not missing:
                lost = [m.addr for m in self.plan.members if m.addr not in survivors]
                self._write_plan(base + "plan", self._form({a: ready[a] for a in survivors}, lost))
                continue  # read back whichever plan won
            if time.monotonic() - began > rdv.wait_s:
                raise RendezvousError(
                    f"round {r} of {rdv.where} did not form within {rdv.wait_s:g} s "
                    f"({TIMEOUT_ENV}): {plural(len(missing), 'surviving host')} did not get "
                    f"ready: {', '.join(missing)} (registered, but their fleetrun did not stop "
                    "its processes and come back); check their fleetrun's stderr")
            wait.tick(f"ready: {', '.join(ready) or 'none'}; not yet: {', '.join(missing)}")
            time.sleep(_POLL_S)
        return None

    def _survivors(self):
        """Members of the current round whose registration lives and that left no done/ record."""
        rdv = self.rdv
        hosts, _ = rdv.client.range(rdv.prefix + "hosts/", prefix=True)
        done, _ = rdv.client.range(rdv.prefix + "done/", prefix=True)
        live = {HostRecord.from_json(kv.value).addr for kv in hosts}
        gone = {kv.key[len(rdv.prefix + "done/"):] for kv in done}
        return [m.addr for m in self.plan.members if m.addr in live and m.addr not in gone]
