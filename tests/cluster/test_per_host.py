"""One CTR-DNN job across three hosts, each started by the same fleetrun command on that
host (servers on two hosts, workers on all three), encrypted with the job's keys.

Sync must equal the same job on one host to float tolerance (same servers, workers, data
shards and seed); async must be within 0.01 test AUC of it. A host whose link is cut mid-
training is named by the survivors within the heartbeat bound, and every fleetrun ends
non-zero with nothing left running in any namespace.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn")
EXAMPLE = os.path.abspath(EXAMPLE)
TRAIN = os.path.join(EXAMPLE, "train.py")
PORT_SERVER, PORT_WORKER = 6170, 6171
DENSE = [f"fc_{i}.{k}_0" for i in range(4) for k in ("w", "b")]


def _clean_env(**more):
    """The environment of every run: no role variables, and one BLAS thread per process
    (fleetrun gives a host's workers its cores, so 1 worker on a host of its own would
    get more BLAS threads than 3 on one host, and another summation order)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRAINING_ROLE", "PADDLE_", "FLEET_CURVE", "POD_IP"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", **more)
    return env


def _python(*args, cwd=EXAMPLE, timeout=120, env=None):
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env or _clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """6 train files (2 per worker, so sync workers run equal step counts) and a test set."""
    out = tmp_path_factory.mktemp("ctr") / "data"
    _python("generate_data.py", "--out_dir", out, "--train_lines", 60000, "--test_lines",
            10000, "--train_files", 6)
    return out


def _evaluate(model_dir, data):
    out = _python("infer.py", "--model_dir", model_dir / "epoch_0", "--data_dir", data)
    return json.loads(out.strip().splitlines()[-1])


def _dense(model_dir):
    return {name: np.load(model_dir / "epoch_0" / name) for name in DENSE}


def _train_args(data, model_dir, strategy, epochs=1):
    # One thread per worker: two would read two files at once, in an order that differs
    # from run to run, and the runs could not be compared step for step.
    return [TRAIN, "--data_dir", data, "--model_dir", model_dir, "--strategy", strategy,
            "--batch_size", 200, "--print_period", 5, "--epochs", epochs, "--seed", 7,
            "--threads", 1]


def _one_host(tmp_path, data, strategy):
    model = tmp_path / f"one-{strategy}"
    _python("-m", "fleet.launch", "--server_num", 2, "--worker_num", 3, "--log_dir",
            model / "log", *_train_args(data, model, strategy), cwd=tmp_path, timeout=180)
    return model


def _endpoints(cluster):
    h1, h2, h3 = cluster.hosts
    servers = [f"{h.addr}:{PORT_SERVER}" for h in (h1, h2)]
    workers = [f"{h.addr}:{PORT_WORKER}" for h in (h1, h2, h3)]
    return ",".join(servers), ",".join(workers)


def _start_on_every_host(cluster, tmp_path, data, strategy, keys, epochs=1, env=None):
    """The same fleetrun command on each host; returns {host name: (Popen, its dir)}."""
    servers, workers = _endpoints(cluster)
    model = tmp_path / f"multi-{strategy}"
    started = {}
    for host in cluster.hosts:
        work = tmp_path / host.name
        work.mkdir(exist_ok=True)
        argv = [sys.executable, "-m", "fleet.launch", "--servers", servers, "--workers", workers,
                "--keys_dir", keys, "--log_dir", work / "log", "--result_json",
                work / "result.json", "--timeout", 240,
                *_train_args(data, model, strategy, epochs)]
        started[host.name] = (host.popen(argv, cwd=work, env=env or _clean_env(),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True), work)
    return model, started


def _finish(started, timeout):
    results = {}
    deadline = time.monotonic() + timeout
    for name, (proc, work) in started.items():
        out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        results[name] = (proc.returncode, out, err, work)
    return results


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "k"
    _python("-m", "fleet.launch", "--make_keys", path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_ctr_dnn_across_three_hosts_matches_the_same_job_on_one_host(
        cluster_factory, tmp_path, data, keys, strategy):
    cluster = cluster_factory(3)
    model, started = _start_on_every_host(cluster, tmp_path, data, strategy, keys)
    results = _finish(started, 200)
    for name, (code, out, err, work) in results.items():
        assert code == 0, f"{name}: {err[-3000:]}"
    h1, h2, h3 = cluster.hosts
    assert f"started server 0, worker 0 on this host ({h1.addr})" in results["h1"][2]
    assert f"started server 1, worker 1 on this host ({h2.addr})" in results["h2"][2]
    assert f"started worker 2 on this host ({h3.addr})" in results["h3"][2]
    assert "epoch 0: 20000 examples" in results["h1"][1]  # worker 0's output, streamed on h1
    assert results["h2"][1] == "" and results["h3"][1] == ""
    # the servers bound the hosts' own addresses, never loopback
    result = json.loads((results["h2"][3] / "result.json").read_text())
    assert [p["endpoint"] for p in result["processes"]] == [f"{h2.addr}:{PORT_SERVER}",
                                                            f"{h2.addr}:{PORT_WORKER}"]
    assert cluster.leftovers() == {}

    one = _one_host(tmp_path, data, strategy)
    multi_eval, one_eval = _evaluate(model, data), _evaluate(one, data)
    print(f"{strategy}: 3 hosts test AUC {multi_eval['auc']:.4f} log loss {multi_eval['log_loss']:.4f}; "
          f"one host {one_eval['auc']:.4f} / {one_eval['log_loss']:.4f}")
    if strategy == "sync":
        multi, single = _dense(model), _dense(one)
        for name in DENSE:
            np.testing.assert_allclose(multi[name], single[name], rtol=0, atol=2e-5, err_msg=name)
        assert abs(multi_eval["auc"] - one_eval["auc"]) < 1e-4
        assert abs(multi_eval["log_loss"] - one_eval["log_loss"]) < 1e-4
    else:
        assert abs(multi_eval["auc"] - one_eval["auc"]) < 0.01, (multi_eval, one_eval)
    assert one_eval["auc"] > 0.7  # the planted signal was learned


@pytest.mark.slow
def test_a_host_cut_off_mid_training_is_named_by_every_survivor(cluster_factory, tmp_path,
                                                                data, keys):
    cluster = cluster_factory(3)
    h1, h2, h3 = cluster.hosts
    env = _clean_env(FLEET_HEARTBEAT_MS="500", FLEET_HEARTBEAT_TIMEOUT_MS="3000",
                     FLEET_RPC_TIMEOUT_MS="20000")
    model, started = _start_on_every_host(cluster, tmp_path, data, "async", keys, epochs=400,
                                          env=env)
    log0 = tmp_path / "h1" / "log" / "workerlog.0"
    deadline = time.monotonic() + 60
    while "batch 10," not in (log0.read_text() if log0.exists() else ""):
        assert time.monotonic() < deadline, "worker 0 did not reach batch 10 within 60 s"
        assert all(p.poll() is None for p, _ in started.values()), "a fleetrun ended early"
        time.sleep(0.2)
    cut = time.monotonic()
    h2.link_down()
    results = _finish(started, 60)
    took = time.monotonic() - cut
    for name, (code, out, err, work) in results.items():
        assert code == 1, f"{name} exited {code}: {err[-2000:]}"
    # survivors: h1 (server 0, worker 0) and h3 (worker 2) name h2's address
    for name in ("h1", "h3"):
        err = results[name][2]
        exit_line = [line for line in err.splitlines() if line.startswith("fleetrun: exit 1: ")]
        print(name, exit_line)
        assert exit_line and h2.addr in exit_line[0], f"{name} did not name {h2.addr}:\n{err[-3000:]}"
    server0 = (tmp_path / "h1" / "log" / "serverlog.0").read_text()
    assert f"worker 1 was lost: it stopped sending heartbeats" in server0
    assert f"it is probably dead, or its host {h2.addr} unreachable" in server0
    # the bound: heartbeat timeout 3 s, failure grace 3 s, SIGTERM; generous for a busy CI
    assert took < 30, f"the job took {took:.1f} s to end after the cut"
    assert cluster.leftovers() == {}
