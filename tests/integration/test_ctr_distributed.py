"""The CTR-DNN example with 2 servers and 2 workers in each asynchronous strategy trains
to a test AUC within 0.02 of local training on the same generated data and epochs."""
import json
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn")
EPOCHS = 3


def _run(args, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return proc.stdout


def _test_auc(model_dir, data):
    out = _run(["infer.py", "--model_dir", str(model_dir / f"epoch_{EPOCHS - 1}"), "--data_dir", str(data)], EXAMPLE)
    return json.loads(out.strip().splitlines()[-1])["auc"]


@pytest.fixture(scope="module")
def data_and_local(tmp_path_factory):
    work = tmp_path_factory.mktemp("ctr")
    data = work / "data"
    _run(["generate_data.py", "--out_dir", str(data), "--train_lines", "120000", "--test_lines", "30000"], EXAMPLE)
    _run(["train.py", "--data_dir", str(data), "--model_dir", str(work / "local"), "--epochs", str(EPOCHS),
          "--print_period", "0"], EXAMPLE)
    return data, _test_auc(work / "local", data)


@pytest.mark.parametrize("strategy", ["async", "half_async", "geo"])
def test_ctr_dnn_with_two_servers_and_two_workers_is_within_002_auc_of_local(data_and_local, tmp_path, strategy):
    data, local_auc = data_and_local
    assert local_auc > 0.75  # the planted signal was learned
    model = tmp_path / strategy
    out = _run(["-m", "fleet.launch", "--server_num", "2", "--worker_num", "2", "--log_dir", str(model / "log"),
                "train.py", "--data_dir", str(data), "--model_dir", str(model), "--epochs", str(EPOCHS),
                "--strategy", strategy, "--geo_k", "20", "--print_period", "0"], EXAMPLE)
    auc = _test_auc(model, data)
    assert abs(auc - local_auc) < 0.02, (strategy, auc, local_auc)
    # worker 0 printed the global AUC of each epoch, and wrote it with the job's figures
    with open(model / "metrics.jsonl") as f:
        epochs = [json.loads(line) for line in f if '"final"' in line]
    assert [(e["epoch"], e["workers"], e["examples"]) for e in epochs] == [(i, 2, 120000) for i in range(EPOCHS)]
    for e in epochs:
        assert f"epoch {e['epoch']}: global auc {e['global_auc']:.4f} over 2 workers" in out
        assert 0 < e["global_auc"] < 1 and 0 < e["loss"] < 1
    # the training AUC of the first epoch includes the untrained start (about 0.55); the last one learned
    assert epochs[-1]["global_auc"] > max(0.6, epochs[0]["global_auc"]), epochs
