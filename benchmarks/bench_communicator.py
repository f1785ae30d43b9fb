"""The worker's communicator against a real parameter server on loopback.

Prints one JSON line: dense push+pull GB/s through the communicator and server (a
half-async step: push the gradient, the server applies SGD, pull the block back) for 4 MiB
and 64 MiB parameters, next to raw ZeroMQ moving the same bytes in the same run; and
sparse rows/s (prefetch of 100k ids, then a push of their gradient rows, dim 10).

    python benchmarks/bench_communicator.py [--seconds 2]
"""
import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fleet.framework as fw  # noqa: E402
from bench_transport import bench_raw  # noqa: E402
from fleet import layers, optimizer  # noqa: E402
from fleet.communicator import make_communicator  # noqa: E402
from fleet.framework.tensor import SparseRows  # noqa: E402
from fleet.server.parameter_server import ParameterServer  # noqa: E402
from fleet.transpiler.plan import build_plan  # noqa: E402
from fleet.transport import Client, ServerSocket, serving  # noqa: E402
from strategies import DistributedStrategyFactory  # noqa: E402


@contextlib.contextmanager
def _setup(rows, width, table_rows):
    """Yields (communicator, plan) talking to a real server serving from a thread."""
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[rows])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        e = layers.sequence_pool(layers.embedding(ids, size=[table_rows, 10], is_sparse=True, param_attr="t"), "sum")
        h = layers.fc(x, width, param_attr="w", bias_attr=False)
        optimizer.SGD(1e-6).minimize(layers.mean(layers.concat([h, e], axis=1)))
    strategy = DistributedStrategyFactory.create_half_async_strategy()
    strategy.get_program_config().slice_var_up = False  # one block: the whole payload
    server = ServerSocket("127.0.0.1:0")
    endpoint = f"127.0.0.1:{server.port}"
    plan = build_plan(main, strategy, [endpoint], 1)
    init = {"w": np.zeros((rows, width), np.float32), "t": np.zeros((table_rows, 10), np.float32)}
    ps = ParameterServer(endpoint, plan, init)
    with serving(server, ps.handle):
        comm = make_communicator("half_async", plan, 0, fw.Scope(), {}, connect=lambda ep: Client(ep, 0))
        comm.start()
        try:
            yield comm, plan
        finally:
            comm.stop()


def bench_dense(mib, seconds):
    width = 1024
    rows = mib * 1024 * 1024 // 4 // width
    grad = np.full((rows, width), 1e-3, np.float32)
    with _setup(rows, width, 1000) as (comm, plan):
        name = plan.params["w"].grad
        comm.send({name: grad})  # warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            comm.send({name: grad})  # push, server applies SGD, then pull_dense
            n += 1
        elapsed = time.perf_counter() - t0
    return 2 * grad.nbytes * n / elapsed / 1e9


def bench_sparse(seconds, batch=100_000, table_rows=1_000_000):
    ids = np.random.default_rng(0).integers(0, table_rows, batch)
    with _setup(8, 8, table_rows) as (comm, plan):
        grad_name = plan.params["t"].grad
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            rows = comm.prefetch("t", ids)
            comm.send({grad_name: SparseRows(ids, np.full((batch, 10), 1e-3, np.float32), table_rows)})
            n += 1
        elapsed = time.perf_counter() - t0
    return batch * n / elapsed, len(rows.ids)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    out = {"bench": "communicator", "goal": "dense >= 0.7 of raw ZeroMQ; sparse table lookups+updates >= 10M rows/s"}
    for mib in (4, 64):
        ours = bench_dense(mib, args.seconds)
        raw = bench_raw(np.zeros(mib * 1024 * 1024 // 4, np.float32), args.seconds)
        out[f"dense_{mib}mib_gbps"] = round(ours, 3)
        out[f"raw_zmq_{mib}mib_gbps"] = round(raw, 3)
        out[f"ratio_{mib}mib"] = round(ours / raw, 3)
    rate, unique = bench_sparse(args.seconds)
    out["sparse_prefetch_push_rows_per_s"] = round(rate)
    out["sparse_batch_unique_ids"] = unique
    print(json.dumps(out))


if __name__ == "__main__":
    main()
