"""The worker group with one process per rank (tests/integration/scripts/group_worker.py):
the collectives equal numpy over 2 and 5 processes, bit-identical on every rank, with the
ranks' shared memory (one host; whole and in rounds) and with FLEET_GROUP_SHM=0 (ZeroMQ
only); a rank killed with SIGKILL, or stopped with SIGSTOP, in the middle of a
shared-memory all_reduce (whole or in rounds) is
named by every other rank within the heartbeat bound, and leaves nothing in /dev/shm; a
process without the job's CURVE keys cannot join (the others time out naming it).
"""
import functools
import importlib.util
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from fleet.transport.curve import generate_keys

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "group_worker.py")
_spec = importlib.util.spec_from_file_location("group_worker", SCRIPT)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS = 200, 1500
OP_TIMEOUT_MS = 120_000  # far above the heartbeat bound: a PeerLostError can only come from liveness
BOUND_S = 20  # the heartbeat timeout, process start-up and a loaded machine's margin, far below OP_TIMEOUT_MS


def start_ranks(procs, clean_env, free_ports, tmp_path, n, mode, env_of=lambda rank, env: env):
    endpoints = ",".join(f"127.0.0.1:{p}" for p in free_ports(n))
    started = []
    for rank in range(n):
        env = dict(clean_env, PADDLE_TRAINER_ENDPOINTS=endpoints, PADDLE_TRAINER_ID=str(rank),
                   FLEET_HEARTBEAT_MS=str(HEARTBEAT_MS), FLEET_HEARTBEAT_TIMEOUT_MS=str(HEARTBEAT_TIMEOUT_MS),
                   FLEET_RPC_TIMEOUT_MS=str(OP_TIMEOUT_MS), PYTHONPATH=os.getcwd())
        started.append(procs.start([sys.executable, SCRIPT, mode, str(tmp_path)], env=env_of(rank, env),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return endpoints.split(","), started


def _dev_shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("n, shm", [(2, "1"), (5, "1"), (3, "0")])
def test_collectives_over_processes_equal_numpy_and_agree_bit_for_bit(procs, clean_env, free_ports, tmp_path, n,
                                                                      shm):
    _, ranks = start_ranks(procs, clean_env, free_ports, tmp_path, n, "ops",
                           lambda rank, env: dict(env, FLEET_GROUP_SHM=shm))
    for rank, proc in enumerate(ranks):
        out, err = procs.communicate(proc, 120)
        assert proc.returncode == 0 and out.strip() == "OK", f"rank {rank}: {out}\n{err}"
    results = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(n)]
    for r in range(1, n):
        for name, value in results[0].items():
            assert results[r][name].tobytes() == value.tobytes(), f"{name} differs between ranks 0 and {r}"
    parts = [worker.inputs(r, n) for r in range(n)]
    got = results[0]
    np.testing.assert_array_equal(got["sum_small_f32"], functools.reduce(np.add, [p["small_f32"] for p in parts]))
    np.testing.assert_array_equal(got["max_small_i64"], np.maximum.reduce([p["small_i64"] for p in parts]))
    np.testing.assert_allclose(got["mean_ring_f64"], sum(p["ring_f64"] for p in parts) / n, rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(got["sum_ring_f32"], sum(p["ring_f32"].astype(np.float64) for p in parts),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["min_ring_f32"], np.minimum.reduce([p["ring_f32"] for p in parts]))
    np.testing.assert_array_equal(got["broadcast"], parts[n - 1]["root"])
    for r in range(n):
        np.testing.assert_array_equal(got[f"gather_{r}"], parts[r]["ragged"])
    np.testing.assert_array_equal(got["objects"], np.arange(n))
    # in rounds or whole, the same bits (and without shared memory, the ring's)
    assert got["sum_ring_f32_in_rounds"].tobytes() == got["sum_ring_f32"].tobytes()
    # all six all_reduce calls go through shared memory unless FLEET_GROUP_SHM=0
    assert [int(results[r]["shm_operations"]) for r in range(n)] == [6 if shm == "1" else 0] * n


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_rank_that_dies_or_hangs_mid_operation_is_named_by_every_other(procs, clean_env, free_ports, tmp_path, how,
                                                                          wait_for):
    shm_before = _dev_shm()
    endpoints, ranks = start_ranks(procs, clean_env, free_ports, tmp_path, 3, "loop")
    wait_for(lambda: all((tmp_path / f"rank{r}.ready").exists() for r in range(3)), BOUND_S,
             "every rank to finish its first all_reduce")
    assert [(tmp_path / f"rank{r}.ready").read_text() for r in range(3)] == ["2"] * 3  # through shared memory
    os.kill(ranks[2].pid, how)
    try:
        for rank in (0, 1):
            out, err = procs.communicate(ranks[rank], BOUND_S)
            assert ranks[rank].returncode == 3, f"rank {rank}: {out}\n{err}"
            # each names rank 2: seen itself, or reported by the other before it left
            assert re.match(rf"FAILED PeerLostError: rank 2 \({endpoints[2]}\) of the worker group is lost: its "
                            rf"connection to rank [01] dropped during all_reduce #\d+ \(rank [01] of 3\)", out), out
    finally:
        if how == signal.SIGSTOP:
            procs.kill(ranks[2])
    procs.communicate(ranks[2], BOUND_S)
    assert _dev_shm() <= shm_before  # nothing left behind (other jobs may remove their own meanwhile)


def test_a_process_without_the_curve_keys_cannot_join(procs, clean_env, free_ports, tmp_path):
    keys = tmp_path / "keys"
    generate_keys(str(keys))

    def env_of(rank, env):
        env = dict(env, FLEET_CONNECT_TIMEOUT_MS="4000")
        if rank < 2:
            env["FLEET_CURVE_KEYS_DIR"] = str(keys)
        return env

    endpoints, ranks = start_ranks(procs, clean_env, free_ports, tmp_path, 3, "join", env_of)
    outs = [procs.communicate(proc, BOUND_S)[0] for proc in ranks]
    for rank in (0, 1):
        assert ranks[rank].returncode == 3, outs[rank]
        assert outs[rank].startswith(f"FAILED FleetTimeoutError: rank 2 ({endpoints[2]}) did not answer rank {rank} "
                                     f"in joining the worker group within 4000 ms"), outs[rank]
    assert outs[2].startswith(f"FAILED FleetTimeoutError: ranks 0 ({endpoints[0]}), 1 ({endpoints[1]}) did not "
                              f"answer rank 2 in joining the worker group"), outs[2]
