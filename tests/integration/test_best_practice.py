"""Paddle 1.x's "best practices of distributed training on CPU" page, run as written
(imports aside): its ParallelExecutor example and its fleet example's
CompiledProgram(fleet.main_program).with_data_parallel(...), with CPU_NUM=2 replicas,
locally and on a sync parameter-server worker started by fleetrun. One worker with two
replicas equals local training (the same split, the same combined gradient)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).parent / "scripts" / "best_practice.py"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # local runs and fleetrun jobs (1 server, 1 worker): about 3 s a job


def _env(strategy="sync"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["CPU_NUM"] = "2"
    env["BP_STRATEGY"] = strategy
    return env


def _load(out, tag):
    arrays = dict(np.load(out / f"{tag}.npz"))
    return arrays, json.loads((out / f"{tag}.json").read_text())["losses"]


def test_parallel_executor_and_compiled_program_train_locally_and_on_a_worker_alike(procs, tmp_path, fleetrun):
    out = tmp_path / "out"
    out.mkdir()
    for mode in ("pe", "compiled"):
        run = subprocess.run([sys.executable, str(SCRIPT), mode, str(out)], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
    job = fleetrun("--server_num", "1", "--worker_num", "1", SCRIPT, "compiled", out, timeout=120, env=_env())
    assert job.returncode == 0, job.stderr[-3000:]
    pe, pe_losses = _load(out, "pe-local")
    local, local_losses = _load(out, "compiled-local")
    worker, worker_losses = _load(out, "compiled-worker0")
    assert len(pe_losses) == len(worker_losses) == 20
    assert np.mean(local_losses[-5:]) < np.mean(local_losses[:5]) - 0.05  # it trains
    for name in local:
        np.testing.assert_allclose(pe[name], local[name], rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(worker[name], local[name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(worker_losses, local_losses, rtol=1e-4)


@pytest.mark.parametrize("strategy", ["async", "geo"])
def test_compiled_program_trains_on_an_async_and_a_geo_worker(tmp_path, fleetrun, strategy):
    job = fleetrun("--server_num", "1", "--worker_num", "1", SCRIPT, "compiled", tmp_path, timeout=120,
                   env=_env(strategy))
    assert job.returncode == 0, job.stderr[-3000:]
    _, losses = _load(tmp_path, f"compiled-worker0-{strategy}")
    assert len(losses) == 20 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.03, losses
