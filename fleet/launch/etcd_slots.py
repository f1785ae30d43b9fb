"""Worker slots of an elastic job formed through etcd (``fleetrun --np MIN:MAX --elastic_server``).

The job has MAX worker slots, 0..MAX-1 (every process sees PADDLE_TRAINERS_NUM=MAX, as
under ``fleetrun --np`` on one host). It forms when its hosts offer ``--server_num``
servers and at least MIN workers; the plan's workers are slots 0..k-1, in rank order.
Each slot's state is one key under ``/fleet/jobs/ID/slots/N``, a JSON object
``{"addr": HOST, "state": STATE}``:

    live   a worker of host HOST runs in the slot; the key is bound to HOST's lease, so a
           lost host (lease expired) frees its slots by itself
    free   HOST's worker in the slot was lost while HOST lives; any host may take it
    done   the slot's worker exited 0: the data is done; no lease, it stays

A slot without a key is free, except a slot of the plan whose host is registered and has
not written it yet (it does right after reading the plan). Every change of a slot's key
is a transaction that compares the key's last revision, so two hosts never take one slot.

A host that registers after the job formed offers workers only (servers are fixed) and
takes free slots, up to its ``--worker_num_per_host``, while the data is not done; its
workers start as joining ones (FLEET_ELASTIC_JOINING=1). ``fleetrun --add_workers N``
on any host of the job takes free slots the same way. Every host's
:class:`SlotRegistry` reads the slots every half second: while no slot is done and fewer
than MIN are live, the job ends on every host, naming the lost workers and hosts. Under
``--max_restarts`` (`fleet.launch.etcd_slot_rounds`) that ends the attempt instead, as does
another host registering ready for the next round (also read every half second), and
the round re-makes the slots.

Thread-safety: a SlotRegistry's ``poll``, ``data_done`` and ``check`` may be called from
any thread, its other methods from one thread (fleetrun's main thread); its reader runs on
a thread of its own.
"""
from __future__ import annotations

import dataclasses
import json
import threading

from fleet.endpoints import join_endpoint, parse_endpoint
from fleet.errors import RendezvousError
from fleet.launch.report import plural, say

SLOTS = "slots/"
NP_KEY = "np"  # the job's MIN:MAX, written by its first member
LIVE, FREE, DONE = "live", "free", "done"
_READ_EVERY_S = 0.5


@dataclasses.dataclass(frozen=True)
class Slot:
    """One worker slot as etcd holds it.

    Attributes:
        index: the slot, 0..MAX-1 (the worker's PADDLE_TRAINER_ID).
        addr: the host that holds (or held) it; "" for a slot never taken.
        state: LIVE, FREE, DONE, or "pending" (a plan slot its host has not written yet),
            or "" (never taken).
        mod_revision: the key's last revision (0: no key).
    """

    index: int
    addr: str = ""
    state: str = ""
    mod_revision: int = 0


def read_slots(client, prefix, plan, high, assigned=None):
    """Every slot's state, and the addresses of the registered hosts.

    Args:
        client: the job's EtcdClient. prefix: the job's key prefix ("/fleet/jobs/ID/").
        plan: the formed JobPlan (its workers are slots 0..k-1). high: MAX.
        assigned: {slot: host address} of the current round's plan (default: the formed
            plan's, slot j on the host of plan.workers[j]).

    Returns:
        ([Slot for 0..high-1], set of registered host addresses).

    Raises:
        RendezvousError: etcd did not answer, or a slot key is not fleet's.
    """
    kvs, _ = client.range(prefix + SLOTS, prefix=True)
    hosts, _ = client.range(prefix + "hosts/", prefix=True)
    alive = {kv.key[len(prefix + "hosts/"):] for kv in hosts}
    stored = {}
    for kv in kvs:
        try:
            index = int(kv.key[len(prefix + SLOTS):])
            d = json.loads(kv.value)
            stored[index] = Slot(index, str(d["addr"]), str(d["state"]), kv.mod_revision)
        except (ValueError, KeyError, TypeError) as e:
            raise RendezvousError(f"slot key {kv.key!r} = {kv.value[:200]!r} in etcd is not fleet's: "
                                  "use a --job_id of its own for each job") from e
    if assigned is None:
        assigned = plan_slots(plan)
    slots = []
    for j in range(high):
        if j in stored:
            slots.append(stored[j])
        elif assigned.get(j) in alive:
            slots.append(Slot(j, assigned[j], "pending"))
        else:
            slots.append(Slot(j))
    return slots, alive


def _addr(endpoint):
    return parse_endpoint(endpoint)[0]


def plan_slots(plan):
    """{slot: host address} of a formed plan: slot j is plan.workers[j]'s."""
    return {j: _addr(e) for j, e in enumerate(plan.workers)}


def _value(addr, state):
    return json.dumps({"addr": addr, "state": state})


def claimable(slot):
    """True for a slot a host may take: never taken, freed, or its host's lease ended."""
    return slot.state in ("", FREE)


def below_min(slots, low):
    """None while the job may go on, else (live count) when no slot is done and fewer than
    ``low`` are live (pending plan slots count as live)."""
    if any(s.state == DONE for s in slots):
        return None
    live = sum(1 for s in slots if s.state in (LIVE, "pending"))
    return live if live < low else None


class SlotRegistry:
    """This host's view of the job's worker slots in etcd: take, free, finish, watch MIN.

    Args:
        rendezvous: the joined Rendezvous (client, prefix, lease, me, where, elastic).
        plan: the formed JobPlan.
        assigned: {slot: host address} of the current round (default: the formed plan's).
        round: under --max_restarts (`fleet.launch.etcd_slot_rounds`) the current round:
            a host that registers ready for the next one ends the job here too; None
            without rounds.

    Attributes:
        join_slots: slots this host took when it joined a running job (its workers start
            in them as joining workers).
    """

    def __init__(self, rendezvous, plan, assigned=None, round=None):
        self.rdv = rendezvous
        self.plan = plan
        self.assigned = plan_slots(plan) if assigned is None else dict(assigned)
        self.round = round
        self.low, self.high = rendezvous.elastic
        self.addr = rendezvous.me.addr
        self.join_slots = ()
        self.why_none = ""            # why the last claim found no slot
        self._lock = threading.Lock()
        self._change = None
        self._held = {}               # slot -> host last seen holding it live (for messages)
        self._lost = []               # "worker N (host A)" of every slot lost, in order
        self._lost_hosts = []         # addresses of lost hosts that held slots
        self._any_done = False
        self._stopped = threading.Event()
        self._thread = None

    # -- this host's slots -----------------------------------------------------------------
    def agree_np(self):
        """Checks that this host's --np is the job's: the first member writes it under
        ``np``, the other members and the hosts joining later compare.

        Raises:
            RendezvousError: etcd did not answer; another --np, or a job formed without --np.
        """
        key, mine = self.rdv.prefix + NP_KEY, f"{self.low}:{self.high}"
        if self.rdv.late:
            kvs, _ = self.rdv.client.range(key)
            job = kvs[0].value if kvs else None
        else:
            job = self.rdv.client.put_if_absent(key, mine)[1].value
        if job == mine:
            return
        raise RendezvousError(f"{self.rdv.where} runs {f'with --np {job}' if job else 'without --np (a fixed job)'}, "
                              f"and this host gives --np {mine}: give every host of a job the same --np")

    def take_plan_slots(self):
        """Writes the plan slots of this host as live (bound to its lease). Returns them.

        Raises:
            RendezvousError: etcd did not answer, or a plan slot is held by another host.
        """
        mine = tuple(sorted(j for j, a in self.assigned.items() if a == self.addr))
        for j in mine:
            if not self.rdv.client.put_if_unchanged(self._key(j), _value(self.addr, LIVE), 0, self.rdv.lease):
                raise RendezvousError(f"worker slot {j} of {self.rdv.where} is held already, but the plan gives "
                                      f"it to this host ({self.addr}): give the job a --job_id of its own")
        return mine

    def claim(self, count):
        """Takes up to ``count`` free slots for this host, lowest first, one transaction
        each; sets ``why_none`` when it took fewer.

        Returns:
            The slots taken, in order.

        Raises:
            RendezvousError: etcd did not answer.
        """
        taken, self.why_none = [], ""
        while len(taken) < count:
            slots, _ = read_slots(self.rdv.client, self.rdv.prefix, self.plan, self.high, self.assigned)
            if any(s.state == DONE for s in slots):
                self.why_none = "the data is done: a worker of the job already exited 0"
                break
            free = [s for s in slots if claimable(s)]
            if not free:
                self.why_none = (f"every one of the {self.high} worker slots (--np {self.low}:{self.high}) "
                                 "is taken")
                break
            slot = free[0]
            if self.rdv.client.put_if_unchanged(self._key(slot.index), _value(self.addr, LIVE),
                                                slot.mod_revision, self.rdv.lease):
                taken.append(slot.index)
            # else another host took it meanwhile: read again
        return taken

    def release(self, index):
        """Marks this host's slot free (its worker was lost). Never raises: an unreachable
        etcd is said, and the slot is freed when this host's lease ends."""
        self._write(index, FREE, lease=0, what="free")

    def mark_done(self, index):
        """Marks this host's slot done (its worker exited 0). Never raises (as release)."""
        self._write(index, DONE, lease=0, what="done")

    def data_done(self):
        """True once a slot is done, as last read (or marked here)."""
        with self._lock:
            return self._any_done

    def _write(self, index, state, lease, what):
        key = self._key(index)
        try:
            kvs, _ = self.rdv.client.range(key)
            current = kvs[0] if kvs else None
            if current is not None and json.loads(current.value).get("addr") != self.addr:
                return  # another host took it after this one's lease ended: it is theirs
            self.rdv.client.put_if_unchanged(key, _value(self.addr, state),
                                             current.mod_revision if current else 0, lease)
            if state == DONE:
                with self._lock:
                    self._any_done = True
        except (RendezvousError, ValueError) as e:
            say(f"could not mark worker slot {index} {what} in {self.rdv.where} ({e}); it is freed when this "
                "host's registration ends")

    def _key(self, index):
        return f"{self.rdv.prefix}{SLOTS}{index}"

    # -- the whole job's MIN -------------------------------------------------------------------
    def start(self):
        """Starts reading the slots every half second (see ``poll``). Never blocks."""
        self._thread = threading.Thread(target=self._run, name="etcd-slots", daemon=True)
        self._thread.start()

    def stop(self):
        """Stops the reader. Blocks up to about a second."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0 + self.rdv.client.timeout)

    def poll(self):
        """The sentence ending the job when it fell below MIN workers, or None. Never blocks."""
        with self._lock:
            return self._change

    def check(self):
        """Reads the slots once and records what changed; returns ``poll()``.

        Raises:
            RendezvousError: etcd did not answer.
        """
        slots, alive = read_slots(self.rdv.client, self.rdv.prefix, self.plan, self.high, self.assigned)
        begun = self._round_begun()
        with self._lock:
            if begun and self._change is None:
                self._change = begun
            for s in slots:
                was = self._held.get(s.index)
                if s.state in (LIVE, "pending"):
                    self._held[s.index] = s.addr
                elif was is not None:
                    del self._held[s.index]
                    if s.state != DONE:
                        gone = was not in alive
                        self._lost.append(f"worker {s.index} ({'lost with ' if gone else 'on '}host {was})")
                        if gone and was not in self._lost_hosts:
                            self._lost_hosts.append(was)
            self._any_done = self._any_done or any(s.state == DONE for s in slots)
            live = below_min(slots, self.low)
            if live is not None and self._change is None:
                hosts = f"; lost hosts: {', '.join(self._lost_hosts)}" if self._lost_hosts else ""
                self._change = (f"only {plural(live, 'worker')} of {self.rdv.where} live, fewer than --np "
                                f"{self.low}:{self.high}'s minimum {self.low}, and no worker has finished the data: "
                                f"the job fails. Lost: {', '.join(self._lost) or 'none seen'}{hosts}")
            return self._change

    def _round_begun(self):
        """The sentence saying another host registered ready for the next round, or None."""
        if self.round is None:
            return None
        base = f"{self.rdv.prefix}rounds/{self.round + 1}/ready/"
        kvs, _ = self.rdv.client.range(base, prefix=True)
        others = sorted(kv.key[len(base):] for kv in kvs if kv.key[len(base):] != self.addr)
        if not others:
            return None
        return (f"host {others[0]} began round {self.round + 1} of {self.rdv.where} (it stopped its processes "
                "after a failure): this host stops its processes and joins the round (--max_restarts)")

    def _run(self):
        while not self._stopped.wait(_READ_EVERY_S):
            try:
                self.check()
            except RendezvousError:
                pass  # the keepalive thread says etcd is down; training goes on meanwhile


class ElasticMonitor:
    """What ``launch`` polls in an elastic job formed through etcd: the membership
    monitor's change (a lost server host, this host cut off), else the slots' MIN.
    ``slots`` is read by ``fleet.launch.elastic.ElasticPolicy``.

    Thread-safety: ``poll`` and ``etcd_down`` from any thread.
    """

    def __init__(self, membership, slots):
        self.membership = membership
        self.slots = slots

    def poll(self):
        """The change that ends the job, as a sentence, or None. Never blocks."""
        return self.membership.poll() or self.slots.poll()

    def etcd_down(self):
        """(seconds since, the error) while etcd does not answer, else None."""
        return self.membership.etcd_down()

    def cut_off(self):
        """True once etcd answered that this host's own lease is gone. Never blocks."""
        return self.membership.cut_off()

    def lost_hosts(self):
        """The lost member hosts that ran servers, in the order seen. Never blocks."""
        return self.membership.lost_hosts()

    def why_lost(self, addr):
        """How a lost member was lost ("" if it was not). Never blocks."""
        return self.membership.why_lost(addr)


def describe_slots(slots):
    """E.g. "slot 0: live on 10.0.0.1; slot 2: free" for messages and tests."""
    return "; ".join(f"slot {s.index}: {s.state or 'never taken'}" + (f" on {s.addr}" if s.addr else "")
                     for s in slots)


def slot_endpoints(me, plan, high, start_port):
    """This host's endpoint for each of the MAX slots: its plan slots keep the plan's
    endpoints; every other slot gets the next port after this host's own offer (ports
    start_port.. hold its servers and offered workers), so a slot taken here later has a
    port no other process here uses.

    Args:
        me: this host's HostRecord. plan: the formed JobPlan. high: MAX.
        start_port: the --start_port its record's endpoints start at.

    Returns:
        A tuple of ``high`` "addr:port" endpoints, slot j's at j.
    """
    mine = {j: e for j, e in enumerate(plan.workers) if _addr(e) == me.addr}
    port = start_port + len(me.servers) + len(me.workers)
    endpoints = []
    for j in range(high):
        if j in mine:
            endpoints.append(mine[j])
        else:
            endpoints.append(join_endpoint(me.addr, port))
            port += 1
    return tuple(endpoints)
