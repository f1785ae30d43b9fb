"""The CTR-DNN example as the cluster tests run it: data, training arguments, evaluation,
and the same job on one host to compare with."""
import json
import os
import subprocess
import sys

import numpy as np

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn")
EXAMPLE = os.path.abspath(EXAMPLE)
TRAIN = os.path.join(EXAMPLE, "train.py")
PORT_SERVER, PORT_WORKER = 6170, 6171
DENSE = [f"fc_{i}.{k}_0" for i in range(4) for k in ("w", "b")]
# Async runs differ from run to run (which update lands first depends on timing); after 3
# epochs two runs agree far within 0.01 test AUC, after 1 they were 0.0125 apart on a busy
# machine. Sync and collective are compared step for step, so one epoch is enough.
EPOCHS = {"sync": 1, "async": 3, "collective": 1}
# Strategies whose runs are deterministic: compared with the one-host job to float tolerance.
STEP_FOR_STEP = ("sync", "collective")


def clean_env(**more):
    """The environment of every run: no role variables, and one BLAS thread per process
    (fleetrun gives a host's workers its cores, so 1 worker on a host of its own would
    get more BLAS threads than 3 on one host, and another summation order)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINING_ROLE", "PADDLE_", "FLEET_CURVE", "POD_IP"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", **more)
    return env


def python(*args, cwd=EXAMPLE, timeout=120, env=None):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env or clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return proc.stdout


def make_data(out):
    """6 train files (2 per worker of 3, so sync workers run equal step counts) and a test set."""
    python("generate_data.py", "--out_dir", out, "--train_lines", 60000, "--test_lines",
           10000, "--train_files", 6)
    return out


def make_keys(path):
    python("-m", "fleet.launch", "--make_keys", path)
    return path


def last_epoch(model_dir):
    """The directory of the last epoch's model train.py saved under model_dir."""
    epochs = sorted(int(p.name.split("_")[1]) for p in model_dir.glob("epoch_*"))
    assert epochs, f"no epoch_N model in {model_dir}"
    return model_dir / f"epoch_{epochs[-1]}"


def evaluate(model_dir, data):
    out = python("infer.py", "--model_dir", last_epoch(model_dir), "--data_dir", data)
    return json.loads(out.strip().splitlines()[-1])


def dense(model_dir):
    return {name: np.load(last_epoch(model_dir) / name) for name in DENSE}


def train_args(data, model_dir, strategy, epochs=None):
    # One thread per worker: two would read two files at once, in an order that differs
    # from run to run, and the runs could not be compared step for step.
    return [TRAIN, "--data_dir", data, "--model_dir", model_dir, "--strategy", strategy,
            "--batch_size", 200, "--print_period", 5, "--epochs", epochs or EPOCHS[strategy], "--seed", 7,
            "--threads", 1]


def one_host(tmp_path, data, strategy):
    """The same job on one host: 2 servers and 3 workers, or 3 workers for collective."""
    model = tmp_path / f"one-{strategy}"
    roles = ["--collective"] if strategy == "collective" else ["--server_num", 2]
    python("-m", "fleet.launch", *roles, "--worker_num", 3, "--log_dir",
           model / "log", *train_args(data, model, strategy), cwd=tmp_path, timeout=180)
    return model


def same_blas_kernels():
    """--env for the BLAS kernel choice of this machine's environment, if it makes one.

    The remote processes of fleetrun --hosts get the dispatcher's FLEET_*, PYTHON*, NUMBA_*
    and thread-count variables, not the rest of its environment: where OPENBLAS_CORETYPE
    picks the kernels here, the remote processes need it too, or their sums round
    differently and sync no longer matches the one-host job bit for bit.
    """
    value = os.environ.get("OPENBLAS_CORETYPE")
    return ["--env", f"OPENBLAS_CORETYPE={value}"] if value else []


def assert_matches_one_host(model, one, data, strategy, label):
    """Sync and collective: the same dense parameters (to 2e-5) and test AUC / log loss (to
    1e-4) as the job on one host; async: test AUC within 0.01. Prints both evaluations."""
    multi_eval, one_eval = evaluate(model, data), evaluate(one, data)
    print(f"{strategy}: {label} test AUC {multi_eval['auc']:.4f} log loss "
          f"{multi_eval['log_loss']:.4f}; one host {one_eval['auc']:.4f} / {one_eval['log_loss']:.4f}")
    if strategy in STEP_FOR_STEP:
        multi, single = dense(model), dense(one)
        for name in DENSE:
            np.testing.assert_allclose(multi[name], single[name], rtol=0, atol=2e-5, err_msg=name)
        assert abs(multi_eval["auc"] - one_eval["auc"]) < 1e-4
        assert abs(multi_eval["log_loss"] - one_eval["log_loss"]) < 1e-4
    else:
        assert abs(multi_eval["auc"] - one_eval["auc"]) < 0.01, (multi_eval, one_eval)
    assert one_eval["auc"] > 0.7  # the planted signal was learned
