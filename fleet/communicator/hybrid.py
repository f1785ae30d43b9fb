"""The hybrid strategy's communicator: dense parameters all-reduced among the workers,
tables on the parameter servers.

``HybridCommunicator`` is the async communicator for the ``is_sparse`` /
``is_distributed`` tables (rows prefetched, gradients queued and pushed by the send
thread, servers applying them on arrival) plus the collective exchange of
``fleet.communicator.collective`` for the dense parameters, which every worker holds and
updates itself with the mean of all workers' gradients each step (so they stay identical
on every worker, as in sync training, while the tables train at async speed). Pass ends,
unequal shards and failures of other workers behave as in the collective mode.

The tables get one update per step, as in sync training: the trainer combines a
worker's threads into one step, each step is one push to every server (also one without
rows for it), and the servers average one push per worker into one update
(``merge_async_pushes`` = 0, the hybrid strategy's default). The rows of the next step
are pulled in the background while the current one computes (``prepare_step``), after
the previous step was sent: a step's rows miss at most the last step's table updates.
"""
from fleet.communicator.api import register
from fleet.communicator.asynchronous import AsyncCommunicator
from fleet.communicator.collective import GroupSteps


@register("hybrid")
class HybridCommunicator(GroupSteps, AsyncCommunicator):
    """Async for the servers' tables, collective for the dense parameters.

    Args: those of ``fleet.communicator.base.Communicator``, plus ``make_group`` (callable
    returning the joined ``WorkerGroup``).
    """

    push_to_every_server = True

    def __init__(self, plan, worker_id, scope, flags, connect, liveness=None, make_group=None):
        super().__init__(plan, worker_id, scope, flags, connect, liveness=liveness)
        self._init_group(make_group, self.who, scope)

    def start(self):
        """Connects to the servers, then joins the worker group (both bounded)."""
        super().start()
        self.start_group()

    def stop(self):
        """The final round with the workers and leaving the group, then the servers' stop
        (flush, goodbye). Idempotent."""
        try:
            self.stop_group()
        finally:
            super().stop()

    def check_alive(self):
        if self._failure is not None:
            raise self._failure
        super().check_alive()
