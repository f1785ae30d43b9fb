"""The evaluation idiom of Paddle 1.x scripts on a distributed worker: a test program
cloned with clone(for_test=True) before minimize evaluates with the servers' current
parameters (dense, is_sparse and is_distributed), as the saved inference model and a test
clone of fleet.main_program do. Runs tests/integration/scripts/eval_clone_model.py under
fleetrun with 2 servers and 2 workers; about 3 s per strategy. In GEO, whose workers train
their own copies, both clones read those."""
import os

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "eval_clone_model.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_test_clone_taken_before_minimize_predicts_with_the_servers_values(fleetrun, tmp_path, mode):
    result = fleetrun("--server_num", 2, "--worker_num", 2, "--log_dir", tmp_path / "log",
                      SCRIPT, mode, tmp_path, 30, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    out = np.load(tmp_path / "eval.npz")
    # worker 1 trained with fluid.default_main_program(): its steps went through the servers too
    for worker in (0, 1):
        sends, *losses = np.load(tmp_path / f"worker{worker}.npy")
        assert len(losses) == 30 and np.isfinite(losses).all()
        assert sends >= 15, (worker, sends)  # async merges a few steps' sends at most
    # training moved the parameters the clone reads ...
    assert np.abs(out["pre"] - out["before"]).max() > 1e-3
    # ... and the clone reads exactly what the servers hold
    np.testing.assert_array_equal(out["pre"], out["post"])
    np.testing.assert_array_equal(out["pre"], out["saved"])
    # evaluating did not create rows of the distributed table for ids never trained
    assert len(out["unseen"]) > 10
    assert np.intersect1d(out["unseen"], out["saved_ids"]).size == 0


@pytest.mark.slow
def test_in_geo_a_test_clone_taken_before_minimize_reads_the_workers_own_copies(fleetrun, tmp_path):
    """GEO workers train local copies and exchange deltas: both test clones read the copies."""
    result = fleetrun("--server_num", 2, "--worker_num", 2, "--log_dir", tmp_path / "log",
                      SCRIPT, "geo", tmp_path, 30, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    out = np.load(tmp_path / "eval.npz")
    assert np.abs(out["pre"] - out["before"]).max() > 1e-3
    np.testing.assert_array_equal(out["pre"], out["post"])
