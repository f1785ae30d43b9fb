"""Checkpoints of a real job: periodic saves, kill -9 of the whole job, resume from the
latest valid checkpoint bit for bit, and loading onto another number of servers.

The job is tests/integration/scripts/ckpt_model.py under fleetrun: sync mode with Adam,
a dense weight split across the servers, an is_sparse embedding (row blocks) and an
is_distributed table.
"""
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from fleet import checkpoint as ckpt
from fleet.framework import io as fio

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ckpt_model.py")
FLEETRUN = (sys.executable, "-m", "fleet.launch")
LAYOUT = ("@blocks", "@block_offsets", "@shards", "@servers")  # per-block / per-server records of scalar state
TABLE = "dtable"


def _table_rows(saved):
    """{id: (value, moment1, moment2)} of the saved distributed table."""
    cols = [saved[f"{TABLE}@values"], saved[f"{TABLE}_moment1_0@values"], saved[f"{TABLE}_moment2_0@values"]]
    return {int(i): tuple(c[j] for c in cols) for j, i in enumerate(saved[f"{TABLE}@ids"])}


def _alive(pid):
    """True if pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill_job(launcher, pids):
    """SIGKILL to fleetrun's process group and to every process of the job."""
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _die_with_pytest():
    """preexec_fn: the launcher gets SIGKILL if this test process dies (the suite's
    watchdog knows only processes of the function-scoped ``procs`` fixture)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


@pytest.fixture(scope="module")
def killed_job(tmp_path_factory):
    """Job 1 (2 servers, 2 workers) trains 14 steps checkpointing every 4 (2 kept), then
    the whole job is killed with SIGKILL. A copy of its latest checkpoint is kept aside."""
    root = tmp_path_factory.mktemp("ckpt")
    out, checkpoints = root / "out1", root / "ckpt"
    out.mkdir()
    launcher = subprocess.Popen(
        [*FLEETRUN, "--server_num", "2", "--worker_num", "2", "--log_dir", str(root / "log1"), SCRIPT,
         "sync", str(out), str(checkpoints), "14", "--interval", "4", "--keep", "2", "--hold"],
        cwd=root, start_new_session=True, preexec_fn=_die_with_pytest, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        deadline = time.monotonic() + 90
        while not all((out / f"trained.{i}").exists() for i in (0, 1)):
            if launcher.poll() is not None:
                pytest.fail(f"job 1 ended before training finished:\n{launcher.stderr.read()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail("job 1 did not finish its 14 steps within 90 s")
            time.sleep(0.05)
        pids = [int(p.read_text()) for p in out.glob("pid.*")]
        assert len(pids) == 4
        _kill_job(launcher, pids)
        launcher.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"processes of the killed job still alive: {pids}"
            time.sleep(0.02)
    finally:
        _kill_job(launcher, pids)
        launcher.communicate()
    shutil.copytree(checkpoints / "ckpt-12", root / "reference")
    with open(out / "worker0.json") as f:
        info = json.load(f)
    return types.SimpleNamespace(root=root, ckpt=checkpoints, reference=str(root / "reference"), info=info)


def _run(fleetrun, tmp_path, servers, workers, *args):
    out = tmp_path / f"out_{servers}x{workers}"
    out.mkdir()
    result = fleetrun("--server_num", servers, "--worker_num", workers, "--log_dir", tmp_path / f"log_{servers}",
                      SCRIPT, "sync", out, *args, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    with open(out / "worker0.json") as f:
        return out, json.load(f)


def test_after_kill_9_the_job_resumes_from_the_latest_valid_checkpoint_bit_for_bit(killed_job, fleetrun, tmp_path):
    base = killed_job.ckpt
    assert [s for s, _ in ckpt.list_checkpoints(str(base))] == [8, 12]  # every 4 steps, newest 2 kept
    # damage that must be skipped: a save with no manifest, a truncated file, a temporary
    (base / "ckpt-16").mkdir()
    shutil.copytree(base / "ckpt-12", base / "ckpt-20")
    victim = base / "ckpt-20" / fio.read_manifest(str(base / "ckpt-20"))["vars"]["fc_0.w_0"]["file"]
    victim.write_bytes(victim.read_bytes()[:-100])
    shutil.copytree(base / "ckpt-12", base / ".ckpt-24.tmp-0badf00d")
    assert ckpt.latest_checkpoint(str(base)) == str(base / "ckpt-12")

    resaved, infer = tmp_path / "resaved", tmp_path / "infer"
    out, info = _run(fleetrun, tmp_path, 2, 2, base, 20, "--interval", "4", "--keep", "2",
                     "--resave", resaved, "--infer", infer)
    assert info["resumed"] == str(base / "ckpt-12") and (info["step"], info["epoch"]) == (12, 0)
    # saved again before any training: every array identical, table order included
    reference, again = fio.read_vars(killed_job.reference), fio.read_vars(str(resaved))
    assert sorted(again) == sorted(reference)
    assert {"emb_moment2_0", "fc_0.w_0_beta1_pow_0@blocks", f"{TABLE}@ids", f"{TABLE}_moment1_0@values",
            f"{TABLE}_beta2_pow_0@shards", "fc_1.b_0_beta2_pow_0"} <= set(reference)
    # each server's learning-rate counter after steps 0..11, loaded and saved back
    assert reference["@LR_DECAY_COUNTER@@servers"].tolist() == [[11], [11]]
    for name, value in reference.items():
        assert again[name].dtype == value.dtype, name
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    assert fio.read_manifest(str(resaved))["extra"]["mode"] == "sync"
    # training went on from step 12 exactly as the killed job had (same data, sync)
    np.testing.assert_allclose(info["losses"][:2], killed_job.info["losses"][12:14], rtol=1e-6, atol=0)
    assert np.mean(info["losses"]) < np.mean(killed_job.info["losses"][:4])
    assert info["final_step"] == 20
    # new checkpoints replaced the damaged ones; old ones and the temporary were pruned
    assert sorted(os.listdir(base)) == ["ckpt-16", "ckpt-20"]
    assert ckpt.latest_checkpoint(str(base)) == str(base / "ckpt-20")
    assert fio.read_manifest(str(base / "ckpt-20"))["extra"]["step"] == 20

    # the inference model predicts in a fresh process with no servers what the worker predicted
    code = ("import sys, numpy as np, fleet\n"
            "program, feeds, fetch = fleet.load_inference_model(sys.argv[1])\n"
            "p = np.load(sys.argv[2]); n = len(p['x'])\n"
            "feed = {'x': p['x'], 'ids': (p['ids'], np.full(n, 2)), 'dids': (p['dids'], np.ones(n, np.int64))}\n"
            "(pred,) = fleet.Executor().run(program, feed=feed, fetch_list=fetch)\n"
            "np.save(sys.argv[3], pred); print(feeds)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    proc = subprocess.run([sys.executable, "-c", code, str(infer), str(out / "probe.npz"), str(tmp_path / "p.npy")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['x', 'ids', 'dids']"
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), np.load(out / "probe.npz")["pred"])


@pytest.mark.parametrize("servers", [3, 1])
def test_a_checkpoint_loads_onto_another_number_of_servers(killed_job, fleetrun, tmp_path, servers):
    resaved = tmp_path / "resaved"
    _run(fleetrun, tmp_path, servers, 1, tmp_path / "unused", 0, "--load", killed_job.reference,
         "--resave", resaved)
    reference, again = fio.read_vars(killed_job.reference), fio.read_vars(str(resaved))
    for name, value in reference.items():
        if name.endswith(LAYOUT) or name.startswith(TABLE + "@") or name.endswith("@values"):
            continue
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    got, want = _table_rows(again), _table_rows(reference)
    assert sorted(got) == sorted(want)
    for row_id, row in want.items():
        for a, b in zip(got[row_id], row):
            np.testing.assert_array_equal(a, b, err_msg=str(row_id))
    manifest = fio.read_manifest(str(resaved))
    assert manifest["extra"]["server_num"] == servers
    assert again[f"{TABLE}_beta1_pow_0@shards"].shape == (servers, 1)
    # another server count: each server takes the saved worker's counter
    assert again["@LR_DECAY_COUNTER@@servers"].tolist() == [[11]] * servers
    blocks = len(again["fc_0.w_0@block_offsets"]) if "fc_0.w_0@block_offsets" in again else 1
    assert blocks == servers  # [13, 2048] is split into one block per server
