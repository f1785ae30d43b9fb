"""Dense push+pull bandwidth of fleet.transport next to raw ZeroMQ, on loopback.

Prints one JSON line. For each payload size, a push (payload to the server, short
answer) followed by a pull (short request, payload back) moves the payload twice; GB/s =
2 * payload * rounds / seconds. The baseline is the same exchange on a bare DEALER/ROUTER
pair with copy=False, in the same process and run; the goal is ours / raw >= 0.7.

    python benchmarks/bench_transport.py [--seconds 1.5] [--sizes-mib 4 64]
"""
import argparse
import json
import threading
import time

import numpy as np
import zmq

from fleet.transport import Client, ServerSocket, serving


def _raw_server(sock, payload, stop):
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while not stop.is_set():
        if not poller.poll(50):
            continue
        identity, head, *rest = sock.recv_multipart(copy=False)
        if head.bytes == b"pull":
            sock.send_multipart([identity, b"ok", payload], copy=False)
        else:
            sock.send_multipart([identity, b"ok"], copy=False)


def bench_raw(payload, seconds):
    """Returns GB/s of push+pull on bare sockets."""
    ctx = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.linger = dealer.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    stop = threading.Event()
    thread = threading.Thread(target=_raw_server, args=(router, payload, stop), daemon=True)
    thread.start()
    try:
        def round_trip():
            dealer.send_multipart([b"push", payload], copy=False)
            dealer.recv_multipart(copy=False)
            dealer.send_multipart([b"pull"], copy=False)
            frames = dealer.recv_multipart(copy=False)
            np.frombuffer(frames[1].buffer, dtype=np.float32)

        return _rate(round_trip, payload.nbytes, seconds)
    finally:
        stop.set()
        thread.join(5)
        router.close(0)
        dealer.close(0)


def bench_fleet(payload, seconds):
    """Returns GB/s of push+pull through Client / ServerSocket."""
    server = ServerSocket("127.0.0.1:0")

    def handler(request):
        if request.op == "pull":
            request.reply(["block"], [payload])
        else:
            request.reply()

    with serving(server, handler), Client(server.endpoint, 0, timeout_ms=60_000) as client:
        def round_trip():
            client.request("push", ["block"], [payload])
            client.request("pull")["block"]

        return _rate(round_trip, payload.nbytes, seconds)


def _rate(round_trip, nbytes, seconds):
    round_trip()  # connect and warm up
    rounds, start = 0, time.perf_counter()
    while True:
        round_trip()
        rounds += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and rounds >= 3:
            return 2 * nbytes * rounds / elapsed / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="time per measurement")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--repeats", type=int, default=3, help="alternating measurements; the best is kept")
    args = parser.parse_args()
    result = {"benchmark": "transport_push_pull_loopback", "zmq": zmq.zmq_version(), "pyzmq": zmq.__version__}
    for mib in args.sizes_mib:
        payload = np.random.default_rng(0).random(mib * (1 << 20) // 4, dtype=np.float32)
        raw, ours = 0.0, 0.0
        for _ in range(args.repeats):  # alternate, so both see the same machine load
            raw = max(raw, bench_raw(payload, args.seconds))
            ours = max(ours, bench_fleet(payload, args.seconds))
        result[f"raw_zmq_gbps_{mib}mib"] = round(raw, 3)
        result[f"fleet_gbps_{mib}mib"] = round(ours, 3)
        result[f"ratio_{mib}mib"] = round(ours / raw, 3)
    result["goal_ratio"] = 0.7
    print(json.dumps(result))


if __name__ == "__main__":
    main()
