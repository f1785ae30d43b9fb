"""Rounds of an elastic etcd job (``--np MIN:MAX --elastic_server --max_restarts K``):
a failure that would end the job restarts it from its checkpoint with its worker slots re-made.

Without --max_restarts an elastic job formed through etcd (`fleet.launch.etcd_slots`)
ends when a host that ran a server is lost, when a server process fails, or when fewer
than MIN worker slots live. With it, each of those starts a *round*, as
`fleet.launch.etcd_rounds` does for a fixed job:

1. every surviving host stops its processes and counts a restart (the same K,
   restarts.log, LOG_DIR/attempt-N/); the other hosts learn of the round when its first
   host registers ready for it (``rounds/R/ready/ADDR``: they poll the slots and that key
   every half second), or by the change itself;
2. each registers ready with free ports, the slots it ran in round r and its
   --worker_num_per_host, and waits for the other survivors: every host of the job whose
   lease lives and that left no ``done/`` record, members of round r first, then the
   hosts that joined the running job later (they become members of the new round);
3. the plan of round r+1 is written once, by a transaction that also deletes every key
   under ``slots/``: the lost hosts' servers move by `fleet.launch.replacement.reassign`
   (a moved server takes its new host's next offered port) and the slots are re-made
   by :func:`remake_slots`; a slot freed while the hosts restart apart thus never counts
   against MIN, and until a host writes its slots of the round they count as live;
4. each host reads the plan, takes its slots of the round (live, bound to its lease) and
   starts its share; server 0 loads the newest checkpoint with the acknowledged work
   units of its manifest, and the workers resume as after any restart.

A host of workers only whose every worker was lost, with no change of the job seen
within the lease's TTL plus the restart's settle time, leaves as without --max_restarts:
no restart, its slots free, the job goes on while MIN slots live. A host whose own lease
expired ends the job as without restarts.

Thread-safety: a :class:`SlotRegroup` is driven by the thread that runs the job.
"""
from __future__ import annotations

import json

from fleet.endpoints import join_endpoint, parse_endpoint
from fleet.errors import RendezvousError
from fleet.launch.etcd_membership import MembershipMonitor
from fleet.launch.etcd_rendezvous import HostRecord, JobPlan
from fleet.launch.etcd_rounds import Regroup, free_ports, shares_of
from fleet.launch.etcd_slots import SLOTS, ElasticMonitor, SlotRegistry, plan_slots
from fleet.launch.replacement import Share, reassign


def remake_slots(members, held, wanted, lost, high):
    """The worker slots of the next round: which host runs each.

    Each surviving host keeps the slots it ran (lowest first, up to the workers it
    wants), so its workers resume their places; then, in the job's order, a host that
    wants more takes the lowest slots nobody keeps, the lost hosts' last (they are left
    for hosts that join later where possible). The result depends only on the inputs.

    Args:
        members: the addresses of the round's hosts, in the job's order.
        held: address -> the slots it ran in the round (lost hosts' too, when known).
        wanted: surviving address -> its --worker_num_per_host.
        lost: the addresses that are gone.
        high: MAX (slots are 0..MAX-1).

    Returns:
        {slot: address} of the surviving hosts' slots.
    """
    survivors = [a for a in members if a not in lost]
    assigned = {}
    for addr in survivors:
        for j in sorted(held.get(addr, ()))[:wanted.get(addr, 0)]:
            if 0 <= j < high and j not in assigned:
                assigned[j] = addr
    of_lost = {j for a in lost for j in held.get(a, ())}
    spare = sorted((j for j in range(high) if j not in assigned), key=lambda j: (j in of_lost, j))
    for addr in survivors:
        short = wanted.get(addr, 0) - sum(1 for a in assigned.values() if a == addr)
        for _ in range(max(0, short)):
            if not spare:
                break
            assigned[spare.pop(0)] = addr
    return dict(sorted(assigned.items()))


def slot_plan(plan, assigned_before, ready, lost, low, high):
    """The next round's plan: servers moved by ``reassign``, slots by ``remake_slots``.

    Args:
        plan: the current round's JobPlan. assigned_before: its {slot: address}.
        ready: surviving address -> its ready/ record ({"ports", "slots", "want"}).
        lost: the addresses that are gone. low, high: --np MIN:MAX.

    Returns:
        (JobPlan whose members hold their servers and no workers, [Move], {slot: address}).

    Raises:
        ConfigError: every member is lost. RendezvousError: a survivor offered too few
            ports, or the survivors want fewer than MIN workers.
    """
    members = [m.addr for m in plan.members]
    held = {a: [j for j, h in assigned_before.items() if h == a] for a in members}
    for addr, record in ready.items():
        held[addr] = [int(j) for j in record.get("slots", held.get(addr, ()))]
    assigned = remake_slots(members, held, {a: int(r.get("want", 0)) for a, r in ready.items()},
                            set(lost), high)
    if len(assigned) < low:
        raise RendezvousError(f"the surviving hosts ({', '.join(ready)}) run {len(assigned)} workers, fewer than "
                              f"--np {low}:{high}'s minimum {low}: the job cannot re-form; start hosts with "
                              "more workers (--worker_num_per_host) and a new --job_id")
    shares, moves = reassign([(a, Share(share.servers, tuple(sorted(held.get(a, ()))) if a not in lost else ()))
                              for a, share in shares_of(plan)], set(lost))
    servers = list(plan.servers)
    offered = {a: list(r["ports"]) for a, r in ready.items()}
    for move in moves:
        if not offered.get(move.target):
            raise RendezvousError(f"host {move.target} offered no free port for server {move.index}")
        servers[move.index] = join_endpoint(move.target, offered[move.target].pop(0))
    by_addr = {m.addr: m for m in plan.members}
    new = JobPlan(tuple(HostRecord(a, tuple(servers[i] for i in share.servers), (), by_addr[a].hostname,
                                   by_addr[a].revision) for a, share in shares.items()), tuple(servers), ())
    return new, moves, assigned


def describe_slot_plan(plan, assigned):
    """E.g. "10.0.0.1: server 0, slot 0; 10.0.0.3: slots 1, 2"."""
    parts = []
    for m in plan.members:
        slots = [j for j, a in sorted(assigned.items()) if a == m.addr]
        names = [f"server {i}" for i, e in enumerate(plan.servers) if parse_endpoint(e)[0] == m.addr]
        if slots:
            names.append(f"slot{'s' if len(slots) > 1 else ''} {', '.join(map(str, slots))}")
        parts.append(f"{m.addr}: {', '.join(names) or 'nothing'}")
    return "; ".join(parts)


def slot_plan_from_json(text):
    """(JobPlan, move descriptions, {slot: address}) of a stored round plan of an elastic job.

    Raises:
        RendezvousError: the text is not such a plan.
    """
    try:
        d = json.loads(text)
        members = tuple(HostRecord.from_json(json.dumps(r), int(r["revision"])) for r in d["members"])
        assigned = {int(j): str(a) for j, a in d["slots"].items()}
        return JobPlan(members, tuple(d["servers"]), ()), list(d["moves"]), assigned
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RendezvousError(f"a round plan {text[:200]!r} of this job in etcd is not fleet's "
                              "(--np): use a --job_id of its own for each job") from e


def join_newest_round(rendezvous, plan):
    """For a host joining a running elastic job: the newest round's plan (its servers may
    have moved since the job formed), its monitor watching that round's server hosts.

    Args:
        rendezvous: the joined Rendezvous (late). plan: the formed plan (round 0).

    Returns:
        (round, JobPlan, {slot: address}); (0, plan, its slots) when no round followed.

    Raises:
        RendezvousError: etcd did not answer, or a stored plan is not fleet's.
    """
    base = rendezvous.prefix + "rounds/"
    kvs, revision = rendezvous.client.range(base, prefix=True)
    plans = {int(kv.key[len(base):].split("/")[0]): kv.value for kv in kvs
             if kv.key.endswith("/plan") and kv.key[len(base):].split("/")[0].isdigit()}
    if not plans:
        return 0, plan, plan_slots(plan)
    r = max(plans)
    newest, _, assigned = slot_plan_from_json(plans[r])
    old = rendezvous.monitor
    old.stop_watching()
    rendezvous.monitor = MembershipMonitor(rendezvous, newest, revision, old.keepalive)
    return r, newest, assigned


class SlotRegroup(Regroup):
    """One host's part in the rounds of an elastic etcd job (see the module docstring).

    Args:
        rendezvous: the joined Rendezvous (elastic). plan: round 0's plan.
        config_for: ``config_for(plan, slots, every_slot)`` -> the LaunchConfig of this
            host's servers of the plan and its worker slots ``slots``; ``every_slot``: the
            round's slots on every host (the servers expect those workers), ascending.
        registry: the current round's started SlotRegistry (its slots taken).
        want: this host's --worker_num_per_host.
        config: the current round's LaunchConfig as fleetrun made it (default: config_for's).
        round: the current round (a host that joined after rounds: the newest one's).
        assigned: the current round's {slot: address} (default: the formed plan's).

    Attributes (besides Regroup's):
        remakes_slots: True (`fleet.launch.restart` runs every restart as a round).
        assigned: {slot: address} of the current round. registry: its SlotRegistry.
    """

    remakes_slots = True

    def __init__(self, rendezvous, plan, config_for, registry, want, config=None, round=0, assigned=None):
        self.registry = registry
        self.want = want
        self.assigned = plan_slots(plan) if assigned is None else dict(assigned)
        self.registry.round = round
        self._joined = {}  # address -> HostRecord of the survivors not in the current plan
        super().__init__(rendezvous, plan, lambda p: config_for(p, self.my_slots(), tuple(sorted(self.assigned))))
        self.round = round
        if config is not None:  # as fleetrun made it (a late host: no slots of the plan)
            self.config = config

    @property
    def monitor(self):
        """What the current round's job polls: the membership, else the slots and rounds."""
        return ElasticMonitor(self.rdv.monitor, self.registry)

    def my_slots(self):
        """This host's slots of the current round (with those it took joining), ascending."""
        mine = {j for j, a in self.assigned.items() if a == self.rdv.me.addr}
        return tuple(sorted(mine | set(self.registry.join_slots)))

    def _survivors(self):
        """Every host of the job whose lease lives and that left no done/ record: the
        round's members in their order, then hosts that joined later by registration."""
        rdv = self.rdv
        hosts, _ = rdv.client.range(rdv.prefix + "hosts/", prefix=True)
        done, _ = rdv.client.range(rdv.prefix + "done/", prefix=True)
        gone = {kv.key[len(rdv.prefix + "done/"):] for kv in done}
        live = {r.addr: r for r in (HostRecord.from_json(kv.value, kv.create_revision) for kv in hosts)
                if r.addr not in gone}
        members = [m.addr for m in self.plan.members if m.addr in live]
        self._joined = {a: r for a, r in sorted(live.items(), key=lambda i: (i[1].revision, i[0]))
                        if a not in members and not any(m.addr == a for m in self.plan.members)}
        return members + list(self._joined)

    def describe_plan(self):
        """The current round's servers and slots by host."""
        return describe_slot_plan(self.plan, self.assigned)

    def next_round(self, signals):
        """Regroup.next_round with this round's slot reader stopped first (so slots freed
        while the hosts restart apart end nothing). Blocks as Regroup.next_round; raises
        its errors."""
        self.registry.stop()
        return super().next_round(signals)

    def _offer(self):
        addr = self.rdv.me.addr
        used = [parse_endpoint(e)[1] for e in (*self.config.server_endpoints, *self.config.worker_endpoints)
                if parse_endpoint(e)[0] == addr]
        return {"addr": addr, "ports": free_ports(addr, max(used, default=0), len(self.plan.servers)),
                "slots": list(self.my_slots()), "want": self.want}

    def _form(self, ready, lost):
        joined = tuple(HostRecord(r.addr, (), (), r.hostname, r.revision) for r in self._joined.values())
        current = JobPlan(self.plan.members + joined, self.plan.servers, self.plan.workers)
        plan, moves, assigned = slot_plan(current, self.assigned, ready, lost, self.registry.low,
                                          self.registry.high)
        return json.dumps({"members": [json.loads(m.to_json()) | {"revision": m.revision} for m in plan.members],
                           "servers": list(plan.servers), "moves": [m.describe() for m in moves],
                           "slots": {str(j): a for j, a in assigned.items()}})

    def _write_plan(self, key, text):
        # The slots of the ended round go in the same transaction that writes the plan, so
        # no host of the new round ever sees them.
        self.rdv.client.put_if_absent(key, text, clear_prefix=self.rdv.prefix + SLOTS)

    def _adopt(self, text):
        plan, moves, self._next_assigned = slot_plan_from_json(text)
        return plan, moves

    def _start_round(self):
        self.assigned = self._next_assigned
        self.registry = SlotRegistry(self.rdv, self.plan, self.assigned, self.round)
        self.registry.take_plan_slots()
        self.registry.start()
