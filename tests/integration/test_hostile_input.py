"""Hostile peers next to a real job (2 servers, 2 sync workers, SGD: the result is exact).

- 10,000 random and mutated frames fired at a server's port while the job trains: each
  gets an error reply, the server keeps serving, and the job ends with exactly the
  parameters of an undisturbed run.
- With CURVE keys (FLEET_CURVE_KEYS_DIR) for the job, a client without the keys, or with
  keys the servers do not know, gets no reply at all, and the job's result is unchanged:
  the same as without CURVE.
"""
import os
import random
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq

from fleet.errors import FleetTimeoutError, TransportError
from fleet.transport import Client, CurveConfig, generate_keys, message

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "live_model.py")
STEPS, BATCH = 12, 4
PARAMS = ("emb", "fc_0_w_0", "fc_0_b_0", "fc_1_w_0", "fc_1_b_0")
MAX_BYTES = 4 << 20
FRAMES = 10_000
REFUSED = 100  # of FRAMES: well-formed requests the server must refuse (unknown op, id outside the job)
ROLE_VARIABLES = ("TRAINING_ROLE", "PADDLE_", "POD_IP", "FLEET_CURVE_")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(ROLE_VARIABLES)}
    env.update(FLEET_HEARTBEAT_MS="200", FLEET_HEARTBEAT_TIMEOUT_MS="5000", FLEET_MAX_MESSAGE_BYTES=str(MAX_BYTES))
    env.update(extra)
    return env


def _results(out):
    return [dict(np.load(out / f"worker{i}.npz")) for i in range(2)]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    """The parameters (each worker's view) and server logs of the job run with nobody else about."""
    work = tmp_path_factory.mktemp("undisturbed")
    (work / "out").mkdir()
    cmd = [sys.executable, "-m", "fleet.launch", "--server_num", "2", "--worker_num", "2", "--log_dir",
           str(work / "log"), SCRIPT, "sync", str(work / "out"), str(STEPS), str(BATCH)]
    proc = subprocess.run(cmd, cwd=work, env=_env(), capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [(work / "log" / f"serverlog.{i}").read_text() for i in range(2)]
    return _results(work / "out"), logs


class HeldJob:
    """The job on known ports; its workers wait before the last steps until release()."""

    def __init__(self, tmp_path, start_fleetrun, free_ports, env):
        s0, s1, w0, w1 = free_ports(4)
        self.servers = [f"127.0.0.1:{s0}", f"127.0.0.1:{s1}"]
        self.out, self.log = tmp_path / "out", tmp_path / "log"
        self.out.mkdir()
        self.launcher = start_fleetrun(
            "--servers", ",".join(self.servers), "--workers", f"127.0.0.1:{w0},127.0.0.1:{w1}",
            "--log_dir", self.log, SCRIPT, "sync", self.out, STEPS, BATCH, "--step-sleep", "0.05",
            "--hold", STEPS - 2, env=env)

    def wait_training(self, wait_for):
        wait_for(lambda: all((self.out / f"worker{i}.training").exists() for i in range(2)), 90,
                 "both workers to train a step")

    def release_and_finish(self, procs):
        (self.out / "go").write_text("")
        out, err = procs.communicate(self.launcher, 120)
        assert self.launcher.returncode == 0, err[-3000:]
        return _results(self.out), [(self.log / f"serverlog.{i}").read_text() for i in range(2)]


def _assert_same_parameters(got, expected):
    for worker in range(2):
        for name in PARAMS:
            np.testing.assert_array_equal(got[worker][name], expected[worker][name], err_msg=f"{name}, worker {worker}")


# ------------------------------------------------------------------------------- frames

def _request_frames(rng):
    """A well-formed request a worker of this job could send (ops, names and shapes of it)."""
    op, names, arrays, meta = rng.choice([
        ("sync_push", ["fc_0.w_0"], [np.ones((10, 32), np.float32)], {"pull": ["fc_0.w_0"]}),
        ("push", ["fc_1.b_0"], [np.ones(2, np.float32)], None),
        ("pull_dense", [], [], {"blocks": ["fc_0.b_0"]}),
        ("pull_sparse", ["ids"], [np.arange(5, dtype=np.int64)], {"table": "emb"}),
        ("barrier", [], [], None), ("stop", [], [], None), ("heartbeat", [], [], None),
        ("sync_push", ["emb@ROWS", "emb@VALUES"], [np.array([3, 7]), np.ones((2, 4), np.float32)], {"pull": []}),
    ])
    return [bytes(memoryview(f)) for f in message.encode(op, rng.randrange(1, 1 << 20), rng.randrange(2),
                                                          names, arrays, meta)]


def _mutate(rng):
    """Frames of one hostile message: garbage, damaged or cut headers, lying sizes, ..."""
    frames = _request_frames(rng)
    header = msgpack.unpackb(frames[0], raw=False)
    kind = rng.randrange(11)
    if kind == 0:  # random bytes
        return [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:  # flipped header bytes
        data = bytearray(frames[0])
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return [bytes(data), *frames[1:]]
    if kind == 2:  # truncated header
        return [frames[0][:rng.randrange(len(frames[0]))], *frames[1:]]
    if kind == 3:  # a buffer cut short or grown: its size no longer matches its shape
        if len(frames) == 1:
            return frames + [rng.randbytes(rng.randrange(1, 64))]
        i = rng.randrange(1, len(frames))
        cut = frames[i][:-rng.randrange(1, len(frames[i]) + 1)] if rng.random() < 0.5 else frames[i] + b"\0" * 4
        return frames[:i] + [cut] + frames[i + 1:]
    if kind == 4:  # a frame missing or extra
        return frames[:-1] if len(frames) > 1 else frames + [b"\0" * 8]
    if kind == 5:  # another protocol version
        header["v"] = rng.choice([0, 2, 99, -1, "1", None, 1.5])
    elif kind == 6:  # a field of the wrong type
        header[rng.choice(["op", "seq", "worker", "names", "dtypes", "shapes"])] = rng.choice(
            [None, "x", 2**64 - 1, [], [[1]], {"a": 1}, 3.5, b"\0", True])
    elif kind == 7:  # a field missing
        del header[rng.choice(["v", "op", "seq", "worker", "names", "dtypes", "shapes"])]
    elif kind == 8:  # shapes that lie or overflow
        header["shapes"] = [[2**40, 2**40]] * len(header["names"]) if header["names"] else [[1]]
    elif kind == 9:  # a dtype nobody speaks
        header["dtypes"] = ["complex128"] * len(header["names"]) if header["names"] else ["bool"]
    else:  # not a map
        return [msgpack.packb(rng.choice([[1, 2], 5, "text", None, b"raw"])), *frames[1:]]
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def _oversized(rng):
    """Well-formed but larger than FLEET_MAX_MESSAGE_BYTES (each frame under ZeroMQ's cut-off)."""
    arrays = [np.zeros(MAX_BYTES // 8 * 3, np.uint8) for _ in range(3)]
    return [bytes(memoryview(f)) for f in message.encode("push", 1, 0, ["a", "b", "c"], arrays)]


def _refused(rng):
    """Well-formed, harmless requests the server must refuse: unknown ops, ids outside the job."""
    op, worker = rng.choice([("frobnicate", 0), ("push", 7), ("stop", -3), ("sync_push", 2), ("barrier", 99)])
    return [bytes(memoryview(f)) for f in message.encode(op, 1, worker, ["fc_1.b_0"], [np.ones(2, np.float32)])]


def hostile_messages(seed):
    """FRAMES messages: REFUSED well-formed refused ones, 20 oversized, the rest malformed.
    Each malformed one is checked here to be rejected by the wire format (so none can
    be a valid request by chance)."""
    rng = random.Random(seed)
    out = [_refused(rng) for _ in range(REFUSED)] + [_oversized(rng) for _ in range(20)]
    while len(out) < FRAMES:
        frames = _mutate(rng)
        try:
            message.decode(frames, max_bytes=MAX_BYTES)
        except TransportError:
            out.append(frames)
    rng.shuffle(out)
    return out


def _fire(endpoint, messages, curve=None):
    """Sends every message from one DEALER, 100 at a time, and returns the replies (decoded)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if curve is not None:
        curve.apply_client(sock)
    sock.connect(f"tcp://{endpoint}")
    replies = []
    try:
        for start in range(0, len(messages), 100):
            for frames in messages[start:start + 100]:
                sock.send_multipart(frames)
            deadline = time.monotonic() + 30
            while len(replies) < min(start + 100, len(messages)):
                assert time.monotonic() < deadline, f"{len(replies)} replies to {start + 100} messages after 30 s"
                if sock.poll(100):
                    replies.append(message.decode(sock.recv_multipart(), reply=True))
    finally:
        sock.close(linger=0)
    return replies


# ------------------------------------------------------------------------------- tests

def test_ten_thousand_hostile_frames_at_a_server_leave_it_serving_and_the_job_result_exact(
        tmp_path, start_fleetrun, procs, free_ports, wait_for, undisturbed):
    messages = hostile_messages(seed=2024)
    job = HeldJob(tmp_path, start_fleetrun, free_ports, _env())
    job.wait_training(wait_for)
    replies = _fire(job.servers[0], messages)
    assert len(replies) == FRAMES and not any(r.header["ok"] for r in replies)
    errors = [r.header["error"] for r in replies]
    assert sum(e.startswith("malformed message: ") for e in errors) == FRAMES - REFUSED
    assert sum("is not a worker of this job" in e or "unknown op 'frobnicate'" in e for e in errors) == REFUSED
    assert sum("over the limit of 4194304 (FLEET_MAX_MESSAGE_BYTES)" in e for e in errors) == 20
    with Client(job.servers[0], 0, timeout_ms=5000) as client:  # still up and answering
        assert client.ping()
    got, logs = job.release_and_finish(procs)
    expected, undisturbed_logs = undisturbed
    _assert_same_parameters(got, expected)
    assert (f"answered {FRAMES - REFUSED} malformed messages and {REFUSED} failed requests with errors"
            in logs[0]), logs[0][-2000:]
    assert "malformed" not in logs[1] and "malformed" not in undisturbed_logs[0]


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")
def test_with_curve_a_client_without_the_keys_gets_no_answer_and_the_job_result_is_unchanged(
        tmp_path, start_fleetrun, procs, free_ports, wait_for, undisturbed):
    keys_dir = str(tmp_path / "keys")
    keys = generate_keys(keys_dir)
    stranger = generate_keys(str(tmp_path / "stranger"))
    impostor = CurveConfig(keys.server_public, client_public=stranger.client_public,
                           client_secret=stranger.client_secret)
    job = HeldJob(tmp_path, start_fleetrun, free_ports, _env(FLEET_CURVE_KEYS_DIR=keys_dir))
    job.wait_training(wait_for)
    # what a worker would send, and what would wreck a sync job: a stop for worker 0, a step
    attack = [[bytes(memoryview(f)) for f in message.encode(op, 1, 0, names, arrays)] for op, names, arrays in (
        ("ping", [], []), ("stop", [], []), ("push", ["fc_1.b_0"], [np.full(2, 1e6, np.float32)]),
        ("sync_push", ["fc_1.b_0"], [np.full(2, 1e6, np.float32)]))]
    attackers = [(endpoint, curve) for endpoint in job.servers for curve in (None, impostor)]
    assert _count_replies(attackers, attack, seconds=0.5) == {a: 0 for a in attackers}
    with Client(job.servers[0], 0, timeout_ms=300) as client, pytest.raises(FleetTimeoutError) as error:
        client.request("pull_dense", meta={"blocks": ["fc_1.b_0"]})
    assert "If the servers use CURVE authentication" in str(error.value)
    got, logs = job.release_and_finish(procs)
    expected, _ = undisturbed
    _assert_same_parameters(got, expected)  # CURVE on: the very result of CURVE off
    assert all("malformed" not in log and "failed requests" not in log for log in logs)


def _count_replies(attackers, messages, seconds):
    """Sends messages from a fresh DEALER per (endpoint, CURVE keys or None) at once; returns
    {attacker: replies received within ``seconds``}."""
    socks = {}
    try:
        for endpoint, curve in attackers:
            sock = socks[(endpoint, curve)] = zmq.Context.instance().socket(zmq.DEALER)
            sock.linger = 0
            if curve is not None:
                curve.apply_client(sock)
            sock.connect(f"tcp://{endpoint}")
            for frames in messages:
                sock.send_multipart(frames)
        replies = dict.fromkeys(socks, 0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for attacker, sock in socks.items():
                while sock.poll(0):
                    sock.recv_multipart()
                    replies[attacker] += 1
            time.sleep(0.01)
        return replies
    finally:
        for sock in socks.values():
            sock.close(linger=0)
