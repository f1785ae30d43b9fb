"""Throughput of the sparse-row kernels of fleet.kernels; prints one JSON line.

    python benchmarks/bench_kernels.py [--rows 100000] [--height 1000000] [--dim 10]

Each kernel is called once to compile (or load from numba's cache) and warm the table
pages, then timed ``--repeat`` times; the figure is the median. ``merge_rows`` and
``scatter_add`` get ``--rows`` random ids with duplicates; ``sgd_rows`` and ``adam_rows``
get the unique ids that merging leaves (as the optimizer rules call them), and their
rows/s counts those. ``adam_rows_all_ms`` is one non-lazy Adam sweep of the whole table;
``gather_pool_26_slots_us`` is 26 per-slot sum-pool calls of one id per example for
``--batch`` examples, written into column slices of one concat buffer.
"""
import argparse
import json
import statistics
import time

import numpy as np

from fleet.kernels import embedding, optim, sparse


def _median_seconds(fn, repeat):
    fn()  # compile or load from cache, fault in pages
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="ids per batch (default 100000)")
    parser.add_argument("--height", type=int, default=1_000_000, help="table rows (default 1000000)")
    parser.add_argument("--dim", type=int, default=10, help="row width (default 10)")
    parser.add_argument("--batch", type=int, default=1000, help="examples per gather_pool call")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per kernel (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, args.height, args.rows, dtype=np.int64)
    values = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    table = rng.standard_normal((args.height, args.dim)).astype(np.float32)
    m1 = np.zeros_like(table)
    m2 = np.zeros_like(table)
    uniq, summed = sparse.merge_rows(ids, values)
    lr_t, eps_t = 1e-3, 1e-8

    merge_s = _median_seconds(lambda: sparse.merge_rows(ids, values), args.repeat)
    scatter_s = _median_seconds(lambda: sparse.scatter_add(table, ids, values), args.repeat)
    sgd_s = _median_seconds(lambda: optim.sgd_rows(table, uniq, summed, 1e-3), args.repeat)
    adam_s = _median_seconds(
        lambda: optim.adam_rows(table, m1, m2, uniq, summed, lr_t, 0.9, 0.999, eps_t), args.repeat
    )
    adam_all_s = _median_seconds(
        lambda: optim.adam_rows_all(table, m1, m2, uniq, summed, lr_t, 0.9, 0.999, eps_t), args.repeat
    )

    slots = 26
    slot_ids = [rng.integers(0, args.height, args.batch, dtype=np.int64) for _ in range(slots)]
    offsets = np.arange(args.batch + 1, dtype=np.int64)
    concat = np.empty((args.batch, slots * args.dim + 13), dtype=np.float32)
    outs = [concat[:, k * args.dim : (k + 1) * args.dim] for k in range(slots)]
    no_argmax = np.zeros((0, 0), dtype=np.int64)

    def pool_all_slots():
        for k in range(slots):
            embedding.gather_pool(table, slot_ids[k], offsets, 0, -1, outs[k], no_argmax)

    gather_s = _median_seconds(pool_all_slots, args.repeat)

    print(json.dumps({
        "bench": "kernels",
        "rows": args.rows,
        "unique_rows": int(len(uniq)),
        "height": args.height,
        "dim": args.dim,
        "merge_rows_rows_per_s": round(args.rows / merge_s),
        "scatter_add_rows_per_s": round(args.rows / scatter_s),
        "sgd_rows_rows_per_s": round(len(uniq) / sgd_s),
        "adam_rows_rows_per_s": round(len(uniq) / adam_s),
        "adam_rows_all_ms": round(adam_all_s * 1e3, 3),
        "gather_pool_26_slots_us": round(gather_s * 1e6, 1),
    }))


if __name__ == "__main__":
    main()
