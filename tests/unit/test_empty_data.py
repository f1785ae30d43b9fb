"""A pass over no data is an error naming why, and a process that trained nothing does
not save a model (issue: an empty data file trained nothing, exited 0 and saved a model).

Paddle 1.x's train_from_dataset returns without an error after a pass over files that hold
no example; fleet raises DataError instead (README, "No data is an error").
"""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError
from role_makers import LocalRoleMaker

pytestmark = pytest.mark.usefixtures("fresh_fleet")


def _model():
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        y = layers.data("y", shape=[1], dtype="int64")
        pred = layers.fc(x, 2, act="softmax")
        loss = layers.mean(layers.cross_entropy(pred, y))
        optimizer.SGD(0.1).minimize(loss)
    return main, startup, [x, y], loss, pred


def _dataset(inputs, files, kind="QueueDataset"):
    ds = fleet.DatasetFactory().create_dataset(kind)
    ds.set_use_var(inputs)
    ds.set_batch_size(4)
    ds.set_filelist(files)
    return ds


def _write(path, lines):
    path.write_text("".join(f"2 0.5 {i % 3 * 0.1} 1 {i % 2}\n" for i in range(lines)))
    return str(path)


@pytest.fixture
def model():
    """A local fleet with a fresh model: (exe, main, inputs, pred)."""
    fleet.init(LocalRoleMaker())
    main, startup, inputs, loss, pred = _model()
    exe = fleet.Executor()
    exe.run(startup)
    return exe, main, inputs, pred


# ------------------------------------------------------------------ passes over no data


def test_an_empty_file_list_is_a_data_error_that_says_how_a_worker_gets_none(model):
    exe, main, inputs, _ = model
    with pytest.raises(DataError) as e:
        exe.train_from_dataset(main, _dataset(inputs, []), print_period=0)
    assert str(e.value) == (
        "train_from_dataset ran a pass over 0 examples: the dataset's file list is empty (set_filelist([])); "
        "give every worker at least one file (fleet.split_files(files) gives a worker none when there are "
        "fewer files than workers). Nothing was trained, so the pass is an error rather than a model that "
        "looks trained")


def test_empty_files_are_a_data_error_naming_them(model, tmp_path):
    exe, main, inputs, _ = model
    files = [_write(tmp_path / "a.txt", 0), _write(tmp_path / "b.txt", 0)]
    with pytest.raises(DataError) as e:
        exe.train_from_dataset(main, _dataset(inputs, files), print_period=0)
    assert str(e.value) == (
        f"train_from_dataset ran a pass over 0 examples: the dataset's 2 files {files} held 0 lines; check the "
        f"files (and the pipe command, if one is set). Nothing was trained, so the pass is an error rather "
        f"than a model that looks trained")


def test_files_whose_every_line_was_skipped_say_so(model, tmp_path):
    exe, main, inputs, _ = model
    bad = tmp_path / "bad.txt"
    bad.write_text("not a line\nnor this\n")
    ds = _dataset(inputs, [str(bad)])
    ds.set_skip_bad_lines(True)
    with pytest.raises(DataError, match=r"the dataset's 1 file \[.*bad.txt'\] held 2 lines, every one "
                                        r"skipped as malformed \(set_skip_bad_lines\)"):
        exe.train_from_dataset(main, ds, print_period=0)


def test_an_in_memory_dataset_that_loaded_nothing_is_a_data_error(model, tmp_path):
    exe, main, inputs, _ = model
    empty = _write(tmp_path / "empty.txt", 0)
    ds = _dataset(inputs, [empty], kind="InMemoryDataset")
    ds.load_into_memory()
    with pytest.raises(DataError) as e:
        exe.train_from_dataset(main, ds, print_period=0)
    assert str(e.value) == (
        f"train_from_dataset ran a pass over 0 examples: the InMemoryDataset holds 0 examples: load_into_memory "
        f"read 1 file ['{empty}'], which held 0 lines; check the files (and the pipe command, if one is set). "
        f"Nothing was trained, so the pass is an error rather than a model that looks trained")


def test_an_in_memory_dataset_loaded_from_an_empty_file_list_says_how_a_worker_gets_none(model):
    exe, main, inputs, _ = model
    ds = _dataset(inputs, [], kind="InMemoryDataset")
    ds.load_into_memory()
    with pytest.raises(DataError) as e:
        exe.train_from_dataset(main, ds, print_period=0)
    assert str(e.value) == (
        "train_from_dataset ran a pass over 0 examples: the InMemoryDataset holds 0 examples: its file list was "
        "empty when it was loaded (set_filelist([])); give every worker at least one file (fleet.split_files(files) "
        "gives a worker none when there are fewer files than workers). Nothing was trained, so the pass is an "
        "error rather than a model that looks trained")


def test_split_files_gives_a_worker_no_file_when_there_are_fewer_files_than_workers(model):
    from role_makers import Role, RoleMakerBase

    class Worker2Of3(RoleMakerBase):
        def generate_role(self):
            self._role, self._current_id, self._worker_num = Role.WORKER, 2, 3
            self._server_endpoints = []
            self._role_is_generated = True
            self._is_local = True

    fleet.init(Worker2Of3())
    assert fleet.split_files(["a", "b"]) == []  # Paddle's split, unchanged: the pass reports it


def test_infer_from_dataset_over_no_data_is_an_error_too(model):
    exe, main, inputs, _ = model
    with pytest.raises(DataError, match=r"^infer_from_dataset ran a pass over 0 examples: .* Nothing was "
                                        r"predicted, so the pass is an error rather than a model that looks "
                                        r"predicted$"):
        exe.infer_from_dataset(main, _dataset(inputs, []), print_period=0)


# ------------------------------------------------------------------ saves of untrained parameters
UNTRAINED = ("fleet.{what}() refused: this process trained no example (no exe.run of a training program or "
             "train_from_dataset pass ran one) and loaded no model, so the save would hold the initial "
             "parameters as if they were a trained model. Check that this process got data; to save untrained "
             "parameters on purpose, set FLEET_SAVE_UNTRAINED=1")


def _feed(n=4):
    return {"x": np.full((n, 2), 0.5, np.float32), "y": np.arange(n).reshape(n, 1) % 2}


def test_a_save_after_training_on_nothing_is_refused_and_writes_nothing(model, tmp_path):
    exe, main, inputs, pred = model
    for batch in []:  # an exe.run loop over a reader that gave nothing
        exe.run(main, feed=batch)
    with pytest.raises(ConfigError) as e:
        fleet.save_persistables(exe, str(tmp_path / "model"))
    assert str(e.value) == UNTRAINED.format(what="save_persistables")
    with pytest.raises(ConfigError) as e:
        fleet.save_inference_model(exe, str(tmp_path / "infer"), ["x"], [pred], main_program=main)
    assert str(e.value) == UNTRAINED.format(what="save_inference_model")
    assert not list(tmp_path.iterdir())


def test_a_run_of_the_forward_program_only_does_not_count_as_training(model, tmp_path):
    exe, main, inputs, pred = model
    exe.run(main.clone(for_test=True), feed=_feed(), fetch_list=[pred])
    with pytest.raises(ConfigError, match="trained no example"):
        fleet.save_persistables(exe, str(tmp_path / "model"))


def test_one_trained_example_allows_the_save(model, tmp_path):
    exe, main, inputs, pred = model
    exe.run(main, feed=_feed(1))
    assert fleet.save_persistables(exe, str(tmp_path / "model"))
    assert fleet.save_inference_model(exe, str(tmp_path / "infer"), ["x"], [pred], main_program=main)


def test_a_save_right_after_loading_a_model_is_allowed(model, tmp_path, monkeypatch):
    exe, main, inputs, pred = model
    monkeypatch.setenv("FLEET_SAVE_UNTRAINED", "1")
    fleet.save_persistables(exe, str(tmp_path / "start"))
    monkeypatch.delenv("FLEET_SAVE_UNTRAINED")
    fw.global_scope().loaded_from = None
    fleet.load_persistables(exe, str(tmp_path / "start"))
    assert fleet.save_persistables(exe, str(tmp_path / "copy"))


def test_an_inference_program_alone_saves_without_training(model, tmp_path):
    exe, main, inputs, pred = model
    assert fleet.save_inference_model(exe, str(tmp_path / "infer"), ["x"], [pred], main_program=main, program_only=True)


def test_save_untrained_takes_only_0_or_1(model, tmp_path, monkeypatch):
    exe, main, inputs, pred = model
    monkeypatch.setenv("FLEET_SAVE_UNTRAINED", "yes")
    with pytest.raises(ConfigError) as e:
        fleet.save_persistables(exe, str(tmp_path / "model"))
    assert str(e.value) == ("FLEET_SAVE_UNTRAINED='yes' must be 0 or 1 (1: allow saving parameters that nothing "
                            "trained or loaded)")


# ------------------------------------------------------------------ telling the job
def _recording_hooks():
    from fleet.framework.hooks import TrainingHooks

    class Recording(TrainingHooks):
        who = "worker 1 of 2"

        def __init__(self):
            self.failures = []

        def pass_failed(self, error):
            self.failures.append(error)

    return Recording()


def test_a_pass_over_no_data_names_the_worker_and_is_reported_to_the_hooks(model):
    exe, main, inputs, _ = model
    main.training_hooks = hooks = _recording_hooks()
    with pytest.raises(DataError) as e:
        exe.train_from_dataset(main, _dataset(inputs, []), print_period=0)
    assert str(e.value).startswith("worker 1 of 2: train_from_dataset ran a pass over 0 examples: ")
    assert hooks.failures == [e.value]


def test_a_bad_line_is_reported_to_the_hooks_but_a_failure_of_the_job_is_not(model, tmp_path):
    from fleet.errors import ServerError

    exe, main, inputs, _ = model
    main.training_hooks = hooks = _recording_hooks()
    bad = tmp_path / "bad.txt"
    bad.write_text("not a line\n")
    with pytest.raises(DataError, match="line 1") as e:
        exe.train_from_dataset(main, _dataset(inputs, [str(bad)]), print_period=0)
    assert hooks.failures == [e.value]

    def told(feed):
        raise ServerError("127.0.0.1:6170", "worker 0 was lost: ...")

    hooks.failures.clear()
    hooks.prefetch_ahead = True
    hooks.prepare_batch = told
    with pytest.raises(ServerError):
        exe.train_from_dataset(main, _dataset(inputs, [_write(tmp_path / "ok.txt", 12)]), print_period=0)
    assert hooks.failures == []


# ------------------------------------------------------------------ saves on a distributed worker
class FakeRuntime:
    """What Fleet._check_trained asks a worker's runtime: the servers' progress."""

    def __init__(self, updates, loaded):
        self.progress = (updates, loaded)

    def job_progress(self, what):
        return self.progress


@pytest.mark.parametrize("updates, loaded, refused", [(0, False, True), (5, False, False), (0, True, False)])
def test_a_worker_that_trained_nothing_saves_only_what_the_servers_trained_or_loaded(
        model, tmp_path, updates, loaded, refused):
    from role_makers import Role, RoleMakerBase

    class Worker0Of2(RoleMakerBase):
        def generate_role(self):
            self._role, self._current_id, self._worker_num = Role.WORKER, 0, 2
            self._server_endpoints = ["127.0.0.1:6170"]
            self._role_is_generated = True

    fleet.init(Worker0Of2())
    fleet.base.fleet._runtime = FakeRuntime(updates, loaded)
    if not refused:
        fleet.base.fleet._check_trained("save_persistables")
        return
    with pytest.raises(ConfigError) as e:
        fleet.base.fleet._check_trained("save_persistables")
    assert str(e.value) == (
        "worker 0 of 2: fleet.save_persistables() refused: this process trained no example (no exe.run of a "
        "training program or train_from_dataset pass ran one) and loaded no model, the servers applied no update "
        "from any worker and loaded no checkpoint (fleet.init_server(dirname)), so the save would hold the initial "
        "parameters as if they were a trained model. Check that this process got data; to save untrained "
        "parameters on purpose, set FLEET_SAVE_UNTRAINED=1")


def test_job_progress_counts_the_servers_updates_and_loads():
    from types import SimpleNamespace

    from fake_cluster import Cluster
    from fleet.runtime import WorkerRuntime
    from strategies import DistributedStrategyFactory

    main, startup, inputs, loss, pred = _model()
    cluster = Cluster(main, startup, DistributedStrategyFactory.create_async_strategy(), 2)
    runtime = SimpleNamespace(comm=cluster.comm, _need_started=lambda what: None)
    assert WorkerRuntime.job_progress(runtime) == (0, False)
    cluster.push({"fc_0.w_0@GRAD": np.ones((2, 2), np.float32)})
    assert WorkerRuntime.job_progress(runtime) == (1, False)  # one push, to the server holding the block


def test_a_global_shuffle_that_left_this_worker_nothing_says_so(model, tmp_path):
    exe, main, inputs, _ = model
    ds = _dataset(inputs, [_write(tmp_path / "part", 8)], kind="InMemoryDataset")
    ds.load_into_memory()
    nothing = ds._block.slice(0, 0).to_bytes()

    class GetsNothing:
        """Worker 1 of 2 in an exchange that sent every example to worker 0."""

        def worker_num(self):
            return 2

        def worker_index(self):
            return 1

        def _all_to_all(self, blobs):
            return [nothing, nothing]

    ds.global_shuffle(GetsNothing())
    assert ds.get_memory_data_size() == 0
    with pytest.raises(DataError) as e:
        exe.train_from_dataset(main, ds, print_period=0)
    assert str(e.value) == (
        "train_from_dataset ran a pass over 0 examples: the InMemoryDataset holds 0 examples although its load "
        "read some (global_shuffle gave this worker none of them). Nothing was trained, so the pass is an error "
        "rather than a model that looks trained")
