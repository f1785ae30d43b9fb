"""A formed job's membership in etcd: its lease kept alive, its keys watched.

Started by ``fleet.launch.etcd_rendezvous.Rendezvous.join`` once the job formed. A
keepalive thread renews this host's lease every TTL/3 s and says when etcd stops and starts
answering; a watch thread reads the job's keys and records the first membership change: a
member whose ``hosts/`` key disappears without its ``done/`` record (lease expired: host
lost or fleetrun killed), or whose ``done/`` record is a non-zero exit code; in an elastic job
(``--np``) only a member that runs a server counts (a host of workers only frees its
worker slots and ``fleet.launch.etcd_slots`` enforces MIN). fleetrun polls
:meth:`MembershipMonitor.poll` every 50 ms and ends the job on a change.

Thread-safety: ``poll`` and ``etcd_down`` may be called from any thread.
"""
from __future__ import annotations

import threading
import time

from fleet.errors import RendezvousError
from fleet.launch.report import say

TTL_ENV = "PADDLE_ELASTIC_TTL"
_RETRY_WATCH_S = 1.0


class KeepAlive(threading.Thread):
    """Renews a lease every ttl/3 s; says (once each) when etcd stops and starts answering.

    Args:
        client: the job's EtcdClient.
        lease: the lease id to renew.
        ttl: the lease's seconds.
        where: "job J at etcd E", for messages.

    Attributes (read under ``lock``):
        down_since: wall time etcd stopped answering, None while it answers.
        down_error: the error of the first call that got no answer.
        expired: etcd answered that the lease is gone (expired while etcd was unreachable
            from here, or revoked).

    Thread-safety: ``stop`` from any thread; the attributes under ``lock``.
    """

    def __init__(self, client, lease, ttl, where):
        super().__init__(name="etcd-keepalive", daemon=True)
        self.client = client
        self.lease = lease
        self.period = max(ttl / 3.0, 0.2)
        self.where = where
        self.lock = threading.Lock()
        self.down_since = None   # wall time etcd last stopped answering, None while it answers
        self.down_error = None
        self.expired = False
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.wait(self.period):
            try:
                ttl = self.client.keepalive(self.lease)
            except RendezvousError as e:
                with self.lock:
                    first = self.down_since is None
                    if first:
                        self.down_since, self.down_error = time.time(), str(e)
                if first:
                    say(f"{e}. Training goes on (nothing in training talks to etcd); a host "
                        "lost or joining meanwhile ends the job")
                continue
            with self.lock:
                was_down, self.down_since = self.down_since, None
                self.expired = ttl <= 0
            if was_down is not None:
                say(f"etcd at {self.client.endpoint} answers again after {time.time() - was_down:.1f} s")

    def stop(self):
        """Stop renewing (the thread ends within one period). Never blocks."""
        self._stop_event.set()


class MembershipMonitor:
    """Watches a formed job's keys in etcd; says when its membership changed.

    Started by ``Rendezvous.join``. Reads events on a thread of its own; a broken watch
    (etcd gone) is re-opened every second from the last revision seen, so no change made
    while it was broken is missed.

    Args:
        rendezvous: the Rendezvous whose job it watches (client, prefix, ttl, where).
        plan: the formed JobPlan.
        revision: the store's revision at which the plan was read; events after it count.
        keepalive: the running KeepAlive of this host's lease.
    """

    def __init__(self, rendezvous, plan, revision, keepalive):
        self.rdv = rendezvous
        self.plan = plan
        self.keepalive = keepalive
        self._members = {m.addr for m in plan.members
                         if getattr(rendezvous, "elastic", None) is None or m.servers}
        self._done = {}
        self._lost = []   # member addresses lost or left failing, in the order seen
        self._why = {}    # address -> how it was lost, e.g. "its fleetrun exited 1"
        self._change = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watch = None
        self._revision = revision
        self._thread = threading.Thread(target=self._run, name="etcd-watch", daemon=True)
        self._thread.start()

    def poll(self):
        """The membership change seen so far, as a sentence, or None. Never blocks."""
        with self._lock:
            if self._change is None and self.keepalive.expired:
                self._change = (f"this host's registration in {self.rdv.where} expired (its lease "
                                f"was not renewed within {self.rdv.ttl} s, {TTL_ENV}), so the "
                                "other hosts count it as lost")
            return self._change

    def lost_hosts(self):
        """The member addresses seen lost (lease expired) or leaving with a non-zero exit
        code, in the order seen. Never blocks."""
        with self._lock:
            return list(self._lost)

    def why_lost(self, addr):
        """How a lost member was lost, e.g. "its fleetrun exited 1" ("" if it was not). Never blocks."""
        with self._lock:
            return self._why.get(addr, "")

    def cut_off(self):
        """True once etcd answered that this host's own lease is gone. Never blocks."""
        return self.keepalive.expired

    def etcd_down(self):
        """(seconds since, the error) while etcd does not answer, else None."""
        with self.keepalive.lock:
            if self.keepalive.down_since is None:
                return None
            return time.time() - self.keepalive.down_since, self.keepalive.down_error

    def stop(self):
        """Stop watching and renewing. Blocks up to about a second."""
        self.stop_watching()
        self.keepalive.stop()

    def stop_watching(self):
        """Stop watching but go on renewing the lease (a new round of the job watches
        with a monitor of its own). Blocks up to about a second."""
        self._stopped.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        self._thread.join(timeout=1.0)

    def _run(self):
        client, prefix = self.rdv.client, self.rdv.prefix
        while not self._stopped.is_set():
            try:
                self._watch = client.watch(prefix, prefix=True, start_revision=self._revision + 1)
                if self._stopped.is_set():
                    self._watch.close()
                    return
                for batch, revision in self._watch.events():
                    for event in batch:
                        self._on_event(event)
                    self._revision = revision
            except RendezvousError:
                pass  # the keepalive thread says etcd is down; retry the watch
            self._stopped.wait(_RETRY_WATCH_S)

    def _on_event(self, event):
        prefix = self.rdv.prefix
        key = event.kv.key
        if key.startswith(prefix + "done/") and event.kind == "PUT":
            addr = key[len(prefix + "done/"):]
            self._done[addr] = event.kv.value
            if addr in self._members and event.kv.value != "0":
                self._set(addr, f"host {addr} ({self.plan.ranks_of(addr)}) left {self.rdv.where}: its "
                          f"fleetrun exited {event.kv.value}", f"its fleetrun exited {event.kv.value}")
        elif key.startswith(prefix + "hosts/") and event.kind == "DELETE":
            addr = key[len(prefix + "hosts/"):]
            if addr in self._members and addr not in self._done:
                self._set(addr, f"host {addr} ({self.plan.ranks_of(addr)}) was lost from "
                          f"{self.rdv.where}: its registration expired (no keepalive for "
                          f"{self.rdv.ttl} s: the host is down, cut off, or its fleetrun was "
                          "killed); only --max_restarts re-forms the job without it",
                          f"its registration expired (no keepalive for {self.rdv.ttl} s)")

    def _set(self, addr, change, why):
        with self._lock:
            if addr not in self._lost:
                self._lost.append(addr)
                self._why[addr] = why
            if self._change is None:
                self._change = change
