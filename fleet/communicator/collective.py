"""The collective strategy's communicator: no servers; the workers exchange gradients.

Every worker keeps every parameter and runs the optimizer ops itself. The worker program's
``c_allreduce_grads`` op (``fleet.transpiler.collective_program``) calls
``all_reduce_grads`` once per step, after the worker's threads were combined: one
``all_reduce`` (sum) of every dense gradient of the step at once, then the sum scaled by
1 / workers; the rows of sparse gradients are merged on each worker (each row once, its
values summed), all-gathered (one int64 and one float32 array per worker: counts and row
ids, values) and concatenated in rank order, values scaled the same way. Every worker
then holds the same gradients bit for bit (the group's reduction order is the same
everywhere) and applies the same update, so parameters stay identical on every worker.
``c_broadcast_params`` (the startup program's last op) gives every worker rank 0's
initial values.

Ends of passes (unequal shards): the dense all-reduce carries one more value per worker,
its flag (and a checksum slot): 1 = this worker ran a step, 0 = its pass is over (``end_pass``) or it stopped
(``stop_worker``), 2 = it failed. Every worker sees every flag in the same round. When all
are 1 the step is applied; otherwise nobody applies it: in ``train_from_dataset`` the
workers that ran a step end their pass there (``EndOfPass``: every worker stops at the
shortest shard, the step computed on the longer shards is dropped and the learning-rate
counter's increment taken back); in an ``exe.run`` loop a worker that still runs steps
after another stopped gets a ConfigError naming it; a failed worker makes the others
raise a TransportError naming it. A worker that dies without a word is named by the
group's heartbeats (``fleet.transport.group``). The final round (``stop_worker``) carries
each worker's CRC32 of its all-reduced parameters: they must be equal (else DataError).

``GroupSteps`` holds this logic for the collective communicator and for the hybrid one
(``fleet.communicator.hybrid``), which all-reduces its dense gradients the same way and
sends its tables' gradients to the servers.

Thread-safety: the ops run from the one thread that runs a step's optimize phase (the
trainer combines its threads first); ``exe.run`` of a collective program from several
threads at once is not supported (the rounds of different threads would mix).
"""
import logging
import zlib

import numpy as np

from fleet.communicator.api import CommunicatorAPI, register
from fleet.errors import ConfigError, DataError, FleetError, ServerError, TransportError
from fleet.framework.hooks import EndOfPass
from fleet.framework.tensor import SparseRows

log = logging.getLogger("fleet")

STEP, FINISHED, FAILED = 1, 0, 2
_WIRE_DTYPES = (np.float32, np.float64, np.int32, np.int64)


def _ranks(ranks):
    return ("worker " if len(ranks) == 1 else "workers ") + ", ".join(map(str, ranks))


class GradientExchange:
    """One worker's side of the per-step exchange (see the module docstring).

    Args:
        group: the worker group (``fleet.transport.group.WorkerGroup``).
    """

    def __init__(self, group):
        self.group = group
        self.size = int(group.size)
        self.rank = int(group.rank)

    def round(self, layout, values, flag, checksum=0):
        """One round: this worker's ``flag`` and, for a step, its gradients.

        Args:
            layout: the op's attributes (``params``, ``shapes``, ``sparse``).
            values: the step's gradients, in layout order (None when ``flag`` is not STEP).
            flag: STEP, FINISHED or FAILED.
            checksum: a 32-bit value every worker sees (the final round's CRC32 of the
                parameters), carried exactly as two 16-bit halves.

        Returns:
            (flags of every worker as a numpy int array, the mean gradients in layout order,
            or None when not every worker ran a step). ``self.checksums`` then holds every
            worker's checksum.

        Blocks until every worker took part (bounded by the group's timeout).
        """
        shapes = [tuple(s) for s in layout["shapes"]]
        sparse = list(layout["sparse"])
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        dense = [i for i, s in enumerate(sparse) if not s]
        total = sum(sizes[i] for i in dense)
        buf = np.zeros(total + 3 * self.size, dtype=np.float32)
        if flag == STEP:
            offset = 0
            for i in dense:
                value = values[i]
                if value is not None:
                    if isinstance(value, SparseRows):
                        value = value.to_dense()
                    flat = np.asarray(value, dtype=np.float32).reshape(-1)
                    if flat.size != sizes[i]:
                        raise DataError(f"gradient of {layout['params'][i]!r} has {flat.size} values, expected "
                                        f"{sizes[i]} (shape {list(shapes[i])})")
                    buf[offset:offset + sizes[i]] = flat
                offset += sizes[i]
        buf[total + 3 * self.rank:total + 3 * self.rank + 3] = (flag, checksum >> 16, checksum & 0xFFFF)
        out = self.group.all_reduce(buf, op="sum")
        tail = np.rint(out[total:]).astype(np.int64).reshape(self.size, 3)
        flags = tail[:, 0]
        self.checksums = [int(hi) << 16 | int(lo) for hi, lo in tail[:, 1:]]
        if flag != STEP or (flags != STEP).any():
            return flags, None
        scale = np.float32(1.0 / self.size)
        result = [None] * len(sizes)
        offset = 0
        for i in dense:
            part = out[offset:offset + sizes[i]]
            part *= scale
            result[i] = part.reshape(shapes[i])
            offset += sizes[i]
        tables = [i for i, s in enumerate(sparse) if s]
        if tables:
            self._gather_rows(tables, shapes, values, result, scale)
        return flags, result

    def _gather_rows(self, tables, shapes, values, result, scale):
        counts, rows, vals = [], [], []
        for i in tables:
            height, width = shapes[i][0], int(np.prod(shapes[i][1:], dtype=np.int64))
            value = values[i]
            if value is None:
                r, v = np.empty(0, np.int64), np.empty((0, width), np.float32)
            elif isinstance(value, SparseRows):
                if not value.unique:  # each row once: the all-gather carries a fifth as much for CTR-DNN
                    value = value.merged()
                r = np.asarray(value.rows, dtype=np.int64).reshape(-1)
                v = np.asarray(value.values, dtype=np.float32).reshape(len(r), width)
            else:  # a table whose lookup was not sparse: every row
                r = np.arange(height, dtype=np.int64)
                v = np.asarray(value, dtype=np.float32).reshape(height, width)
            counts.append(len(r))
            rows.append(r)
            vals.append(v.reshape(-1))
        ints = np.concatenate([np.asarray(counts, dtype=np.int64)] + rows)
        floats = np.concatenate(vals) if vals else np.empty(0, np.float32)
        got_ints = self.group.all_gather(ints)
        got_floats = self.group.all_gather(np.ascontiguousarray(floats, dtype=np.float32))
        per_table = {i: ([], []) for i in tables}
        for r_ints, r_floats in zip(got_ints, got_floats):
            n = len(tables)
            r_counts = r_ints[:n]
            row_at, val_at = n, 0
            for k, i in enumerate(tables):
                width = int(np.prod(shapes[i][1:], dtype=np.int64))
                c = int(r_counts[k])
                per_table[i][0].append(r_ints[row_at:row_at + c])
                per_table[i][1].append(r_floats[val_at:val_at + c * width].reshape(c, width))
                row_at += c
                val_at += c * width
        for i in tables:
            r = np.concatenate(per_table[i][0])
            v = np.concatenate(per_table[i][1])
            v *= scale
            result[i] = SparseRows(r, v.reshape((len(r),) + tuple(shapes[i][1:])), shapes[i][0])


class GroupSteps:
    """The worker-group half of the collective and hybrid communicators: the per-step
    exchange, the initial broadcast, pass ends and the final round (module docstring).

    Subclasses call ``_init_group(make_group, who)`` in their constructor, ``start_group()``
    from ``start`` and ``stop_group()`` from ``stop``.
    """

    uses_worker_group = True
    requires_thread_barrier = True
    allows_split_batches = True

    def _init_group(self, make_group, who, scope=None):
        if make_group is None:
            raise ConfigError(f"the {self.mode} communicator needs the workers' group (PADDLE_TRAINER_ENDPOINTS)")
        self._make_group = make_group
        self.group = None
        self.exchange = None
        self.layout = None
        self._pending_broadcast = None
        self._in_pass = False
        self._rounds = 0
        self._pass_over = False
        self._failure = None  # a group error seen: no more rounds are possible
        self._failed_announced = False
        self.who = who
        self.rounds = 0
        self._scope = scope

    # ------------------------------------------------------------------ lifecycle
    def start_group(self):
        """Joins the worker group (blocks until every worker answered, bounded), then runs
        the broadcast of a startup program that ran before."""
        if self.group is None:
            self.group = self._make_group()
            self.exchange = GradientExchange(self.group)
        pending, self._pending_broadcast = self._pending_broadcast, None
        if pending is not None:
            self.broadcast_params(*pending)

    def stop_group(self):
        """The final round (FINISHED: a worker still running steps is told), then leaves
        the group. Blocks (bounded); idempotent."""
        group = self.group
        if group is None:
            return
        try:
            if self._failure is None and not self._failed_announced and self.layout is not None:
                flags, _ = self._round(None, FINISHED, self._checksum())
                self._check_identical(flags)
        finally:
            self.group = None
            group.close()

    def _checksum(self):
        """CRC32 of the all-reduced parameters' values in this worker's scope."""
        crc = 0
        for name in self.layout["params"]:
            value = self._scope.value(name) if self._scope is not None else None
            if isinstance(value, np.ndarray):
                crc = zlib.crc32(np.ascontiguousarray(value).view(np.uint8), crc)
        return crc

    def _check_identical(self, flags):
        """After the final round of workers that all stopped: their parameters must be
        bit-identical (the all-reduce promises it); checked by CRC32.

        Raises:
            DataError: they differ (names the workers and their checksums).
        """
        sums = self.exchange.checksums
        if (flags != FINISHED).any() or self._scope is None:
            return
        if len(set(sums)) > 1:
            raise DataError(f"{self.who}: the all-reduced parameters differ between the workers at the end "
                            f"(CRC32 {', '.join(f'worker {r}: {c:08x}' for r, c in enumerate(sums))}); they "
                            f"must be identical: check that every worker runs the same program")
        log.info("fleet: %s: the %d all-reduced parameters are identical on every worker (CRC32 %08x)",
                 self.who, len(self.layout["params"]), sums[0])

    def set_layout(self, layout):
        """The gradients each step exchanges: the ``c_allreduce_grads`` op's attributes
        (``params``, ``shapes``, ``sparse``, ``undo_increments``), from the program."""
        self.layout = dict(layout)

    def _need_group(self, what):
        if self.group is None:
            raise ConfigError(f"{what} needs the other workers: call fleet.init_worker() first")

    def _round(self, values, flag, checksum=0):
        try:
            return self.exchange.round(self.layout, values, flag, checksum)
        except (FleetError, OSError) as e:
            self._failure = e
            raise

    # ------------------------------------------------------------------ steps
    def all_reduce_grads(self, layout, values, scope):
        """The mean over the workers of this step's gradients (``c_allreduce_grads``).

        Returns:
            The gradients in ``layout["params"]`` order.

        Raises:
            EndOfPass: in a pass, another worker's pass is over; this step is not applied
                (its learning-rate increment in ``scope`` is taken back).
            ConfigError: outside a pass, another worker stopped (names it).
            TransportError: another worker failed (names it), or the group's error.
        """
        self._need_group("training a collective step")
        if self._failure is not None:
            raise self._failure
        self.layout = dict(layout)
        flags, reduced = self._round(values, STEP)
        if reduced is not None:
            self._rounds += 1
            self.rounds += 1
            return reduced
        for name, step in layout.get("undo_increments", ()):
            counter = scope.value(name)
            if isinstance(counter, np.ndarray):
                counter -= np.asarray(step).astype(counter.dtype)
        failed = [r for r, f in enumerate(flags) if f == FAILED]
        ended = [r for r, f in enumerate(flags) if f == FINISHED]
        if failed:
            self._failure = TransportError(
                f"{self.who}: {_ranks(failed)} failed (its log says why), so this worker stops too")
            raise self._failure
        if self._in_pass:
            self._pass_over = True
            log.info("fleet: %s: %s ran out of data; every worker ends this pass at the shortest shard "
                     "(this worker's current batch and the rest of its shard are not trained)",
                     self.who, _ranks(ended))
            raise EndOfPass(f"{_ranks(ended)} ran out of data")
        raise ConfigError(
            f"{self.who}: {_ranks(ended)} stopped training (fleet.stop_worker() or the end of a pass) while this "
            f"worker still runs steps: in an exe.run loop every worker must run the same number of steps (give "
            f"every worker as many batches), or train with exe.train_from_dataset, which stops every worker at "
            f"the shortest shard")

    def broadcast_params(self, scope, names):
        """Replaces the values of ``names`` in ``scope`` by rank 0's (``c_broadcast_params``);
        before init_worker() it is remembered and done when the group is joined. Blocks
        (bounded)."""
        if self.group is None:
            self._pending_broadcast = (scope, list(names))
            return
        groups = {}
        for name in names:
            value = scope.value(name)
            if not isinstance(value, np.ndarray):
                continue
            dtype = value.dtype if value.dtype.type in _WIRE_DTYPES else np.dtype(np.int32 if value.dtype.kind in "bui"
                                                                                  else np.float64)
            groups.setdefault(np.dtype(dtype).name, []).append((name, value))
        for dtype in sorted(groups):
            items = groups[dtype]
            flat = np.concatenate([np.asarray(v, dtype=dtype).reshape(-1) for _, v in items])
            got = self.group.broadcast(flat if self.group.rank == 0 else None, root=0)
            if got.size != flat.size:
                raise ConfigError(
                    f"{self.who}: worker 0 broadcast {got.size} {dtype} values for {[n for n, _ in items][:5]}, "
                    f"this worker holds {flat.size}: every worker must build the same program")
            offset = 0
            for name, value in items:
                value[...] = got[offset:offset + value.size].reshape(value.shape).astype(value.dtype)
                offset += value.size
        count = sum(len(v) for v in groups.values())
        if self.group.rank == 0:
            log.info("fleet: %s gave its initial values of %d variables to the other workers", self.who, count)
        else:
            log.info("fleet: %s took worker 0's initial values of %d variables", self.who, count)

    # ------------------------------------------------------------------ coordination
    def group_barrier(self, timeout=None):
        self._need_group("barrier_worker")
        self.group.barrier(timeout_ms=None if timeout is None else int(timeout * 1000))

    def group_all_to_all(self, blobs):
        """Sends blobs[j] to worker j; returns what every worker sent to this one. Every
        worker receives every blob (one all_gather), fine for the sizes of a shuffle's
        index or moderate data."""
        self._need_group("exchanging data between workers")
        lengths = np.array([len(b) for b in blobs], dtype=np.int64)
        payload = b"".join(bytes(b) for b in blobs)
        payload += b"\0" * (-len(payload) % 8)
        mine = np.concatenate([lengths, np.frombuffer(payload, dtype=np.int64)])
        out = []
        for got in self.group.all_gather(mine):
            n = self.group.size
            sizes = got[:n]
            data = got[n:].tobytes()
            start = int(sizes[:self.group.rank].sum())
            out.append(data[start:start + int(sizes[self.group.rank])])
        return out

    # ------------------------------------------------------------------ pass hooks
    def begin_pass(self, threads):
        self._in_pass, self._rounds, self._pass_over = True, 0, False
        super().begin_pass(threads)

    def pass_interrupted(self, error):
        """A thread failed: the others are told FAILED (unless the failure came from them
        or the group), so they stop instead of waiting."""
        if isinstance(error, (TransportError, ServerError)) or isinstance(error, EndOfPass):
            self._pass_over = True
        else:
            self._announce_failure()
        super().pass_interrupted(error)

    def end_pass(self):
        """A pass that ran steps and ended here (not by agreement) says FINISHED once."""
        try:
            if self._in_pass and self._rounds and not self._pass_over and self._failure is None \
                    and not self._failed_announced and self.group is not None:
                self._pass_over = True
                self._round(None, FINISHED)
        finally:
            self._in_pass = False
            super().end_pass()

    def pass_failed(self, error):
        self._announce_failure()
        super().pass_failed(error)

    def _announce_failure(self):
        if self._failed_announced or self._failure is not None or self.group is None or self.layout is None:
            return
        self._failed_announced = True
        try:
            self._round(None, FAILED)
        except Exception as e:  # noqa: BLE001 - the original error is what the caller raises
            log.warning("fleet: %s could not tell the other workers of its error (%s); they learn of it "
                        "when it exits", self.who, e)


@register("collective")
class CollectiveCommunicator(GroupSteps, CommunicatorAPI):
    """Collective training's communicator (see the module docstring).

    Args:
        plan: None (no servers).
        worker_id: this worker's index.
        scope, flags, connect, liveness: accepted for ``make_communicator``; unused.
        make_group: callable returning the joined ``WorkerGroup``.
    """

    def __init__(self, plan, worker_id, scope, flags, connect=None, liveness=None, make_group=None):
        self.plan = plan
        self.worker_id = int(worker_id)
        self.running = False
        self._init_group(make_group, f"worker {self.worker_id}", scope)

    def start(self):
        """Joins the group (bounded)."""
        self.start_group()
        self.running = True

    def flush(self):
        """Nothing is queued: every step's exchange is done when its op returns."""

    def stop(self):
        """The final round, then leaves the group. Idempotent."""
        self.running = False
        self.stop_group()

    def check_alive(self):
        if self._failure is not None:
            raise self._failure

    def prefetch(self, table, ids, is_test=False, shows=None, clicks=None):
        raise ConfigError(f"prefetch reads tables on servers, and a collective job has none (table {table!r} "
                          f"is on every worker)")

    def send(self, grads):
        raise ConfigError("send is for parameter servers; a collective worker all-reduces its gradients "
                          "(c_allreduce_grads)")

    def geo_step(self, grads):
        raise ConfigError(f"geo_step is only for GEO training; this worker runs {self.mode}")

    def barrier_worker(self, timeout=None):
        self.group_barrier(timeout)

    def all_to_all(self, blobs):
        return self.group_all_to_all(blobs)

    def report_failure(self, text):
        """Leaves the group, so the other workers notice at once that this one cannot go
        on (their next exchange names it). Never raises."""
        log.error("fleet: %s failed: %s", self.who, text)
        group, self.group = self.group, None
        if group is not None:
            try:
                group.close()
            except Exception:  # noqa: BLE001 - failing already
                pass
