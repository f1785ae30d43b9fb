"""The sync strategy's communicator (Paddle's Sync).

- ``SyncCommunicator``: a step's (thread-averaged) gradients go to every server in one
  ``sync_push``; each server answers once every worker's step is in and applied, with
  the fresh values of its dense blocks. When ``send`` returns, parameters are updated.
"""
from fleet.communicator.api import register
from fleet.communicator.base import Communicator


@register("sync")
class SyncCommunicator(Communicator):
    mode = "sync"
    requires_thread_barrier = True

    def send(self, grads):
        """Sends the step's gradients; returns when every server applied the step with all
        workers' gradients and this worker holds the updated dense parameters."""
        per_ep = self.split_grads(grads)
        pulls = {}
        for p in self.dense:
            for b in p.blocks:
                pulls.setdefault(b.endpoint, []).append(b.name)
        requests = {ep: ("sync_push", names, arrays, {"pull": pulls.get(ep, [])})
                    for ep, (names, arrays) in per_ep.items()}
        replies = self._all(requests)
        self._count("sends")
        for reply in replies.values():
            self._write_blocks(reply.names, reply.arrays)
