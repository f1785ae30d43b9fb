"""Threaded training over a dataset: the engine behind ``Executor.train_from_dataset``."""
import contextlib
import logging
import os
import sys
import threading
import time

import numpy as np

from fleet.errors import ConfigError, DataError, ServerError, TransportError
from fleet.framework.hooks import EndOfPass, TrainingHooks
from fleet.framework.runner import Runner, batch_size as _batch_size, feed_value, run_combined_step, split_batch
from strategies.execution import ReduceStrategy

log = logging.getLogger("fleet")

# How long a training thread waits for the dataset's next batch before it reports the
# producers that are stuck (a pipe command that never ends, a file on a dead mount).
DATASET_BATCH_TIMEOUT_S = 600.0


class FetchHandler:
    """Receives fetched values periodically during ``train_from_dataset`` (Paddle's API).

    Args:
        var_dict: {label: Variable or name} to fetch.
        period_secs: how often ``handler`` is called, from a monitor thread.
    """

    def __init__(self, var_dict=None, period_secs=60):
        self.var_dict = dict(var_dict or {})
        self.period_secs = float(period_secs)

    def handler(self, res_dict):
        """Called with {label: numpy value}; override it. The default prints them."""
        print(" ".join(f"{k}={_fmt(v)}" for k, v in res_dict.items()), flush=True)


def _fmt(value):
    arr = np.asarray(value)
    if arr.size == 1:
        return f"{float(arr.reshape(-1)[0]):.6f}"
    return np.array2string(arr.reshape(-1)[:8], precision=5)


def _name(v):
    return v if isinstance(v, str) else v.name


def serial_threads_requested():
    """True when FLEET_SERIAL_THREADS=1: training threads take turns, one whole step at a
    time in the order the batches come (results equal one thread's, bit for bit)."""
    raw = os.environ.get("FLEET_SERIAL_THREADS", "0").strip()
    if raw not in ("0", "1", ""):
        raise ConfigError(f"FLEET_SERIAL_THREADS={raw!r} must be 0 or 1 (1: training threads "
                          f"take turns, one step at a time, for debugging accuracy)")
    return raw == "1"


class DatasetTrainer:
    """Runs one pass of a program over a dataset with N threads (Hogwild or Reduce)."""

    def __init__(self, plan, program, dataset, scope, threads, fetch_list, fetch_info,
                 print_period, fetch_handler, debug, executor=None, train=True):
        self.executor = executor
        self.train = train
        self.program = program
        self.dataset = dataset
        self.scope = scope
        self.threads = threads
        self.fetch_names = [_name(v) for v in fetch_list]
        self.fetch_info = fetch_info or self.fetch_names
        self.print_period = max(int(print_period or 0), 0)
        self.fetch_handler = fetch_handler
        self.debug = debug
        self.plan = plan
        self.block = program.global_block()
        self._lock = threading.Lock()
        self._batches = 0
        self._examples = 0
        self._errors = []
        self._last_fetch = {}
        self._stop = threading.Event()
        self._t0 = None
        self._bar = None
        self._skipped = 0
        self.checkpoint = None  # a CheckpointConfig: after_step(executor) after every batch
        build = getattr(program, "_build_strategy", None)
        reduce_strategy = getattr(build, "reduce_strategy", None)
        self.hooks = program.training_hooks or TrainingHooks()
        # Sync and half-async workers average their threads' gradients every step, each
        # thread on a batch of its own (Paddle's communicator). Reduce (a build strategy of
        # local training) splits each batch across the threads instead, so an update is
        # made from one batch, as with one thread (Paddle's ParallelExecutor).
        # Collective workers need one combined step too, but either kind will do.
        self.barrier = self.hooks.requires_thread_barrier
        self.split = (reduce_strategy == ReduceStrategy.Reduce
                      and (not self.barrier or self.hooks.allows_split_batches))
        self.reduce = threads > 1 and (self.barrier or self.split)
        self.serial = serial_threads_requested()
        self._turn = threading.Lock() if self.serial else contextlib.nullcontext()

    # ---------------------------------------------------------------- helpers
    def _feed(self, runner, batch):
        for name, value in batch.items():
            var = self.block.vars.get(name)
            runner.local[name] = feed_value(var, value) if var is not None else value
        return _batch_size(batch)

    def _record(self, runner, examples, steps=1):
        """Counts a trained batch; ``steps`` batches are told to the checkpoint config
        (a reduce step tells all of its batches at once, after its last, so a checkpoint
        never falls inside a step)."""
        with self._lock:
            self._batches += 1
            self._examples += examples
            batches = self._batches
        if self.train and self.plan.trains:  # before a checkpoint of this step is due
            self.scope.record_training(examples)
        if self._bar is not None:
            self._bar.update(examples)
        if self.checkpoint is not None and steps:
            self.checkpoint.after_step(self.executor, steps)
        if self.print_period and batches % self.print_period == 0:
            values = {label: runner.value(n) for label, n in zip(self.fetch_info, self.fetch_names)}
            self._last_fetch = {k: np.array(getattr(v, "values", v)) for k, v in values.items()
                                if v is not None}
            self._print(batches)

    def _print(self, batches):
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        parts = [f"batch {batches}", f"{self._examples / elapsed:,.0f} examples/s"]
        parts += [f"{label} {_fmt(v)}" for label, v in self._last_fetch.items()]
        line = ", ".join(parts)
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)

    def _empty_pass_error(self, report):
        """The DataError of a pass that ran no example (Paddle 1.x returns without one)."""
        describe = getattr(self.dataset, "_describe_empty_pass", None)
        reason = describe(report) if describe is not None else "the dataset gave no batch"
        who = self.hooks.who
        trained = "trained" if self.train else "predicted"
        return DataError(
            f"{who + ': ' if who else ''}{'train' if self.train else 'infer'}_from_dataset ran a pass over 0 "
            f"examples: {reason}. Nothing was {trained}, so the pass is an error rather than a model "
            f"that looks {trained}")

    def _skip(self, source, count):
        """Reads and drops the first ``count`` batches of the pass: the ones this worker
        trained in this epoch before the checkpoint it resumed from. Returns how many
        were dropped (fewer when the pass ends first)."""
        dropped = 0
        while dropped < count and self._next(source) is not None:
            dropped += 1
        if count:
            who = self.hooks.who
            print(f"{who + ': ' if who else ''}resuming the epoch after the {dropped} batches trained before "
                  f"the checkpoint (skipped, not trained again)", flush=True)
        return dropped

    # ---------------------------------------------------------------- loops
    def _next(self, source):
        return source.get(DATASET_BATCH_TIMEOUT_S)

    def _hogwild_loop(self, source, index):
        runner = Runner(self.plan, self.scope.new_scope())
        ahead = self.hooks.prefetch_ahead and not self.serial and getattr(source, "prefetch_ahead", True)
        batch_done = getattr(source, "batch_done", None)  # elastic passes acknowledge work units
        try:
            batch = self._next(source) if ahead else None
            while not self._stop.is_set():
                with self._turn:  # FLEET_SERIAL_THREADS: one whole step at a time
                    if not ahead:
                        batch = self._next(source)
                    if batch is None:
                        break
                    following = self._next(source) if ahead else None
                    if following is not None:  # its remote rows come while this batch runs
                        self.hooks.prepare_batch(following)
                    n = self._feed(runner, batch)
                    runner.run()
                    self._record(runner, n)
                    if batch_done is not None:
                        batch_done(batch)
                    batch = following
                if index == 0:
                    self._runner0 = runner
        except EndOfPass:  # the job agreed to end the pass (collective): not an error
            self._stop.set()
        except BaseException as e:  # noqa: BLE001 - re-raised by run() in the caller
            self._errors.append(e)
            self._stop.set()
        finally:
            self.hooks.thread_finished()

    def _reduce_loop(self, source):
        runners = [Runner(self.plan, self.scope.new_scope()) for _ in range(self.threads)]
        from concurrent.futures import ThreadPoolExecutor

        # With prefetch_ahead the next step's batches are read before this one runs, so
        # their remote rows come while it computes (as in the Hogwild loop).
        ahead = self.hooks.prefetch_ahead and not self.serial and getattr(source, "prefetch_ahead", True)
        batch_done = getattr(source, "batch_done", None)  # elastic passes (never ahead)
        following = self._next_group(source) if ahead else None
        with ThreadPoolExecutor(self.threads, thread_name_prefix="fleet-train") as pool:
            while not self._stop.is_set():
                batches = following if ahead else self._next_group(source)
                if not batches:
                    break
                if ahead:
                    following = self._next_group(source)
                    if following:
                        self.hooks.prepare_step(following)
                active = runners[: len(batches)]
                if self.split:
                    group = (id(self), self._batches)
                    for r in active:
                        r.step_group = group

                def compute(runner, batch):
                    n = self._feed(runner, batch)
                    runner.run(optimize=False, schedule=False)
                    return n

                # A split batch's parts are weighted by their share of its examples, so the
                # update is the whole batch's mean gradient (as one thread computes it).
                try:
                    lead, sizes = run_combined_step(active, batches, compute, self.plan.grad_names, self.split,
                                                    map if self.serial else pool.map)
                except EndOfPass:  # the job agreed to end the pass (collective): not an error
                    break
                if self.split:
                    self._record(lead, sum(sizes))
                else:
                    for i, (runner, n) in enumerate(zip(active, sizes)):
                        self._record(runner, n, steps=len(active) if i == len(active) - 1 else 0)
                if batch_done is not None:
                    for batch in self._group_batches:
                        batch_done(batch)
                self._runner0 = lead

    def _next_group(self, source):
        """The batches of one reduce step: one per thread, or one batch split across them."""
        if self.split:
            batch = self._next(source)
            self._group_batches = [] if batch is None else [batch]
            return [] if batch is None else split_batch(batch, self.threads)
        batches = []
        # An elastic pass's later batches may only come once these ran (their work
        # units end the pass): take what is ready, never wait holding batches.
        ready = getattr(source, "get_ready", None)
        for _ in range(self.threads):
            batch = self._next(source) if not batches or ready is None else ready()
            if batch is None:
                break
            batches.append(batch)
        self._group_batches = batches
        return batches

    def _monitor(self):
        handler = self.fetch_handler
        names = {label: _name(v) for label, v in handler.var_dict.items()}
        while not self._stop.wait(handler.period_secs):
            runner = getattr(self, "_runner0", None)
            if runner is None:
                continue
            values = {}
            for label, name in names.items():
                v = runner.value(name)
                if v is not None:
                    values[label] = np.array(getattr(v, "values", v))
            if values:
                handler.handler(values)

    def _blas_limit(self):
        """With several training threads, each runs BLAS on its share of the BLAS threads
        this process may use (its pool size, which OMP_NUM_THREADS / OPENBLAS_NUM_THREADS
        set; fleetrun gives each worker its share of the machine): two threads each driving
        a 2-thread BLAS pool oversubscribe 2 cores (measured 3x slower;
        benchmarks/bench_local_train.py)."""
        if self.threads <= 1:
            return contextlib.nullcontext()
        try:
            from threadpoolctl import threadpool_info, threadpool_limits
        except ImportError:
            return contextlib.nullcontext()
        pools = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
        budget = max(pools) if pools else (os.cpu_count() or 1)
        return threadpool_limits(limits=max(1, budget // self.threads), user_api="blas")

    def run(self):
        with self._blas_limit():
            return self._run()

    def _say_elastic_resume(self, source, skip):
        """An elastic pass has no per-worker place to skip to: server 0's work queue
        resumes the epoch (it restored the units acknowledged before the checkpoint)."""
        restored = getattr(source, "restored", {}).get("units", 0)
        if not (skip or restored):
            return
        who = self.hooks.who
        if restored:
            text = (f"elastic pass: resuming the epoch from the checkpoint: server 0 restored the {restored} of "
                    f"{source.total_units} work units acknowledged before it ({source.restored['examples']} "
                    f"examples), which are not trained again")
        else:
            text = (f"elastic pass: the {skip} batches trained in this epoch before the checkpoint are trained "
                    f"again: server 0 restored no work units of it (the checkpoint holds none of this epoch, "
                    f"or they were over other files)")
        print(f"{who + ': ' if who else ''}{text}", flush=True)

    def _run(self):
        elastic = getattr(self.dataset, "_open_elastic_pass", None) if self.train else None
        source = elastic(self.threads, self.hooks) if elastic is not None else None
        try:
            skip = self.checkpoint.begin_pass() if self.checkpoint is not None and self.train else 0
            if source is None:
                source = self.dataset._open_pass(self.threads)
                self._skipped = self._skip(source, skip)
            else:
                self._say_elastic_resume(source, skip)
        except BaseException:
            if source is not None:
                source.close()
            raise
        self.hooks.begin_pass(self.threads)
        if sys.stdout.isatty() and self.print_period:
            try:
                from tqdm import tqdm

                self._bar = tqdm(unit=" ex", unit_scale=True, dynamic_ncols=True, leave=False)
            except ImportError:
                self._bar = None
        self._t0 = time.perf_counter()
        monitor = None
        if self.fetch_handler is not None:
            monitor = threading.Thread(target=self._monitor, name="fleet-fetch-handler", daemon=True)
            monitor.start()
        try:
            if self.reduce:
                try:
                    self._reduce_loop(source)
                except BaseException as e:  # noqa: BLE001
                    self._errors.append(e)
            else:
                workers = [threading.Thread(target=self._hogwild_loop, args=(source, i),
                                            name=f"fleet-train-{i}", daemon=True)
                           for i in range(self.threads)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
        finally:
            self._stop.set()
            source.close()
            if monitor is not None:
                monitor.join(timeout=5)
            if self._bar is not None:
                self._bar.close()
            if self._errors:
                self.hooks.pass_interrupted(self._errors[0])
            self.hooks.end_pass()
        if self._errors:
            error = self._errors[0]
            if not isinstance(error, (TransportError, ServerError)):  # not the job's failure told to us
                self.hooks.pass_failed(error)
            raise error
        report = dict(source.report()) if hasattr(source, "report") else {}
        if self._examples == 0 and report.get("elastic"):
            log.info("%s: the other workers trained every work unit of this elastic pass", self.hooks.who or "worker")
        elif self._examples == 0 and not self._skipped:
            error = self._empty_pass_error(report)
            self.hooks.pass_failed(error)
            raise error
        elapsed = time.perf_counter() - self._t0
        runner = getattr(self, "_runner0", None)
        if runner is not None and self.fetch_names:  # the values after the last batch
            for label, name in zip(self.fetch_info, self.fetch_names):
                value = runner.value(name)
                if value is not None:
                    self._last_fetch[label] = np.array(getattr(value, "values", value))
        skipped = int(report.get("bad_lines_skipped", 0))
        summary = {
            "examples": self._examples,
            "batches": self._batches,
            "seconds": elapsed,
            "examples_per_sec": self._examples / elapsed if elapsed > 0 else 0.0,
            "bad_lines_skipped": skipped,
            "resumed_after_batches": self._skipped,  # trained before the checkpoint resumed from
            "fetch": self._last_fetch,  # {label: value} of the fetch_list after the last batch
        }
        if self.print_period:
            print(f"pass done: {self._examples} examples in {self._batches} batches, "
                  f"{summary['examples_per_sec']:,.0f} examples/s"
                  + (f", {skipped} bad lines skipped" if skipped else ""), flush=True)
        return summary
