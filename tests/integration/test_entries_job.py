"""Tables with entries and a CTR accessor in real jobs: the same script
(tests/integration/scripts/entries_model.py) trained locally and under fleetrun keeps the
same admitted ids with equal statistics on the servers (one, or two whose shards' union
is the local table), fleet.shrink() deletes on every server and returns the count on
every worker, and the strategy's accessor config is the servers' tables'. About 3 s per
job."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "entries_model.py")
ACCESSOR = {"delete_threshold": 0.3, "show_click_decay_rate": 0.9}


def _local(procs, clean_env, out, entry):
    proc = procs.start([sys.executable, SCRIPT, "sync", out, entry], cwd=out, env=clean_env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = procs.communicate(proc, 120)
    assert proc.returncode == 0, stderr[-3000:] + stdout[-2000:]
    return np.load(out / "local.npz"), json.loads((out / "local.json").read_text())["deleted"]


def _servers(out, n):
    return [np.load(out / f"server{i}.npz") for i in range(n)]


def _rows(dumps):
    rows = {}
    for d in dumps:
        for i, row_id in enumerate(d["ids"]):
            rows[int(row_id)] = (d["values"][i], d["stats"][i])
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("servers", [1, 2])
@pytest.mark.parametrize("entry", ["count", "show_click"])
def test_local_and_distributed_sync_keep_the_same_rows_statistics_and_shrink(fleetrun, procs, clean_env,
                                                                               tmp_path, servers, entry):
    local_dir, job_dir = tmp_path / "local", tmp_path / "job"
    local_dir.mkdir()
    job_dir.mkdir()
    local, local_deleted = _local(procs, clean_env, local_dir, entry)
    result = fleetrun("--server_num", servers, "--worker_num", 1, "--log_dir", tmp_path / "log",
                      SCRIPT, "sync", job_dir, entry, timeout=120, env=clean_env)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    dumps = _servers(job_dir, servers)
    remote, expected = _rows(dumps), _rows([local])
    assert sorted(remote) == sorted(expected) and len(expected) >= 10
    for row_id, (value, stats) in expected.items():
        np.testing.assert_array_equal(remote[row_id][1], stats, err_msg=f"statistics of id {row_id}")
        np.testing.assert_allclose(remote[row_id][0], value, rtol=1e-5, atol=1e-6, err_msg=f"row of id {row_id}")
    worker_deleted = json.loads((job_dir / "worker0.json").read_text())["deleted"]
    assert worker_deleted == local_deleted and local_deleted["emb"] > 0
    per_server = [json.loads(str(d["deleted"]))["emb"] for d in dumps]
    assert sum(per_server) == local_deleted["emb"] and min(per_server) > 0
    for d in dumps:
        accessor = json.loads(str(d["accessor"]))
        assert {k: accessor[k] for k in ACCESSOR} == ACCESSOR
        if servers == 2:
            assert len(d["ids"]) and len(set(np.asarray(d["ids"]) % 2)) == 1  # one shard each


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "half_async", "hybrid"])
def test_every_worker_gets_the_count_that_every_server_deleted(fleetrun, clean_env, tmp_path, mode):
    result = fleetrun("--server_num", 2, "--worker_num", 2, "--log_dir", tmp_path / "log",
                      SCRIPT, mode, tmp_path, "show_click", timeout=120, env=clean_env)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    returned = [json.loads((tmp_path / f"worker{k}.json").read_text())["deleted"] for k in (0, 1)]
    per_server = [json.loads(str(d["deleted"]))["emb"] for d in _servers(tmp_path, 2)]
    assert returned[0] == returned[1] == {"emb": sum(per_server)}
    assert min(per_server) > 0
