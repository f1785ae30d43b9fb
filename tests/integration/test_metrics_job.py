"""fleet.metrics on a real job: fleetrun with 1 server and 3 workers, each training on its
own data (tests/integration/scripts/metrics_job.py), then merging its metrics with the
others' over the workers' group. The global AUC on every worker equals the AUC of all the
workers' predictions pooled and bucketed offline as the auc layer buckets them (exact),
and sum / max / min / acc / mae / mse / rmse equal numpy on the pooled values."""
import math
import os

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "metrics_job.py")
WORKERS, STEPS, THRESHOLDS = 3, 8, 4095


def offline_auc(predict, label):
    """Paddle's AUC of the predictions bucketed as the auc layer does (4096 buckets),
    walking the buckets from the highest down."""
    bucket = np.clip((predict[:, 1].astype(np.float64) * THRESHOLDS).astype(np.int64), 0, THRESHOLDS)
    pos = np.bincount(bucket[label == 1], minlength=THRESHOLDS + 1)
    neg = np.bincount(bucket[label == 0], minlength=THRESHOLDS + 1)
    area = tp = fp = 0.0
    for i in range(THRESHOLDS, -1, -1):
        new_tp, new_fp = tp + pos[i], fp + neg[i]
        area += (new_fp - fp) * (tp + new_tp) / 2
        tp, fp = new_tp, new_fp
    return area / (tp * fp), pos, neg


@pytest.mark.slow
def test_global_metrics_of_three_workers_equal_the_metrics_of_their_pooled_predictions(fleetrun, tmp_path):
    result = fleetrun("--server_num", 1, "--worker_num", WORKERS, "--log_dir", tmp_path / "log",
                      SCRIPT, tmp_path, STEPS, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    w = [dict(np.load(tmp_path / f"worker{i}.npz")) for i in range(WORKERS)]
    predict = np.concatenate([d["predict"] for d in w])
    label = np.concatenate([d["label"] for d in w])
    assert len(label) == 64 * (3 * STEPS + 3)  # the workers trained different amounts

    expected, pos, neg = offline_auc(predict, label)
    for d in w:  # the offline bucketing is the layer's: each worker's own buckets agree
        own, own_pos, own_neg = offline_auc(d["predict"], d["label"])
        np.testing.assert_array_equal(d["stat_pos"], own_pos)
        np.testing.assert_array_equal(d["stat_neg"], own_neg)
    for d in w:
        assert float(d["result_auc"]) == expected  # exact, on every worker
        assert float(d["result_auc_by_name"]) == expected
    own_aucs = [offline_auc(d["predict"], d["label"])[0] for d in w]
    assert min(abs(a - expected) for a in own_aucs) > 1e-4  # not just any worker's own AUC

    vectors = np.stack([d["own_vector"] for d in w])
    p1 = predict[:, 1].astype(np.float64)
    for d in w:
        np.testing.assert_allclose(d["result_sum"], vectors.sum(axis=0), rtol=1e-12)
        np.testing.assert_array_equal(d["result_max"], vectors.max(axis=0))
        np.testing.assert_array_equal(d["result_min"], vectors.min(axis=0))
        assert d["result_max"][0, 1] == p1.max() and d["result_min"][1, 0] == p1.min()
        np.testing.assert_array_equal(d["result_sum_counts"], np.bincount(label, minlength=2))
        assert float(d["result_acc"]) == pytest.approx((predict.argmax(axis=1) == label).mean(), rel=1e-12)
        assert float(d["result_mae"]) == pytest.approx(np.abs(p1 - label).mean(), rel=1e-9)
        assert float(d["result_mse"]) == pytest.approx(((p1 - label) ** 2).mean(), rel=1e-9)
        assert float(d["result_rmse"]) == pytest.approx(math.sqrt(((p1 - label) ** 2).mean()), rel=1e-9)
    for key in ("result_sum", "result_acc", "result_mae", "result_rmse"):  # bit-identical everywhere
        assert all(np.array_equal(d[key], w[0][key]) for d in w), key
