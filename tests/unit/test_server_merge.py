"""merge_async_pushes: async servers average a window of pushes into one update; the window
shrinks as workers stop so no push is left behind."""
import numpy as np
import pytest

from fleet.errors import ConfigError
from fleet.server.parameter_server import ParameterServer
from strategies import DistributeTranspilerConfig
from test_server_liveness import LR, handle, make_server, w_value


def merging(workers, merge):
    ps = make_server("async", workers=workers)
    return ParameterServer(ps.endpoint, ps.plan, {"w": np.ones((7, 2), np.float32), "b": np.zeros(2, np.float32),
                                                  "t": np.full((100, 3), 2.0, np.float32)}, merge_pushes=merge)


def push(ps, worker, v, rows=None):
    names, arrays = ["w"], [np.full((7, 2), v, np.float32)]
    if rows is not None:
        names += ["t@ROWS", "t@VALUES"]
        arrays += [np.asarray(rows, dtype=np.int64), np.full((len(rows), 3), v, np.float32)]
    req = handle(ps, "push", worker, names, arrays)
    assert req.answer[0] == "ok", req.answer


def test_a_window_of_pushes_becomes_one_update_with_their_mean():
    ps = merging(workers=3, merge=3)
    push(ps, 0, 1.0, rows=[5])
    push(ps, 2, 2.0, rows=[5, 6])
    np.testing.assert_array_equal(w_value(ps), 1.0)  # not applied yet: the window holds 2 of 3
    push(ps, 0, 6.0)
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * (1.0 + 2.0 + 6.0) / 3)
    t = ps.blocks["t"][2].pull()
    np.testing.assert_allclose(t[5], 2.0 - LR * (1.0 + 2.0) / 3)  # rows: summed, divided by the window
    np.testing.assert_allclose(t[6], 2.0 - LR * 2.0 / 3)
    np.testing.assert_array_equal(t[7], 2.0)


def test_zero_means_one_push_per_worker_still_training_and_stops_release_the_rest():
    ps = merging(workers=2, merge=0)
    push(ps, 0, 4.0)
    np.testing.assert_array_equal(w_value(ps), 1.0)
    assert handle(ps, "stop", 1).answer[0] == "ok"  # worker 1 is done: a window is one push now
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 4.0)
    push(ps, 0, 2.0)
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 6.0)


def test_a_window_may_hold_several_pushes_of_one_worker_and_shrinks_as_workers_stop():
    ps = merging(workers=2, merge=4)  # e.g. 2 workers x 2 threads, each thread pushing
    for v in (1.0, 1.0, 2.0):
        push(ps, 0, v)
    np.testing.assert_array_equal(w_value(ps), 1.0)
    push(ps, 0, 4.0)
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 8.0 / 4)
    push(ps, 1, 2.0)
    assert handle(ps, "stop", 0).answer[0] == "ok"  # one of two workers left: windows of 2
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 2.0)  # 1 of 2 pushes in
    push(ps, 1, 2.0)
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 4.0)
    push(ps, 1, 4.0)
    assert handle(ps, "stop", 1).answer[0] == "ok"  # the last stop releases what is left
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 8.0)


def test_one_applies_each_push_on_arrival_as_paddle():
    ps = merging(workers=2, merge=1)
    push(ps, 0, 1.0)
    push(ps, 1, 1.0)
    np.testing.assert_allclose(w_value(ps), 1.0 - 2 * LR)


def test_merging_and_dc_asgd_are_refused_together():
    ps = make_server("async", workers=2)
    with pytest.raises(ConfigError, match="cannot be combined with merge_async_pushes=2"):
        ParameterServer(ps.endpoint, ps.plan, {"w": np.ones((7, 2), np.float32), "b": np.zeros(2, np.float32),
                                               "t": np.full((100, 3), 2.0, np.float32)},
                        dc_asgd=True, merge_pushes=2)


def test_the_setting_is_validated_with_its_fix():
    config = DistributeTranspilerConfig()
    assert config.merge_async_pushes == 1
    with pytest.raises(ConfigError, match=r"merge_async_pushes=-1 .*config.merge_async_pushes = 0"):
        config.merge_async_pushes = -1


def test_a_push_without_rows_counts_as_its_workers_share_of_the_window():
    """A hybrid worker whose step has no rows on this server still pushes (nothing): the
    update is the mean over the workers' steps, the empty one adding zero, as in sync."""
    ps = merging(workers=2, merge=0)
    push(ps, 0, 1.0, rows=[5])
    assert handle(ps, "push", 1, [], []).answer[0] == "ok"
    t = ps.blocks["t"][2].pull()
    np.testing.assert_allclose(t[5], 2.0 - LR * 1.0 / 2)
    np.testing.assert_allclose(w_value(ps), 1.0 - LR * 1.0 / 2)


def test_the_hybrid_strategy_merges_one_push_per_worker_by_default():
    from strategies import DistributedStrategyFactory

    assert DistributedStrategyFactory.create_hybrid_strategy().get_program_config().merge_async_pushes == 0
    assert DistributedStrategyFactory.create_async_strategy().get_program_config().merge_async_pushes == 1


def test_a_push_asking_for_dense_blocks_is_answered_with_their_values_after_it():
    ps = merging(workers=1, merge=1)
    req = handle(ps, "push", 0, ["w"], [np.full((7, 2), 3.0, np.float32)], {"pull": ["w", "b"]})
    assert req.answer[0] == "ok", req.answer
    names, arrays = req.answer[1], req.answer[2]
    assert names == ["w", "b"]
    np.testing.assert_allclose(arrays[0], 1.0 - LR * 3.0)  # the update applied, then read
    np.testing.assert_array_equal(arrays[1], 0.0)


def test_a_push_asking_for_an_unknown_block_is_refused_before_it_is_applied():
    ps = merging(workers=1, merge=1)
    req = handle(ps, "push", 0, ["w"], [np.full((7, 2), 3.0, np.float32)], {"pull": ["nope"]})
    assert req.answer[0] == "error" and "'nope'" in req.answer[1]
    np.testing.assert_array_equal(w_value(ps), 1.0)
