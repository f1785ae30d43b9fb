"""Training hooks: how a distributed runtime takes part in ``train_from_dataset``.

A program may carry one ``TrainingHooks`` object (``program.training_hooks``; clones keep
it). Local training has none. A distributed worker's runtime attaches its communicator,
which is a ``TrainingHooks``, to the worker's transpiled program; the communicator ops of
that program reach it there too.

The dataset trainer calls, per pass (one ``train_from_dataset`` call):

1. ``begin_pass(threads)`` once, from the calling thread, before any batch is read;
2. from each training thread, for every batch: ``prepare_batch(feed)`` with the feed of
   the batch this thread will run *next* (only when ``prefetch_ahead`` is true), then
   the program runs the current batch; when the threads run in lock step (below), the
   thread that runs the steps calls ``prepare_step(feeds)`` instead, once per step, with
   the feeds of the *next* step (one per thread);
3. ``thread_finished()`` from each training thread as it ends (also after an error);
4. ``end_pass()`` once, from the calling thread, after every training thread ended
   (also after an error);
5. ``pass_failed(error)`` when the pass ends with an error of this process's own (bad
   or no data, a bug), not one the job reported to it, just before it is raised.

When the pass ends with an error raised in a training thread, ``pass_interrupted(error)``
is called just before ``end_pass`` (so ``end_pass`` knows the pass did not end cleanly).

An op may end the pass early by raising ``EndOfPass`` (the collective communicators do
when another worker's shard has ended): the step it was raised in is not applied, the
training threads stop, and the pass ends normally.

``who`` names this process in errors ("worker 1 of 2"; empty for local training).

``requires_thread_barrier`` tells the trainer that the threads of this process must
average their gradients every step (sync and half-async), which it does by running them
in lock step and reducing their gradients before the send. With ``allows_split_batches``
as well, a Reduce build strategy still splits each batch across the threads (their
gradients weighted by their share of its examples) instead of giving each thread a batch
of its own: the collective communicators need one combined step, of either kind.
"""


class EndOfPass(Exception):
    """Raised by an op (through the training hooks) to end the current pass here: the
    step it was raised in is not applied, and the pass ends without an error. The dataset
    trainer catches it; it never reaches the user from ``train_from_dataset``."""


class TrainingHooks:
    """Base of the hooks; every method does nothing. Subclasses override what they need.

    Attributes:
        requires_thread_barrier: the training threads average their gradients each step.
        allows_split_batches: with requires_thread_barrier, a Reduce build strategy may
            split each batch across the threads.
        prefetch_ahead: call ``prepare_batch`` with each thread's next batch
            (``prepare_step`` with the next step's batches when the threads run in
            lock step).
        who: how errors name this process ("worker 1 of 2"), or "".
    """

    requires_thread_barrier = False
    allows_split_batches = False
    prefetch_ahead = False
    who = ""

    def begin_pass(self, threads):
        """A pass starts with ``threads`` training threads. Called once, may block briefly."""

    def prepare_batch(self, feed):
        """The calling training thread will run ``feed`` ({name: value}) after its current
        batch: start fetching what that batch needs. Must not block on the network; must
        not modify ``feed``. Called from training threads concurrently (thread-safe)."""

    def prepare_step(self, feeds):
        """The lock-step threads will run ``feeds`` (a list of {name: value}, one per
        thread) as their next step, after the current one: start fetching what that step
        needs. Called from the thread that runs the steps, once per step, only when
        ``prefetch_ahead`` is true. Must not block on the network; must not modify the
        feeds."""

    def thread_finished(self):
        """The calling training thread has run its last batch of the pass."""

    def pass_interrupted(self, error):
        """A training thread raised ``error`` (any kind); ``end_pass`` follows. Called from
        the calling thread; bounded; must not raise."""

    def end_pass(self):
        """Every training thread has ended; finish the pass's communication (blocks,
        bounded by the runtime's timeouts)."""

    def pass_failed(self, error):
        """The pass ends with ``error``, raised in this process (not a failure the job
        reported to it): tell the peers, so they stop now instead of waiting for this
        process. Called from the calling thread after ``end_pass``; bounded; must not
        raise."""

# ---------------------------------------------------------------------- programs to run
# A distributed worker's runtime registers how the programs its user built before
# ``minimize`` (test clones, the default main program) run on this worker: their reads of
# server-held parameters must go to the servers. The executor asks before every run.
_program_rewriter = None


def set_program_rewriter(rewrite):
    """Registers ``rewrite(program) -> program`` (or None to remove it): the executor runs
    what it returns instead of ``program``. It must return ``program`` itself for programs
    it does not handle, must be cheap when called again with an unchanged program, and is
    called from any thread that runs a program (thread-safe)."""
    global _program_rewriter
    _program_rewriter = rewrite


# Local training: the upper layer registers how programs whose tables it serves in
# process (tables with an entry or accessor: ``fleet.local_tables``) run. A runtime's
# rewriter above takes precedence (its programs talk to servers).
_local_rewriter = None


def set_local_rewriter(rewrite):
    """Registers ``rewrite(program) -> program`` for programs run while no runtime's
    rewriter is set (local training), or None to remove it; the same contract as
    ``set_program_rewriter``."""
    global _local_rewriter
    _local_rewriter = rewrite


def program_to_run(program):
    """The program the executor runs for ``program``: a runtime's rewrite when one is
    registered, else the local rewrite when one is registered, else ``program``."""
    rewrite = _program_rewriter
    if rewrite is None:
        rewrite = _local_rewriter
    return program if rewrite is None else rewrite(program)
