"""fleet.metrics: local values, Paddle 2.x's formulas on known inputs, arguments read from
the scope, the errors, and the AUC of buckets merged over several workers against the AUC
of all their predictions pooled (exact). Workers are threads sharing ``Loopback`` (the
``util`` shape: all_reduce / all_gather_object) or, further down, real WorkerGroups."""
import math
import threading
import time

import numpy as np
import pytest

import fleet
import fleet.base
import fleet.framework as fw
from fleet import layers, metrics
from fleet.errors import ConfigError, DataError, FleetTimeoutError, TransportError
from role_makers import LocalRoleMaker, Role, UserDefinedRoleMaker

pytestmark = pytest.mark.usefixtures("fresh_fleet")


class Loopback:
    """In-process workers: member(rank) is one worker's view; each operation meets the
    others at a barrier (timeout names the ranks that did not come), then reduces in rank
    order."""

    def __init__(self, size, timeout_s=5.0):
        self.size, self.timeout_s = size, timeout_s
        self.slots = [None] * size
        self.barrier = threading.Barrier(size)
        self.closed = []

    def member(self, rank):
        return _Member(self, rank)


class _Member:
    def __init__(self, hub, rank):
        self.hub, self.rank, self.size = hub, rank, hub.size

    def _exchange(self, value):
        hub = self.hub
        hub.slots[self.rank] = value
        try:
            hub.barrier.wait(hub.timeout_s)
            values = list(hub.slots)
            hub.barrier.wait(hub.timeout_s)
        except threading.BrokenBarrierError:
            raise FleetTimeoutError(f"rank {self.rank}: not every rank came within {hub.timeout_s} s") from None
        return values

    def all_reduce(self, array, op="sum"):
        values = self._exchange(np.array(array))
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        out = values[0].copy()
        for v in values[1:]:
            out = fn(out, v)
        return out

    def all_gather_object(self, obj):
        return self._exchange(obj)

    def close(self):
        self.hub.closed.append(self.rank)


def run_workers(size, fn, hub=None):
    """fn(rank, member) on ``size`` threads; returns their results, or raises the first error."""
    hub = hub or Loopback(size)
    results, errors = [None] * size, [None] * size

    def body(rank):
        try:
            results[rank] = fn(rank, hub.member(rank))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a worker thread hung"
    return results, errors


def paddle_auc_loop(stat_pos, stat_neg):
    """Paddle 2.x fleet.metrics.auc's walk over the buckets, written as a plain loop."""
    area = pos = neg = total = 0.0
    for index in range(len(stat_pos) - 1, -1, -1):
        new_pos, new_neg = pos + stat_pos[index], neg + stat_neg[index]
        total += stat_pos[index] + stat_neg[index]
        area += (new_neg - neg) * (pos + new_pos) / 2
        pos, neg = new_pos, new_neg
    return 0.5 if pos * neg == 0 or total == 0 else area / (pos * neg)


def mann_whitney(buckets_pos, buckets_neg):
    """P(a positive's bucket > a negative's) + half the ties, from the bucket indices."""
    pos = np.repeat(np.arange(len(buckets_pos)), buckets_pos)
    neg = np.repeat(np.arange(len(buckets_neg)), buckets_neg)
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


# ------------------------------------------------------------------ local values
def test_without_a_job_every_metric_is_the_local_value():
    x = np.array([[1.5, -2.0], [3.0, 4.0]], dtype=np.float32)
    for fn in (metrics.sum, metrics.max, metrics.min):
        out = fn(x)
        np.testing.assert_array_equal(out, x)
        assert out.dtype == np.float32 and out is not x
    assert metrics.acc(np.array([3]), np.array([4])) == 0.75
    assert metrics.mae(np.array([2.5]), np.array([10])) == 0.25
    assert metrics.mse(np.array([4.0]), np.array([16])) == 0.25
    assert metrics.rmse(np.array([4.0]), np.array([16])) == 0.5


def test_local_training_gives_local_values_too():
    fleet.init(LocalRoleMaker())
    assert fleet.base.fleet._metric_group("fleet.metrics.sum") is None
    np.testing.assert_array_equal(metrics.max(np.arange(3)), np.arange(3))
    assert metrics.auc(np.array([0, 1, 1]), np.array([1, 1, 0])) == 0.875


def test_auc_follows_paddles_walk_over_the_buckets_on_known_counts():
    # buckets 0..2; positives in 1 and 2, negatives in 0 and 1: of the 4 pairs, 3 ordered
    # right and one tie (counted half) -> 0.875
    assert metrics.auc(np.array([0, 1, 1]), np.array([1, 1, 0])) == 0.875
    assert metrics.auc(np.array([[0, 0, 5]]), np.array([[5, 0, 0]])) == 1.0   # Paddle's [1, buckets]
    assert metrics.auc(np.array([5, 0, 0]), np.array([0, 0, 5])) == 0.0
    assert metrics.auc(np.array([0, 3, 0]), np.array([0, 2, 0])) == 0.5      # all tied
    # no negatives, no positives, nothing: Paddle's 0.5
    assert metrics.auc(np.array([1, 2, 3]), np.zeros(3, np.int64)) == 0.5
    assert metrics.auc(np.zeros(3, np.int64), np.array([1, 2, 3])) == 0.5
    assert metrics.auc(np.zeros(4, np.int64), np.zeros(4, np.int64)) == 0.5
    rng = np.random.default_rng(3)
    pos, neg = rng.integers(0, 20, 200), rng.integers(0, 20, 200)
    value = metrics.auc(pos, neg)
    assert value == paddle_auc_loop(pos.astype(float), neg.astype(float))   # the same order of additions
    assert value == pytest.approx(mann_whitney(pos, neg), rel=1e-12)


def test_arguments_are_read_from_the_scope_by_name_or_variable():
    p = layers.data("p", shape=[2])
    y = layers.data("y", shape=[1], dtype="int64")
    auc_var, _, [_, _, stat_pos, stat_neg] = layers.auc(p, y, num_thresholds=9)
    exe = fleet.Executor()
    exe.run(fleet.default_startup_program())
    p1 = np.array([0.95, 0.75, 0.35, 0.05, 0.65, 0.35], np.float32)
    (layer_auc,) = exe.run(feed={"p": np.stack([1 - p1, p1], 1), "y": [[1], [0], [1], [0], [1], [0]]},
                           fetch_list=[auc_var])
    pos, neg = fw.global_scope()[stat_pos.name], fw.global_scope()[stat_neg.name]
    np.testing.assert_array_equal(pos, [0, 0, 0, 1, 0, 1, 0, 0, 1, 0])
    expected = paddle_auc_loop(pos, neg)
    assert metrics.auc(stat_pos, stat_neg) == expected
    assert metrics.auc(stat_pos.name, stat_neg.name) == expected
    assert expected == pytest.approx(layer_auc[0]) == pytest.approx(mann_whitney(pos, neg))
    # another scope: the value there, not the global one
    other = fw.Scope()
    other[stat_pos.name], other[stat_neg.name] = np.array([0] * 9 + [4]), np.array([4] + [0] * 9)
    assert metrics.auc(stat_pos, stat_neg.name, scope=other) == 1.0
    other["hits"], other["seen"] = np.array([6.0], np.float32), np.array([8], np.int64)
    assert metrics.acc("hits", "seen", scope=other) == 0.75
    np.testing.assert_array_equal(metrics.sum("hits", scope=other), [6.0])


def test_sum_max_min_return_arrays_of_the_input_shape_and_widen_small_integers():
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    out = metrics.sum(x)
    assert out.dtype == np.int32 and out.shape == (2, 3)
    np.testing.assert_array_equal(out, x)
    assert metrics.min(np.float16(2.5)).dtype == np.float32
    assert metrics.max(7).shape == () and metrics.max(7) == 7


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("call, message", [
    (lambda: metrics.auc("nope", "nope"),
     "fleet.metrics.auc: stat_pos names variable 'nope', which is not in the scope; run the program that "
     "computes it first"),
    (lambda: metrics.auc(np.zeros((3, 4)), np.zeros((3, 4))),
     "fleet.metrics.auc: stat_pos has shape [3, 4]; it takes the auc layer's stat_pos (shape [buckets] or "
     "[1, buckets])"),
    (lambda: metrics.auc(np.zeros(4), np.zeros(5)),
     "fleet.metrics.auc: stat_pos has 4 buckets and stat_neg 5; pass the two bucket states of the same auc layer"),
    (lambda: metrics.auc(np.array([1, -1]), np.zeros(2)),
     "fleet.metrics.auc: stat_pos holds negative counts (bucket 1: -1)"),
    (lambda: metrics.sum(np.array([True, False])),
     "fleet.metrics.sum: input has dtype bool; pass numbers"),
    (lambda: metrics.sum(np.zeros(2, np.complex64)),
     "fleet.metrics.sum: input has dtype complex64; pass numbers"),
    (lambda: metrics.acc(np.array([1, 2]), np.array([3])),
     "fleet.metrics.acc: correct has 2 values (shape [2]); it takes one accumulated value (shape [1])"),
    (lambda: metrics.mae(np.array([1.0]), 0),
     "fleet.metrics.mae: total_ins_num is 0: no example was counted, so the mae is undefined"),
    (lambda: metrics.sum(np.ones(2), scope={"x": 1}),
     "fleet.metrics.sum: scope={'x': 1} is not a fleet Scope"),
    (lambda: metrics.sum(np.ones(2), util=object()),
     "fleet.metrics.sum: util=<object object"),
])
def test_bad_arguments_are_named_with_the_fix(call, message):
    with pytest.raises((ConfigError, DataError)) as info:
        call()
    assert message in str(info.value)


def test_a_server_calling_a_metric_is_told_to_call_it_on_the_workers():
    fleet.init(UserDefinedRoleMaker(current_id=0, role=Role.SERVER, worker_num=2,
                                    server_endpoints=["127.0.0.1:6170"]))
    with pytest.raises(ConfigError) as info:
        metrics.auc(np.zeros(3), np.zeros(3))
    assert str(info.value) == (
        "fleet.metrics.auc is for workers: this process is server 0, and servers hold no metrics and do not "
        "join the workers' group; call it in the worker branch of the script (if fleet.is_worker(): ...), on "
        "every worker")


# ------------------------------------------------------------------ over several workers
def _worker_predictions(rng, rank, n):
    """Each worker's predictions come from another distribution (other data)."""
    label = rng.integers(0, 2, n)
    score = np.clip(rng.normal(0.35 + 0.1 * rank + 0.25 * label, 0.2 + 0.05 * rank), 0, 1)
    return score.astype(np.float32), label


def _layer_buckets(scores, labels, num_thresholds):
    """stat_pos / stat_neg of the auc layer after one batch of these predictions."""
    fw.reset_default_programs()
    p = layers.data("p", shape=[2])
    y = layers.data("y", shape=[1], dtype="int64")
    _, _, [_, _, stat_pos, stat_neg] = layers.auc(p, y, num_thresholds=num_thresholds)
    scope, exe = fw.Scope(), fleet.Executor()
    exe.run(fleet.default_startup_program(), scope=scope)
    exe.run(feed={"p": np.stack([1 - scores, scores], 1), "y": labels.reshape(-1, 1)}, scope=scope)
    return scope[stat_pos.name].copy(), scope[stat_neg.name].copy()


@pytest.mark.parametrize("workers, num_thresholds", [(2, 4095), (3, 4095), (5, 127)])
def test_auc_of_merged_buckets_equals_the_auc_of_all_predictions_pooled(workers, num_thresholds):
    rng = np.random.default_rng(workers)
    preds = [_worker_predictions(rng, r, 400 + 150 * r) for r in range(workers)]
    buckets = [_layer_buckets(s, y, num_thresholds) for s, y in preds]
    pooled_pos, pooled_neg = _layer_buckets(np.concatenate([s for s, _ in preds]),
                                            np.concatenate([y for _, y in preds]), num_thresholds)
    offline = paddle_auc_loop(pooled_pos.astype(float), pooled_neg.astype(float))

    results, errors = run_workers(workers, lambda r, g: metrics.auc(*buckets[r], util=g))
    assert errors == [None] * workers
    assert results == [offline] * workers                    # exact, on every worker
    assert offline == pytest.approx(mann_whitney(pooled_pos, pooled_neg), rel=1e-12)
    local = [metrics.auc(*b) for b in buckets]               # and not just any worker's own
    assert all(abs(v - offline) > 1e-6 for v in local)


def test_sum_max_min_acc_mae_mse_rmse_over_workers_equal_numpy_on_the_pooled_values():
    workers, rng = 3, np.random.default_rng(7)
    x = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(workers)]
    counts = [rng.integers(1, 100, (2, 3)) for _ in range(workers)]
    errs = [rng.random(50 + 10 * r) for r in range(workers)]
    hits = [rng.integers(0, 2, 40 + r) for r in range(workers)]

    def worker(r, g):
        n = np.array([len(errs[r])], np.int64)
        return (metrics.sum(x[r], util=g), metrics.max(x[r], util=g), metrics.min(x[r], util=g),
                metrics.sum(counts[r], util=g),
                metrics.acc(np.array([hits[r].sum()]), np.array([len(hits[r])]), util=g),
                metrics.mae(np.array([np.abs(errs[r]).sum()]), n, util=g),
                metrics.mse(np.array([(errs[r] ** 2).sum()]), n, util=g),
                metrics.rmse(np.array([(errs[r] ** 2).sum()]), n, util=g))

    results, errors = run_workers(workers, worker)
    assert errors == [None] * workers
    all_err, all_hits = np.concatenate(errs), np.concatenate(hits)
    for s, mx, mn, c, a, mae, mse, rmse in results:
        np.testing.assert_allclose(s, x[0] + x[1] + x[2], rtol=1e-6)
        np.testing.assert_array_equal(mx, np.maximum.reduce(x))
        np.testing.assert_array_equal(mn, np.minimum.reduce(x))
        np.testing.assert_array_equal(c, counts[0] + counts[1] + counts[2])
        assert a == all_hits.mean()
        assert mae == pytest.approx(np.abs(all_err).mean(), rel=1e-12)
        assert mse == pytest.approx((all_err ** 2).mean(), rel=1e-12)
        assert rmse == pytest.approx(math.sqrt((all_err ** 2).mean()), rel=1e-12)
    assert all(r[4:] == results[0][4:] for r in results)


def test_workers_making_different_calls_all_raise_naming_each_workers_call():
    def worker(r, g):
        metrics.sum(np.zeros(2), util=g)                      # call 1: the same everywhere
        if r == 1:
            return metrics.max(np.zeros(2), util=g)
        return metrics.auc(np.zeros(8, np.int64), np.zeros(8, np.int64), util=g)

    _, errors = run_workers(3, worker)
    expected = ("fleet.metrics.{}: the workers made different metric calls: worker 0 called auc(int64[8], "
                "int64[8]) as its call 2; worker 1 called max(float64[2]) as its call 2; worker 2 called "
                "auc(int64[8], int64[8]) as its call 2. Every worker must call the same fleet.metrics functions, on arrays of the same shapes "
                "and dtypes, in the same order (they are collective calls)")
    assert [str(e) for e in errors] == [expected.format(m) for m in ("auc", "max", "auc")]
    assert all(type(e) is ConfigError for e in errors)


def test_workers_may_pass_other_dtypes_where_the_reduction_does_not_depend_on_them():
    def worker(r, g):  # worker 1 counts in float32 and int32 buckets, the others in int64
        counts = np.array([3], np.int64 if r != 1 else np.float32)
        buckets = np.array([1, 2, 0], np.int64 if r != 1 else np.int32)
        return metrics.acc(counts, np.array([4]), util=g), metrics.auc(buckets, buckets[::-1].copy(), util=g)

    results, errors = run_workers(3, worker)
    assert errors == [None] * 3
    assert results == [(0.75, metrics.auc(np.array([3, 6, 0]), np.array([0, 6, 3])))] * 3


def test_a_worker_that_skips_a_call_leaves_the_others_with_a_timeout_naming_the_call():
    hub = Loopback(2, timeout_s=0.5)

    def worker(r, g):
        if r == 0:
            return metrics.sum(np.ones(1), util=g)
        return None

    _, errors = run_workers(2, worker, hub)
    assert errors[1] is None and isinstance(errors[0], FleetTimeoutError)
    assert str(errors[0]).startswith("fleet.metrics.sum (this worker's metric call 1): rank 0: not every rank "
                                     "came within 0.5 s. Metric calls are collective: every worker must make "
                                     "the same fleet.metrics calls in the same order")


# ------------------------------------------------------------------ the job's group
class RecordingGroup:
    """What group_from_env returned: a one-member Loopback that records close()."""

    made = []

    def __init__(self, role_maker, alive_check=None):
        self.role_maker, self.closed, self.alive_check = role_maker, 0, alive_check
        self.rank, self.size = role_maker.worker_index(), role_maker.worker_num()
        RecordingGroup.made.append(self)

    def all_gather_object(self, obj):
        return [obj] * self.size

    def all_reduce(self, array, op="sum"):
        return np.asarray(array) * self.size if op == "sum" else np.asarray(array)

    def close(self):
        self.closed += 1


def test_a_parameter_server_worker_makes_the_group_once_and_stop_worker_closes_it(monkeypatch):
    import fleet.transport.group as group_module

    RecordingGroup.made.clear()
    monkeypatch.setattr(group_module, "group_from_env", RecordingGroup)
    rm = UserDefinedRoleMaker(current_id=1, role=Role.WORKER, worker_num=3, server_endpoints=["127.0.0.1:6170"])
    fleet.init(rm)
    np.testing.assert_array_equal(metrics.sum(np.array([2.0])), [6.0])   # 3 workers x 2.0
    assert metrics.acc(np.array([1]), np.array([4])) == 0.25
    assert len(RecordingGroup.made) == 1 and RecordingGroup.made[0].role_maker is rm
    fleet.stop_worker()
    assert RecordingGroup.made[0].closed == 1
    metrics.sum(np.array([1.0]))                                          # a new group after the stop
    assert len(RecordingGroup.made) == 2
    fleet.init(rm)                                                        # a new job closes the old group
    assert RecordingGroup.made[1].closed == 1


def test_the_metrics_group_of_a_parameter_server_worker_waits_only_while_its_servers_live(monkeypatch):
    """The group's waits check the communicator's liveness: a lost server ends them with its error."""
    import types

    import fleet.transport.group as group_module

    RecordingGroup.made.clear()
    monkeypatch.setattr(group_module, "group_from_env", RecordingGroup)
    fleet.init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=2,
                                    server_endpoints=["127.0.0.1:6170"]))
    comm = types.SimpleNamespace(check_alive=lambda: None)
    monkeypatch.setattr(fleet.base.fleet, "_runtime", types.SimpleNamespace(comm=comm))
    metrics.sum(np.array([1.0]))
    assert RecordingGroup.made[-1].alive_check is comm.check_alive


def test_a_runtime_with_a_worker_group_lends_it_to_the_metrics(monkeypatch):
    import fleet.transport.group as group_module

    monkeypatch.setattr(group_module, "group_from_env", lambda rm: pytest.fail("made a second group"))
    fleet.init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=2,
                                    server_endpoints=["127.0.0.1:6170"]))
    lent = RecordingGroup(fleet.base.fleet._role_maker)

    class Comm:  # the shape of the collective and hybrid communicators
        uses_worker_group = True
        group = None

    class Runtime:
        comm = Comm()

        def stop_worker(self):
            self.comm.group = None

    fleet.base.fleet._runtime = runtime = Runtime()
    with pytest.raises(ConfigError) as info:                 # before init_worker joined it
        metrics.sum(np.array([3], np.int64))
    assert str(info.value) == ("fleet.metrics.sum runs over the workers' group this job trains with, which this "
                               "worker has not joined: call it after fleet.init_worker() and before "
                               "fleet.stop_worker()")
    runtime.comm.group = lent
    np.testing.assert_array_equal(metrics.sum(np.array([3], np.int64)), [6])
    fleet.stop_worker()
    assert lent.closed == 0  # the communicator's group is the communicator's to close


# ------------------------------------------------------------------ real worker groups
def run_group(size, ports, fn, timeout_ms=None):
    """fn(rank, group) on ``size`` threads, each holding a WorkerGroup on 127.0.0.1; every
    group is closed before this returns."""
    from fleet.transport.group import WorkerGroup

    endpoints = [f"127.0.0.1:{p}" for p in ports(size)]

    def body(rank, _):
        with WorkerGroup(endpoints, rank, timeout_ms=timeout_ms) as group:
            return fn(rank, group)

    return run_workers(size, body, Loopback(size, timeout_s=60))


def test_over_real_worker_groups_the_merged_auc_is_the_pooled_auc_and_every_metric_agrees(free_ports):
    rng = np.random.default_rng(11)
    preds = [_worker_predictions(rng, r, 300 + 100 * r) for r in range(3)]
    buckets = [_layer_buckets(s, y, 4095) for s, y in preds]
    pooled = _layer_buckets(np.concatenate([s for s, _ in preds]), np.concatenate([y for _, y in preds]), 4095)
    offline = paddle_auc_loop(*(b.astype(float) for b in pooled))
    x = [rng.normal(size=5).astype(np.float32) for _ in range(3)]

    results, errors = run_group(3, free_ports, lambda r, g: (
        metrics.auc(*buckets[r], util=g), metrics.max(x[r], util=g),
        metrics.rmse(np.array([float(r + 1)]), np.array([2 * r + 1]), util=g)))
    assert errors == [None] * 3
    for auc_value, mx, rmse in results:
        assert auc_value == offline
        np.testing.assert_array_equal(mx, np.maximum.reduce(x))
        assert rmse == math.sqrt(6.0 / 9.0)


def test_over_real_worker_groups_a_worker_that_skips_a_call_is_named_by_the_others(free_ports):
    def worker(rank, group):
        metrics.sum(np.ones(3), util=group)
        if rank == 1:
            time.sleep(1.5)  # skips the auc every other worker calls, and leaves later
            return None
        return metrics.auc(np.ones(4, np.int64), np.ones(4, np.int64), util=group)

    _, errors = run_group(3, free_ports, worker, timeout_ms=800)
    assert errors[1] is None
    for rank in (0, 2):
        text = str(errors[rank])
        assert type(errors[rank]) is FleetTimeoutError, errors[rank]
        assert text.startswith("fleet.metrics.auc (this worker's metric call 2): rank 1 (127.0.0.1:"), text
        assert "within 800 ms" in text, text
        assert "every worker must make the same fleet.metrics calls in the same order" in text


def test_over_real_worker_groups_a_worker_that_stopped_is_named_by_the_others(free_ports):
    def worker(rank, group):
        metrics.sum(np.ones(3), util=group)
        if rank == 1:
            return None  # closes its group at once
        return metrics.acc(np.ones(1), np.ones(1), util=group)

    _, errors = run_group(3, free_ports, worker, timeout_ms=5000)
    assert errors[1] is None
    for rank in (0, 2):
        assert isinstance(errors[rank], TransportError), errors[rank]
        assert str(errors[rank]).startswith(
            f"fleet.metrics.acc (this worker's metric call 2): rank 1 (127.0.0.1:"), errors[rank]
        assert "closed the worker group while rank" in str(errors[rank])


def test_a_group_that_does_not_form_is_reported_as_the_metric_call_that_waited(monkeypatch):
    import fleet.transport.group as group_module

    def missing_worker(role_maker, alive_check=None):
        raise FleetTimeoutError("rank 2 (127.0.0.1:7003) did not answer rank 0 in joining within 60000 ms")

    monkeypatch.setattr(group_module, "group_from_env", missing_worker)
    fleet.init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=3, server_endpoints=["127.0.0.1:6170"]))
    with pytest.raises(FleetTimeoutError) as info:
        metrics.auc(np.zeros(3), np.zeros(3))
    assert str(info.value) == (
        "fleet.metrics.auc: the workers' group for global metrics did not form: rank 2 (127.0.0.1:7003) did not "
        "answer rank 0 in joining within 60000 ms. Every worker makes the same fleet.metrics calls; a worker that "
        "makes none, or its first one more than FLEET_CONNECT_TIMEOUT_MS after the others, leaves them waiting")
