"""Elastic jobs without processes: the work queue, the server forgetting lost workers and
admitting new ones, the pass-grouped barrier and reduce, the dataset's byte-range units,
FLEET_ELASTIC parsing and fleetrun's --np configuration."""
import numpy as np
import pytest

from fleet.dataset.elastic import read_unit
from fleet.elastic import check_elastic_mode, elastic_range, parse_np
from fleet.errors import ConfigError, DataError
from fleet.launch.cli import build_parser, config_from_args
from fleet.launch.config import LaunchConfig, process_environment
from fleet.server.work_queue import WorkQueue
from test_server_liveness import ENDPOINT, handle, make_server
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan


# ------------------------------------------------------------------ FLEET_ELASTIC
def test_np_parses_min_max_and_a_single_number():
    assert parse_np("2:4") == (2, 4)
    assert parse_np(" 3 ") == (3, 3)
    assert elastic_range({"FLEET_ELASTIC": "1:2"}) == (1, 2)
    assert elastic_range({}) is None


@pytest.mark.parametrize("bad", ["4:2", "0:3", "a:b", "1:2:3", ""])
def test_a_malformed_np_names_the_value_and_the_form(bad):
    with pytest.raises(ConfigError, match=f"--np={bad!r} is not MIN:MAX with 1 <= MIN <= MAX"):
        parse_np(bad)


def test_a_sync_strategy_in_an_elastic_job_is_refused_naming_the_fix():
    env = {"FLEET_ELASTIC": "2:4"}
    for mode in ("async", "half_async", "geo"):
        check_elastic_mode(mode, env)
    with pytest.raises(ConfigError, match=r"FLEET_ELASTIC=2:4, from fleetrun --np\) but its strategy is sync.*"
                                          r"Use an async, half_async or geo strategy"):
        check_elastic_mode("sync", env)
    check_elastic_mode("sync", {})  # not elastic: anything goes


# ------------------------------------------------------------------ the work queue
FILES = [["a", 250], ["b", 100]]


def test_units_are_byte_ranges_handed_out_in_order_and_acknowledged_once():
    q = WorkQueue()
    status = q.open(0, 0, FILES, 100)
    assert status["units"] == 4  # a: 0-100, 100-200, 200-250; b: 0-100
    got = [q.take(w, 0) for w in (0, 1, 0, 1)]
    assert [(u["unit"], u["path"], u["start"], u["end"]) for u in got] == [
        (0, "a", 0, 100), (1, "a", 100, 200), (2, "a", 200, 250), (3, "b", 0, 100)]
    assert q.take(0, 0) == {"wait": True}  # held by workers: they may still come back
    for u, w, n in ((0, 0, 10), (1, 1, 11), (2, 0, 5), (3, 1, 9)):
        assert q.ack(w, 0, u, n)
    assert q.take(1, 0) == {"done": True}
    s = q.status()["0"]
    assert (s["acked"], s["examples"], s["workers"]) == (4, 35, {"0": {"units": 2, "examples": 15},
                                                                  "1": {"units": 2, "examples": 20}})


def test_a_lost_workers_units_go_back_to_the_front_and_its_late_ack_is_stale():
    q = WorkQueue()
    q.open(0, 0, FILES, 100)
    first, second = q.take(1, 0), q.take(1, 0)
    third = q.take(0, 0)
    assert q.release(1) == 2
    assert [q.take(0, 0)["unit"] for _ in range(2)] == [first["unit"], second["unit"]]
    assert not q.ack(1, 0, first["unit"], 7)  # worker 1's ack after it was taken for lost
    assert q.ack(0, 0, third["unit"], 3)
    s = q.status()["0"]
    assert (s["returned_units"], s["returned_bytes"], s["returned_from"], s["stale_acks"]) == (2, 200, [1], 1)


def test_workers_opening_a_pass_over_other_files_are_told_to_give_the_same_list():
    q = WorkQueue()
    q.open(0, 0, FILES, 100)
    with pytest.raises(DataError, match=r"worker 1 opened pass 0 over 1 files \(a\), but worker 0 opened it over "
                                        r"2 files \(a, b\).*fleet.split_files returns the whole list"):
        q.open(1, 0, [["a", 250]], 100)


def test_a_checkpointed_pass_resumes_without_the_units_acknowledged_before_it(caplog):
    before = WorkQueue()
    before.open(0, 0, FILES, 100)
    taken = [before.take(w, 0)["unit"] for w in (0, 1, 0)]
    assert before.ack(0, 0, taken[0], 10) and before.ack(1, 0, taken[1], 11)
    record = before.progress_of(0)  # what worker 0's checkpoint keeps; unit 2 is held, not acknowledged
    assert record == {"files": FILES, "unit_bytes": 100, "units": 4, "acked": [[0, 10], [1, 11]]}
    assert before.progress_of(5) is None  # a worker that opened no pass

    after = WorkQueue()  # the restarted job's server 0, loaded from that checkpoint
    after.restore(record)
    with caplog.at_level("INFO", logger="fleet.server"):
        status = after.open(1, 0, FILES, 100)
    assert "pass 0 resumes the checkpoint's pass: 2 of its 4 units (21 examples)" in caplog.text
    assert (status["acked"], status["pending"], status["restored"]) == (2, 2, {"units": 2, "examples": 21})
    assert [after.take(1, 0)["unit"] for _ in range(2)] == [2, 3]
    assert after.ack(1, 0, 2, 5) and after.ack(1, 0, 3, 9)
    s = after.status()["0"]
    assert (s["done"], s["examples"], s["workers"]) == (True, 35, {"1": {"units": 2, "examples": 14}})
    assert after.open(1, 1, FILES, 100)["restored"] == {"units": 0, "examples": 0}  # the next pass: whole


def test_a_checkpointed_pass_over_other_files_is_not_resumed_and_says_why(caplog):
    q = WorkQueue()
    q.restore({"files": FILES, "unit_bytes": 100, "units": 4, "acked": [[0, 10]]})
    with caplog.at_level("WARNING", logger="fleet.server"):
        status = q.open(0, 0, FILES, 50)
    assert status["acked"] == 0 and status["pending"] == status["units"] == 7
    assert ("pass 0 does not resume the checkpoint's pass, so it is trained whole: the checkpoint's pass was over "
            "2 files (a, b) in units of 100 bytes, this one over 2 files (a, b) in units of 50 bytes") in caplog.text
    with pytest.raises(DataError, match="is not a record of acknowledged work units"):
        q.restore({"acked": 3})


def test_a_unit_holds_the_lines_that_start_in_its_range(tmp_path):
    path = tmp_path / "f"
    lines = [b"%d\t" % i + b"x" * (i % 7) + b"\n" for i in range(200)]
    path.write_bytes(b"".join(lines) + b"last-without-newline")
    size = path.stat().st_size
    for unit in (1, 13, 64, size):
        pieces = [read_unit(str(path), a, min(size, a + unit)) for a in range(0, size, unit)]
        assert b"".join(pieces) == path.read_bytes(), unit


# ------------------------------------------------------------------ the server
def elastic_server(mode="async", low=2, high=4, merge_pushes=1):
    plain = make_server(mode, workers=high)
    init = {"w": np.ones((7, 2), np.float32), "b": np.zeros(2, np.float32), "t": np.full((100, 3), 2.0, np.float32)}
    return ParameterServer(ENDPOINT, plain.plan, init, merge_pushes=merge_pushes, elastic=(low, high))


def test_a_lost_worker_is_forgotten_not_the_jobs_failure_and_its_units_return():
    ps = elastic_server()
    handle(ps, "join", 0), handle(ps, "join", 1)
    for w in (0, 1):
        handle(ps, "units_open", w, meta={"pass": 0, "files": FILES, "unit_bytes": 100})
    held = handle(ps, "units_take", 1, meta={"pass": 0})
    assert held.answer[0] == "ok"
    barrier = handle(ps, "barrier", 0, meta={"pass": 0})
    assert barrier.deferred and not barrier.answered
    ps.check_liveness({0: 100.0, 1: 97.0}, timeout_s=2.0, now=100.0)
    assert ps.failure is None and ps.lost.keys() == {1} and ps.live == {0}
    assert barrier.answer[0] == "ok"  # the barrier counts the live workers only
    assert ps.work.status()["0"]["pending"] == 4  # worker 1's unit is back
    refused = handle(ps, "units_take", 1, meta={"pass": 0})
    assert refused.answer[0] == "error" and "worker 1 was lost" in refused.answer[1]
    assert "fleet.init_worker()" in refused.answer[1]
    again = handle(ps, "join", 1)  # a replacement takes the id
    assert again.answer[0] == "ok" and ps.live == {0, 1} and 1 not in ps.lost


def test_a_new_worker_id_joins_and_counts_in_merged_pushes_and_reductions():
    ps = elastic_server(merge_pushes=0)
    handle(ps, "join", 0), handle(ps, "join", 1), handle(ps, "join", 3)
    assert ps.live == {0, 1, 3} and ps._merge_window() == 3
    reqs = [handle(ps, "reduce", w, ["a0"], [np.array([float(w)])], {"reduce": "sum"}) for w in (0, 1)]
    assert not any(r.answered for r in reqs)
    last = handle(ps, "reduce", 3, ["a0"], [np.array([3.0])], {"reduce": "sum"})
    assert [r.answer[2][0].tolist() for r in reqs + [last]] == [[4.0]] * 3
    handle(ps, "stop", 3)
    assert ps._merge_window() == 2 and not ps.finished()
    handle(ps, "stop", 0), handle(ps, "stop", 1)
    assert ps.finished()


def test_barriers_are_grouped_by_pass_so_a_late_joiner_does_not_hold_the_others():
    ps = elastic_server()
    for w in (0, 1, 2):
        handle(ps, "join", w)
    for w in (0, 1):
        handle(ps, "units_open", w, meta={"pass": 1, "files": FILES, "unit_bytes": 100})
    handle(ps, "units_open", 2, meta={"pass": 0, "files": FILES, "unit_bytes": 100})
    late = handle(ps, "barrier", 2, meta={"pass": 0})
    assert late.answer[0] == "ok"  # the others are past pass 0
    first = handle(ps, "barrier", 0, meta={"pass": 1})
    assert not first.answered
    handle(ps, "units_open", 2, meta={"pass": 1, "files": FILES, "unit_bytes": 100})
    handle(ps, "barrier", 1, meta={"pass": 1})
    assert not first.answered  # worker 2 is in pass 1 now
    handle(ps, "barrier", 2, meta={"pass": 1})
    assert first.answer[0] == "ok"


def test_an_elastic_sync_server_is_refused():
    plain = make_server("sync", workers=2)
    with pytest.raises(ConfigError, match="cannot train in sync mode"):
        ParameterServer(ENDPOINT, plain.plan, {}, elastic=(1, 2))


def test_a_fixed_job_still_fails_on_a_lost_worker():
    ps = make_server("async", workers=2)
    refused = handle(ps, "join", 0)
    assert "'join' is an op of elastic jobs" in refused.answer[1]
    ps.check_liveness({0: 100.0, 1: 97.0}, timeout_s=2.0, now=100.0)
    assert ps.failure is not None and "worker 1 was lost" in ps.failure
    assert "data: the job is not elastic (fleetrun --np MIN:MAX" in ps.failure


# ------------------------------------------------------------------ fleetrun --np
def test_np_gives_max_worker_slots_starts_min_and_sets_fleet_elastic():
    args = build_parser().parse_args(["--np", "2:4", "--server_num", "1", "train.py"])
    config = config_from_args(args)
    assert config.elastic == (2, 4) and len(config.worker_endpoints) == 4 and config.here("worker") == (0, 1)
    env = process_environment(config, "worker", 3, base={"FLEET_ELASTIC": "9:9"})
    assert (env["FLEET_ELASTIC"], env["PADDLE_TRAINERS_NUM"], env["PADDLE_TRAINER_ID"]) == ("2:4", "4", "3")
    fixed = config_from_args(build_parser().parse_args(["--server_num", "1", "train.py"]))
    assert "FLEET_ELASTIC" not in process_environment(fixed, "worker", 0, base={"FLEET_ELASTIC": "2:4"})


def test_np_refuses_a_worker_num_outside_its_range_and_collective_jobs():
    with pytest.raises(ConfigError, match=r"--worker_num 5 is outside --np 2:4"):
        config_from_args(build_parser().parse_args(["--np", "2:4", "--worker_num", "5", "train.py"]))
    with pytest.raises(ConfigError, match=r"give --server_num 1 or more, without --collective"):
        config_from_args(build_parser().parse_args(["--np", "2:4", "--collective", "train.py"]))
    with pytest.raises(ConfigError, match=r"worker_replacements are for elastic jobs"):
        LaunchConfig("train.py", server_endpoints=("127.0.0.1:1",), worker_endpoints=("127.0.0.1:2",),
                     worker_replacements=1)


def test_a_multi_host_elastic_config_starts_its_local_slots_and_admits_by_id():
    config = LaunchConfig("train.py", server_endpoints=("10.0.0.1:1",),
                          worker_endpoints=("10.0.0.1:2", "10.0.0.2:2", "10.0.0.2:3"),
                          local_servers=(), local_workers=(1,), elastic=(1, 3))
    assert config.here("worker") == (1,) and config.initial_workers == 1
    env = process_environment(config, "worker", 2, base={})
    assert (env["FLEET_ELASTIC"], env["PADDLE_TRAINER_ID"], env["POD_IP"]) == ("1:3", "2", "10.0.0.2")


def test_a_rounds_server_expects_the_rounds_slots_so_a_reduction_does_not_wait_for_a_lost_hosts_id():
    plain = make_server("async", workers=3)
    init = {"w": np.ones((7, 2), np.float32), "b": np.zeros(2, np.float32), "t": np.full((100, 3), 2.0, np.float32)}
    ps = ParameterServer(ENDPOINT, plain.plan, init, elastic=(2, 3), expected=(0, 2))  # slot 1's host was lost
    assert ps.live == {0, 2}
    first = handle(ps, "reduce", 0, ["a0"], [np.array([1.0])], {"reduce": "sum"})
    assert not first.answered
    last = handle(ps, "reduce", 2, ["a0"], [np.array([2.0])], {"reduce": "sum"})
    assert first.answer[0] == "ok" and last.answer[0] == "ok"
    assert elastic_server(low=2, high=3).live == {0, 1}  # without: ids 0..MIN-1
