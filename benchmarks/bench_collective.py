"""all_reduce bandwidth of the worker group (fleet.transport.group) next to raw ZeroMQ and MPI.

One process per rank on this machine. For each group size N (2, 4) and array size
(4 MiB, 64 MiB of float32): algorithm bandwidth = array bytes / seconds per all_reduce
(the slowest rank's time, best of --repeats), on the path a user gets ("fleet_gbps":
shared memory, as every rank is on this host, unless FLEET_GROUP_SHM=0) and, when that
is shared memory, on ZeroMQ next to it, the same arrays in the same processes
("fleet_zmq_gbps": the ring). The bound comes from raw ZeroMQ in the
same run: two processes, a DEALER streaming the array to a ROUTER with copy=False (in
messages of the ring's chunk size and in one message; the faster counts), B_raw = bytes
/ s. A ring moves 2(N-1)/N of the array through each rank, so the goal is algorithm
bandwidth >= 0.8 * B_raw / (2(N-1)/N) (the issue's definition). B_raw is one direction
on an otherwise idle pair, while in the ring every rank sends and receives at once, and
here N processes share this machine's cores; so a second bound is measured the way the
ring moves data: N processes in a ring, each streaming the array to its right neighbour
while it receives one from its left (B_ring = bytes / s of the slowest), and the same
goal is checked against B_ring / (2(N-1)/N). When mpi4py and mpirun are installed, MPI's
Allreduce of the same arrays runs in the same run (mpirun -np N --oversubscribe).

A latency sweep (arrays of 1 KiB to 1 MiB, N = 2 and 4) times the direct exchange, the
ring and shared memory on the same arrays: the smallest size where the ring is faster
than the direct exchange is where RING_MIN_BYTES belongs, and the smallest where shared
memory is, SHM_MIN_BYTES.

Prints one JSON line with "checks" ({"figure", "goal", "value", "met"}).

    python benchmarks/bench_collective.py [--sizes-mib 4 64] [--ranks 2 4] [--seconds 1.0]
"""
import argparse
import importlib.util
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SWEEP_KIB = (1, 4, 16, 64, 256, 512, 1024)
GOAL_FRACTION = 0.8
PROCESS_TIMEOUT_S = 600


def free_ports(count):
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# ------------------------------------------------------------------ one rank

def timed_all_reduce(group, array, seconds, repeats):
    """Seconds per all_reduce on the slowest rank, best of ``repeats``; every rank runs
    the same number of operations."""
    for _ in range(2):
        group.all_reduce(array)
    start = time.perf_counter()
    group.all_reduce(array)
    one = group.all_reduce(np.array([time.perf_counter() - start]), "max")[0]
    count = max(3, math.ceil(seconds / max(one, 1e-6)))
    best = math.inf
    for _ in range(repeats):
        group.barrier()
        start = time.perf_counter()
        for _ in range(count):
            group.all_reduce(array)
        elapsed = time.perf_counter() - start
        best = min(best, group.all_reduce(np.array([elapsed]), "max")[0] / count)
    return best


def rank_main(args):
    sys.path.insert(0, ROOT)
    from fleet.transport.group import group_from_env

    out = {"bandwidth": {}, "zmq_bandwidth": {}, "sweep": {}}
    with group_from_env() as group:
        out["shared_memory"] = group.shared_memory
        for mib in args.sizes_mib:
            array = np.random.default_rng(group.rank).random(mib * (1 << 20) // 4, dtype=np.float32)
            out["bandwidth"][str(mib)] = timed_all_reduce(group, array, args.seconds, args.repeats)
            if group.shared_memory:  # the ZeroMQ path next to it, on the same arrays
                group.shared_memory = False
                out["zmq_bandwidth"][str(mib)] = timed_all_reduce(group, array, args.seconds, args.repeats)
                group.shared_memory = True
        if args.sweep:
            shm, ring_min, shm_min = group.shared_memory, group.ring_min_bytes, group.shm_min_bytes
            for kib in SWEEP_KIB:
                array = np.ones(kib * 1024 // 4, dtype=np.float32)
                times = {}
                for algo, ring_threshold, use_shm in (("direct", 1 << 40, False), ("ring", 0, False),
                                                      ("shm", 1 << 40, True)):
                    if use_shm and not shm:
                        continue
                    group.ring_min_bytes, group.shm_min_bytes, group.shared_memory = ring_threshold, 0, use_shm
                    times[algo] = timed_all_reduce(group, array, args.seconds / 4, args.repeats)
                out["sweep"][str(kib)] = times
            group.shared_memory, group.ring_min_bytes, group.shm_min_bytes = shm, ring_min, shm_min
    if group.rank == 0:
        print(json.dumps(out), flush=True)


def run_group(n, args):
    """Runs ``n`` rank processes; returns rank 0's JSON result."""
    endpoints = ",".join(f"127.0.0.1:{p}" for p in free_ports(n))
    procs = []
    for rank in range(n):
        env = dict(os.environ, PADDLE_TRAINER_ENDPOINTS=endpoints, PADDLE_TRAINER_ID=str(rank),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        argv = [sys.executable, __file__, "--rank", "--seconds", str(args.seconds), "--repeats", str(args.repeats),
                "--sizes-mib", *map(str, args.sizes_mib)] + (["--sweep"] if args.sweep else ["--no-sweep"])
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outputs = [p.communicate(timeout=PROCESS_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise SystemExit(f"bench_collective: rank {rank} of {n} failed (exit {p.returncode}):\n{err[-2000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


# ------------------------------------------------------------------ raw ZeroMQ

def raw_receiver(args):
    """Binds a ROUTER, receives --bytes per round in messages, answers "done" per round."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(f"tcp://127.0.0.1:{args.port}")
    while True:
        identity, *frames = router.recv_multipart(copy=False)
        if frames[0].bytes == b"stop":
            break
        got = len(frames[0].buffer)
        while got < args.bytes:
            identity, frame = router.recv_multipart(copy=False)
            got += len(frame.buffer)
        router.send_multipart([identity, b"done"])
    router.close()
    ctx.term()


def raw_bandwidth(nbytes, message_bytes, seconds, repeats):
    """B_raw in GB/s: a DEALER streaming ``nbytes`` per round to a ROUTER in another process."""
    port = free_ports(1)[0]
    receiver = subprocess.Popen([sys.executable, __file__, "--raw-receiver", "--port", str(port),
                                 "--bytes", str(nbytes)])
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.sndhwm = 0
    dealer.connect(f"tcp://127.0.0.1:{port}")
    payload = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32).view(np.uint8)
    pieces = [payload[i:i + message_bytes] for i in range(0, nbytes, message_bytes)]

    def one_round():
        for piece in pieces:
            dealer.send(piece, copy=False)
        if not dealer.poll(PROCESS_TIMEOUT_S * 1000):
            raise SystemExit("bench_collective: the raw ZeroMQ receiver did not answer")
        dealer.recv()

    try:
        one_round()
        start = time.perf_counter()
        one_round()
        rounds = max(3, math.ceil(seconds / max(time.perf_counter() - start, 1e-6)))
        best = 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(rounds):
                one_round()
            best = max(best, nbytes * rounds / (time.perf_counter() - start) / 1e9)
        dealer.send(b"stop")
        receiver.wait(30)
        return best
    finally:
        dealer.close()
        ctx.term()
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def raw_ring_process(args):
    """One process of the raw ZeroMQ ring: streams --bytes per round to its right
    neighbour while it receives as much from its left, like a rank of the all_reduce
    ring; prints its seconds for --rounds rounds, once per repeat."""
    n, rank = len(args.ports), args.rank_index
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.rcvhwm = 0
    router.bind(f"tcp://127.0.0.1:{args.ports[rank]}")
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.sndhwm = 0
    dealer.connect(f"tcp://127.0.0.1:{args.ports[(rank + 1) % n]}")
    payload = np.random.default_rng(rank).random(args.bytes // 4, dtype=np.float32).view(np.uint8)
    pieces = [payload[i:i + args.message_bytes] for i in range(0, args.bytes, args.message_bytes)]

    def receive(nbytes):
        got = 0
        while got < nbytes:
            if not router.poll(PROCESS_TIMEOUT_S * 1000):
                raise SystemExit(f"bench_collective: raw ring process {rank} heard nothing from its left")
            _, frame = router.recv_multipart(copy=False)
            got += len(frame.buffer)

    def sync():  # a token twice round the ring: every process has started this repeat
        for _ in range(2):
            if rank == 0:
                dealer.send(b"go")
                receive(2)
            else:
                receive(2)
                dealer.send(b"go")

    def one_round():
        for piece in pieces:
            dealer.send(piece, copy=False)
        receive(args.bytes)

    try:
        sync()
        one_round()
        times = []
        for _ in range(args.repeats):
            sync()
            start = time.perf_counter()
            for _ in range(args.rounds):
                one_round()
            times.append(time.perf_counter() - start)
        sync()  # nobody leaves while its right neighbour still receives
        print(json.dumps(times), flush=True)
    finally:
        dealer.close()
        router.close()
        ctx.term()


def raw_ring_bandwidth(n, nbytes, message_bytes, rounds, repeats):
    """GB/s each process streams to its right neighbour while every one of ``n``
    processes sends and receives at once (the traffic pattern of the ring), slowest
    process, best of ``repeats``."""
    ports = free_ports(n)
    argv = [sys.executable, __file__, "--raw-ring", "--bytes", str(nbytes), "--message-bytes", str(message_bytes),
            "--rounds", str(rounds), "--repeats", str(repeats), "--ports", *map(str, ports)]
    procs = [subprocess.Popen(argv + ["--rank-index", str(r)], stdout=subprocess.PIPE, text=True) for r in range(n)]
    try:
        outs = [p.communicate(timeout=PROCESS_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"bench_collective: a raw ring process failed (exit codes {[p.returncode for p in procs]})")
    times = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    slowest = [max(t[i] for t in times) for i in range(repeats)]
    return nbytes * rounds / min(slowest) / 1e9


# ------------------------------------------------------------------ MPI

def mpi_main(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    for mib in args.sizes_mib:
        send = np.random.default_rng(comm.rank).random(mib * (1 << 20) // 4, dtype=np.float32)
        recv = np.empty_like(send)
        for _ in range(2):
            comm.Allreduce(send, recv, op=MPI.SUM)
        start = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        one = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        count = max(3, math.ceil(args.seconds / max(one, 1e-6)))
        best = math.inf
        for _ in range(args.repeats):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(count):
                comm.Allreduce(send, recv, op=MPI.SUM)
            best = min(best, comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / count)
        out[str(mib)] = best
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


def run_mpi(n, args):
    """MPI Allreduce seconds per size, or a string saying why it did not run."""
    if importlib.util.find_spec("mpi4py") is None or shutil.which("mpirun") is None:
        return "skipped: mpi4py or mpirun not installed"
    argv = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += [sys.executable, __file__, "--mpi", "--seconds", str(args.seconds), "--repeats", str(args.repeats),
             "--sizes-mib", *map(str, args.sizes_mib)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"error: mpirun did not finish within {PROCESS_TIMEOUT_S} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return f"error: mpirun exit {proc.returncode}: {(proc.stderr or proc.stdout)[-500:]}"
    return json.loads(lines[-1])


# ------------------------------------------------------------------ report

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[4, 64])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements per figure; the best is kept")
    p.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the direct-vs-ring latency sweep")
    p.add_argument("--sweep", dest="sweep", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--raw-receiver", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--raw-ring", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ports", type=int, nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--rank-index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--message-bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(args)
    if args.mpi:
        return mpi_main(args)
    if args.raw_receiver:
        return raw_receiver(args)
    if args.raw_ring:
        return raw_ring_process(args)

    sys.path.insert(0, ROOT)
    from fleet.transport import group as group_module

    result = {"benchmark": "collective_all_reduce", "zmq": zmq.zmq_version(), "cpus": os.cpu_count(),
              "chunk_bytes": group_module.CHUNK_BYTES, "ring_min_bytes": group_module.RING_MIN_BYTES,
              "shm_min_bytes": group_module.SHM_MIN_BYTES, "raw_gbps": {}, "raw_ring_gbps": {}, "fleet_gbps": {},
              "shared_memory": {}, "fleet_zmq_gbps": {}, "mpi_gbps": {}, "sweep_us": {}}
    for mib in args.sizes_mib:
        nbytes = mib * (1 << 20)
        result["raw_gbps"][str(mib)] = round(max(
            raw_bandwidth(nbytes, group_module.CHUNK_BYTES, args.seconds, args.repeats),
            raw_bandwidth(nbytes, nbytes, args.seconds, args.repeats)), 3)
    checks = []
    for n in args.ranks:
        ours = run_group(n, argparse.Namespace(**{**vars(args), "sweep": args.sweep}))
        mpi = run_mpi(n, args)
        result["fleet_gbps"][str(n)] = {mib: round(int(mib) * (1 << 20) / s / 1e9, 3)
                                        for mib, s in ours["bandwidth"].items()}
        result["shared_memory"][str(n)] = ours["shared_memory"]
        result["fleet_zmq_gbps"][str(n)] = {mib: round(int(mib) * (1 << 20) / s / 1e9, 3)
                                            for mib, s in ours["zmq_bandwidth"].items()}
        result["mpi_gbps"][str(n)] = mpi if isinstance(mpi, str) else {
            mib: round(int(mib) * (1 << 20) / s / 1e9, 3) for mib, s in mpi.items()}
        if ours["sweep"]:
            sweep = {kib: {algo: round(s * 1e6, 1) for algo, s in t.items()} for kib, t in ours["sweep"].items()}
            result["sweep_us"][str(n)] = sweep
            for algo in ("ring", "shm"):
                faster = [int(kib) for kib, t in sweep.items() if algo in t and t[algo] < t["direct"]]
                result.setdefault(f"{algo}_faster_from_kib", {})[str(n)] = min(faster) if faster else None
        for mib in args.sizes_mib:
            nbytes = mib * (1 << 20)
            raw = result["raw_gbps"][str(mib)]
            rounds = max(3, math.ceil(args.seconds * raw * 1e9 / 2 / nbytes))
            ring_raw = round(max(raw_ring_bandwidth(n, nbytes, message_bytes, rounds, args.repeats)
                                 for message_bytes in (group_module.CHUNK_BYTES, nbytes)), 3)
            result["raw_ring_gbps"].setdefault(str(n), {})[str(mib)] = ring_raw
            value = result["fleet_gbps"][str(n)][str(mib)]
            for name, base in (("raw ZeroMQ one way on an idle pair", raw),
                               (f"raw ZeroMQ ring, {n} processes each sending and receiving at once", ring_raw)):
                bound = base / (2 * (n - 1) / n)
                checks.append({"figure": f"all_reduce of {mib} MiB over {n} processes: GB/s of algorithm "
                                         f"bandwidth / ({name}: {base:.2f} GB/s / (2(N-1)/N))",
                               "goal": f">= {GOAL_FRACTION}", "value": round(value / bound, 3),
                               "met": value / bound >= GOAL_FRACTION})
    result["checks"] = checks
    print(json.dumps(result))


if __name__ == "__main__":
    main()
