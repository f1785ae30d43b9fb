"""A worker merges a sparse gradient before it leaves: each row once, its values summed in
the order they appear (Paddle's MergeAdd), so the push (and the collective all-gather)
carries a batch's distinct ids, not every occurrence."""
import contextlib

import numpy as np
import pytest

import fleet.framework as fw
from fleet.communicator import make_communicator
from fleet.framework.tensor import SparseRows
from fleet.transport import Client, ServerSocket, serving
from test_communicator_liveness import _plan

FLAGS = {"communicator_send_queue_size": 1, "communicator_max_merge_var_num": 1, "put_timeout_s": 30}
MODES = ("async", "half_async", "sync")


def _repeated_rows():
    """Row 7 three times, in an order whose float32 sum depends on it: 1e8 + 1 rounds to
    1e8, so (1e8 + 1) - 1e8 is 0, while 1 + (1e8 - 1e8) would be 1."""
    rows = np.array([7, 3, 7, 7, 3], np.int64)
    values = np.array([[1e8, 1], [2, 2], [1, 1], [-1e8, 1], [5, 5]], np.float32)
    return SparseRows(rows, values, 50)


def test_merged_sums_each_rows_values_in_the_order_they_appear():
    grad = _repeated_rows()
    merged = grad.merged()
    assert merged.rows.dtype == np.int64 and merged.rows.tolist() == [3, 7]
    np.testing.assert_array_equal(merged.values, np.array([[7, 7], [0, 3]], np.float32))
    assert merged.unique and not grad.unique and merged.height == 50
    assert grad.rows.tolist() == [7, 3, 7, 7, 3]  # the original is left as it was


def test_merged_of_no_rows_is_no_rows():
    merged = SparseRows(np.empty(0, np.int64), np.empty((0, 4), np.float32), 9).merged()
    assert merged.rows.shape == (0,) and merged.values.shape == (0, 4) and merged.unique


@pytest.mark.parametrize("mode", MODES)
def test_the_rows_sent_to_a_server_are_merged(mode):
    plan = _plan(mode, "127.0.0.1:9")
    comm = make_communicator(mode, plan, 0, fw.Scope(), FLAGS, connect=lambda ep: None)
    grads = {plan.params["t"].grad: _repeated_rows(), plan.params["w"].grad: np.ones((6, 2), np.float32)}
    (names, arrays), = comm.split_grads(grads).values()
    sent = dict(zip(names, arrays))
    assert sent["t@ROWS"].tolist() == [3, 7]
    np.testing.assert_array_equal(sent["t@VALUES"], np.array([[7, 7], [0, 3]], np.float32))
    np.testing.assert_array_equal(sent["w"], np.ones((6, 2), np.float32))


def test_an_async_step_reaches_the_server_merged():
    """Through the send queue (the copy a step is queued as is the merged one) and the
    send thread, as a server receives it."""
    pushes = []

    def handler(request):
        if request.op == "push":
            pushes.append({n: np.array(a) for n, a in zip(request.names, request.arrays)})
            pulls = request.meta.get("pull", [])
            request.reply(pulls, [np.zeros((6, 2), np.float32) for _ in pulls])
        else:
            request.reply()

    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving(ServerSocket("127.0.0.1:0"), handler, poll_ms=5, threaded=True))
        plan = _plan("async", server.endpoint)
        comm = make_communicator("async", plan, 0, fw.Scope(), FLAGS,
                                 connect=lambda ep: Client(ep, 0, timeout_ms=10000))
        comm.start()
        stack.callback(comm.stop)
        grad = _repeated_rows()
        comm.send({plan.params["t"].grad: grad})
        grad.values[:] = 0  # the training thread reuses its arrays: the queued step is a copy
        comm.flush()
    assert len(pushes) == 1
    assert pushes[0]["t@ROWS"].tolist() == [3, 7]
    np.testing.assert_array_equal(pushes[0]["t@VALUES"], np.array([[7, 7], [0, 3]], np.float32))
