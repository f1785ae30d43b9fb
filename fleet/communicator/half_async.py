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
        self.push_and_pull_dense(self.split_grads(grads))
        self._count("sends")
