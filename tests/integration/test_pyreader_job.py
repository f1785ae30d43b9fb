"""A parameter-server job (1 server, 2 async workers) whose workers read through a
non-iterable fluid.io.PyReader: every epoch runs every batch, then EOFException ends it."""
import os
import re

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "pyreader_job.py")


def test_workers_train_two_epochs_through_a_started_pyreader(fleetrun, tmp_path):
    result = fleetrun("--server_num", 1, "--worker_num", 2, "--log_dir", tmp_path / "log", SCRIPT, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    for i in range(2):
        with open(tmp_path / "log" / f"workerlog.{i}") as f:
            log = f.read()
        epochs = re.findall(rf"worker {i} epoch (\d) steps (\d+) auc ([0-9.]+)", log)
        assert [(e, s) for e, s, _ in epochs] == [("0", "47"), ("1", "47")], log[-2000:]  # 3000 samples / 64
        assert float(epochs[-1][2]) > 0.6  # it learned from what the reader gave
