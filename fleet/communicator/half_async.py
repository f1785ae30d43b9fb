"""The half_async strategy's communicator (Paddle's HalfAsync).

- ``HalfAsyncCommunicator``: the same step from the worker's side, but servers apply on
  arrival; the worker then holds fresh dense parameters. One round trip per step, as
  sync's (``RowsWithStep``): the ``push`` also asks for the rows of the next step's
  batches, which the server reads right after applying (or recording) this push, as a
  ``pull_sparse`` sent when the push was answered would read them. A batch needing a
  server that gets no push this step is pulled by its prefetch op as before.
"""
from fleet.communicator.api import register
from fleet.communicator.base import Communicator
from fleet.communicator.sync import RowsWithStep


@register("half_async")
class HalfAsyncCommunicator(RowsWithStep, Communicator):
    mode = "half_async"
    requires_thread_barrier = True

    def send(self, grads):
        """Sends the step's gradients (applied on arrival) with the dense pulls and the
        next step's row pulls; blocks until every server answered.

        Raises:
            DataError: a server answered without the dense blocks or rows asked for
                (names the server).
        """
        pulls = self._rows_for_send()
        requests = self._requests("push", self.split_grads(grads))
        dense = self._dense_blocks()  # empty when the servers hold no dense block
        for ep, names in dense.items():
            if ep in requests:
                requests[ep][3]["pull"] = names
            else:
                requests[ep] = ("pull_dense", [], [], {"blocks": names})
        requests = {ep: (op, list(names), list(arrays), meta) for ep, (op, names, arrays, meta) in requests.items()}
        pulls, rows, parts = self._attach_rows(requests, pulls, ("push",))
        replies = self._all(requests)
        if dense:
            self._count("pulls")
        self._count("sends")
        self._take_replies(replies, dense, rows, parts, pulls, {ep: repr(requests[ep][0]) for ep in replies})
