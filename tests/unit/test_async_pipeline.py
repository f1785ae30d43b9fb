"""The async communicator's pipeline: a thread's next batch's rows are pulled in the
background once its previous step was sent, and a step waits for the step before it to be
sent (at most one batch of its own staleness)."""
import contextlib
import threading
import time

import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.communicator import asynchronous, make_communicator
from fleet.communicator.asynchronous import AsyncCommunicator
from fleet.errors import DataError
from fleet.framework.tensor import LoDTensor, SparseRows
from fleet.transpiler.plan import build_plan
from fleet.transport import Client, ServerSocket, serving
from strategies import DistributedStrategyFactory
from test_communicator_liveness import _plan

PUSH_DELAY_S = 0.3
FLAGS = {"communicator_send_queue_size": 1, "communicator_max_merge_var_num": 1, "put_timeout_s": 30}


def _answer_push(request):
    """Answers a push with the dense blocks it asks for (zeros), as a server does."""
    pulls = request.meta.get("pull", [])
    request.reply(pulls, [np.zeros((6, 2), np.float32) for _ in pulls])


class SlowPushServer:
    """Answers pushes after PUSH_DELAY_S (from a timer), pulls at once; logs what it did."""

    def __init__(self):
        self.log = []
        self.lock = threading.Lock()

    def _note(self, what):
        with self.lock:
            self.log.append((time.monotonic(), what))

    def __call__(self, request):
        self._note(f"got {request.op}")
        if request.op == "push":
            request.defer()

            def answer():
                self._note("sent push")
                pulls = request.meta.get("pull", [])  # the dense values after the push
                request.reply(pulls, [np.full((6, 2), 5.0, np.float32) for _ in pulls])
            threading.Timer(PUSH_DELAY_S, answer).start()
        elif request.op == "pull_dense":
            request.reply(request.meta["blocks"], [np.zeros((6, 2), np.float32)])
        elif request.op == "pull_sparse":
            ids = request.arrays[0]
            request.reply(["rows"], [np.repeat(ids[:, None].astype(np.float32), 2, axis=1)])
        else:
            request.reply()

    def first(self, what):
        with self.lock:
            return next(i for i, (_, w) in enumerate(self.log) if w == what)


@pytest.fixture
def job():
    handler = SlowPushServer()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving(ServerSocket("127.0.0.1:0"), handler, poll_ms=10, threaded=True))
        plan = _plan("async", server.endpoint)
        comm = make_communicator("async", plan, 0, fw.Scope(), FLAGS,
                                 connect=lambda ep: Client(ep, 0, timeout_ms=10000))
        comm.set_prefetch_inputs({"t": ["ids"]})
        comm.start()
        stack.callback(comm.stop)
        yield comm, plan, handler


def _grads(plan):
    return {plan.params["w"].grad: np.ones((6, 2), np.float32)}


def test_next_batch_rows_are_pulled_after_the_previous_step_was_sent(job):
    comm, plan, server = job
    comm.send(_grads(plan))  # queued: the push is answered 0.3 s later
    ids = np.array([7, 3, 7, 9], dtype=np.int64)
    comm.prepare_batch({"ids": LoDTensor(ids, np.array([0, 2, 4], dtype=np.int64)), "x": np.zeros((2, 4))})
    rows = comm.prefetch("t", ids)  # the op of the next batch takes what was pulled ahead
    assert rows.ids.tolist() == [3, 7, 9]
    np.testing.assert_array_equal(rows.values[:, 0], [3, 7, 9])
    assert comm.stats["prefetches_ahead_used"] == 1
    assert server.first("sent push") < server.first("got pull_sparse")


def test_rows_pulled_ahead_for_other_ids_are_not_used(job):
    comm, plan, server = job
    comm.prepare_batch({"ids": LoDTensor(np.array([1, 2], dtype=np.int64), np.array([0, 2], dtype=np.int64))})
    rows = comm.prefetch("t", np.array([4, 5], dtype=np.int64))
    assert rows.ids.tolist() == [4, 5] and comm.stats["prefetches_ahead_used"] == 0
    np.testing.assert_array_equal(rows.values[:, 0], [4, 5])


def test_a_step_waits_until_the_step_before_it_was_sent(job):
    comm, plan, server = job
    start = time.monotonic()
    comm.send(_grads(plan))  # step 1: queued, does not wait
    assert time.monotonic() - start < PUSH_DELAY_S / 2
    comm.send(_grads(plan))  # step 2: waits for step 1's push and the pull after it
    assert time.monotonic() - start >= PUSH_DELAY_S
    np.testing.assert_array_equal(comm.scope["w"], np.full((6, 2), 5.0))  # pulled with the push's answer
    assert not any(w == "got pull_dense" for _, w in server.log)  # one round trip per step


def test_rows_pulled_ahead_are_used_in_the_trainers_order(job):
    """The trainer prepares batch t+1 before it runs batch t, so each prefetch finds its
    batch's pull behind the next one's (keeping only the newest used none of them)."""
    comm, plan, server = job
    batches = [np.array([3 * i, 3 * i + 1, 40 + i], dtype=np.int64) for i in range(5)]

    def feed(ids):
        return {"ids": LoDTensor(ids, np.array([0, len(ids)], dtype=np.int64))}

    comm.prepare_batch(feed(batches[0]))
    for t, ids in enumerate(batches):
        if t + 1 < len(batches):
            comm.prepare_batch(feed(batches[t + 1]))  # the lookahead, before batch t runs
        rows = comm.prefetch("t", ids)  # batch t's prefetch op
        np.testing.assert_array_equal(rows.values[:, 0], np.unique(ids))
        comm.send(_grads(plan))
    assert comm.stats["prefetches_ahead_used"] == len(batches)
    assert comm.stats["prefetches"] == len(batches)  # no pull was made twice


@pytest.fixture
def merging_job():
    """An async communicator merging up to 2 steps (CPU_NUM=2 in Paddle) against a server
    that answers at once and logs each push's gradient."""
    pushes = []

    def handler(request):
        if request.op == "push":
            pushes.append(np.array(request.arrays[0]))
            _answer_push(request)
        elif request.op == "pull_dense":
            request.reply(request.meta["blocks"], [np.zeros((6, 2), np.float32)])
        else:
            request.reply()

    def make(wait_times):
        flags = dict(FLAGS, communicator_max_merge_var_num=2, communicator_send_queue_size=2,
                     communicator_send_wait_times=wait_times, communicator_is_sgd_optimizer=0)
        comm = make_communicator("async", plan, 0, fw.Scope(), flags,
                                 connect=lambda ep: Client(ep, 0, timeout_ms=10000))
        comm.start()
        stack.callback(comm.stop)
        return comm

    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving(ServerSocket("127.0.0.1:0"), handler, poll_ms=5, threaded=True))
        plan = _plan("async", server.endpoint)
        yield make, plan, pushes


def _two_threads_send(comm, plan, gap_s):
    """Both threads send a step of zeros (each becomes a sender), then thread A a step of
    ones and thread B a step of threes gap_s later. Returns the non-zero pushes' first
    values."""
    grad = plan.params["w"].grad
    both_sent, flushed = threading.Barrier(2), threading.Barrier(2)

    def thread(value, delay):
        comm.send({grad: np.zeros((6, 2), np.float32)})
        if both_sent.wait() == 0:
            comm.flush()  # the zero steps are pushed before the steps that count
        flushed.wait()
        time.sleep(delay)
        comm.send({grad: np.full((6, 2), value, np.float32)})

    threads = [threading.Thread(target=thread, args=(1.0, 0.0)), threading.Thread(target=thread, args=(3.0, gap_s))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    comm.flush()


def _nonzero(pushes):
    return [float(p.reshape(-1)[0]) for p in pushes if p.any()]


def test_the_send_thread_waits_send_wait_times_to_merge_the_threads_steps(merging_job):
    make, plan, pushes = merging_job
    _two_threads_send(make(wait_times=10), plan, gap_s=0.03)  # 30 ms < 10 x 10 ms
    assert _nonzero(pushes) == [2.0]  # one push: the mean of the two steps


def test_a_step_later_than_send_wait_times_goes_alone(merging_job):
    make, plan, pushes = merging_job
    _two_threads_send(make(wait_times=1), plan, gap_s=0.1)  # 100 ms > 1 x 10 ms
    assert _nonzero(pushes) == [1.0, 3.0]


def test_a_single_sender_does_not_wait_for_a_second_step(merging_job):
    """Reduce threads or one thread: only one thread sends, so nothing is waited for."""
    make, plan, pushes = merging_job
    comm = make(wait_times=100)  # would wait 1 s per step
    grad = plan.params["w"].grad
    start = time.monotonic()
    for value in (1.0, 2.0, 3.0):
        comm.send({grad: np.full((6, 2), value, np.float32)})
    comm.flush()
    assert _nonzero(pushes) == [1.0, 2.0, 3.0]
    assert time.monotonic() - start < 2.0  # three waits for a second step would take 3 s


def _feed(ids):
    return {"ids": LoDTensor(np.asarray(ids, dtype=np.int64), np.array([0, len(ids)], dtype=np.int64))}


def test_a_lock_step_step_is_pulled_ahead_in_one_request_after_the_previous_step_was_sent(job):
    """prepare_step: one pull per table for every batch of the next step, made once the
    step before was sent; each thread's prefetch (from any thread) takes its batch's rows."""
    comm, plan, server = job
    comm.send(_grads(plan))  # queued: the push is answered 0.3 s later
    comm.prepare_step([_feed([7, 3, 7]), _feed([9, 3])])
    got = {}

    def thread_runs(ids):
        got[tuple(ids)] = comm.prefetch("t", np.asarray(ids, dtype=np.int64))

    other = threading.Thread(target=thread_runs, args=([9, 3],))
    other.start()  # the second batch's thread may ask first
    other.join()
    thread_runs([7, 3, 7])
    for ids, rows in got.items():
        np.testing.assert_array_equal(rows.values[rows.local(np.asarray(ids)), 0], ids)
    assert comm.stats["prefetches_ahead_used"] == 2
    assert comm.stats["prefetches"] == 1  # one pull for the whole step
    assert server.first("sent push") < server.first("got pull_sparse")


def test_lock_step_pulls_ahead_are_used_in_the_trainers_order_whatever_thread_asks(job):
    comm, plan, server = job
    steps = [[[4 * t, 4 * t + 1], [4 * t + 2, 4 * t + 3, 48]] for t in range(4)]
    comm.prepare_step([_feed(ids) for ids in steps[0]])
    for t, batches in enumerate(steps):
        if t + 1 < len(steps):
            comm.prepare_step([_feed(ids) for ids in steps[t + 1]])  # before step t runs
        for ids in reversed(batches):
            rows = comm.prefetch("t", np.asarray(ids, dtype=np.int64))
            np.testing.assert_array_equal(rows.values[rows.local(np.asarray(ids)), 0], ids)
        comm.send(_grads(plan))
    assert comm.stats["prefetches_ahead_used"] == 8
    assert comm.stats["prefetches"] == len(steps)


def test_steps_prepared_and_never_run_are_dropped(job):
    comm, plan, server = job
    for t in range(5):  # a failed pass: steps prepared, none run
        comm.prepare_step([_feed([t])])
    assert [job.step for job in comm._ahead[("step", "t")]] == [4, 5]


@pytest.fixture
def two_servers():
    pushes = {0: [], 1: []}

    def handler(index):
        def handle(request):
            if request.op == "push":
                pushes[index].append(list(request.names))
                _answer_push(request)
            elif request.op == "pull_dense":
                request.reply(request.meta["blocks"], [np.zeros((6, 2), np.float32)])
            else:
                request.reply()
        return handle

    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(serving(ServerSocket("127.0.0.1:0"), handler(i), poll_ms=5, threaded=True))
                   for i in range(2)]
        yield [s.endpoint for s in servers], pushes


def test_a_hybrid_worker_pushes_to_every_server_each_step(two_servers):
    """Servers merging one push per worker must see every worker's step, also one that
    has no rows of theirs: the hybrid communicator sends every server a push per round."""
    endpoints, pushes = two_servers
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        a = layers.sequence_pool(layers.embedding(ids, size=[50, 2], is_sparse=True, param_attr="a"), "sum")
        b = layers.sequence_pool(layers.embedding(ids, size=[50, 2], is_sparse=True, param_attr="b"), "sum")
        optimizer.SGD(0.1).minimize(layers.mean(layers.elementwise_add(a, b)))
    plan = build_plan(main, DistributedStrategyFactory.create_async_strategy(), endpoints, 1)
    holder = {p.name: p.blocks[0].endpoint for p in plan.params.values()}
    assert sorted(holder.values()) == sorted(endpoints), holder  # a on one server, b on the other
    grad_a = plan.params["a"].grad
    for every in (False, True):
        comm = make_communicator("async", plan, 0, fw.Scope(), FLAGS, connect=lambda ep: Client(ep, 0, timeout_ms=10000))
        assert isinstance(comm, AsyncCommunicator)
        comm.push_to_every_server = every
        comm.start()
        try:
            comm.send({grad_a: SparseRows(np.array([1, 2], np.int64), np.ones((2, 2), np.float32), 50)})
            comm.flush()
        finally:
            comm.stop()
        other = endpoints.index(holder["b"])
        assert pushes[1 - other] == [["a@ROWS", "a@VALUES"]]
        assert pushes[other] == ([[]] if every else [])
        pushes[0].clear()
        pushes[1].clear()


def test_each_step_goes_in_one_push_with_every_gradient(monkeypatch):
    """A step's dense and sparse gradients are queued together, so the send thread never
    pushes part of a step (and pulls the dense parameters) and the rest in a second round,
    however long copying the step's gradients takes."""
    pushes = []
    copy = asynchronous._copy

    def slow_copy(value):
        time.sleep(0.02)  # a large gradient: the send thread is free to run meanwhile
        return copy(value)

    monkeypatch.setattr(asynchronous, "_copy", slow_copy)

    def handler(request):
        if request.op == "push":
            pushes.append(sorted(request.names))
            _answer_push(request)
        elif request.op == "pull_dense":
            request.reply(request.meta["blocks"], [np.zeros((6, 2), np.float32)])
        else:
            request.reply()

    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving(ServerSocket("127.0.0.1:0"), handler, poll_ms=5, threaded=True))
        plan = _plan("async", server.endpoint)
        comm = make_communicator("async", plan, 0, fw.Scope(), FLAGS, connect=lambda ep: Client(ep, 0, timeout_ms=10000))
        comm.start()
        stack.callback(comm.stop)
        grads = {plan.params["w"].grad: np.ones((6, 2), np.float32),
                 plan.params["t"].grad: SparseRows(np.array([1, 4], np.int64), np.ones((2, 2), np.float32), 50)}
        for _ in range(10):
            comm.send(grads)
        comm.flush()
    assert len(pushes) == 10
    assert all(p == pushes[0] and len(p) == 3 for p in pushes), pushes  # w, t@ROWS, t@VALUES


def test_a_push_answered_without_the_dense_blocks_asked_for_is_an_error_naming_the_server():
    def handler(request):  # a server that ignores the push's "pull"
        request.reply()

    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving(ServerSocket("127.0.0.1:0"), handler, poll_ms=5, threaded=True))
        plan = _plan("async", server.endpoint)
        comm = make_communicator("async", plan, 0, fw.Scope(), FLAGS, connect=lambda ep: Client(ep, 0, timeout_ms=10000))
        comm.start()
        stack.callback(comm.stop)
        with pytest.raises(DataError, match=f"server {server.endpoint} answered 'push' with blocks"):
            comm.push_and_pull_dense(comm.split_grads(_grads(plan)))
