"""The server side of elastic jobs (``fleet.elastic``): the work queue and its wire ops.

``WorkQueue`` hands out the data of each pass in work units: a byte range
``[start, end)`` of one file, the lines whose first byte lies in it (a line that starts
before ``start`` belongs to the unit before). Workers take units on request, one at a time,
and acknowledge each once its batches were trained and their updates were on the servers.
A lost worker's units that were taken but not acknowledged go back to the front of the
queue, so the next worker that asks takes them: the lost worker's unfinished share is
split among the workers still training (a replacement or a newly joined worker takes units
like any other). A pass ends for a worker once every unit of the pass is acknowledged;
until then a worker with nothing to take is told to wait, because a lost worker's units
may still come back.

Counting: every unit is acknowledged exactly once (a late acknowledgement of a unit that
was handed to another worker is refused as stale), so the acknowledged examples of a pass
are its examples, none skipped. Examples are trained twice only within units a lost
worker held when it was lost: at most the units one worker may hold at once (the dataset
holds at most ``2 x threads``) times the unit size.

Checkpoints: the worker that checkpoints asks server 0 (``units_status`` with meta
``mine``) which units of the pass it is in were acknowledged, *before* the save reads the
servers' state, so the save holds every one of their updates; the manifest keeps the list
(``work_units``). A server that loads such a checkpoint restores it into the first pass
opened afterwards (the resumed epoch), if that pass is over the same files cut the same
way: those units count as acknowledged (by worker ``RESTORED``) and are not handed out
again, so a restarted elastic job trains again only what came after the checkpoint.

``ElasticOps`` is the mixin of ``ParameterServer`` that answers the ops of elastic jobs:
``join``, ``units_open``, ``units_take``, ``units_ack``, ``units_status`` and ``reduce``
(the elastic replacement of the workers' ring for ``fleet.metrics``). Server 0 holds the
work queue and the reductions.

Thread-safety: one thread (the server's handler) calls everything here.
"""
import collections
import logging

import numpy as np

from fleet.errors import DataError, FleetError

log = logging.getLogger("fleet.server")

_REDUCE_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
RESTORED = -1  # the "worker" of units acknowledged before the checkpoint a job resumed from


def _pass_of(req):
    value = req.meta.get("pass", -1)
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


class _Pass:
    """The units of one pass and who holds or acknowledged each."""

    def __init__(self, pass_id, files, unit_bytes, opened_by):
        self.id = pass_id
        self.files = [(str(path), int(size)) for path, size in files]
        self.unit_bytes = int(unit_bytes)
        self.opened_by = opened_by
        self.units = []
        for path, size in self.files:
            start = 0
            while start < size:
                end = min(size, start + self.unit_bytes)
                self.units.append((path, start, end))
                start = end
        self.pending = collections.deque(range(len(self.units)))
        self.held = {}  # unit -> worker
        self.acked = {}  # unit -> (worker, examples)
        self.returned = []  # (unit, worker) given back because the worker was lost
        self.stale_acks = 0

    def done(self):
        return len(self.acked) == len(self.units)

    def status(self):
        per_worker = {}
        restored = {"units": 0, "examples": 0}
        for worker, examples in self.acked.values():
            entry = restored if worker == RESTORED else per_worker.setdefault(str(worker), {"units": 0, "examples": 0})
            entry["units"] += 1
            entry["examples"] += int(examples)
        returned_bytes = sum(self.units[u][2] - self.units[u][1] for u, _ in self.returned)
        held_by = {}
        for worker in self.held.values():
            held_by[str(worker)] = held_by.get(str(worker), 0) + 1
        return {"pass": self.id, "units": len(self.units), "pending": len(self.pending), "held": len(self.held),
                "held_by": held_by,
                "acked": len(self.acked), "examples": sum(int(e) for _, e in self.acked.values()),
                "workers": per_worker, "returned_units": len(self.returned), "returned_bytes": returned_bytes,
                "returned_from": sorted({w for _, w in self.returned}), "stale_acks": self.stale_acks,
                "restored": restored,
                "done": self.done(), "unit_bytes": self.unit_bytes}


    def checkpoint_record(self):
        """What a checkpoint keeps of this pass: {"files", "unit_bytes", "units",
        "acked": [[unit, examples], ...]} (the units acknowledged so far)."""
        return {"files": [list(f) for f in self.files], "unit_bytes": self.unit_bytes, "units": len(self.units),
                "acked": [[u, int(e)] for u, (_, e) in sorted(self.acked.items())]}

    def restore(self, record):
        """Marks the units ``record`` (a ``checkpoint_record()`` in a checkpoint) lists as
        acknowledged by RESTORED. Returns why it cannot, or None once done."""
        if [list(f) for f in self.files] != record.get("files") or self.unit_bytes != record.get("unit_bytes"):
            return (f"the checkpoint's pass was over {len(record.get('files') or [])} files "
                    f"({_head(record.get('files') or [])}) in units of {record.get('unit_bytes')} bytes, this one "
                    f"over {len(self.files)} files ({_head(self.files)}) in units of {self.unit_bytes} bytes")
        units = [(u, e) for u, e in record.get("acked") or []
                 if isinstance(u, int) and 0 <= u < len(self.units) and isinstance(e, int) and e >= 0]
        for unit, examples in units:
            self.acked[unit] = (RESTORED, examples)
        done = {u for u, _ in units}
        self.pending = collections.deque(u for u in self.pending if u not in done)
        return None


class WorkQueue:
    """Work units of every pass of an elastic job (see the module docstring)."""

    def __init__(self):
        self.passes = {}
        self.progress = {}  # worker -> the newest pass it opened
        self.resume = None  # the progress of the pass a loaded checkpoint was taken in

    def progress_of(self, worker):
        """``_Pass.checkpoint_record()`` of the newest pass ``worker`` opened, or None."""
        current = self.passes.get(self.progress.get(worker, -1))
        return None if current is None else current.checkpoint_record()

    def restore(self, record):
        """Keeps a checkpoint's ``work_units`` record for the next pass opened (the
        resumed epoch's). Raises DataError for a record fleet did not write."""
        if not (isinstance(record, dict) and isinstance(record.get("files"), list)
                and isinstance(record.get("acked"), list)):
            raise DataError(f"the checkpoint's work_units {str(record)[:200]!r} is not a record of acknowledged "
                            f"work units ({{'files', 'unit_bytes', 'acked'}})")
        self.resume = record

    def open(self, worker, pass_id, files, unit_bytes):
        """Opens pass ``pass_id`` over ``files`` ([[path, size in bytes], ...]); the first
        worker to open a pass makes its units, the others must give the same files.

        Returns:
            The pass's status dict.

        Raises:
            DataError: a malformed request, or files that differ from the pass's (names both).
        """
        if not isinstance(pass_id, int) or isinstance(pass_id, bool) or pass_id < 0:
            raise DataError(f"units_open needs meta 'pass' (an int >= 0); got {pass_id!r}")
        if not isinstance(files, list) or not all(
                isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) and isinstance(f[1], int)
                and f[1] >= 0 for f in files):
            raise DataError("units_open needs meta 'files': a list of [path, size in bytes]")
        if not isinstance(unit_bytes, int) or isinstance(unit_bytes, bool) or unit_bytes < 1:
            raise DataError(f"units_open needs meta 'unit_bytes' (an int >= 1); got {unit_bytes!r}")
        self.progress[worker] = max(pass_id, self.progress.get(worker, -1))
        current = self.passes.get(pass_id)
        if current is None:
            current = self.passes[pass_id] = _Pass(pass_id, files, unit_bytes, worker)
            log.info("work queue: worker %d opened pass %d: %d files, %d units of up to %d bytes", worker, pass_id,
                     len(files), len(current.units), unit_bytes)
            self._resume_into(current)
        elif [list(f) for f in current.files] != files:
            raise DataError(
                f"worker {worker} opened pass {pass_id} over {len(files)} files ({_head(files)}), but worker "
                f"{current.opened_by} opened it over {len(current.files)} files ({_head(current.files)}): in an "
                f"elastic job every worker gives train_from_dataset the same file list (fleet.split_files returns "
                f"the whole list), and the work queue splits it")
        return current.status()

    def _resume_into(self, current):
        record, self.resume = self.resume, None
        if record is None:
            return
        why = current.restore(record)
        if why is not None:
            log.warning("work queue: pass %d does not resume the checkpoint's pass, so it is trained whole: %s",
                        current.id, why)
            return
        restored = current.status()["restored"]
        log.info("work queue: pass %d resumes the checkpoint's pass: %d of its %d units (%d examples) were "
                 "acknowledged before the checkpoint and are not handed out again", current.id, restored["units"],
                 len(current.units), restored["examples"])

    def _pass(self, pass_id, op):
        current = self.passes.get(pass_id)
        if current is None:
            raise DataError(f"{op}: pass {pass_id!r} was not opened (units_open first)")
        return current

    def take(self, worker, pass_id):
        """Hands ``worker`` the next unit of the pass.

        Returns:
            {"unit": i, "path", "start", "end"}, or {"wait": True} while units are held by
            other workers, or {"done": True} once every unit is acknowledged.
        """
        current = self._pass(pass_id, "units_take")
        if current.pending:
            unit = current.pending.popleft()
            current.held[unit] = worker
            path, start, end = current.units[unit]
            return {"unit": unit, "path": path, "start": start, "end": end}
        if current.done():
            return {"done": True}
        return {"wait": True}

    def ack(self, worker, pass_id, unit, examples):
        """Records that ``worker`` trained ``unit`` (``examples`` examples).

        Returns:
            True, or False for a stale acknowledgement (the unit is not held by this worker:
            it was handed to another after this one was taken for lost).
        """
        current = self._pass(pass_id, "units_ack")
        if not isinstance(unit, int) or not 0 <= unit < len(current.units):
            raise DataError(f"units_ack: pass {pass_id} has units 0..{len(current.units) - 1}; got {unit!r}")
        if not isinstance(examples, int) or examples < 0:
            raise DataError(f"units_ack needs meta 'examples' (an int >= 0); got {examples!r}")
        if current.held.get(unit) != worker:
            current.stale_acks += 1
            return False
        del current.held[unit]
        current.acked[unit] = (worker, examples)
        return True

    def release(self, worker):
        """Puts every unit ``worker`` holds back at the front of its pass's queue.

        Returns:
            The number of units given back.
        """
        count = 0
        for current in self.passes.values():
            mine = sorted(u for u, w in current.held.items() if w == worker)
            for unit in reversed(mine):
                del current.held[unit]
                current.pending.appendleft(unit)
                current.returned.append((unit, worker))
            count += len(mine)
        return count

    def status(self):
        """{pass id: status dict} of every pass."""
        return {str(p): current.status() for p, current in sorted(self.passes.items())}


def _head(files):
    shown = [f[0] for f in files[:2]]
    return ", ".join(shown) + (f", ... {len(files) - 2} more" if len(files) > 2 else "") if shown else "none"


class ElasticOps:
    """The ops of an elastic job, mixed into ``ParameterServer`` (which sets ``elastic``,
    ``live``, ``stopped``, ``lost`` and ``workers`` and calls ``_init_elastic``)."""

    def _init_elastic(self):
        self.work = WorkQueue()
        self._reduce = {}  # worker -> parked reduce request

    def _need_elastic(self, op):
        if self.elastic is None:
            raise DataError(f"{op!r} is an op of elastic jobs (FLEET_ELASTIC, fleetrun --np); this job is not elastic")

    def _elastic_seen(self, req):
        """Called for every request of an elastic job: a worker id heard for the first time
        joins; a forgotten (lost) one is refused until it joins again.

        Raises:
            FleetError: a request from a worker the servers forgot, but ``join``.
        """
        w = req.worker
        if w in self.lost:
            if req.op not in ("join", "stop", "fail", "pull_dense", "pull_sparse"):
                raise FleetError(
                    f"worker {w} was lost ({self.lost[w]}) and the servers forgot it; its unacknowledged work "
                    f"went to the other workers. A replacement process takes this id by calling "
                    f"fleet.init_worker()")
            return
        if (w not in self.live and w not in self.stopped and 0 <= w
                and req.op not in ("pull_dense", "pull_sparse", "units_status")):
            self.live.add(w)
            log.info("server %s: worker %d joined (%d training)", self.endpoint, w, len(self.live - self.stopped))

    def _op_join(self, req):
        """A worker process (new, or a replacement taking a lost worker's id) joins: the id
        counts as live, and whatever a previous process of this id held is released."""
        self._need_elastic("join")
        w = req.worker
        if w in self.stopped:
            raise DataError(f"worker id {w} already finished (it called fleet.stop_worker()); a joining worker "
                            f"takes an id that never ran or was lost")
        previous = self.lost.pop(w, None)
        self.live.add(w)
        released = self.work.release(w)
        for parked in (self._barrier, self._exchange, self._reduce):
            parked.pop(w, None)
        if previous is not None or released:
            log.warning("server %s: worker %d joined again as a replacement (%d of its units went back to the "
                        "queue)", self.endpoint, w, released)
        req.reply(meta={"live": sorted(self.live - self.stopped)})

    def _forget_worker(self, worker, reason):
        """Elastic: forgets a lost worker instead of failing the job; its units go back to
        the queue and every wait that counted it is checked again."""
        self.lost[worker] = reason
        self.live.discard(worker)
        released = self.work.release(worker)
        for parked in (self._barrier, self._exchange, self._reduce):
            parked.pop(worker, None)
        log.warning("server %s: worker %d was lost: %s; the servers forget it (elastic job): %d of its work units "
                    "go back to the queue, %d workers still training", self.endpoint, worker, reason, released,
                    len(self.live - self.stopped))
        self._membership_changed()

    def _membership_changed(self):
        """Re-checks every wait that counts the live workers (a worker stopped or was lost)."""
        self._apply_pending()
        self._maybe_release_barrier()
        self._maybe_release_exchange()
        self._maybe_release_reduce()

    def _op_units_open(self, req):
        self._need_elastic("units_open")
        meta = req.meta
        req.reply(meta=self.work.open(req.worker, meta.get("pass"), meta.get("files"), meta.get("unit_bytes")))

    def _op_units_take(self, req):
        self._need_elastic("units_take")
        req.reply(meta=self.work.take(req.worker, req.meta.get("pass")))

    def _op_units_ack(self, req):
        self._need_elastic("units_ack")
        meta = req.meta
        ok = self.work.ack(req.worker, meta.get("pass"), meta.get("unit"), meta.get("examples"))
        req.reply(meta={"accepted": ok})

    def _op_units_status(self, req):
        """The work queue's figures: meta ``passes`` ({pass: status}) and ``live``; with
        meta ``mine`` true also ``mine``: the progress of the newest pass the asking worker
        opened (what a checkpoint keeps), or None."""
        self._need_elastic("units_status")
        meta = {"passes": self.work.status(), "live": sorted(self.live - self.stopped),
                "lost": {str(w): why for w, why in self.lost.items()}}
        if req.meta.get("mine"):
            meta["mine"] = self.work.progress_of(req.worker)
        req.reply(meta=meta)

    def _op_reduce(self, req):
        """Element-wise sum, max or min (meta ``reduce``) of one array over the live workers:
        parked until every worker still training sent its array (a worker lost meanwhile
        is left out). Answers the result and meta ``workers`` (how many contributed)."""
        self._need_elastic("reduce")
        op = req.meta.get("reduce")
        if op not in _REDUCE_OPS or len(req.arrays) != 1:
            raise DataError(f"reduce needs meta 'reduce' in {sorted(_REDUCE_OPS)} and one array; got {op!r}, "
                            f"{len(req.arrays)} arrays")
        if req.worker in self._reduce:
            raise DataError(f"worker {req.worker} sent a second reduce before the first completed")
        req.defer()
        self._reduce[req.worker] = req
        self._maybe_release_reduce()

    def _release_keyed(self, parked, answer):
        """Answers parked requests (barriers, reductions) in groups by the pass their
        worker was in (meta ``pass``: the newest pass it opened, -1 before any): a group
        is complete once every worker still training sent one with that pass or opened a
        later pass. So a worker that joins in a later pass goes through the calls of the
        passes it missed (its passes there are empty) without holding up the others, and
        the others do not wait for it there."""
        for key in sorted({_pass_of(r) for r in parked.values()}):
            group = {w: r for w, r in parked.items() if _pass_of(r) == key}
            if all(w in group or self.work.progress.get(w, -1) > key for w in self.live - self.stopped):
                for w in group:
                    del parked[w]
                answer([group[w] for w in sorted(group)])

    def _maybe_release_reduce(self):
        if self._reduce:
            self._release_keyed(self._reduce, self._answer_reduce)

    def _answer_reduce(self, reqs):
        shapes = {(r.arrays[0].shape, r.arrays[0].dtype.str, r.meta.get("reduce")) for r in reqs}
        if len(shapes) != 1:
            text = "; ".join(f"worker {r.worker}: {r.meta.get('reduce')} of {r.arrays[0].dtype}{list(r.arrays[0].shape)}"
                             for r in reqs)
            for r in reqs:
                r.reply_error(f"the workers reduced different arrays ({text}): every worker must make the same "
                              f"fleet.metrics calls in the same order")
            return
        fn = _REDUCE_OPS[reqs[0].meta["reduce"]]
        out = np.array(reqs[0].arrays[0], copy=True)
        for r in reqs[1:]:
            out = fn(out, r.arrays[0])
        for r in reqs:
            r.reply(names=["result"], arrays=[out], meta={"workers": len(reqs)})
