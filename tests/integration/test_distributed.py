"""Servers and workers in separate processes on 127.0.0.1, in each strategy.

Each test runs tests/integration/scripts/dist_model.py under fleetrun (2 servers, 2
workers) and, where it compares, once locally with no servers on the same global data.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "dist_model.py")
PARAMS = ("fc_0_w_0", "fc_0_b_0", "fc_1_w_0", "fc_1_b_0")


def _local(tmp_path, mode, steps, batch, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    proc = subprocess.run([sys.executable, SCRIPT, mode, str(tmp_path), str(steps), str(batch), *extra],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _load(tmp_path, "local")


def _load(path, tag):
    with open(os.path.join(path, tag + ".json")) as f:
        info = json.load(f)
    return dict(np.load(os.path.join(path, tag + ".npz"))), info


def _distributed(fleetrun, tmp_path, mode, steps, batch, *extra, servers=2, workers=2):
    out = tmp_path / mode
    out.mkdir()
    result = fleetrun("--server_num", servers, "--worker_num", workers, "--log_dir", tmp_path / "log",
                      SCRIPT, mode, out, steps, batch, *extra, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    return [_load(out, f"worker{i}") for i in range(workers)]


def test_sync_two_workers_match_one_process_with_double_batch(fleetrun, tmp_path):
    local, _ = _local(tmp_path, "sync", 6, 8)
    (w0, info0), (w1, _) = _distributed(fleetrun, tmp_path, "sync", 6, 8)
    # the table and the first fc weight are each split across the two servers
    assert len(info0["blocks"]["emb"]) == 2 and len(info0["blocks"]["fc_0.w_0"]) == 2
    assert {b[1] for b in info0["blocks"]["emb"]} == {b[1] for b in info0["blocks"]["fc_0.w_0"]}
    for name in PARAMS + ("emb",):
        np.testing.assert_allclose(w0[name], local[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(w0[name], w1[name], err_msg=name)
    np.testing.assert_allclose(w0["emb_probe"], local["emb"][:10], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_sync_servers_apply_a_schedule_and_regularizers_as_one_process_does(fleetrun, tmp_path):
    # RMSProp with exponential_decay, an optimizer L2Decay and a ParamAttr L1Decay: the
    # servers step their counter once per sync step and add each decay once
    local, local_info = _local(tmp_path, "sync", 6, 8, "--schedule")
    (w0, info0), (w1, _) = _distributed(fleetrun, tmp_path, "sync", 6, 8, "--schedule")
    for name in PARAMS + ("emb",):
        np.testing.assert_allclose(w0[name], local[name], rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(w0[name], w1[name], err_msg=name)
    assert info0["lr"] == local_info["lr"] == pytest.approx(0.01 * 0.5 ** 2.5)  # step 5 of 0..5


@pytest.mark.parametrize("mode", ["async", "half_async", "geo"])
def test_each_strategy_trains_and_workers_end_with_the_servers_values(fleetrun, tmp_path, mode):
    (w0, info0), (w1, info1) = _distributed(fleetrun, tmp_path, mode, 24, 8)
    for name in PARAMS + ("emb",):
        np.testing.assert_allclose(w0[name], w1[name], rtol=1e-6, atol=1e-6, err_msg=name)
    first = np.mean([info0["losses"][:4], info1["losses"][:4]])
    last = np.mean([info0["losses"][-4:], info1["losses"][-4:]])
    assert last < first, (mode, first, last)


def test_geo_sends_about_one_kth_of_async_messages(fleetrun, tmp_path):
    steps, k = 24, 4  # dist_model.py uses update_frequency 4
    (_, geo), _ = _distributed(fleetrun, tmp_path, "geo", steps, 8)
    (_, asy), _ = _distributed(fleetrun, tmp_path, "async", steps, 8)
    # exchanges after steps 1, 3, 7 (the interval doubles up to k), then every k steps, and
    # the end of the run sends what the last exchange left
    ends, interval = [], 1
    while (ends[-1] if ends else 0) + interval <= steps:
        ends.append((ends[-1] if ends else 0) + interval)
        interval = min(k, 2 * interval)
    assert ends[:4] == [1, 3, 7, 11]
    assert geo["stats"]["sends"] == len(ends) + (ends[-1] < steps)
    assert asy["stats"]["sends"] >= steps // 2  # async sends after nearly every step (merging a few)
    assert geo["stats"]["sends"] * (k // 2) <= asy["stats"]["sends"]


def test_distributed_table_takes_ids_from_the_whole_int64_range(fleetrun, tmp_path):
    local_like = _distributed(fleetrun, tmp_path, "async", 10, 8, "--distributed-table")
    (w0, info0), (w1, _) = local_like
    probe = w0["emb_probe"]
    assert probe.shape == (4, 4) and np.isfinite(probe).all()
    np.testing.assert_array_equal(probe, w1["emb_probe"])
    # every id was trained (rows moved away from their Uniform(-0.5, 0.5) start) and the
    # shards are id % 2: both servers hold rows
    assert len(info0["blocks"]["emb"]) == 2


def test_async_worker_keeps_sending_after_a_checkpoint_midway(fleetrun, tmp_path):
    """save_persistables flushes the async queues; training must go on sending after it."""
    (w0, info0), (w1, _) = _distributed(fleetrun, tmp_path, "async", 16, 8, "--save-midway")
    assert info0["stats"]["sends"] >= 12  # sends continued after the save at step 8
    saved = np.load(tmp_path / "async" / "midway" / "fc_0.w_0")  # Paddle's layout: named as the variable
    assert saved.shape == w0["fc_0_w_0"].shape and not np.array_equal(saved, w0["fc_0_w_0"])
