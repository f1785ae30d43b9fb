"""The executor: runs programs on feeds, and trains from datasets with threads.

``Executor.run`` runs every op of a program in order on one batch. ``train_from_dataset``
runs N training threads, each on its own child scope, over batches made by the dataset's
producer threads; parameters are shared (Hogwild: each thread runs whole steps on its
own batches), or, when the program's build strategy says Reduce, the threads split each
batch and their gradients, weighted by their share of its examples, are combined by a
numba kernel and applied once (equal to one thread on the whole batch, to float rounding).

Thread-safety: one Executor may be used from several threads; each thread gets its own
temporaries. Running the same program concurrently on the same scope races on the
parameters by design (Hogwild).
"""
import logging
import threading

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework.compiler import CompiledProgram
from fleet.framework.hooks import program_to_run
from fleet.framework.program import Program, Variable, default_main_program
from fleet.framework.runner import Plan, Runner, feed_value
from fleet.framework.scope import global_scope
from fleet.framework.tensor import LoDTensor, SparseRows
from fleet.framework.trainer import DatasetTrainer

log = logging.getLogger("fleet")

def _examples_in(feed):
    """The batch size of a feed: the rows of its first input (sequences: their count)."""
    for value in feed.values():
        if isinstance(value, LoDTensor):
            return value.batch_size
        if isinstance(value, tuple) and len(value) == 2:  # (values, lengths)
            return len(value[1])
        return len(value) if hasattr(value, "__len__") else 1
    return 0


# Non-iterable readers between start() and reset() (``fluid.io.PyReader`` and
# ``DataLoader.from_generator(iterable=False)``), newest last: ``Executor.run`` without a
# feed takes the next batch of the newest one whose inputs the program has.
_started_readers = []
_readers_lock = threading.Lock()


def start_reader(reader):
    """Registers a started non-iterable reader: it has ``feed_names`` and ``next_feed()``
    (the next feed: a dict, or a list of one dict per place; raises EOFException at the
    end)."""
    with _readers_lock:
        if reader not in _started_readers:
            _started_readers.append(reader)


def stop_reader(reader):
    """Unregisters a reader (its reset())."""
    with _readers_lock:
        if reader in _started_readers:
            _started_readers.remove(reader)


def _next_from_reader(program):
    inner = getattr(program, "program", program)  # a CompiledProgram's
    if not isinstance(inner, Program):
        return None
    names = inner.global_block().vars
    with _readers_lock:
        readers = list(reversed(_started_readers))
    for reader in readers:
        if all(name in names for name in reader.feed_names):
            return reader.next_feed()
    return None


class Executor:
    """Runs programs (Paddle's ``fluid.Executor``; the place argument is accepted and ignored:
    fleet runs on CPUs)."""

    def __init__(self, place=None):
        self.place = place
        self._plans = {}
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._closed = False
        self._on_close = []  # what close() must call (see close)

    # ---------------------------------------------------------------- preparing
    def _plan(self, program):
        key = program._id
        with self._lock:
            entry = self._plans.get(key)
            if entry is None or entry[0] != program._version:
                entry = (program._version, Plan(program))
                self._plans[key] = entry
        return entry[1]

    def _runner(self, program, scope):
        plan = self._plan(program)
        runners = getattr(self._tls, "runners", None)
        if runners is None:
            runners = self._tls.runners = {}
        key = (program._id, id(scope))
        runner = runners.get(key)
        if runner is None or runner.plan is not plan:
            runner = runners[key] = Runner(plan, scope)
        return runner

    # ---------------------------------------------------------------- run
    def run(self, program=None, feed=None, fetch_list=None, feed_var_name="feed",
            fetch_var_name="fetch", scope=None, return_numpy=True, use_program_cache=True,
            return_merged=True):
        """Runs ``program`` once on ``feed`` and returns the fetched values.

        Args:
            program: a Program (default: the default main program), or a data-parallel
                ``CompiledProgram`` (the batch is split across its replicas; see
                ``fleet.framework.compiler``).
            feed: {name: value}; a lod_level=0 input as an array [batch, *shape], a
                lod_level=1 input as ``(values, lengths)`` or a list of sequences. A list
                of one such dict is taken as the dict (Paddle's feed per place); a
                CompiledProgram takes one dict per replica.
            fetch_list: variables or names whose values to return.
            scope: where parameters live (default: ``global_scope()``).
            return_numpy: return numpy arrays (copies); else the raw values.
            return_merged: for a CompiledProgram, each fetched value is the replicas'
                values concatenated along dim 0 (else a list of them).

        Returns:
            A list with one value per fetched variable.

        Raises:
            ConfigError / DataError: unknown feed names, wrong shapes or dtypes, missing
                inputs; each message names the variable and what was expected.
            TypeError: ``program`` is not a Program.

        Blocks until every op ran (for a distributed worker, until its communication for
        this step is done as the strategy requires).
        """
        if self._closed:
            raise ConfigError("this Executor was closed; create a new fleet.Executor()")
        program = default_main_program() if program is None else program
        scope = global_scope() if scope is None else scope
        if not feed and _started_readers:
            feed = _next_from_reader(program)
        if isinstance(program, CompiledProgram):
            self._note_closing(program.program)
            if program._is_data_parallel:
                return program._run(self, feed, fetch_list, scope, return_numpy, return_merged)
            program = program.program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a fleet.Program, got {type(program).__name__}")
        self._note_closing(program)
        if isinstance(feed, (list, tuple)):  # one feed per place (a DataLoader's batches)
            if len(feed) != 1:
                raise DataError(f"feed is a list of {len(feed)} dicts (one per place) but the program is not "
                                f"compiled with data parallel; run a CompiledProgram(...).with_data_parallel() "
                                f"or feed one dict")
            feed = feed[0]
        program = program_to_run(program)
        runner = self._runner(program, scope)
        local = runner.local
        try:
            if feed:
                self._feed(program, runner.plan, feed, local)
            runner.run()
            if runner.plan.trains and feed:
                scope.record_training(_examples_in(feed))
            return self._fetch(runner, fetch_list, return_numpy)
        finally:
            for name in feed or ():  # a later run must not see this run's inputs
                local.pop(name.name if isinstance(name, Variable) else name, None)

    def _feed(self, program, plan, feed, local):
        if not isinstance(feed, dict):
            raise DataError(f"feed must be a dict of {{name: value}}, got {type(feed).__name__}")
        block = program.global_block()
        for name, value in feed.items():
            if isinstance(name, Variable):
                name = name.name
            var = block.vars.get(name)
            if var is None:
                raise DataError(
                    f"feed {name!r} is not a variable of this program; its inputs are "
                    f"{sorted(plan.data_vars) or 'none'}"
                )
            local[name] = feed_value(var, value)

    def _fetch(self, runner, fetch_list, return_numpy):
        if not fetch_list:
            return []
        out = []
        for item in fetch_list:
            name = item.name if isinstance(item, Variable) else item
            if not isinstance(name, str):
                raise ConfigError(f"fetch_list entries are variables or names, got {item!r}")
            value = runner.value(name)
            if value is None:
                raise ConfigError(
                    f"cannot fetch {name!r}: no op of this program produced it and it is not "
                    f"in the scope; fetch a variable of the program you run"
                )
            if return_numpy:
                if isinstance(value, LoDTensor):
                    value = np.array(value.values)
                elif isinstance(value, SparseRows):
                    value = value.to_dense()
                else:
                    value = np.array(value)
            out.append(value)
        return out

    # ---------------------------------------------------------------- datasets
    def train_from_dataset(self, program=None, dataset=None, scope=None, thread=0, debug=False,
                           fetch_list=None, fetch_info=None, print_period=100,
                           fetch_handler=None, checkpoint=None):
        """Trains ``program`` on one pass over ``dataset`` with several threads.

        Args:
            program: the program to run (default: the default main program).
            dataset: a fleet dataset (``DatasetFactory().create_dataset(...)``).
            thread: training threads (default: the dataset's ``set_thread`` value).
            fetch_list / fetch_info: variables printed every ``print_period`` batches,
                each with its label.
            fetch_handler: a ``FetchHandler`` called with the latest fetched values every
                ``period_secs`` seconds from a monitor thread.
            debug: print a timing line per printed batch.
            checkpoint: a ``fleet.CheckpointConfig``: its ``after_step`` runs after every
                batch (the first worker checkpoints when due) and its ``after_epoch``
                once the pass is over.

        Returns:
            A dict summary of the pass: examples, batches, seconds, examples_per_sec,
            bad_lines_skipped and the last fetched values (Paddle returns None; the extra
            information is for scripts that want it).

        Raises:
            RuntimeError: no dataset, or no thread count (Paddle's messages).
            DataError: a producer met bad data (file, line and field named).

        Blocks until the pass is over; every wait for data is bounded.
        """
        return self._run_from_dataset(program, dataset, scope, thread, debug, fetch_list,
                                      fetch_info, print_period, fetch_handler, train=True,
                                      checkpoint=checkpoint)

    def infer_from_dataset(self, program=None, dataset=None, scope=None, thread=0, debug=False,
                           fetch_list=None, fetch_info=None, print_period=100,
                           fetch_handler=None):
        """Like ``train_from_dataset`` but runs only the forward ops (no parameter updates)."""
        return self._run_from_dataset(program, dataset, scope, thread, debug, fetch_list,
                                      fetch_info, print_period, fetch_handler, train=False)

    def _run_from_dataset(self, program, dataset, scope, thread, debug, fetch_list, fetch_info,
                          print_period, fetch_handler, train, checkpoint=None):
        if dataset is None:
            raise RuntimeError("dataset is need and should be initialized")
        program = default_main_program() if program is None else program
        if isinstance(program, CompiledProgram):  # the dataset's threads are the replicas
            program = program.program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a fleet.Program, got {type(program).__name__}")
        if not train:
            program = program.clone(for_test=True)
        program = program_to_run(program)
        thread = int(thread) if thread else int(getattr(dataset, "thread_num", 0) or 0)
        if thread <= 0:
            raise RuntimeError(
                "You should set thread num first, either in Dataset or in Executor.train_from_dataset"
            )
        fetch_list = list(fetch_list or [])
        fetch_info = list(fetch_info or [])
        if fetch_info and len(fetch_info) != len(fetch_list):
            raise ConfigError(
                f"fetch_info has {len(fetch_info)} labels for {len(fetch_list)} fetch_list "
                f"entries; give one label per fetched variable"
            )
        scope = global_scope() if scope is None else scope
        self._note_closing(program)
        trainer = DatasetTrainer(self._plan(program), program, dataset, scope, thread, fetch_list,
                                 fetch_info, print_period, fetch_handler, debug, executor=self, train=train)
        trainer.checkpoint = checkpoint
        summary = trainer.run()
        if checkpoint is not None:
            checkpoint.after_epoch(self)
        return summary

    def _note_closing(self, program):
        callbacks = getattr(program, "_on_executor_close", ())
        if callbacks:
            with self._lock:  # run() may be called from several threads
                for callback in callbacks:
                    if not any(c is callback for c in self._on_close):
                        self._on_close.append(callback)

    def close(self):
        """Releases the executor's buffers. A program that says what its executor's close
        means (``program._on_executor_close``: callables) has them called once, in the
        order its runs registered them: a ``fluid.DistributeTranspiler`` trainer program
        tells the servers this trainer is done, as Paddle's ``exe.close()`` does (with the
        fleet API, ``fleet.stop_worker()`` does the talking to servers)."""
        with self._lock:
            callbacks, self._on_close = self._on_close, []
        self._plans.clear()
        self._tls = threading.local()
        self._closed = True
        for callback in callbacks:
            callback()
