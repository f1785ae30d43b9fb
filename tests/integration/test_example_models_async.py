"""Each model port of examples/models trains asynchronously with 1 server and 2 workers
(fleetrun, train.py --strategy async) to a test AUC above 0.65 on every task, evaluated by
the first worker with the test program cloned before minimize (the threshold is justified
in tests/unit/test_example_models.py). About 3 s per model."""
import json
import os

import pytest

MODELS_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models")
MODELS = ("dnn", "wide_deep", "deepfm", "xdeepfm", "dcn", "nfm", "mmoe", "share_bottom", "esmm")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_the_model_trains_async_with_one_server_and_two_workers_to_a_test_auc_above_065(fleetrun, tmp_path, model):
    result = fleetrun("--server_num", 1, "--worker_num", 2, "--log_dir", tmp_path / "log",
                      os.path.abspath(os.path.join(MODELS_DIR, "train.py")), "--model", model, "--strategy", "async",
                      timeout=180)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    out = json.loads(lines[-1])
    assert out["model"] == model and out["strategy"] == "async" and out["examples"] == 10000
    assert min(out["auc"]) > 0.65, out
