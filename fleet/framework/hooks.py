"""Training hooks: how a distributed runtime takes part in ``train_from_dataset``.

A program may carry one ``TrainingHooks`` object (``program.training_hooks``; clones keep
it). Local training has none. A distributed worker's runtime attaches its communicator,
which is a ``TrainingHooks``, to the worker's transpiled program; the communicator ops of
that program reach it there too.

The dataset trainer calls, per pass (one ``train_from_dataset`` call):

1. ``begin_pass(threads)`` once, from the calling thread, before any batch is read;
2. from each training thread, for every batch: ``prepare_batch(feed)`` with the feed of
   the batch this thread will run *next* (only when ``prefetch_ahead`` is true), then
   the program runs the current batch;
3. ``thread_finished()`` from each training thread as it ends (also after an error);
4. ``end_pass()`` once, from the calling thread, after every training thread ended
   (also after an error);
5. ``pass_failed(error)`` when the pass ends with an error of this process's own (bad
   or no data, a bug), not one the job reported to it, just before it is raised.

``who`` names this process in errors ("worker 1 of 2"; empty for local training).

``requires_thread_barrier`` tells the trainer that the threads of this process must
average their gradients every step (sync and half-async), which it does by running them
in lock step and reducing their gradients before the send.
"""


class TrainingHooks:
    """Base of the hooks; every method does nothing. Subclasses override what they need.

    Attributes:
        requires_thread_barrier: the training threads average their gradients each step.
        prefetch_ahead: call ``prepare_batch`` with each thread's next batch.
        who: how errors name this process ("worker 1 of 2"), or "".
    """

    requires_thread_barrier = False
    prefetch_ahead = False
    who = ""

    def begin_pass(self, threads):
        """A pass starts with ``threads`` training threads. Called once, may block briefly."""

    def prepare_batch(self, feed):
        """The calling training thread will run ``feed`` ({name: value}) after its current
        batch: start fetching what that batch needs. Must not block on the network; must
        not modify ``feed``. Called from training threads concurrently (thread-safe)."""

    def thread_finished(self):
        """The calling training thread has run its last batch of the pass."""

    def end_pass(self):
        """Every training thread has ended; finish the pass's communication (blocks,
        bounded by the runtime's timeouts)."""

    def pass_failed(self, error):
        """The pass ends with ``error``, raised in this process (not a failure the job
        reported to it): tell the peers, so they stop now instead of waiting for this
        process. Called from the calling thread after ``end_pass``; bounded; must not
        raise."""
