"""One rank of a worker group, for tests/integration/test_group_processes.py.

Usage: group_worker.py MODE OUT_DIR  (PADDLE_TRAINER_ENDPOINTS, PADDLE_TRAINER_ID and
FLEET_* set by the test)

MODE "ops": every collective on ``inputs(rank, size)``; the results go to OUT_DIR/rank<r>.npz.
MODE "loop": all_reduce of 1 MB whole and of 1 MB + 4 KB in rounds (the group's
pipelined shared-memory path, from 1 MB + 1 byte here), in turn, forever;
OUT_DIR/rank<r>.ready after the first two, holding the number of all_reduce calls that
went through shared memory.
MODE "join": join the group and pass a barrier.
Any failure is printed as "FAILED <type>: <message>" on stdout, exit code 3.
"""
import os
import sys

import numpy as np

from fleet.transport.group import group_from_env


def inputs(rank, size):
    """The arrays rank ``rank`` of ``size`` contributes (name -> array)."""
    rng = np.random.default_rng([11, rank])
    return {
        "small_f32": rng.standard_normal((3, 5)).astype(np.float32),
        "small_i64": rng.integers(-50, 50, size=(7,)).astype(np.int64),
        "ring_f64": rng.standard_normal((300, 301)),
        "ring_f32": rng.standard_normal(1 << 20).astype(np.float32),
        "ragged": np.full((rank * 20_000 + 1, 3), rank, dtype=np.int32),
        "root": np.arange(200_000, dtype=np.float32) + 1000 * rank,
    }


def ops(group, out):
    mine = inputs(group.rank, group.size)
    results = {
        "sum_small_f32": group.all_reduce(mine["small_f32"], "sum"),
        "max_small_i64": group.all_reduce(mine["small_i64"], "max"),
        "mean_ring_f64": group.all_reduce(mine["ring_f64"], "mean"),
        "sum_ring_f32": group.all_reduce(mine["ring_f32"], "sum"),
        "min_ring_f32": group.all_reduce(mine["ring_f32"], "min"),
        "broadcast": group.broadcast(mine["root"] if group.rank == group.size - 1 else None, root=group.size - 1),
    }
    # the same sum in rounds of 64 KiB through shared memory (from 1 MiB on, here)
    group.shm_pipeline_min_bytes, group.shm_round_bytes = 1 << 20, 64 << 10
    results["sum_ring_f32_in_rounds"] = group.all_reduce(mine["ring_f32"], "sum")
    for r, part in enumerate(group.all_gather(mine["ragged"])):
        results[f"gather_{r}"] = part
    ranks = group.all_gather_object({"rank": group.rank})
    group.barrier()
    results["objects"] = np.array([o["rank"] for o in ranks])
    results["shm_operations"] = np.array(group.stats()["shm_operations"])
    np.savez(os.path.join(out, f"rank{group.rank}.npz"), **results)


def loop(group, out):
    x = np.full(1 << 18, float(group.rank), dtype=np.float32)
    y = np.full((1 << 18) + 1024, float(group.rank), dtype=np.float32)
    group.shm_pipeline_min_bytes, group.shm_round_bytes = (1 << 20) + 1, 64 << 10
    group.all_reduce(x)
    group.all_reduce(y)
    with open(os.path.join(out, f"rank{group.rank}.ready.tmp"), "w") as f:
        f.write(str(group.stats()["shm_operations"]))
    os.replace(os.path.join(out, f"rank{group.rank}.ready.tmp"), os.path.join(out, f"rank{group.rank}.ready"))
    while True:
        group.all_reduce(x)
        group.all_reduce(y)


def main():
    mode, out = sys.argv[1], sys.argv[2]
    try:
        with group_from_env() as group:
            {"ops": ops, "loop": loop, "join": lambda g, _: g.barrier()}[mode](group, out)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print("OK", flush=True)


if __name__ == "__main__":
    main()
