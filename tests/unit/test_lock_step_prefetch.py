"""Threads in lock step (the hybrid strategy's, or a Reduce build strategy's) with
``prefetch_ahead``: the trainer reads each step's batches one step early and hands them
to ``prepare_step`` before the current step runs, so their remote rows come meanwhile."""
import threading

import numpy as np
import pytest

import fleet
import fleet.framework as fw
import fleet.framework.runner
from fleet import layers, optimizer
from fleet.framework.hooks import TrainingHooks
from role_makers import LocalRoleMaker

pytestmark = pytest.mark.usefixtures("fresh_fleet")

LINES, BATCH, THREADS = 24, 4, 2


class LockStep(TrainingHooks):
    """Records the prepared steps and the batches each step ran, in order."""

    requires_thread_barrier = True
    prefetch_ahead = True

    def __init__(self):
        self.events = []

    def prepare_step(self, feeds):
        self.events.append(("prepared", sorted(float(v) for f in feeds for v in np.asarray(f["x"])[:, 0])))


def test_each_step_is_prepared_before_the_step_before_it_runs(tmp_path, monkeypatch):
    fleet.init(LocalRoleMaker())
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        y = layers.data("y", shape=[1], dtype="int64")
        loss = layers.mean(layers.cross_entropy(layers.fc(x, 2, act="softmax"), y))
        optimizer.SGD(0.1).minimize(loss)
    exe = fleet.Executor()
    exe.run(startup)
    path = tmp_path / "data.txt"
    path.write_text("".join(f"2 {i} 0 1 {i % 2}\n" for i in range(LINES)))
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var([x, y])
    ds.set_batch_size(BATCH)
    ds.set_thread(THREADS)
    ds.set_filelist([str(path)])
    main.training_hooks = hooks = LockStep()
    real_run = fw.runner.Runner.run

    def run(runner, *args, **kwargs):  # records each thread's compute of its batch
        if kwargs.get("optimize") is False and kwargs.get("compute", True):
            with lock:
                hooks.events.append(("ran", [float(v) for v in np.asarray(runner.local["x"])[:, 0]]))
        return real_run(runner, *args, **kwargs)

    lock = threading.Lock()
    monkeypatch.setattr(fw.runner.Runner, "run", run)
    summary = exe.train_from_dataset(main, ds, thread=THREADS, print_period=0)
    assert summary["examples"] == LINES
    # per step: the next step prepared, then this step's THREADS batches computed
    steps, prepared, ran = [], [], []
    for kind, values in hooks.events:
        if kind == "prepared":
            assert not ran, hooks.events  # prepared between steps, never within one
            prepared.append((len(steps), values))
        else:
            ran.append(values)
            if len(ran) == THREADS:
                steps.append(sorted(v for batch in ran for v in batch))
                ran = []
    assert len(steps) == LINES // (BATCH * THREADS)
    # step k+1 was prepared, with its batches, after step k-1 ran and before step k did
    assert prepared == [(k, steps[k + 1]) for k in range(len(steps) - 1)]
    assert sorted(v for s in steps for v in s) == list(range(LINES))
