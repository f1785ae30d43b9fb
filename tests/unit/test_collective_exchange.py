"""The collective communicator's rounds, with ranks as threads over an in-process group:
dense gradients averaged and sparse rows gathered in rank order; a worker whose pass
ended ends the others' pass (the step not applied, the learning-rate increment taken
back); a stop during an exe.run loop and a failure are named; the final round compares
the parameters' CRC32."""
import threading

import numpy as np
import pytest

from fleet.communicator.collective import CollectiveCommunicator
from fleet.errors import ConfigError, DataError, TransportError
from fleet.framework.hooks import EndOfPass
from fleet.framework.scope import Scope
from fleet.framework.tensor import SparseRows

LAYOUT = {"params": ["w", "table"], "shapes": [[2, 3], [10, 2]], "sparse": [False, True],
          "undo_increments": [["@LR_DECAY_COUNTER@", 1.0]]}


class ThreadGroup:
    """n ranks in one process: every collective op meets at a barrier."""

    def __init__(self, shared, rank):
        self.shared, self.rank, self.size = shared, rank, shared["n"]

    def _exchange(self, array):
        self.shared["slots"][self.rank] = np.array(array, copy=True)
        self.shared["barrier"].wait(timeout=10)
        got = [np.array(a, copy=True) for a in self.shared["slots"]]
        self.shared["barrier"].wait(timeout=10)
        return got

    def all_reduce(self, array, op="sum"):
        got = self._exchange(array)
        out = got[0].copy()
        for a in got[1:]:
            out += a
        return out

    def all_gather(self, array):
        return self._exchange(array)

    def broadcast(self, array, root=0):
        return self._exchange(array if self.rank == root else np.zeros(0))[root]

    def close(self):
        pass


def run_ranks(n, body):
    """Runs body(rank, comm, scope) in n threads; returns {rank: result or exception}."""
    shared = {"n": n, "slots": [None] * n, "barrier": threading.Barrier(n)}
    out = {}

    def run(rank):
        scope = Scope()
        scope["w"] = np.full((2, 3), 0.5, np.float32)
        scope["@LR_DECAY_COUNTER@"] = np.array([4], np.int64)
        comm = CollectiveCommunicator(None, rank, scope, {}, make_group=lambda: ThreadGroup(shared, rank))
        comm.who = f"worker {rank} of {n}"
        comm.set_layout(LAYOUT)
        comm.start()
        try:
            out[rank] = body(rank, comm, scope)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def grads_of(rank):
    dense = np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1)
    rows = SparseRows(np.array([rank, 7], np.int64), np.full((2, 2), rank + 1.0, np.float32), 10)
    return [dense, rows]


def test_dense_gradients_are_averaged_and_sparse_rows_gathered_in_rank_order():
    out = run_ranks(3, lambda rank, comm, scope: comm.all_reduce_grads(LAYOUT, grads_of(rank), scope))
    for rank in range(3):
        dense, rows = out[rank]
        np.testing.assert_allclose(dense, np.arange(6).reshape(2, 3) * 2.0)  # (1 + 2 + 3) / 3
        assert rows.rows.tolist() == [0, 7, 1, 7, 2, 7] and rows.height == 10
        np.testing.assert_allclose(rows.values[:, 0], np.array([1, 1, 2, 2, 3, 3]) / 3.0)
        assert np.array_equal(dense, out[0][0]) and np.array_equal(rows.values, out[0][1].values)


def test_each_workers_repeated_rows_are_merged_before_they_are_gathered():
    """A batch's ids repeat: every worker sums its duplicates first, so each row of a
    worker appears once in the gathered gradient (ascending), with the sum of its values."""
    def grads(rank):
        rows = SparseRows(np.array([7, rank, 7, 7], np.int64),
                          np.array([[1, 2], [10, 20], [100, 200], [1000, 2000]], np.float32) * (rank + 1), 10)
        return [np.zeros((2, 3), np.float32), rows]

    out = run_ranks(2, lambda rank, comm, scope: comm.all_reduce_grads(LAYOUT, grads(rank), scope))
    for rank in range(2):
        rows = out[rank][1]
        assert rows.rows.tolist() == [0, 7, 1, 7]
        np.testing.assert_array_equal(rows.values, np.array([[10, 20], [1101, 2202], [20, 40], [2202, 4404]]) / 2.0)
        assert np.array_equal(rows.values, out[0][1].values)


def test_a_worker_out_of_data_ends_every_pass_and_the_step_is_not_applied():
    def body(rank, comm, scope):
        comm.begin_pass(1)
        comm.all_reduce_grads(LAYOUT, grads_of(rank), scope)  # a step every worker had
        if rank == 1:
            comm.end_pass()  # its shard is over: says so in the next round
            return "ended"
        try:
            comm.all_reduce_grads(LAYOUT, grads_of(rank), scope)
        except EndOfPass as e:
            comm.end_pass()  # the pass ended by agreement: no further round
            return str(e), int(scope["@LR_DECAY_COUNTER@"][0])

    out = run_ranks(3, body)
    assert out[1] == "ended"
    assert out[0] == out[2] == ("worker 1 ran out of data", 3)  # 4 less the step's increment


def test_a_stop_during_an_exe_run_loop_is_named():
    def body(rank, comm, scope):
        if rank == 1:
            comm.stop()
            return "stopped"
        return comm.all_reduce_grads(LAYOUT, grads_of(rank), scope)

    out = run_ranks(2, body)
    assert out[1] == "stopped" and isinstance(out[0], ConfigError)
    assert str(out[0]).startswith("worker 0 of 2: worker 1 stopped training (fleet.stop_worker() or the end of a "
                                  "pass) while this worker still runs steps")


def test_a_failed_worker_is_named():
    def body(rank, comm, scope):
        comm.begin_pass(1)
        if rank == 2:
            comm.pass_failed(ValueError("bad line"))
            return "failed"
        return comm.all_reduce_grads(LAYOUT, grads_of(rank), scope)

    out = run_ranks(3, body)
    for rank in (0, 1):
        assert isinstance(out[rank], TransportError)
        assert str(out[rank]) == f"worker {rank} of 3: worker 2 failed (its log says why), so this worker stops too"


def test_the_final_round_compares_every_workers_parameters():
    def body(rank, comm, scope):
        if rank == 1:
            scope["w"][0, 0] = 0.25  # not what the others hold
        comm.stop()

    out = run_ranks(2, body)
    for rank in (0, 1):
        assert isinstance(out[rank], DataError)
        assert "the all-reduced parameters differ between the workers at the end (CRC32 worker 0: " in str(out[rank])
    assert run_ranks(2, lambda rank, comm, scope: comm.stop()) == {0: None, 1: None}


def test_prefetch_and_send_are_refused_with_the_reason():
    comm = CollectiveCommunicator(None, 0, Scope(), {}, make_group=lambda: None)
    with pytest.raises(ConfigError, match="prefetch reads tables on servers, and a collective job has none"):
        comm.prefetch("table", np.array([1]))
    with pytest.raises(ConfigError, match="send is for parameter servers"):
        comm.send({})
