"""ParameterServer without sockets: lost workers fail the job and free every waiting
request; hostile requests are refused before anything changes."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import DataError, FleetError
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan
from strategies import DistributedStrategyFactory

ENDPOINT = "127.0.0.1:6170"
LR = 0.5


class FakeRequest:
    """What ParameterServer.handle uses of a transport Request, recording the answer."""

    def __init__(self, op, worker, names=(), arrays=(), meta=None):
        self.op, self.worker, self.seq = op, worker, 1
        self.names, self.arrays = list(names), list(arrays)
        self.meta = dict(meta or {})
        self.header = {"op": op, "worker": worker, "names": self.names, **self.meta}
        self.answer = None  # ("ok", names, arrays) or ("error", text)
        self.deferred = False

    @property
    def answered(self):
        return self.answer is not None

    def defer(self):
        self.deferred = True

    def reply(self, names=(), arrays=(), meta=None):
        assert self.answer is None, "answered twice"
        self.answer = ("ok", list(names), list(arrays))

    def reply_error(self, text):
        assert self.answer is None, "answered twice"
        self.answer = ("error", text)


def make_server(mode="sync", workers=2):
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        e = layers.sequence_pool(layers.embedding(ids, size=[100, 3], is_sparse=True, param_attr="t"), "sum")
        out = layers.fc(layers.concat([e, x], axis=1), 2, param_attr="w", bias_attr="b")
        optimizer.SGD(LR).minimize(layers.mean(out))
    strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
                "async": DistributedStrategyFactory.create_async_strategy}[mode]()
    plan = build_plan(main, strategy, [ENDPOINT], workers)
    init = {"w": np.ones((7, 2), np.float32), "b": np.zeros(2, np.float32), "t": np.full((100, 3), 2.0, np.float32)}
    return ParameterServer(ENDPOINT, plan, init)


def handle(ps, op, worker, names=(), arrays=(), meta=None):
    req = FakeRequest(op, worker, names, arrays, meta)
    try:
        ps.handle(req)
    except Exception as e:  # as the transport does: the exception becomes the error reply
        req.reply_error(str(e))
    return req


def w_value(ps):
    return ps.blocks["w"][2].pull()


def sync_step(ps, worker, v):
    return handle(ps, "sync_push", worker, ["w"], [np.full((7, 2), v, np.float32)], {"pull": ["w"]})


def test_a_worker_silent_past_the_timeout_fails_the_parked_step_of_the_others_naming_it():
    ps = make_server("sync", workers=3)
    parked = [sync_step(ps, 0, 1.0), sync_step(ps, 2, 1.0)]
    assert all(r.deferred and not r.answered for r in parked)
    ps.check_liveness({0: 100.0, 1: 97.0, 2: 100.0}, timeout_s=2.0, now=100.0)
    expected = ("worker 1 was lost: it stopped sending heartbeats 3.0 s ago (FLEET_HEARTBEAT_TIMEOUT_MS=2000) "
                "without calling fleet.stop_worker(); it is probably dead (see its log, workerlog.1 under "
                "fleetrun). The job cannot go on without its share of the data: the job is not elastic "
                "(fleetrun --np MIN:MAX makes an async, half-async or GEO job go on without it), so every worker "
                "stops; restart the job from its last checkpoint")
    assert [r.answer for r in parked] == [("error", expected)] * 2
    assert ps.failure == expected and ps.status() == {"failed": expected}
    assert ps.lost == {1: "it stopped sending heartbeats 3.0 s ago (FLEET_HEARTBEAT_TIMEOUT_MS=2000) without "
                          "calling fleet.stop_worker(); it is probably dead (see its log, workerlog.1 under fleetrun)"}
    np.testing.assert_array_equal(w_value(ps), 1.0)  # the incomplete step was not applied
    # every later request but stop is answered with the same error
    again = sync_step(ps, 0, 1.0)
    assert again.answer == ("error", expected)
    assert handle(ps, "pull_dense", 2, meta={"blocks": ["w"]}).answer == ("error", expected)
    assert ps.all_told(heard_since=set())  # 0 and 2 got error replies; 1 is lost
    assert not ps.finished()
    assert handle(ps, "stop", 0).answer[0] == "ok" and handle(ps, "stop", 2).answer[0] == "ok"
    assert ps.finished()


def test_a_worker_is_told_by_the_heartbeat_reply_when_it_was_not_waiting():
    ps = make_server("async", workers=2)
    ps.check_liveness({0: 10.0, 1: 1.0}, timeout_s=5.0, now=10.0)
    assert ps.failure.startswith("worker 1 was lost: it stopped sending heartbeats 9.0 s ago")
    assert not ps.all_told(heard_since=set())
    assert ps.all_told(heard_since={0})


def test_workers_never_heard_from_or_stopped_are_not_timed_out():
    ps = make_server("sync", workers=3)
    assert handle(ps, "stop", 2).answer[0] == "ok"
    ps.check_liveness({0: 100.0, 2: 0.0}, timeout_s=2.0, now=100.0)  # 1 never heard, 2 stopped
    assert ps.failure is None and ps.lost == {}
    parked = sync_step(ps, 0, 1.0)
    assert parked.deferred and not parked.answered  # still waits for worker 1


def test_a_barrier_waiting_for_a_lost_worker_is_released_with_the_error():
    ps = make_server("async", workers=2)
    barrier = handle(ps, "barrier", 0)
    assert not barrier.answered
    ps.fail_worker(1, "its process was killed")
    assert barrier.answer == ("error", ps.failure)
    assert ps.failure.startswith("worker 1 was lost: its process was killed. The job cannot go on")


def test_a_worker_id_outside_the_job_is_refused_and_cannot_end_the_server():
    ps = make_server("async", workers=2)
    push = handle(ps, "push", 7, ["w"], [np.full((7, 2), 1.0, np.float32)])
    assert push.answer == ("error", "worker id 7 is not a worker of this job (ids 0..1); 'push' refused")
    assert handle(ps, "stop", -1).answer[0] == "error" and handle(ps, "stop", 2).answer[0] == "error"
    assert ps.stopped == set() and not ps.finished()
    np.testing.assert_array_equal(w_value(ps), 1.0)
    # reads are open to any id (tools and tests pull with ids of their own)
    assert handle(ps, "pull_dense", 99, meta={"blocks": ["w"]}).answer[0] == "ok"


def test_a_push_with_one_bad_gradient_applies_none_of_them():
    ps = make_server("async", workers=1)
    good = np.full((7, 2), 1.0, np.float32)
    cases = [
        (["w", "nope"], [good, good], "holds no block 'nope'"),
        (["w", "b"], [good, np.ones(5, np.float32)], "block 'b' has shape (2,); got a gradient of 5 values"),
        (["w", "t@ROWS", "t@VALUES"], [good, np.array([3, 100]), np.ones((2, 3), np.float32)],
         "block 't' holds rows [0, 100); got rows 3..100"),
        (["w", "t@ROWS", "t@VALUES"], [good, np.array([3]), np.ones((1, 4), np.float32)],
         "block 't' of shape (100, 3) cannot take rows of width 4"),
        (["w", "t@ROWS"], [good, np.array([3])], "sparse gradient 't@ROWS' must be followed by its @VALUES array"),
    ]
    for names, arrays, message in cases:
        req = handle(ps, "push", 0, names, arrays)
        assert req.answer[0] == "error" and message in req.answer[1], (names, req.answer)
    np.testing.assert_array_equal(w_value(ps), 1.0)
    np.testing.assert_array_equal(ps.blocks["t"][2].pull(), 2.0)


def test_a_sync_step_with_a_bad_gradient_is_refused_on_arrival_and_the_step_still_completes():
    ps = make_server("sync", workers=2)
    bad = handle(ps, "sync_push", 0, ["w"], [np.ones((3, 2), np.float32)], {"pull": ["w"]})
    assert bad.answer == ("error", "block 'w' has shape (7, 2); got a gradient of 6 values")
    assert handle(ps, "sync_push", 0, ["w"], [np.ones((7, 2), np.float32)], {"pull": ["nope"]}).answer[0] == "error"
    first, second = sync_step(ps, 0, 1.0), sync_step(ps, 1, 3.0)
    for req in (first, second):
        assert req.answer[0] == "ok"
        np.testing.assert_allclose(req.answer[2][0], 1.0 - LR * 2.0)  # mean of 1 and 3


def test_a_sync_step_that_fails_while_applying_answers_every_parked_worker(monkeypatch):
    ps = make_server("sync", workers=2)

    def broken(*args, **kwargs):
        raise FloatingPointError("overflow in the update")

    monkeypatch.setattr(ps, "_apply", broken)
    first, second = sync_step(ps, 0, 1.0), sync_step(ps, 1, 1.0)
    expected = ("error", f"the sync step failed on server {ENDPOINT}: FloatingPointError: overflow in the update")
    assert first.answer == expected
    assert second.answer == expected


def test_the_failure_is_a_fleet_error_so_the_transport_sends_its_text_unchanged():
    ps = make_server("async", workers=2)
    ps.fail_worker(0, "gone")
    req = FakeRequest("push", 1, ["w"], [np.ones((7, 2), np.float32)])
    with pytest.raises(FleetError) as error:
        ps.handle(req)
    assert str(error.value) == ps.failure and not isinstance(error.value, DataError)
    assert 1 in ps.told


# ------------------------------------------------------------------ a worker that reports its failure
def test_a_worker_reporting_its_error_fails_the_job_at_once_naming_it_and_its_error():
    ps = make_server("sync", workers=2)
    parked = sync_step(ps, 0, 1.0)
    report = handle(ps, "fail", 1, meta={"reason": "DataError: worker 1 of 2: no examples"})
    assert report.answer == ("ok", [], [])
    failure = ("worker 1 was lost: it failed: DataError: worker 1 of 2: no examples. The job cannot go on "
               "without its share of the data: the job is not elastic (fleetrun --np MIN:MAX makes an async, "
               "half-async or GEO job go on without it), so every worker stops; restart the job from its last "
               "checkpoint")
    assert parked.answer == ("error", failure)
    assert ps.status() == {"failed": failure}
    assert handle(ps, "fail", 0, meta={"reason": "RuntimeError: later"}).answer == ("ok", [], [])
    assert ps.failure == failure  # the first failure stays the one reported
    assert handle(ps, "fail", 0).answer == ("error", "fail needs meta 'reason': the text of the worker's error")


def test_the_server_counts_the_updates_it_applied_for_checkpoint_info():
    ps = make_server("async", workers=1)
    assert handle(ps, "checkpoint_info", 0).answer == ("ok", [], [])
    assert ps.updates == 0
    handle(ps, "push", 0, ["w"], [np.ones((7, 2), np.float32)])
    assert ps.updates == 1


# ------------------------------------------------------------------ what a server waits for
def test_waits_name_the_workers_a_parked_step_and_barrier_wait_for():
    ps = make_server("sync", workers=3)
    assert ps.waits() == []
    sync_step(ps, 2, 1.0)
    handle(ps, "barrier", 0)
    waits = ps.waits()
    assert [(what, arrived, missing) for what, _, arrived, missing in waits] == [
        ("the sync step", [2], [0, 1]), ("barrier_worker", [0], [1, 2])]
    handle(ps, "stop", 1)
    assert [(what, arrived, missing) for what, _, arrived, missing in ps.waits()] == [
        ("the sync step", [2], [0]), ("barrier_worker", [0], [2])]


class FakeSocket:
    endpoint = ENDPOINT

    def __init__(self, heard):
        self.heard = heard

    def last_heard(self):
        return dict(self.heard)

    def set_heartbeat_status(self, meta):
        pass


def test_the_server_watch_logs_workers_to_connect_parked_steps_and_workers_to_stop(monkeypatch, caplog):
    import logging
    import threading
    import time

    from fleet.runtime import _ServerWatch

    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "1")
    ps = make_server("sync", workers=2)
    sock = FakeSocket({0: time.monotonic()})
    watch = _ServerWatch(ps, sock, threading.Event(), 60.0, "server 0")
    with caplog.at_level(logging.INFO, logger="fleet"):
        time.sleep(0.01)
        watch.tick()
        sock.heard[1] = time.monotonic()
        sync_step(ps, 0, 1.0)
        time.sleep(0.01)
        watch.tick()
        sync_step(ps, 1, 1.0)
        handle(ps, "stop", 1)
        time.sleep(0.01)
        watch.tick()
    messages = [r.getMessage().rsplit(" for ", 1)[0] for r in caplog.records
                if r.getMessage().startswith("waiting for")]
    assert messages == [
        f"waiting for 2 workers to connect to server 0 ({ENDPOINT}) (1 of 2 connected; not yet worker 1)",
        "waiting for worker 1 at the sync step on server 0 (1 of 2 arrived)",
        "waiting for worker 0 to call fleet.stop_worker() (server 0 serves until every worker did) (1 of 2 stopped)"]


def test_a_worker_that_never_connects_fails_the_job_after_the_first_contact_bound():
    ps = make_server("sync", workers=3)
    ps.worker_endpoints = ("10.0.0.1:6171", "10.0.0.2:6171", "10.0.0.3:6171")
    heard = {0: 100.0, 1: 100.0}
    ps.check_liveness(heard, timeout_s=2.0, now=100.0, since=0.0, first_contact_s=600.0)
    assert ps.failure is None  # within the bound: a slow scheduler is not a failure
    heard = {0: 601.0, 1: 600.5}
    ps.check_liveness(heard, timeout_s=2.0, now=601.0, since=0.0, first_contact_s=600.0)
    assert ps.lost == {2: "it never connected: nothing came from it in the 601 s this server has been "
                          "serving (FLEET_WORKER_CONNECT_TIMEOUT_MS=600000) (was it started on its host "
                          "10.0.0.3?); check that every host's processes were started"}
    assert ps.failure.startswith("worker 2 was lost: it never connected")
    # without a bound (first_contact_s None) a silent worker is never failed for silence alone
    other = make_server("sync", workers=2)
    other.check_liveness({0: 5000.0}, timeout_s=2.0, now=5000.0, since=0.0)
    assert other.failure is None


def test_workers_split_between_a_sync_step_and_the_barrier_are_told_at_once():
    ps = make_server("sync", workers=3)
    step = sync_step(ps, 0, 1.0)                       # worker 0 has one more batch
    first = handle(ps, "barrier", 1)                   # workers 1 and 2 ran out of data
    assert not step.answered and not first.answered    # worker 2 may still come to either
    second = handle(ps, "barrier", 2)
    expected = ("worker 0 waits in a sync step while workers 1, 2 wait at fleet.barrier_worker(): "
                "the workers ran different numbers of sync steps, so neither wait can end. In sync training "
                "every worker must run the same number of steps per pass: give each worker the same number "
                "of batches (files of equal line counts, as many per worker), or end the pass with "
                "fleet.stop_worker() instead of a barrier")
    assert [r.answer for r in (step, first, second)] == [("error", expected)] * 3
    assert ps.failure == expected
    np.testing.assert_array_equal(w_value(ps), 1.0)    # the incomplete step was not applied


def test_a_barrier_after_equal_steps_is_not_a_crossed_wait():
    ps = make_server("sync", workers=2)
    steps = [sync_step(ps, 0, 1.0), sync_step(ps, 1, 3.0)]
    assert all(r.answer[0] == "ok" for r in steps)
    barriers = [handle(ps, "barrier", 0), handle(ps, "barrier", 1)]
    assert all(r.answer[0] == "ok" for r in barriers) and ps.failure is None
