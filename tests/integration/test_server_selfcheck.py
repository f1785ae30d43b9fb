"""Self-checking server tests in the ps-lite manner: after n pushes of v from each of w
workers, a pull equals the analytic SGD value. One real server on 127.0.0.1 (a thread),
real clients, the real wire."""
import threading

import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ServerError
from fleet.server.parameter_server import ParameterServer
from fleet.transpiler.plan import build_plan
import contextlib

from fleet.transport import Client, ServerSocket, serving
from strategies import DistributedStrategyFactory

LR = 0.5


def _plan(mode, endpoint, workers):
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[4])
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        e = layers.sequence_pool(layers.embedding(ids, size=[100, 3], is_sparse=True, param_attr="t"), "sum")
        out = layers.fc(layers.concat([e, x], axis=1), 2, param_attr="w", bias_attr="b")
        optimizer.SGD(LR).minimize(layers.mean(out))
    strategy = {"sync": DistributedStrategyFactory.create_sync_strategy,
                "async": DistributedStrategyFactory.create_async_strategy}[mode]()
    return build_plan(main, strategy, [endpoint], workers)


@pytest.fixture
def server(free_port):
    with contextlib.ExitStack() as stack:
        def start(mode, workers, dc_asgd=False):
            endpoint = f"127.0.0.1:{free_port()}"
            init = {"w": np.ones((7, 2), np.float32), "b": np.zeros(2, np.float32),
                    "t": np.full((100, 3), 2.0, np.float32)}
            ps = ParameterServer(endpoint, _plan(mode, endpoint, workers), init, dc_asgd=dc_asgd)
            stack.enter_context(serving(ServerSocket(endpoint), ps.handle))
            return endpoint, ps

        yield start


def _push_many(endpoint, worker, op, n, v, meta=None):
    with Client(endpoint, worker, timeout_ms=10_000) as c:
        for _ in range(n):
            c.request(op, names=["w", "t@ROWS", "t@VALUES"],
                      arrays=[np.full((7, 2), v, np.float32), np.array([3, 3, 50]),
                              np.full((3, 3), v, np.float32)], meta=meta)


def _pull(endpoint):
    with Client(endpoint, 99, timeout_ms=10_000) as c:
        w = c.request("pull_dense", meta={"blocks": ["w"]}).arrays[0]
        t = c.request("pull_sparse", names=["ids"], arrays=[np.array([3, 50, 4])], meta={"table": "t"}).arrays[0]
    return w, t


def test_async_pull_after_n_pushes_of_v_from_w_workers_is_analytic(server):
    workers, n, v = 3, 20, 0.25
    endpoint, _ = server("async", workers)
    threads = [threading.Thread(target=_push_many, args=(endpoint, i, "push", n, v)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    w, t = _pull(endpoint)
    np.testing.assert_allclose(w, 1.0 - LR * n * workers * v, rtol=1e-6)
    # row 3 appears twice per push (summed), row 50 once, row 4 never
    np.testing.assert_allclose(t[0], 2.0 - LR * n * workers * 2 * v, rtol=1e-6)
    np.testing.assert_allclose(t[1], 2.0 - LR * n * workers * v, rtol=1e-6)
    np.testing.assert_array_equal(t[2], 2.0)


def test_sync_steps_average_over_workers_and_answer_with_fresh_values(server):
    workers, n, v = 2, 5, 0.5
    endpoint, ps = server("sync", workers)
    results = {}

    def run(worker):
        with Client(endpoint, worker, timeout_ms=10_000) as c:
            for _ in range(n):
                reply = c.request("sync_push", names=["w"], arrays=[np.full((7, 2), v * (worker + 1), np.float32)],
                                  meta={"pull": ["w"]})
            results[worker] = reply.arrays[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    mean_grad = v * (1 + 2) / 2
    for worker in range(workers):
        np.testing.assert_allclose(results[worker], 1.0 - LR * n * mean_grad, rtol=1e-6)


def test_a_bad_request_gets_an_error_naming_the_problem_and_the_server_keeps_serving(server):
    endpoint, _ = server("async", 1)
    with Client(endpoint, 0, timeout_ms=10_000) as c:
        with pytest.raises(ServerError, match="holds no block 'nope'"):
            c.request("pull_dense", meta={"blocks": ["nope"]})
        with pytest.raises(ServerError, match="unknown op 'frobnicate'"):
            c.request("frobnicate")
    w, _ = _pull(endpoint)
    np.testing.assert_array_equal(w, 1.0)


def test_dc_asgd_compensates_a_stale_gradient_with_g_plus_g_squared_times_drift(server):
    endpoint, _ = server("async", 2, dc_asgd=True)
    with Client(endpoint, 0, timeout_ms=10_000) as w0, Client(endpoint, 1, timeout_ms=10_000) as w1:
        w0.request("pull_dense", meta={"blocks": ["w"]})  # worker 0's copy: all ones
        w1.request("push", names=["w"], arrays=[np.full((7, 2), 1.0, np.float32)])  # w -> 1 - 0.5 = 0.5
        g = 0.2
        w0.request("push", names=["w"], arrays=[np.full((7, 2), g, np.float32)])
        w = w0.request("pull_dense", meta={"blocks": ["w"]}).arrays[0]
    compensated = g + g * g * (0.5 - 1.0)  # g + g*g*(param now - param at worker 0's pull)
    np.testing.assert_allclose(w, 0.5 - LR * compensated, rtol=1e-6)
