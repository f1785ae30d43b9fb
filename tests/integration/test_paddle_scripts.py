"""Two public Paddle 1.x scripts, rebuilt with only their imports changed, run locally and
under fleetrun with 2 servers and 2 workers in async, sync and GEO:

- PaddleFleetX's examples/distribute_ctr (tests/integration/scripts/distribute_ctr):
  CTR-DNN on Criteo-format lines through a pipe command; the first worker saves the model
  after the epoch and infer.py evaluates it on held-out lines. Threshold: test AUC 0.60.
  With 10,000 test lines (about 20% clicks) a model that learned nothing scores 0.5 with
  a standard error of sqrt((n+1) / (12 n_pos n_neg)) = 0.007, so 0.60 is 14 standard
  errors above chance; measured: 0.78 locally, 0.715-0.727 distributed on an idle machine
  (sync averages four thread batches per update: fewer updates than local training). Async
  on this small job (80 batches per worker, 2 workers x 2 Hogwild threads, applied as they
  arrive) depends on how the processes are scheduled: 0.64-0.75 over runs on a loaded
  2-core machine (0.6427 once in CI), so the floor sits below that spread, not at it.
- Paddle's dist_fleet_ctr.py test (scripts/dist_fleet_ctr), with its own checks: every
  trainer exits 0 and the saved inference model's __model__ parses
  (check_model_right, SAVE_MODEL=1). Besides: the cost that thread 0 prints falls (mean
  of the first 15 printed batches against the last 15: about 0.695 -> 0.665-0.675;
  one printed batch's noise is about 0.01), and the persistables saved by the first
  worker predict the clicks of the train file above chance: AUC > 0.515 on 20,000 lines
  (null standard error 0.004, so 3.7 of them; the Constant(0.01) initialisation predicts
  every example alike, AUC 0.5; measured 0.547 local, 0.532 sync, 0.59 async and GEO:
  SGD 0.01 on one epoch moves the weights little, by the script's design).

Slow tests: about 10 s per distribute_ctr run (training, then infer.py), 6-8 s per
dist_fleet_ctr run, 65 s for the module.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
FLEETX = os.path.join(SCRIPTS, "distribute_ctr")
DIST_FLEET_CTR = os.path.join(SCRIPTS, "dist_fleet_ctr")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATOR = os.path.join(ROOT, "examples", "ctr_dnn", "generate_data.py")


def _env(**extra):
    """The environment of a script: no role variables, this Python first on PATH (the
    scripts' pipe commands run ``python``), the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_", "POD_IP"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _run(procs, args, cwd, env, timeout=120):
    proc = procs.start([sys.executable, *map(str, args)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    out, err = procs.communicate(proc, timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{err[-3000:]}\n{out[-2000:]}"
    return out


def _fleetrun(procs, tmp_path, cwd, env, *args):
    return _run(procs, ["-m", "fleet.launch", "--server_num", 2, "--worker_num", 2, "--log_dir", tmp_path / "log",
                        *args], cwd, env, timeout=180)


def _last_json(out):
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


# ------------------------------------------------------------------ PaddleFleetX distribute_ctr
@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    data = tmp_path_factory.mktemp("criteo")
    subprocess.run([sys.executable, GENERATOR, "--out_dir", str(data), "--train_lines", "40000",
                    "--test_lines", "10000", "--train_files", "4"], check=True, capture_output=True, timeout=60)
    return data


FLEETX_ARGS = ("--learning_rate", "1e-3", "--batch_size", "250", "--test", "1")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "async", "sync", "geo_async"])
def test_fleetx_distribute_ctr_trains_and_its_saved_model_scores_test_auc_above_060(procs, tmp_path, criteo, mode):
    model = tmp_path / "model"
    args = ["distribute_train.py", "--train_files_path", criteo / "train", "--model_path", model, *FLEETX_ARGS]
    if mode == "local":
        _run(procs, [*args, "--sync_mode", "async"], FLEETX, _env())
    else:
        _fleetrun(procs, tmp_path, FLEETX, _env(), *args, "--sync_mode", mode)
    result = _last_json(_run(procs, ["infer.py", model / "epoch_0", "--test_files_path", criteo / "test"],
                             FLEETX, _env()))
    assert result["examples"] == 10000
    assert result["auc"] > 0.60, result


# ------------------------------------------------------------------ Paddle's dist_fleet_ctr.py
def _printed_costs(text):
    return [float(c) for c in re.findall(r"cost (\d+\.\d+)", text)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["local", "async", "sync", "geo"])
def test_dist_fleet_ctr_passes_its_own_checks_and_learns(procs, tmp_path, mode):
    saved = tmp_path / "saved"
    env = _env(SAVE_MODEL="1", SAVE_DIRNAME=str(saved))
    if mode == "local":
        logs = [_run(procs, ["dist_fleet_ctr.py", "--mode", "async"], DIST_FLEET_CTR, env)]
    else:
        _fleetrun(procs, tmp_path, DIST_FLEET_CTR, env, "dist_fleet_ctr.py", "--mode", mode,
                  "--geo_sgd_need_push_nums", 5)
        logs = [(tmp_path / "log" / f"workerlog.{i}").read_text() for i in range(2)]
    for log in logs:
        costs = _printed_costs(log)
        assert len(costs) >= 100, log[-2000:]  # 312 batches of 128 over 2 threads, thread 0 prints every 2nd
        assert np.mean(costs[-15:]) < np.mean(costs[:15]) - 0.01, (costs[:15], costs[-15:])
    result = _last_json(_run(procs, ["evaluate_saved.py", saved], DIST_FLEET_CTR, _env()))
    assert result["examples"] == 20000
    assert result["auc"] > 0.515, result


@pytest.mark.slow
def test_dist_fleet_ctr_runs_with_roles_from_its_arguments_as_paddles_harness_starts_it(procs, free_ports, tmp_path):
    """TestFleetBase starts two pservers and two trainers with --role/--endpoints/--current_id
    (UserDefinedRoleMaker), not with environment variables. (The script saves to a
    tempfile.mkdtemp() it never removes: TMPDIR puts that in tmp_path.)"""
    endpoints = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    common = ["dist_fleet_ctr.py", "--endpoints", endpoints, "--trainers", 2, "--mode", "async"]
    env = _env(SAVE_MODEL="1", TMPDIR=str(tmp_path))
    started = [procs.start([sys.executable, *map(str, common), "--role", role, "--current_id", str(i)],
                           cwd=DIST_FLEET_CTR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for role in ("pserver", "trainer") for i in (0, 1)]
    outputs = [procs.communicate(p, 120)[0] for p in started]
    assert [p.returncode for p in started] == [0, 0, 0, 0], "\n".join(o[-1500:] for o in outputs)
    for out in outputs[2:]:
        costs = _printed_costs(out)
        assert np.mean(costs[-15:]) < np.mean(costs[:15]) - 0.01
