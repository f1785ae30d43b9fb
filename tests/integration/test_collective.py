"""Collective training (no servers): N workers x batch b end with the parameters of one
process with batch N*b over the same examples (SGD and Adam, a sparse embedding table,
exe.run loops and train_from_dataset with 2 threads), every worker's parameters
bit-identical; unequal shards end every worker at the shortest one; a killed worker is
named by the others."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "collective_model.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import collective_model  # noqa: E402  (the script's data helpers)

pytestmark = pytest.mark.slow
BATCH, STEPS = 16, 6
_PIPES = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}


def _env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    env.update(extra or {})
    return env


def _local(procs, tmp_path, *args):
    out = str(tmp_path / "local.npz")
    proc = procs.start([sys.executable, SCRIPT, "--out", out, *args], env=_env(), **_PIPES)
    stdout, stderr = procs.communicate(proc, 120)
    assert proc.returncode == 0, stderr[-3000:]
    return dict(np.load(out))


def _workers(procs, tmp_path, free_ports, n, *args, env=None, expect_ok=True):
    ports = free_ports(n)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    started = []
    for i in range(n):
        out = str(tmp_path / f"w{i}.npz")
        extra = {"PADDLE_TRAINER_ENDPOINTS": endpoints, "PADDLE_TRAINER_ID": str(i), **(env or {})}
        started.append((procs.start([sys.executable, SCRIPT, "--out", out, *args], env=_env(extra), **_PIPES), out))
    results = []
    for proc, out in started:
        stdout, stderr = procs.communicate(proc, 120)
        if expect_ok:
            assert proc.returncode == 0, stderr[-3000:]
        results.append((proc.returncode, stdout, stderr, dict(np.load(out)) if os.path.exists(out) else None))
    return results


def _assert_same_on_every_worker_and_close_to(results, local, names):
    first = results[0][3]
    for _, _, _, got in results[1:]:
        for name in names:  # bit-identical on every worker
            assert np.array_equal(got[name], first[name]), name
    for name in names:
        np.testing.assert_allclose(first[name], local[name], rtol=2e-5, atol=2e-6, err_msg=name)


PARAMS = ["table", "fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"]


@pytest.mark.parametrize("opt,n", [("sgd", 2), ("adam", 3)])
def test_workers_equal_one_process_with_their_batches_together(procs, tmp_path, free_ports, opt, n):
    args = ["--opt", opt, "--workers", str(n), "--batch", str(BATCH), "--steps", str(STEPS)]
    local = _local(procs, tmp_path, *args)
    results = _workers(procs, tmp_path, free_ports, n, *args)
    names = PARAMS + (["table_moment1_0", "table_moment2_0", "fc_0.w_0_moment2_0", "table_beta1_pow_0"]
                      if opt == "adam" else [])
    _assert_same_on_every_worker_and_close_to(results, local, names)
    # worker 0 saved its own scope, which holds the same values
    assert "trained" not in results[0][2]
    from fleet.framework import io as fio

    saved = fio.read_vars(str(tmp_path / "w0.npz.saved"), PARAMS)
    for name in PARAMS:
        assert np.array_equal(saved[name], results[1][3][name]), name


def _write_shards(data_dir, n, steps_of):
    """Worker i's file holds rows i*b..(i+1)*b of each global batch (steps_of[i] batches);
    the local file holds the global batches of the steps every worker has."""
    rows = collective_model.example_rows(max(steps_of) * BATCH * n)
    os.makedirs(data_dir, exist_ok=True)
    common = min(steps_of)
    for i in range(n):
        mine = [r for s in range(steps_of[i]) for r in rows[(s * n + i) * BATCH:(s * n + i + 1) * BATCH]]
        collective_model.write_multislot(os.path.join(data_dir, f"part{i}"), mine)
    collective_model.write_multislot(os.path.join(data_dir, "partall"), rows[:common * n * BATCH])


def test_dataset_threads_reduce_first_and_equal_one_process(procs, tmp_path, free_ports):
    data = str(tmp_path / "data")
    _write_shards(data, 2, [STEPS, STEPS])
    args = ["--opt", "adam", "--workers", "2", "--batch", str(BATCH), "--feed", "dataset", "--data_dir", data]
    local = _local(procs, tmp_path, *args)
    results = _workers(procs, tmp_path, free_ports, 2, *args, "--threads", "2", env={"CPU_NUM": "2"})
    _assert_same_on_every_worker_and_close_to(results, local, PARAMS + ["table_moment1_0"])
    assert all(f"examples {STEPS * BATCH}" in r[1] for r in results)


def test_unequal_shards_stop_every_worker_at_the_shortest(procs, tmp_path, free_ports):
    data = str(tmp_path / "data")
    _write_shards(data, 2, [STEPS, 3])  # worker 0 has 6 batches, worker 1 has 3
    args = ["--opt", "sgd", "--workers", "2", "--batch", str(BATCH), "--feed", "dataset", "--data_dir", data]
    local = _local(procs, tmp_path, *args)  # the 3 global batches both workers have
    results = _workers(procs, tmp_path, free_ports, 2, *args)
    _assert_same_on_every_worker_and_close_to(results, local, PARAMS)
    assert all(f"examples {3 * BATCH}" in r[1] for r in results)
    assert "worker 0 of 2: worker 1 ran out of data; every worker ends this pass at the shortest shard" \
        in results[0][2]


def test_a_killed_worker_is_named_by_the_others(procs, tmp_path, free_ports):
    args = ["--workers", "3", "--batch", str(BATCH), "--steps", "50", "--die_after", "2"]
    results = _workers(procs, tmp_path, free_ports, 3, *args, env={"FLEET_HEARTBEAT_TIMEOUT_MS": "3000"},
                       expect_ok=False)
    assert results[1][0] == -9
    for code, _, stderr, _ in (results[0], results[2]):
        assert code != 0
        assert "PeerLostError: rank 1 (127.0.0.1:" in stderr, stderr[-2000:]


def test_fleetrun_collective_starts_workers_only(procs, tmp_path):
    args = ["--opt", "adam", "--workers", "2", "--batch", str(BATCH), "--steps", "3"]
    local = _local(procs, tmp_path, *args)
    proc = procs.start([sys.executable, "-m", "fleet.launch", "--collective", "--worker_num", "2", "--log_dir",
                        str(tmp_path / "log"), SCRIPT, "--out", str(tmp_path / "run{rank}.npz"), *args],
                       env=_env(), cwd=str(tmp_path), **_PIPES)
    stdout, stderr = procs.communicate(proc, 120)
    assert proc.returncode == 0, stderr[-3000:]
    assert "done" in stdout  # worker 0's output streams to fleetrun's
    assert not (tmp_path / "log" / "serverlog.0").exists()
    got = dict(np.load(tmp_path / "run1.npz"))
    for name in PARAMS:
        np.testing.assert_allclose(got[name], local[name], rtol=2e-5, atol=2e-6, err_msg=name)
    worker1 = (tmp_path / "log" / "workerlog.1").read_text()
    assert "worker 1 of 2 joined the group of 2 workers (collective)" in worker1
    assert "worker 1 of 2: the 5 all-reduced parameters are identical on every worker (CRC32 " in worker1


EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn")


def _ctr(procs, tmp_path, *args):
    proc = procs.start([sys.executable, *args], cwd=EXAMPLE, env=_env(), **_PIPES)
    stdout, stderr = procs.communicate(proc, 300)
    assert proc.returncode == 0, stderr[-3000:] + stdout[-2000:]
    return stdout


def test_hybrid_ctr_dnn_keeps_dense_identical_and_auc_close_to_sync(procs, tmp_path):
    data = tmp_path / "data"
    _ctr(procs, tmp_path, "generate_data.py", "--out_dir", str(data), "--train_lines", "40000",
         "--test_lines", "10000")
    auc = {}
    for strategy in ("sync", "hybrid"):
        model = tmp_path / strategy
        _ctr(procs, tmp_path, "-m", "fleet.launch", "--server_num", "1", "--worker_num", "2", "--log_dir",
             str(model / "log"), "train.py", "--data_dir", str(data), "--model_dir", str(model), "--strategy",
             strategy, "--print_period", "0")
        out = _ctr(procs, tmp_path, "infer.py", "--model_dir", str(model / "epoch_0"), "--data_dir", str(data))
        auc[strategy] = json.loads(out.strip().splitlines()[-1])["auc"]
    logs = [(tmp_path / "hybrid" / "log" / f"workerlog.{i}").read_text() for i in (0, 1)]
    checks = [re.search(r"worker \d of 2: the (\d+) all-reduced parameters are identical on every worker "
                        r"\(CRC32 ([0-9a-f]{8})\)", log) for log in logs]
    assert all(checks), logs[0][-2000:]
    assert checks[0].groups() == checks[1].groups() and int(checks[0][1]) >= 6  # the fc layers' w and b
    assert auc["sync"] > 0.7 and abs(auc["hybrid"] - auc["sync"]) < 0.02, auc


def test_a_paddle_collective_script_runs_unchanged_on_cuda_places_without_init_or_stop(fleetrun, tmp_path):
    """Its startup program joins the workers and gives them worker 0's initial values (their
    seeds differ), training keeps them identical, and the script's end is a clean end."""
    script = os.path.join(os.path.dirname(SCRIPT), "paddle_collective.py")
    result = fleetrun("--collective", "--worker_num", 2, "--log_dir", tmp_path / "log", script, tmp_path, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    got = [dict(np.load(tmp_path / f"params.{i}.npz")) for i in range(2)]
    for name in got[0]:
        assert np.array_equal(got[0][name], got[1][name]), name
    for i in range(2):
        with open(tmp_path / "log" / f"workerlog.{i}") as f:
            log = f.read()
        assert f"worker {i} of 2 joins the other workers at the startup program" in log, log[-2000:]
        assert f"fluid.CUDAPlace({i}): fleet has no GPU kernels" in log
