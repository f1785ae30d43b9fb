"""FleetUtil (Paddle 1.x's fleet_util, with Paddle 2.x's fleet.util calls) in a job of 1
server and 2 workers: the global AUC equals the AUC of the workers' summed buckets on
both workers, the reductions and the gather see both workers, and only the named ranks
print."""
import os

import numpy as np

from fleet.metrics import auc_of_buckets

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fleet_util_job.py")


def test_fleet_util_reports_over_both_workers(fleetrun, tmp_path):
    result = fleetrun("--server_num", 1, "--worker_num", 2, "--log_dir", tmp_path / "log", SCRIPT, tmp_path,
                      timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    got = [dict(np.load(tmp_path / f"worker{i}.npz")) for i in range(2)]
    expected = auc_of_buckets(got[0]["pos"] + got[1]["pos"], got[0]["neg"] + got[1]["neg"])
    assert 0.0 < expected < 1.0 and all(g["pos"].any() and g["neg"].any() for g in got)  # both classes, both workers
    for i, g in enumerate(got):
        assert float(g["global_auc"]) == expected
        assert g["total"].tolist() == [11] and g["most"].tolist() == [1.0]  # 5 + 6 batches; max of ranks 0, 1
        assert g["gathered"].tolist() == [0, 1]
        assert g["shard"].tolist() == [["a", "b"], ["c", "d"]][i]
        assert not g["zeroed"].any() and g["pos"].any()
    logs = [open(tmp_path / "log" / f"workerlog.{i}").read() for i in range(2)]
    assert f"after pass global auc = {expected}" in logs[0] and "global auc" not in logs[1]
    assert "rank 1 speaking" in logs[1] and "speaking" not in logs[0]
