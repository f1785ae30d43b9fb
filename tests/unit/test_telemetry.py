"""Job telemetry (fleet.telemetry): the counters after known operations of a real worker
communicator and parameter server on loopback, their Prometheus exposition read back with
prometheus_client's parser, the metrics HTTP endpoint, and fleetrun's live summary line."""
import contextlib
import socket
import threading
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fleet.framework as fw
from fleet import layers, optimizer, telemetry
from fleet.communicator import make_communicator
from fleet.errors import ConfigError, TransportError
from fleet.framework.tensor import SparseRows
from fleet.launch.summary import summary_line
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan
from fleet.transport import Client, ServerSocket, message, serving
from fleet.transport.counters import WireCounters, frames_bytes
from fake_cluster import startup_values
from strategies import DistributedStrategyFactory

FLAGS = {"communicator_send_queue_size": 1, "communicator_max_merge_var_num": 1, "put_timeout_s": 30}


def _model(mode, endpoint):
    """A table "t" (rows of width 3; distributed, is_sparse in GEO) and a dense fc weight "w" [7, 2]."""
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        e = layers.sequence_pool(layers.embedding(ids, size=[1000, 3], is_distributed=mode != "geo",
                                                   is_sparse=mode == "geo", param_attr="t"), "sum")
        out = layers.fc(layers.concat([e, x], axis=1), 2, param_attr="w", bias_attr=False)
        optimizer.SGD(0.1).minimize(layers.mean(out))
    strategy = {"async": DistributedStrategyFactory.create_async_strategy,
                "geo": lambda: DistributedStrategyFactory.create_geo_strategy(4)}[mode]()
    return build_plan(main, strategy, [endpoint], 1), startup


class _Runtime:
    """What ProcessTelemetry reads of a worker or server runtime."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


@contextlib.contextmanager
def _job(mode="async", handler=None):
    """A ParameterServer served on loopback and a worker communicator with counted clients.
    Yields (comm, plan, server telemetry, worker telemetry, ps)."""
    with contextlib.ExitStack() as stack:
        sock = ServerSocket("127.0.0.1:0")
        plan, startup = _model(mode, sock.endpoint)
        ps = ParameterServer(sock.endpoint, plan, startup_values(startup))
        stack.enter_context(serving(sock, handler(ps) if handler else ps.handle, poll_ms=10, threaded=True))
        wire = WireCounters()
        scope = fw.Scope()
        comm = make_communicator(mode, plan, 0, scope, FLAGS,
                                 connect=lambda ep: Client(ep, 0, timeout_ms=10000, counters=wire),
                                 update_frequency=4)
        comm.start()
        stack.callback(comm.stop)
        server_t = telemetry.ProcessTelemetry()
        server_t.describe("server", 0, sock.endpoint)
        server_t.attach_server(_Runtime(server=ps, sock=sock))
        worker_t = telemetry.ProcessTelemetry(scope=scope, wire=wire)
        worker_t.describe("worker", 0, "127.0.0.1:7")
        worker_t.attach_worker(_Runtime(comm=comm, started=False))
        yield comm, plan, server_t, worker_t, ps


def _step(plan, ids):
    return {plan.params["w"].grad: np.ones((7, 2), np.float32),
            plan.params["t"].grad: SparseRows(np.array(ids, np.int64), np.ones((len(ids), 3), np.float32), 2 ** 40)}


def _wait(predicate, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.01)


def test_worker_and_server_count_the_same_requests_and_bytes_after_known_operations():
    with _job() as (comm, plan, server_t, worker_t, ps):
        comm.pull_dense()
        comm.prefetch("t", np.array([5, 1, 5, 9, 2], np.int64))  # creates rows 1, 2, 5, 9
        for _ in range(3):
            comm.send(_step(plan, [1, 9]))
        comm.flush()
        comm.scope.record_training(40)
        comm.scope.record_training(24)
        w = worker_t.snapshot()["worker"]
        s = server_t.snapshot()["server"]
    assert (w["examples"], w["steps"], w["pushes"]) == (64, 2, 3)
    assert w["requests"]["push"] == 3 and w["requests"]["pull_sparse"] == 1
    assert w["pulls"] == w["requests"]["pull_dense"] + 1 >= 3  # init, after the rounds, the flush
    assert w["staleness_steps"] == 0 and w["send_queue_depth"] == {plan.params["t"].grad: 0,
                                                                   plan.params["w"].grad: 0}
    assert w["send_queue_capacity"] == 1 and w["mode"] == "async"
    # what the worker counted leaving is what the server counted arriving, op by op
    assert {op: n for op, n in s["requests"].items() if op not in ("heartbeat", "ping")} == w["requests"]
    assert s["received_bytes"] == w["sent_bytes"] > 3 * 7 * 2 * 4
    assert s["sent_bytes"] == w["received_bytes"] > 7 * 2 * 4
    assert s["tables"]["t"]["rows"] == 4 and s["tables"]["t"]["elements"] == 12
    assert s["tables"]["t"]["kind"] == "distributed" and s["tables"]["t"]["bytes"] >= 4 * 3 * 4
    assert s["tables"]["w"] == {"kind": "dense", "rows": 7, "elements": 14, "bytes": 14 * 4}
    assert s["parked"] == {"sync": 0, "barrier": 0, "exchange": 0}
    assert (s["workers"], s["workers_lost"], s["workers_stopped"]) == (1, 0, 0)
    assert list(s["heartbeat_age_seconds"]) == [0] and s["heartbeat_age_seconds"][0] >= 0


def test_wire_bytes_are_the_frame_lengths_of_each_message():
    def echo(request):
        request.reply(["x"], [request.arrays[0] * 2])

    wire = WireCounters()
    x = np.arange(1000, dtype=np.float32)
    with serving(ServerSocket("127.0.0.1:0"), echo) as server, \
            Client(server.endpoint, 3, counters=wire) as client:
        client.request("echo", ["x"], [x])
        stats = server.stats()
    request_bytes = frames_bytes(message.encode("echo", 1, 3, ["x"], [x]))
    reply_bytes = frames_bytes(message.encode("echo", 1, 3, ["x"], [x * 2], ok=True))
    assert wire.snapshot() == {"echo": {"requests": 1, "sent_bytes": request_bytes, "replies": 1,
                                        "received_bytes": reply_bytes}}
    assert request_bytes == 4000 + len(message.encode("echo", 1, 3, ["x"], [x])[0])
    assert (stats["received_bytes"], stats["sent_bytes"]) == (request_bytes, reply_bytes)


def test_async_staleness_is_the_steps_handed_over_and_not_yet_sent():
    parked, release = [], threading.Event()

    def park_pushes(ps):
        def handle(request):
            if request.op == "push" and not release.is_set():
                request.defer()
                parked.append(request)
                return
            ps.handle(request)
        return handle

    with _job(handler=park_pushes) as (comm, plan, server_t, worker_t, ps):
        comm.send(_step(plan, [3]))  # popped by the send thread, its push parked
        _wait(lambda: parked, "the first push reaches the server")
        assert worker_t.snapshot()["worker"]["staleness_steps"] == 1
        other = threading.Thread(target=comm.send, args=(_step(plan, [4]),))
        other.start()  # another training thread: its step waits in the queues
        _wait(lambda: worker_t.snapshot()["worker"]["staleness_steps"] == 2, "the second step is counted")
        other.join(10)
        w = worker_t.snapshot()["worker"]
        assert w["send_queue_depth"] == {plan.params["t"].grad: 1, plan.params["w"].grad: 1}
        release.set()
        for request in parked:
            ps.handle(request)
        _wait(lambda: worker_t.snapshot()["worker"]["staleness_steps"] == 0, "both steps are sent")
        assert server_t.snapshot()["server"]["requests"]["push"] == 2


def test_geo_staleness_is_the_local_steps_since_the_last_exchange():
    with _job("geo") as (comm, plan, server_t, worker_t, ps):
        comm.scope["w"] = np.zeros((7, 2), np.float32)
        comm.scope["t"] = np.zeros((1000, 3), np.float32)
        comm.snapshot()
        seen = []
        for _ in range(4):  # exchanges after 1, then 2 more steps (intervals 1, 2, 4)
            comm.geo_step({})
            seen.append(worker_t.snapshot()["worker"]["staleness_steps"])
        assert seen == [0, 1, 0, 1]
        # the second exchange runs in the background: counted once the servers answered it
        _wait(lambda: worker_t.snapshot()["worker"]["pushes"] == 2, "the second exchange is answered")
        assert server_t.snapshot()["server"]["requests"]["geo_push"] == 2


def test_rates_are_over_the_last_window_of_snapshots():
    rates = telemetry._Rates(window=10, start=100.0)
    assert rates.rates({"a": 50}, now=105.0) == {"a": 10.0}
    assert rates.rates({"a": 150}, now=112.0) == {"a": 12.5}  # since 100: no sample is 10 s old yet
    assert rates.rates({"a": 250}, now=120.0) == {"a": 200 / 15}  # since the sample at 105


def _families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families, family, sample, **labels):
    values = [s.value for s in families[family].samples
              if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(values) == 1, (family, sample, labels, families[family].samples)
    return values[0]


def test_the_exposition_has_prometheus_names_labels_and_the_snapshot_values():
    with _job() as (comm, plan, server_t, worker_t, ps):
        comm.prefetch("t", np.array([5, 1], np.int64))
        comm.send(_step(plan, [1]))
        comm.flush()
        comm.scope.record_training(32)
        worker_text = telemetry.exposition(worker_t)
        server_text = telemetry.exposition(server_t)
        s = server_t.snapshot()["server"]
    w = _families(worker_text)
    me = {"role": "worker", "index": "0", "endpoint": "127.0.0.1:7"}
    assert w["fleet_worker_examples"].type == "counter"
    assert _value(w, "fleet_worker_examples", "fleet_worker_examples_total", **me) == 32
    assert _value(w, "fleet_worker_steps", "fleet_worker_steps_total", **me) == 1
    assert _value(w, "fleet_worker_pushes", "fleet_worker_pushes_total", **me) == 1
    assert _value(w, "fleet_worker_requests", "fleet_worker_requests_total", op="pull_sparse", **me) == 1
    assert _value(w, "fleet_worker_staleness_steps", "fleet_worker_staleness_steps", **me) == 0
    assert _value(w, "fleet_worker_send_queue_depth", "fleet_worker_send_queue_depth", queue="w@GRAD") == 0
    assert _value(w, "fleet_worker_examples_per_second", "fleet_worker_examples_per_second", **me) > 0
    assert _value(w, "fleet_worker_sent_bytes", "fleet_worker_sent_bytes_total") > 0
    srv = _families(server_text)
    me = {"role": "server", "index": "0", "endpoint": ps.endpoint}
    assert _value(srv, "fleet_server_requests", "fleet_server_requests_total", op="push", **me) == 1
    assert _value(srv, "fleet_server_table_rows", "fleet_server_table_rows", table="t", kind="distributed") == 2
    assert _value(srv, "fleet_server_table_memory_bytes", "fleet_server_table_memory_bytes",
                  table="w", kind="dense") == 56
    assert _value(srv, "fleet_server_received_bytes", "fleet_server_received_bytes_total") == s["received_bytes"]
    assert _value(srv, "fleet_server_parked_requests", "fleet_server_parked_requests", wait="sync") == 0
    assert _value(srv, "fleet_server_workers_lost", "fleet_server_workers_lost") == 0
    assert "fleet_worker_examples" not in srv


def _taken_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_the_metrics_endpoint_serves_the_exposition_and_a_taken_port_is_named():
    t = telemetry.ProcessTelemetry(scope=fw.Scope(), wire=WireCounters())
    t.describe("worker", 3, "127.0.0.1:9")
    t.scope.record_training(5)
    holder = _taken_port()
    port = holder.getsockname()[1]
    with holder:
        with pytest.raises(TransportError, match=rf"cannot serve metrics on 127.0.0.1:{port} \(FLEET_METRICS_PORT="
                                                 rf"{port}\): port {port} is already in use.*--metrics_port"):
            telemetry.MetricsServer(port, "127.0.0.1", t)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    server = telemetry.MetricsServer(port, "127.0.0.1", t)
    try:
        metrics = telemetry.parse_metrics(telemetry.scrape(server.url, 5))
    finally:
        server.close()
    assert metrics["fleet_worker_examples_total"] == [({"role": "worker", "index": "3", "endpoint": "127.0.0.1:9"},
                                                       5.0)]
    assert "process_cpu_seconds_total" in metrics
    with pytest.raises(TransportError, match=rf"http://127.0.0.1:{port}/metrics: .*[Cc]onnection refused"):
        telemetry.scrape(server.url, 2)


@pytest.mark.parametrize("text", ["0", "65536", "port", "-1"])
def test_a_bad_metrics_port_is_a_config_error_naming_the_variable(text):
    with pytest.raises(ConfigError, match=rf"FLEET_METRICS_PORT='{text}' is not an integer in \[1, 65536\)"):
        telemetry.metrics_port_from_env({"FLEET_METRICS_PORT": text})
    assert telemetry.metrics_port_from_env({}) is None


def _worker(ex, push, pull, lag=None):
    m = {"fleet_worker_examples_per_second": [({}, ex)], "fleet_worker_pushes_per_second": [({}, push)],
         "fleet_worker_pulls_per_second": [({}, pull)]}
    if lag is not None:
        m["fleet_worker_staleness_steps"] = [({}, lag)]
    return m


def _server(req, rows, mem):
    return {"fleet_server_requests_per_second": [({"op": "push"}, req), ({"op": "heartbeat"}, 99.0)],
            "fleet_server_table_rows": [({"table": "t", "kind": "distributed"}, rows),
                                        ({"table": "w", "kind": "dense"}, 7.0)],
            "fleet_server_table_memory_bytes": [({"table": "t", "kind": "distributed"}, mem),
                                                ({"table": "w", "kind": "dense"}, 56.0)]}


def test_the_live_summary_line_sums_each_role_and_names_who_did_not_answer():
    results = [("worker 0", "worker", _worker(20000.4, 19.0, 19.0, 1.0)),
               ("worker 1", "worker", _worker(21200.0, 19.0, 21.0, 1.4)),
               ("server 0", "server", _server(80.0, 1_200_000.0, 180e6 - 56))]
    assert summary_line(results) == ("workers 2: 41,200 ex/s, 38 push/s, 40 pull/s, lag 1.2 steps; "
                                     "servers 1: 80 req/s, 1.2M rows, 180 MB")
    results[1] = ("worker 1", "worker", "http://127.0.0.1:9/metrics: Connection refused")
    results[0] = ("worker 0", "worker", _worker(900.0, 3.0, 3.0))
    results[2] = ("server 0", "server", _server(80.0, 1_200_000.0, 2.5e6 - 56))
    assert summary_line(results) == ("workers 1 of 2: 900 ex/s, 3 push/s, 3 pull/s; servers 1: 80 req/s, "
                                     "1.2M rows, 2.5 MB; no answer from worker 1 "
                                     "(http://127.0.0.1:9/metrics: Connection refused)")


def test_fleetrun_metrics_port_gives_servers_then_workers_consecutive_ports_and_urls():
    from fleet.launch import LaunchConfig
    from fleet.launch.config import process_environment
    from fleet.launch.local import metrics_url

    config = LaunchConfig("train.py", server_endpoints=("127.0.0.1:6170", "127.0.0.1:6171"),
                          worker_endpoints=("127.0.0.1:6172", "127.0.0.1:6173", "127.0.0.1:6174"),
                          metrics_port=9100, live_summary=2.0)
    ports = [process_environment(config, "server", i, base={})["FLEET_METRICS_PORT"] for i in range(2)]
    ports += [process_environment(config, "worker", j, base={})["FLEET_METRICS_PORT"] for j in range(3)]
    assert ports == ["9100", "9101", "9102", "9103", "9104"]
    assert metrics_url(config, "worker", 1) == "http://127.0.0.1:9103/metrics"
    local = LaunchConfig("train.py", metrics_port=9100)
    assert process_environment(local, "worker", 0, base={}) == {"FLEET_METRICS_PORT": "9100"}
    assert metrics_url(local, "worker", 0) == "http://127.0.0.1:9100/metrics"
    assert "FLEET_METRICS_PORT" not in process_environment(LaunchConfig("train.py"), "worker", 0, base={})


def test_fleetrun_watch_options_are_checked_with_their_fix():
    from fleet.launch import LaunchConfig

    with pytest.raises(ConfigError, match=r"--live_summary reads the processes' metrics endpoints: give "
                                          r"--metrics_port BASE too"):
        LaunchConfig("train.py", live_summary=1.0)
    with pytest.raises(ConfigError, match=r"--live_summary 0 must be a positive number of seconds"):
        LaunchConfig("train.py", metrics_port=9100, live_summary=0)
    with pytest.raises(ConfigError, match=r"--metrics_port 65535 leaves no room for a port per process .* "
                                          r"give a port in 1\.\.65533"):
        LaunchConfig("train.py", server_endpoints=("127.0.0.1:6170",), worker_endpoints=("127.0.0.1:6171",
                                                                                           "127.0.0.1:6172"),
                     metrics_port=65535)


def test_fleetrun_refuses_a_taken_metrics_port_before_starting_anything(tmp_path, capsys):
    from fleet.launch import main

    script = tmp_path / "train.py"
    script.write_text("")
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        with pytest.raises(SystemExit) as ended:
            main(["--server_num", "0", "--metrics_port", str(port), "--log_dir", str(tmp_path / "log"),
                  str(script)])
    assert ended.value.code == 2
    assert (f"worker 0's metrics port {port} (--metrics_port {port} + 0): port {port} is already in use"
            in capsys.readouterr().err)
