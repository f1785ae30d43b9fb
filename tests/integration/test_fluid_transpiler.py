"""Paddle 1.x's manual, run as written (imports aside): fluid.DistributeTranspiler with two
pservers and two trainers started by hand with the manual's variables
(PADDLE_TRAINING_ROLE, PADDLE_PSERVER_IPS, PADDLE_PSERVER_PORT, PADDLE_TRAINERS,
PADDLE_CURRENT_IP, PADDLE_TRAINER_ID). The servers' exe.run(pserver_program) returns once
both trainers called exe.close(); sync equals one process on both trainers' batches
together, and trainer 0's fluid.io.save_persistables and save_inference_model hold
those parameters; async
trains (losses fall)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleet.framework.io import read_vars

SCRIPT = Path(__file__).parent / "scripts" / "fluid_dist_train.py"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # 5 processes per mode, about 6 s each on 2 cores


def _env(tmp_path, **more):
    env = dict(os.environ)
    for name in ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "PADDLE_TRAINER_ID", "PADDLE_CURRENT_IP"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(FLUID_OUT=str(tmp_path), FLEET_CONNECT_TIMEOUT_MS="30000", **more)
    return env


def _run_job(procs, tmp_path, port, sync):
    common = dict(PADDLE_PSERVER_IPS="127.0.0.1,127.0.0.2", PADDLE_PSERVER_PORT=str(port), PADDLE_TRAINERS="2",
                  FLUID_SYNC="1" if sync else "0")
    roles = [dict(PADDLE_TRAINING_ROLE="PSERVER", PADDLE_CURRENT_IP=ip) for ip in ("127.0.0.1", "127.0.0.2")]
    roles += [dict(PADDLE_TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID=str(i)) for i in (0, 1)]
    started = [procs.start([sys.executable, str(SCRIPT)], cwd=tmp_path, env=_env(tmp_path, **common, **role),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for role in roles]
    outputs = [procs.communicate(p, 90) for p in started]
    for role, proc, (out, err) in zip(roles, started, outputs):
        assert proc.returncode == 0, f"{role} exited {proc.returncode}:\n{out}\n{err[-3000:]}"
    return [out for out, _ in outputs]


def _result(tmp_path, tag):
    arrays = np.load(tmp_path / f"{tag}.npz")
    losses = json.loads((tmp_path / f"{tag}.json").read_text())["losses"]
    return {"w": arrays["w"], "b": arrays["b"]}, losses


def test_sync_pservers_serve_until_both_trainers_close_and_equal_one_process_on_both_batches(
        procs, tmp_path, free_port):
    outputs = _run_job(procs, tmp_path, free_port(), sync=True)
    assert "pserver 127.0.0.1:" in outputs[0] and "pserver 127.0.0.2:" in outputs[1]
    local = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env=_env(tmp_path, PADDLE_TRAINING_ROLE="LOCAL", PADDLE_TRAINERS="2"))
    assert local.returncode == 0, local.stderr
    ref, ref_losses = _result(tmp_path, "local")
    for tag in ("trainer0", "trainer1"):
        params, losses = _result(tmp_path, tag)
        assert len(losses) == len(ref_losses) == 240
        for name in ("w", "b"):
            np.testing.assert_allclose(params[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=f"{tag} {name}")
    saved = read_vars(str(tmp_path / "saved"), ["fc_0.w_0", "fc_0.b_0"])  # fluid.io on trainer 0
    np.testing.assert_allclose(saved["fc_0.w_0"], ref["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(saved["fc_0.b_0"], ref["b"], rtol=1e-5, atol=1e-6)
    import fleet.fluid as fluid  # the inference model trainer 0 saved predicts as the reference

    exe = fluid.Executor()
    with fluid.scope_guard(fluid.Scope()):
        program, feeds, fetches = fluid.io.load_inference_model(str(tmp_path / "model"), exe)
        x = np.random.default_rng(3).normal(size=(5, 13)).astype("float32")
        predicted, = exe.run(program, feed={"x": x}, fetch_list=fetches)
    assert feeds == ["x"]
    np.testing.assert_allclose(predicted, x @ ref["w"] + ref["b"], rtol=1e-5, atol=1e-5)
    # each trainer's loss is on its own half of the batch the local run sees whole
    both = np.add(_result(tmp_path, "trainer0")[1], _result(tmp_path, "trainer1")[1]) / 2
    np.testing.assert_allclose(both, ref_losses, rtol=1e-4)


def test_async_trainers_each_train_and_the_pservers_return(procs, tmp_path, free_port):
    _run_job(procs, tmp_path, free_port(), sync=False)
    for tag in ("trainer0", "trainer1"):
        _, losses = _result(tmp_path, tag)
        first, last = np.mean(losses[:16]), np.mean(losses[-16:])
        assert last < 0.6 * first, f"{tag}: mean loss of the first 16 steps {first:.3f}, of the last {last:.3f}"
