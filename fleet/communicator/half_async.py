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
from fleet.errors import DataError


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
        for ep, reply in replies.items():
            asked = dense.get(ep, []) + rows.get(ep, [])
            if list(reply.names) != asked:
                raise DataError(f"server {ep} answered {requests[ep][0]!r} with {list(reply.names)}, not the dense "
                                f"blocks and rows {asked} asked for; run the same fleet version on every process")
            n = len(dense.get(ep, []))
            self._write_blocks(reply.names[:n], reply.arrays[:n])
            self._take_rows(ep, reply.arrays[n:], parts)
        self._publish_rows(pulls)
