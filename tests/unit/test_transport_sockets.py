"""ServerSocket and Client on 127.0.0.1: round trips, errors, timeouts, deferral, pipelining."""
import contextlib
import threading
import time

import numpy as np
import pytest

from fleet.errors import ConfigError, FleetTimeoutError, ServerError, TransportError
from fleet.transport import Client, ServerSocket, request_all, serving as serve_with, wait_for_servers


def echo_handler(request):
    """Answers "echo" with the request's arrays, "fail" with an exception, "slow" late."""
    if request.op == "echo":
        request.reply(request.names, request.arrays, meta=request.meta)
    elif request.op == "fail":
        raise KeyError("no table 'emb'")
    elif request.op == "slow":
        request.defer()
        threading.Timer(request.meta["delay"], request.reply, kwargs={"meta": {"late": True}}).start()
    elif request.op == "forget":
        pass
    else:
        raise ValueError(f"unknown op {request.op!r}")


@contextlib.contextmanager
def serving(handler=echo_handler, endpoint="127.0.0.1:0", **kw):
    server = ServerSocket(endpoint, **kw)
    with serve_with(server, handler, poll_ms=20):
        yield server


@contextlib.contextmanager
def client_of(endpoint, worker=0, **kw):
    client = Client(endpoint, worker, timeout_ms=kw.pop("timeout_ms", 5000), **kw)
    try:
        yield client
    finally:
        client.close()


def test_arrays_of_every_dtype_round_trip_through_a_server():
    arrays = {
        "f32": np.random.default_rng(0).random((100, 10)).astype(np.float32),
        "i64": np.array([-(2**63), -1, 0, 2**63 - 1], dtype=np.int64),
        "u8": np.arange(256, dtype=np.uint8),
        "f64": np.array(3.25),
        "i32": np.zeros((0, 7), dtype=np.int32),
        "big": np.arange(1 << 20, dtype=np.float32),
    }
    with serving() as server, client_of(server.endpoint, worker=4) as client:
        reply = client.request("echo", list(arrays), list(arrays.values()), meta={"step": 3})
        assert reply.meta == {"step": 3} and reply.worker == 4
        for name, arr in arrays.items():
            assert reply[name].dtype == arr.dtype and reply[name].shape == arr.shape
            np.testing.assert_array_equal(reply[name], arr)


def test_a_handler_error_reaches_the_worker_as_server_error_and_the_server_keeps_serving():
    with serving() as server, client_of(server.endpoint) as client:
        with pytest.raises(ServerError) as info:
            client.request("fail")
        assert info.value.endpoint == server.endpoint
        assert info.value.message == "KeyError: \"no table 'emb'\""
        assert str(info.value) == f"server {server.endpoint} failed: KeyError: \"no table 'emb'\""
        assert client.request("echo", ["x"], [np.ones(2)])["x"].tolist() == [1.0, 1.0]
        assert server.stats()["handler_errors"] == 1


def test_a_handler_that_does_not_answer_is_reported_as_a_server_bug():
    with serving() as server, client_of(server.endpoint) as client:
        with pytest.raises(ServerError, match="returned without answering 'forget' \\(a server bug\\)"):
            client.request("forget")


def test_a_timeout_names_the_endpoint_the_op_the_limit_and_the_variable():
    with serving() as server, client_of(server.endpoint, worker=2) as client:
        start = time.monotonic()
        with pytest.raises(FleetTimeoutError) as info:
            client.request("slow", meta={"delay": 0.5}, timeout_ms=100)
        assert time.monotonic() - start < 2
        text = str(info.value)
        assert f"server {server.endpoint} did not answer 'slow' (request 1 of worker 2) within 100 ms" in text
        assert "FLEET_RPC_TIMEOUT_MS" in text and "CURVE" in text
        assert client.request("echo", ["a"], [np.arange(3)])["a"].tolist() == [0, 1, 2]


def test_a_late_reply_to_a_timed_out_request_is_discarded():
    with serving() as server, client_of(server.endpoint) as client:
        slow = client.send_request("slow", meta={"delay": 0.3})
        fast = client.send_request("echo", ["a"], [np.array([1.0])])
        with pytest.raises(FleetTimeoutError):
            client.recv_reply(slow, timeout_ms=50)
        assert client.recv_reply(fast)["a"].tolist() == [1.0]
        deadline = time.monotonic() + 5
        while client.stale_replies == 0 and time.monotonic() < deadline:
            assert client.request("echo", ["b"], [np.array([2.0])])["b"].tolist() == [2.0]
            time.sleep(0.05)
        assert client.stale_replies == 1


def test_pipelined_requests_are_matched_to_their_replies_in_any_order():
    with serving() as server, client_of(server.endpoint) as client:
        slow = client.send_request("slow", meta={"delay": 0.1})
        seqs = [client.send_request("echo", ["i"], [np.array([i])]) for i in range(5)]
        for i, seq in reversed(list(enumerate(seqs))):
            assert client.recv_reply(seq)["i"].tolist() == [i]
        assert client.recv_reply(slow).meta == {"late": True}
        with pytest.raises(TransportError, match="no request 1 is pending"):
            client.recv_reply(slow)


def test_deferred_replies_from_another_thread_release_a_barrier():
    waiting, lock = [], threading.Lock()

    def barrier_handler(request):
        request.defer()
        with lock:
            waiting.append(request)
            if len(waiting) == 3:
                released = list(waiting)
                threading.Thread(target=lambda: [r.reply(meta={"n": len(released)}) for r in released]).start()

    results = []
    with serving(barrier_handler) as server:
        def worker(i):
            with client_of(server.endpoint, worker=i) as client:
                results.append(client.request("barrier").meta["n"])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert results == [3, 3, 3]
        assert server.stats()["deferred"] == 3


def test_a_request_can_be_answered_only_once():
    caught = []

    def twice(request):
        request.reply()
        try:
            request.reply()
        except TransportError as e:
            caught.append(str(e))

    with serving(twice) as server, client_of(server.endpoint, worker=1) as client:
        client.request("x")
    assert caught == ["request 1 ('x' from worker 1) was already answered"]


def test_one_client_shared_by_threads_keeps_each_reply_with_its_request():
    with serving() as server, client_of(server.endpoint) as client:
        errors = []

        def use(i):
            for j in range(30):
                arr = np.full(10, i * 1000 + j, dtype=np.int64)
                if not np.array_equal(client.request("echo", ["a"], [arr])["a"], arr):
                    errors.append((i, j))

        threads = [threading.Thread(target=use, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert errors == []


def test_binding_a_port_in_use_names_the_port_and_never_binds_another():
    with serving() as server:
        with pytest.raises(TransportError, match=f"cannot bind 127.0.0.1:{server.port}: port {server.port} is "
                                                 f"already in use. Stop the process holding it"):
            ServerSocket(server.endpoint)


def test_binding_an_address_of_another_machine_says_so():
    with pytest.raises(TransportError, match="'10.255.255.1' is not an address of this machine"):
        ServerSocket("10.255.255.1:0")


def test_fleet_bind_host_binds_every_interface_and_keeps_the_advertised_name(monkeypatch, free_port):
    # As in Kubernetes: a server known by a DNS name binds 0.0.0.0 (FLEET_BIND_HOST).
    port = free_port()
    monkeypatch.setenv("FLEET_BIND_HOST", "0.0.0.0")
    with serving(endpoint=f"localhost:{port}") as server:
        assert server.endpoint == f"localhost:{port}" and server.host == "localhost"
        assert server._sock.last_endpoint.decode() == f"tcp://0.0.0.0:{port}"
        for endpoint in (f"localhost:{port}", f"127.0.0.1:{port}"):
            with client_of(endpoint) as client:
                reply = client.request("echo", meta={"via": endpoint})
                assert reply.meta == {"via": endpoint}


def test_a_name_zeromq_cannot_bind_needs_fleet_bind_host(monkeypatch, free_port):
    port = free_port()
    monkeypatch.delenv("FLEET_BIND_HOST", raising=False)
    with pytest.raises(TransportError, match=f"cannot bind ctr-server-0.ctr-svc:{port}: 'ctr-server-0.ctr-svc' is "
                                             "not an address of this machine .*or FLEET_BIND_HOST=0.0.0.0 to "
                                             "bind every interface while advertising the endpoint"):
        ServerSocket(f"ctr-server-0.ctr-svc:{port}")
    monkeypatch.setenv("FLEET_BIND_HOST", "0.0.0.0")
    with ServerSocket(f"ctr-server-0.ctr-svc:{port}") as server:
        assert server.endpoint == f"ctr-server-0.ctr-svc:{port}"


@pytest.mark.parametrize("value", ["all", "localhost", "0.0.0.0:6170"])
def test_a_bad_fleet_bind_host_is_a_config_error(monkeypatch, value):
    monkeypatch.setenv("FLEET_BIND_HOST", value)
    with pytest.raises(ConfigError) as info:
        ServerSocket("127.0.0.1:0")
    assert str(info.value) == (
        f"FLEET_BIND_HOST={value!r} is not an IP address; set it to 0.0.0.0 (every IPv4 interface), :: or an "
        "address of this host, or unset it to bind the endpoint's own host")


@pytest.mark.parametrize("endpoint", ["127.0.0.1", "127.0.0.1:http", ":80", "127.0.0.1:70000"])
def test_a_malformed_endpoint_is_a_config_error(endpoint):
    with pytest.raises(ConfigError, match="is not host:port"):
        ServerSocket(endpoint)


def test_a_request_over_the_size_limit_is_refused_before_sending():
    with serving() as server, client_of(server.endpoint, max_message_bytes=1000) as client:
        with pytest.raises(TransportError, match="over the limit of 1000; .* FLEET_MAX_MESSAGE_BYTES"):
            client.request("echo", ["a"], [np.zeros(1000, np.float32)])


def test_a_server_answers_an_oversized_request_with_an_error():
    with serving(max_message_bytes=4096) as server, client_of(server.endpoint) as client:
        parts = [np.zeros(800, np.float32) for _ in range(3)]
        with pytest.raises(ServerError, match="malformed message: message of 9[0-9]+ bytes is over the limit of 4096"):
            client.request("echo", ["a", "b", "c"], parts)
        assert server.stats()["malformed"] == 1
        assert client.request("echo", ["a"], [parts[0]])["a"].shape == (800,)


def test_request_all_gathers_replies_from_several_servers():
    with serving() as one, serving() as two, client_of(one.endpoint) as c1, client_of(two.endpoint) as c2:
        replies = request_all([(c1, "echo", ["a"], [np.array([1])]), (c2, "echo", ["a"], [np.array([2])], None)])
        assert [r["a"].tolist() for r in replies] == [[1], [2]]


def test_request_all_names_every_server_that_did_not_answer(free_port):
    dead = f"127.0.0.1:{free_port()}"
    with serving() as alive, client_of(alive.endpoint) as c1, client_of(dead) as c2:
        with pytest.raises(FleetTimeoutError, match=f"servers {dead} \\('echo'\\) did not answer"):
            request_all([(c1, "echo"), (c2, "echo")], timeout_ms=200)
        assert c1.request("echo").op == "echo"


def test_request_all_raises_a_server_error_after_collecting_every_reply():
    with serving() as one, serving() as two, client_of(one.endpoint) as c1, client_of(two.endpoint) as c2:
        with pytest.raises(ServerError, match="no table 'emb'"):
            request_all([(c1, "fail"), (c2, "echo")])
        assert c2.request("echo", ["z"], [np.array([5])])["z"].tolist() == [5]


def test_wait_for_servers_returns_once_a_late_server_comes_up(free_port):
    port = free_port()
    started = []

    def start_later():
        time.sleep(0.3)
        started.append(serving(endpoint=f"127.0.0.1:{port}"))
        started[0].__enter__()

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        wait_for_servers([f"127.0.0.1:{port}"], timeout_ms=5000, retry_ms=100)
    finally:
        thread.join(timeout=5)
        if started:
            started[0].__exit__(None, None, None)


def test_wait_for_servers_names_the_servers_that_never_answered(free_port):
    dead = f"127.0.0.1:{free_port()}"
    with serving() as alive:
        start = time.monotonic()
        with pytest.raises(FleetTimeoutError, match=rf"servers \['{dead}'\] did not answer within 300 ms \(the others "
                                                    rf"did\).*FLEET_CONNECT_TIMEOUT_MS"):
            wait_for_servers([alive.endpoint, dead], timeout_ms=300, retry_ms=100)
        assert time.monotonic() - start < 3


def test_a_worker_waiting_for_a_late_server_keeps_pinging_the_servers_that_answered(free_port):
    # A server counts pings as heartbeats: one that answered must go on hearing from the
    # worker while it waits for the others, or it would declare the worker lost.
    dead = f"127.0.0.1:{free_port()}"
    with serving() as alive:
        with pytest.raises(FleetTimeoutError):
            wait_for_servers([alive.endpoint, dead], timeout_ms=1000, retry_ms=100)
        assert alive.stats()["pings"] >= 5


def test_ping_and_stats():
    with serving() as server, client_of(server.endpoint) as client:
        assert client.ping()
        client.request("echo")
        stats = server.stats()
        assert stats["pings"] == 1 and stats["received"] == 2 and stats["replies"] == 2


def test_a_closed_client_refuses_requests_and_close_is_idempotent():
    with serving() as server:
        client = Client(server.endpoint, 0)
        client.close()
        client.close()
        with pytest.raises(TransportError, match=f"the client of {server.endpoint} is closed"):
            client.request("echo")


def test_a_closed_server_refuses_to_serve():
    server = ServerSocket("127.0.0.1:0")
    server.close()
    with pytest.raises(TransportError, match="is closed"):
        server.serve_once(echo_handler, 0)


def test_a_peer_failing_requests_in_a_loop_gets_every_error_but_the_log_one_line_a_second(caplog):
    with serving() as server, client_of(server.endpoint) as client:
        with caplog.at_level("WARNING", logger="fleet.transport"):
            for _ in range(50):
                with pytest.raises(ServerError, match="no table 'emb'"):
                    client.request("fail")
        assert server.stats()["handler_errors"] == 50
    warnings = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert 1 <= len(warnings) <= 3  # one per second of the loop
    assert warnings[0] == "handler for 'fail' (request 1 from worker 0) failed: KeyError: \"no table 'emb'\""
