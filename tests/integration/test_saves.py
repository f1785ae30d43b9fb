"""Save modes of a real job: saves taken while two async workers push at full speed are
point-in-time per server, and a base plus its deltas reloads (onto another number of
servers) exactly as the full save of the same instant.

The job is tests/integration/scripts/saves_model.py under fleetrun: versioned pushes
(every gradient 1.0, Adagrad), so each row's moment counts the pushes it received and
its value is a function of that count; see the script for the id scheme.
"""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from fleet.framework import io as fio
from fleet.framework.save_chain import read_chain
from fleet.rules import AdagradRule

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "saves_model.py")
SKETCH_SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "sketch_restart.py")
DATA_ROWS, LR = 61, 0.5


def _rows(dirname):
    """{id: (value row, moment row)} of the save's dtable, and its tombstones."""
    saved = fio.read_vars(dirname)
    ids, values, moments = saved["dtable@ids"], saved["dtable@values"], saved["dtable_moment_0@values"]
    assert len(ids) == len(values) == len(moments) == len(set(ids.tolist()))  # one id set in every array
    deleted = saved.get("dtable@deleted", np.zeros(0, np.int64))
    return {int(i): (values[k], moments[k]) for k, i in enumerate(ids)}, deleted


def _apply(table, delta, deleted):
    out = {i: row for i, row in table.items() if i not in set(deleted.tolist())}
    out.update(delta)
    return out


def _values_by_count(most):
    """The value of a row after k pushes of gradient 1.0, for k < most (the servers' kernel)."""
    rule, param, state = AdagradRule(), np.zeros((1, 4), np.float32), {"moment": np.zeros((1, 4), np.float32)}
    out = [param[0].copy()]
    for _ in range(most):
        rule.apply_sparse(param, np.zeros(1, np.int64), np.ones((1, 4), np.float32), state, LR)
        out.append(param[0].copy())
    return out


def _check_one_instant(table, what):
    """Every row is consistent in itself (value = f(moment)) and, per server, every data
    row of each worker counts the pushes its counter row there says were applied."""
    counts = {i: int(moment[0]) for i, (_, moment) in table.items()}
    ref = _values_by_count(max(counts.values()) + 1)
    for i, (value, moment) in table.items():
        assert np.all(moment == moment[0]), f"{what}: row {i} has moments {moment}"
        np.testing.assert_array_equal(value, ref[counts[i]], err_msg=f"{what}: row {i} (count {counts[i]})")
    for worker in (0, 1):
        for server in (0, 1):
            applied = counts.get(worker * 1000 + 990 + server, 0)
            for row in range(server, DATA_ROWS, 2):
                expected = applied // DATA_ROWS + (1 if row < applied % DATA_ROWS else 0)
                got = counts.get(worker * 1000 + row, 0)
                assert got == expected, (f"{what}: server {server} applied {applied} pushes of worker {worker}, "
                                         f"but its row {worker * 1000 + row} counts {got}, not {expected}")


def _same(a, b, what):
    assert sorted(a) == sorted(b), f"{what}: id sets differ"
    for i in a:
        for x, y in zip(a[i], b[i]):
            np.testing.assert_array_equal(x, y, err_msg=f"{what}: row {i}")


@pytest.mark.slow
def test_saves_while_two_async_workers_push_are_one_instant_per_server_and_the_chain_reloads(fleetrun, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    small = {**os.environ, "FLEET_MAX_MESSAGE_BYTES": "4096"}  # a table read takes many chunks, pushes between them
    run = fleetrun("--server_num", 2, "--worker_num", 2, "--log_dir", tmp_path / "log1", SCRIPT, out, timeout=60,
                   env=small)
    assert run.returncode == 0, run.stderr[-3000:]
    pushes = [int((out / f"pushes.{w}").read_text()) for w in (0, 1)]
    assert min(pushes) >= 200  # 50 before the base, between the saves and after them, per worker

    chain = [read_chain(out / name) for name in ("base", "d1", "d2", "d3")]
    assert [(c["mode"], c["sequence"]) for c in chain] == [(0, 0), (1, 1), (1, 2), (1, 3)]
    assert {c["id"] for c in chain} == {chain[0]["save_id"]}
    assert [c["parent"]["dirname"] for c in chain[1:]] == ["base", "d1", "d2"]

    table, _ = _rows(out / "base")
    _check_one_instant(table, "base")
    counters = [counts_pushes(table)]
    sizes = [len(table)]
    for name in ("d1", "d2", "d3"):
        delta, deleted = _rows(out / name)
        assert len(deleted) == 0
        sizes.append(len(delta))
        table = _apply(table, delta, deleted)
        _check_one_instant(table, f"base + deltas up to {name}")
        counters.append(counts_pushes(table))
    for before, after in zip(counters, counters[1:]):  # both workers pushed between consecutive saves
        assert after[0] >= before[0] + 40 and after[1] >= before[1] + 40, counters
    full, _ = _rows(out / "full")
    _same(table, full, "base + d1 + d2 + d3 vs the full save")
    assert counts_pushes(full) == pushes

    # the chain loads onto 3 servers as the full save (a mode-0 save of the reloaded job)
    run = fleetrun("--server_num", 3, "--worker_num", 1, "--log_dir", tmp_path / "log2", SCRIPT, out,
                   "--load", out / "d3", "--check", timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    reloaded, _ = _rows(out / "reloaded")
    _same(reloaded, full, "the chain loaded onto 3 servers vs the full save")


def counts_pushes(table):
    """[pushes of worker 0, of worker 1] applied, from their counter rows."""
    return [int(table[w * 1000 + 990][1][0]) for w in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("servers_after", [2, 1])
def test_a_candidate_seen_once_before_a_kill_is_admitted_by_its_second_sighting_after_the_restart(
        procs, fleetrun, clean_env, tmp_path, servers_after):
    from tests.integration.conftest import wait_for
    from tests.integration.scripts.sketch_restart import NEW, ONCE, TWICE

    saves, out = tmp_path / "saves", tmp_path / "out"
    saves.mkdir()
    job = procs.start([sys.executable, "-m", "fleet.launch", "--server_num", "2", "--worker_num", "1",
                       "--log_dir", str(tmp_path / "log1"), SKETCH_SCRIPT, "before", str(saves)],
                      cwd=tmp_path, env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (saves / "saved").exists() or job.poll() is not None, 120, "the delta save of the first job")
    assert job.poll() is None, "the first job ended before the kill"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=60)

    delta = fio.read_vars(str(saves / "delta"))
    sketches = delta["emb@sketch@shards"]
    assert sketches.shape == (2, 4, 1 << 22) and sketches.dtype == np.uint8
    assert len(delta["emb@ids"]) == 0  # ONCE: candidates, no row; TWICE: rows unchanged since the base
    assert sorted(fio.read_vars(str(saves / "base"))["emb@ids"].tolist()) == sorted(TWICE.tolist())

    run = fleetrun("--server_num", servers_after, "--worker_num", 1, "--log_dir", tmp_path / "log2", SKETCH_SCRIPT,
                   "after", saves, out, timeout=120, env=clean_env)
    assert run.returncode == 0, run.stderr[-3000:]
    saved = fio.read_vars(str(out))
    ids = set(saved["emb@ids"].tolist())
    assert ids == set(TWICE.tolist()) | set(ONCE.tolist())  # ONCE: admitted by its second sighting
    assert not ids & set(NEW.tolist())  # seen once: still a candidate
    if servers_after == 1:  # the maximum of the two saved sketches, plus NEW's sightings
        merged = np.maximum(sketches[0], sketches[1])
        assert (saved["emb@sketch"] >= merged).all()
    else:
        assert saved["emb@sketch@shards"].shape == (2, 4, 1 << 22)
        assert (saved["emb@sketch@shards"] >= sketches).all()
