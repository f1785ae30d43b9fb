"""Checkpoint save and load of a distributed table on loopback.

Two real parameter servers (threads, real sockets) hold an is_distributed table of
``--rows`` rows of dim 10 with Adam state (value + 2 moments per row) and a 4 MiB dense
weight. Prints one JSON line: the seconds and rows/s (and MB/s of arrays) of a worker's
streaming save (``fleet.server_saves.write_server_params``: chunked ``pull_shard`` / ``pull_state`` reads
into a ``VarsWriter``), of loading the save onto 3 servers (``init_server`` path:
``VarsReader`` + ``ParameterServer.load``), and the size of the save on disk.

    python benchmarks/bench_checkpoint.py [--rows 2000000]
"""
import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time

import numpy as np

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.communicator.sync import SyncCommunicator
from fleet.framework import io as fio
from fleet.server_saves import write_server_params
from fleet.server.checkpoint import initial_values
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan
from fleet.transport import Client, ServerSocket, serving
from strategies import DistributedStrategyFactory


def _program():
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[1024])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        table = fleet.ParamAttr(name="t", initializer=fleet.initializer.Uniform(-0.1, 0.1))
        e = layers.sequence_pool(layers.embedding(ids, size=[10, 10], is_distributed=True, param_attr=table), "sum")
        h = layers.fc(x, 1024, param_attr="w", bias_attr=False)
        optimizer.Adam(1e-3).minimize(layers.mean(layers.concat([h, e], axis=1)))
    return main


def _fill(servers, rows, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
    n = len(servers)
    for index, ps in enumerate(servers):
        (_, table), = ps.shards.values()
        mine = ids[np.mod(ids, n) == index]
        for start in range(0, len(mine), 1 << 18):
            chunk = mine[start:start + (1 << 18)]
            table.push(chunk, rng.normal(size=(len(chunk), 10)).astype(np.float32), 1e-3)
    return len(np.unique(ids))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    program = _program()
    strategy = DistributedStrategyFactory.create_async_strategy()
    sockets = [ServerSocket("127.0.0.1:0") for _ in range(2)]
    endpoints = [f"127.0.0.1:{s.port}" for s in sockets]
    plan = build_plan(program, strategy, endpoints, 1)
    init = {"w": np.zeros((1024, 1024), np.float32)}
    servers = [ParameterServer(ep, plan, init) for ep in endpoints]
    rows = _fill(servers, args.rows)
    tmp = tempfile.mkdtemp(prefix="bench_ckpt_")
    try:
        with contextlib.ExitStack() as stack:
            for sock, ps in zip(sockets, servers):
                stack.enter_context(serving(sock, ps.handle))
            comm = SyncCommunicator(plan, 0, fw.Scope(), {}, connect=lambda ep: Client(ep, 0))
            comm.start()
            started = time.perf_counter()
            with fio.VarsWriter(os.path.join(tmp, "ckpt")) as writer:
                write_server_params(writer, comm, plan.params.values())
            save_s = time.perf_counter() - started
        size = sum(os.path.getsize(os.path.join(tmp, "ckpt", f)) for f in os.listdir(os.path.join(tmp, "ckpt")))
        started = time.perf_counter()
        eps3 = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
        plan3 = build_plan(program, strategy, eps3, 1)
        reader = fio.VarsReader(os.path.join(tmp, "ckpt"))
        loaded = 0
        for ep in eps3:
            ps = ParameterServer(ep, plan3, initial_values(reader, plan3, ep))
            ps.load(reader)
            loaded += sum(len(t) for _, t in ps.shards.values())
        load_s = time.perf_counter() - started
        assert loaded == rows, (loaded, rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({
        "benchmark": "checkpoint", "table_rows": rows, "dim": 10, "optimizer": "adam",
        "save_bytes": size, "save_seconds": round(save_s, 3), "save_rows_per_sec": round(rows / save_s),
        "save_mb_per_sec": round(size / save_s / 1e6, 1),
        "load_onto_3_servers_seconds": round(load_s, 3), "load_rows_per_sec": round(rows / load_s),
    }))


if __name__ == "__main__":
    main()
