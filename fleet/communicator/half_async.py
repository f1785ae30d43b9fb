"""The half_async strategy's communicator (Paddle's HalfAsync).

- ``HalfAsyncCommunicator``: the same step from the worker's side, but servers apply on
  arrival; the worker then pulls fresh dense parameters.
"""
from fleet.communicator.api import register
from fleet.communicator.base import Communicator


@register("half_async")
class HalfAsyncCommunicator(Communicator):
    mode = "half_async"
    requires_thread_barrier = True

    def send(self, grads):
        """Sends the step's gradients (applied on arrival), then pulls fresh dense
        parameters; blocks until both are done."""
        requests = self._requests("push", self.split_grads(grads))
        if requests:
            self._all(requests)
        self._count("sends")
        self.pull_dense()
