"""examples/ctr_dnn/online.py: the done-file protocol, kill -9 and restart, the saved chain.

Each test writes a small stream with generate_online_data.py (1,000-1,200 lines per pass)
and runs online.py as a user would: local training (one process) for the done-file
protocol, a fleetrun job of servers and a worker for kills, restarts and chains.
"""
import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

from tests.integration.conftest import wait_for

pytestmark = pytest.mark.slow

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "ctr_dnn")
SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
DONE = "to.hadoop.done"


def env():
    out = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINING_ROLE", "PADDLE_"))}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, EXAMPLE, out.get("PYTHONPATH")) if p)
    return out


def generate(data, days, passes_per_day, lines=1200):
    subprocess.run([sys.executable, os.path.join(EXAMPLE, "generate_online_data.py"), "--out_dir", str(data),
                    "--days", str(days), "--passes_per_day", str(passes_per_day), "--lines_per_pass", str(lines),
                    "--files_per_pass", "2", "--test_lines", "400"], check=True, env=env(), capture_output=True)


def online_args(data, model, days, passes_per_day, *extra):
    return ["--data_dir", str(data), "--model_dir", str(model), "--days", str(days),
            "--passes_per_day", str(passes_per_day), "--threads", "1", "--batch_size", "200", "--poll_seconds",
            "0.02", "--sparse_feature_dim", "100003", "--entry", "count:2", "--status_seconds", "0.1",
            *map(str, extra)]


def online_cmd(data, model, days, passes_per_day, *extra):
    """online.py as one local process."""
    return [sys.executable, os.path.join(EXAMPLE, "online.py"), *online_args(data, model, days, passes_per_day, *extra)]


def fleetrun_cmd(tmp_path, servers, script, args):
    """``script`` (a path) with ``args`` as a job of ``servers`` servers and 1 worker."""
    return [sys.executable, "-m", "fleet.launch", "--server_num", str(servers), "--worker_num", "1",
            "--log_dir", str(tmp_path / "log"), script, *args]


def events(model):
    path = os.path.join(model, "online.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def progress(model):
    try:
        with open(os.path.join(model, "progress.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"done": [], "save": None}


def names(days, passes_per_day):
    step = 1440 // passes_per_day
    return [f"202601{d + 1:02d}/{p * step // 60:02d}{p * step % 60:02d}"
            for d in range(days) for p in range(passes_per_day)]


def test_online_starts_a_pass_only_after_its_done_file_appears(procs, tmp_path):
    data, model = tmp_path / "data", tmp_path / "model"
    generate(data, 1, 4)
    done = data / "20260101" / "1200" / DONE
    done.unlink()  # pass 3's files are there, its done file is not yet
    out = tmp_path / "out.txt"
    proc = procs.start(online_cmd(data, model, 1, 4, "--wait_timeout", 120), cwd=EXAMPLE, env=env(),
                       stdout=open(out, "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: f"pass 20260101/1200: waiting for {done}" in out.read_text(), 60,
             "online.py to say it waits for pass 3's done file")
    assert progress(model)["done"] == ["20260101/0000", "20260101/0600"]
    assert [e["name"] for e in events(model) if e["event"] == "start"] == ["20260101/0000", "20260101/0600"]
    assert proc.poll() is None  # still waiting, not failed
    done.touch()
    created = os.stat(done).st_mtime
    assert proc.wait(timeout=90) == 0, out.read_text()[-3000:]
    starts = {e["name"]: e["time"] for e in events(model) if e["event"] == "start"}
    assert list(starts) == names(1, 4)
    assert starts["20260101/1200"] >= created - 0.01  # started after the done file, not before
    assert progress(model)["done"] == names(1, 4)


def test_online_stops_naming_the_missing_done_file_after_wait_timeout(procs, tmp_path):
    data, model = tmp_path / "data", tmp_path / "model"
    generate(data, 1, 2)
    done = data / "20260101" / "0000" / DONE
    done.unlink()
    proc = procs.start(online_cmd(data, model, 1, 2, "--wait_timeout", 0.5), cwd=EXAMPLE, env=env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert stderr.strip().splitlines()[-1] == (
        f"online.py: no done file {done} after waiting 0.5 s (--wait_timeout): pass 20260101/0000's data is "
        f"not complete; start its producer or raise --wait_timeout")
    assert f"pass 20260101/0000: waiting for {done} (0 s so far, up to 0.5 s)" in stdout
    assert progress(model)["done"] == [] and events(model) == []


def chain_of(model, save):
    """[(directory relative to model, mode)] of the chain ending at ``save``, base first,
    walked back through each MANIFEST's chain record (its parent's directory is relative
    to this save's parent directory)."""
    links = []
    current = os.path.join(model, save)
    while True:
        with open(os.path.join(current, "MANIFEST.json")) as f:
            chain = json.load(f)["extra"]["chain"]
        links.append((os.path.relpath(current, model), chain["mode"]))
        if chain["mode"] != 1:
            return links[::-1]
        current = os.path.normpath(os.path.join(os.path.dirname(current), chain["parent"]["dirname"]))


def job_pids(root):
    """Pids of the processes fleetrun ``root`` started (its children)."""
    return [p.pid for p in psutil.Process(root).children()]


@pytest.mark.parametrize("layout", ["local", "2 servers"])
def test_online_killed_at_random_points_continues_from_the_last_complete_pass(procs, tmp_path, layout):
    days, per_day = 2, 3
    data, model = tmp_path / "data", tmp_path / "model"
    generate(data, days, per_day, lines=1000)
    if layout == "local":
        cmd = online_cmd(data, model, days, per_day)
    else:
        cmd = fleetrun_cmd(tmp_path, 2, os.path.join(EXAMPLE, "online.py"), online_args(data, model, days, per_day))
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills = []
    for victim, last in (("job", days * per_day - 3), ("one process", days * per_day - 1)):
        # the whole job at once (a host lost), then one process; each during pass target + 1
        target = rng.randrange(min(len(progress(model)["done"]), last - 1), last)
        proc = procs.start(cmd, cwd=EXAMPLE, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if layout != "local":  # every process of the job started (2 servers, 1 worker)
            wait_for(lambda: len(job_pids(proc.pid)) == 3 or proc.poll() is not None, 30, "the job's processes")
        wait_for(lambda: len(progress(model)["done"]) >= target or proc.poll() is not None, 90,
                 f"pass {target} to be done (seed {seed})")
        assert proc.poll() is None, f"seed {seed}: the job ended before the kill"
        # a random moment of the next pass (training, saving, between the save and its record)
        # or, at the latest, just after its record
        wait_for(lambda: rng.random() < 0.05 or len(progress(model)["done"]) > target or proc.poll() is not None,
                 30, "a random moment")
        assert proc.poll() is None, f"seed {seed}: the job ended before the kill"
        if victim == "job" or layout == "local":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(rng.choice(job_pids(proc.pid)), signal.SIGKILL)  # fleetrun then stops the others
        proc.wait(timeout=60)
        kills.append(len(progress(model)["done"]))
    proc = procs.start(cmd, cwd=EXAMPLE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"seed {seed}, killed after {kills} passes done:\n{out[-3000:]}"
    final = progress(model)
    assert final["done"] == names(days, per_day), f"seed {seed}"  # every pass once, in order
    done_events = [e["name"] for e in events(model) if e["event"] == "done"]
    assert len(done_events) == len(set(done_events)), f"seed {seed}: a pass was recorded done twice"
    skipped = [line for line in out.splitlines() if line.endswith("done before this start (progress.json), skipped")]
    assert len(skipped) == kills[-1], f"seed {seed}"
    # the chain on disk: each day ends with a base; day 2's passes are deltas on day 1's base
    assert chain_of(model, final["save"]) == [("20260102/1600", 2)]
    assert chain_of(model, "20260102/0800") == [("20260101/1600", 2), ("20260102/0000", 1), ("20260102/0800", 1)]
    assert chain_of(model, "20260101/0800") == [("20260101/0000", 2), ("20260101/0800", 1)]


@pytest.mark.parametrize("servers_then", [2, 3])
def test_online_chain_loads_equal_to_the_full_state_it_saved(procs, tmp_path, servers_then):
    data, model = tmp_path / "data", tmp_path / "model"
    generate(data, 1, 4)
    full, reloaded = tmp_path / "full", tmp_path / "reloaded"
    args = online_args(data, model, 1, 4, "--stop_after", 3, "--base_mode", 0, "--shrink", "pass")
    script = os.path.join(SCRIPTS, "online_chain.py")
    for servers, what, out in ((2, "train", full), (servers_then, "reload", reloaded)):
        run = subprocess.run(fleetrun_cmd(tmp_path, servers, script, [what, str(out), *args]), cwd=EXAMPLE,
                             env=env(), capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        if what == "train":
            assert progress(model)["done"] == names(1, 4)[:3]
            assert chain_of(model, progress(model)["save"]) == [("20260101/0000", 0), ("20260101/0600", 1),
                                                               ("20260101/1200", 1)]
    a, b = saved_tables(full), saved_tables(reloaded)
    assert sorted(a) == sorted(b)
    assert len(a["SparseFeatFactors@ids"]) > 200  # rows, also after the shrinks
    for name in a:
        if name.startswith("auc"):
            continue  # the worker's own AUC buckets: the reloading worker trained nothing
        if name.endswith("@block_offsets"):
            continue  # where each server's block of a dense parameter starts: differs by server count
        if name.endswith("@sketch@shards"):  # admission sketches: 3 servers each hold the maximum of the 2 saved
            np.testing.assert_array_equal(np.maximum.reduce(a[name]), np.maximum.reduce(b[name]), err_msg=name)
            if servers_then == 2:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
            continue
        if name.endswith(("@shards", "@blocks")):  # a scalar state as each server holds it: a row per server
            np.testing.assert_array_equal(np.unique(a[name], axis=0), np.unique(b[name], axis=0), err_msg=name)
            continue
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def saved_tables(dirname):
    """{var: array} of a save, the rows of id-keyed tables sorted by id."""
    from fleet.framework import io as fio

    manifest = fio.read_manifest(str(dirname))
    arrays = fio.read_vars(str(dirname), sorted(manifest["vars"]))
    for name in [n for n in arrays if n.endswith("@ids")]:
        order = np.argsort(arrays[name], kind="stable")
        table = name[:-len("@ids")]
        for other in [n for n in arrays if n.startswith(table + "@") or n.startswith(table + "_")]:
            if len(arrays[other]) == len(order) and other != name:
                arrays[other] = arrays[other][order]
        arrays[name] = arrays[name][order]
    return arrays
