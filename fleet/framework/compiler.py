"""Data-parallel programs: Paddle's ``CompiledProgram(...).with_data_parallel`` and
``ParallelExecutor`` on CPU replicas.

``Executor.run(compiled, feed=..., fetch_list=...)`` runs one step of a data-parallel
program: the fed batch is split into ``CPU_NUM`` consecutive parts (or as many as
``places`` lists), one per replica; the replicas run the forward and backward ops on
their parts in ``exec_strategy.num_threads`` threads, each with its own temporaries, on
the one set of parameters of the scope; their gradients are combined, each weighted by
its part's share of the batch's examples, and the optimizer ops run once. So a step
equals one replica on the whole batch, to float rounding.

Both ``BuildStrategy.ReduceStrategy`` values do that arithmetic here: Paddle's Reduce
sums the replicas' gradients on one device and applies them once, its AllReduce sums them
on every device and each applies the same update to its own copy of the parameters,
which on CPU replicas sharing one scope is one update as well.

A distributed worker's program (``fleet.main_program`` after ``minimize``) runs the same
way: each replica reads the rows of server-side tables its part needs, and the combined
gradients go to the servers once per step (the send op is an optimizer op).

Fetched values are as Paddle's ``return_merged=True``: each replica's value of a fetched
variable, concatenated along dim 0 (a loss of shape [1] comes back as [replicas]); with
``return_merged=False``, a list of the replicas' values per fetched variable.

Thread-safety: run one data-parallel program from one thread at a time.
"""
import concurrent.futures
import threading

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.framework.hooks import program_to_run
from fleet.framework.program import Program, Variable, default_main_program
from fleet.framework.place import CPUPlace, say_on_the_cpu
from fleet.framework.runner import Runner, batch_size, feed_value, run_combined_step, split_batch
from fleet.framework.tensor import LoDTensor, SparseRows
from strategies import BuildStrategy, ExecutionStrategy
from strategies._env import read_cpu_num


def _compute_part(runner, part):
    """A replica's forward and backward ops on its part of the batch; returns its examples."""
    runner.local.update(part)
    runner.run(optimize=False)
    return batch_size(part) if part else 1


def check_cpu_places(places, fix):
    """Returns ``places`` (one place or a list) as a non-empty list of CPUPlaces (the GPU
    places of fleet.fluid are CPUPlaces that run on the CPU).

    Raises:
        ConfigError: an empty list or a place that is not a CPUPlace; ``fix`` says what
            to pass instead.
    """
    places = list(places) if isinstance(places, (list, tuple)) else [places]
    if not places or any(not isinstance(p, CPUPlace) for p in places):
        raise ConfigError(f"places={places!r}: fleet runs on CPUs only; pass {fix}")
    return places


class CompiledProgram:
    """A program prepared for data-parallel running (Paddle's
    ``fluid.compiler.CompiledProgram``).

    Args:
        program_or_graph: the Program to run (fleet has no separate graph type).
        build_strategy: a ``BuildStrategy`` (``with_data_parallel`` may replace it).

    Raises:
        TypeError: ``program_or_graph`` is not a Program (Paddle's message).
    """

    def __init__(self, program_or_graph, build_strategy=None):
        if not isinstance(program_or_graph, Program):
            raise TypeError("The type of program_to_graph parameter is wrong, expected Graph or "
                            f"Program, but received {type(program_or_graph)}")
        _check_type(build_strategy, BuildStrategy, "build_strategy")
        self._program = program_or_graph
        self._build_strategy = build_strategy
        self._exec_strategy = None
        self._is_data_parallel = False
        self._loss_name = None
        self._places = None
        self._share_vars_from = None
        self._state = None  # (plan, scope, runners) of the last run
        self._lock = threading.Lock()

    def with_data_parallel(self, loss_name=None, build_strategy=None, exec_strategy=None,
                           share_vars_from=None, places=None):
        """Makes this program run on several CPU replicas.

        Args:
            loss_name: the loss variable's name; required when the program trains
                (Paddle's rule).
            build_strategy: how the replicas' gradients combine (both ReduceStrategy values
                give one update from the combined gradient here).
            exec_strategy: ``num_threads`` runs the replicas (default: CPU_NUM).
            share_vars_from: another data-parallel CompiledProgram whose parameters this
                one uses (fleet replicas always share the scope's parameters; accepted
                for Paddle scripts, checked as Paddle checks it).
            places: a list of ``CPUPlace`` (one replica each); default CPU_NUM replicas.

        Returns:
            self.

        Raises:
            ConfigError: compiled twice, a training program without ``loss_name``, a
                wrong strategy type, or a place that is not a CPUPlace.
        """
        if self._is_data_parallel:
            raise ConfigError("Already compiled with parallel, cannot be recompiled.")
        _check_type(build_strategy, BuildStrategy, "build_strategy")
        _check_type(exec_strategy, ExecutionStrategy, "exec_strategy")
        if share_vars_from is not None and not isinstance(share_vars_from, CompiledProgram):
            raise ConfigError(f"share_vars_from must be a CompiledProgram, got {type(share_vars_from).__name__}")
        if share_vars_from is not None and not share_vars_from._is_data_parallel:
            raise ConfigError("The shared Program is not data parallel, cannot share variables from it.")
        if places is not None:
            places = check_cpu_places(places, "[fluid.CPUPlace()] * n or leave places=None (CPU_NUM replicas)")
        if isinstance(loss_name, Variable):
            loss_name = loss_name.name
        if loss_name is None and _has_backward(self._program):
            raise ConfigError("The loss name of CompiledProgram is None. The loss name should be set "
                              "if CompiledProgram contains backward part.")
        if build_strategy is not None:
            self._build_strategy = build_strategy
        self._exec_strategy = exec_strategy
        self._loss_name = loss_name
        self._share_vars_from = share_vars_from
        self._places = places
        self._is_data_parallel = True
        return self

    @property
    def program(self):
        """The Program this runs."""
        return self._program

    def replica_count(self):
        """Replicas a step is split across: len(places), else CPU_NUM (default 1).

        Raises:
            ConfigError: CPU_NUM is not a positive int.
        """
        if not self._is_data_parallel:
            return 1
        return len(self._places) if self._places else read_cpu_num()

    def _threads(self, replicas):
        strategy = self._exec_strategy
        wanted = strategy.num_threads if strategy is not None else replicas
        return max(1, min(int(wanted), replicas))

    # ------------------------------------------------------------- running
    def _run(self, executor, feed, fetch_list, scope, return_numpy, return_merged):
        """One step (called by ``Executor.run``); see the module docstring."""
        replicas = self.replica_count()
        # on a distributed worker, a program built before minimize runs as the runtime says
        plan = executor._plan(program_to_run(self._program))
        with self._lock:
            runners = self._runners(plan, scope, replicas)
            parts = self._split(feed, replicas)
            active = runners[:len(parts)]
            group = (id(self), object())  # metric ops count the parts of one batch once
            for r in active:
                r.step_group = group if len(active) > 1 else None
            try:
                pool = self._state[3] if len(active) > 1 else None
                _, sizes = run_combined_step(active, parts, _compute_part, plan.grad_names, split=True,
                                             map_parts=map if pool is None else pool.map)
                if plan.trains and any(parts):
                    scope.record_training(sum(sizes))
                return self._fetch(active, fetch_list, return_numpy, return_merged)
            finally:
                for r in active:
                    for name in list(r.local):  # a later run must not see this run's values
                        if name in plan.data_vars:
                            del r.local[name]

    def _runners(self, plan, scope, replicas):
        state = self._state
        if state is None or state[0] is not plan or state[1] is not scope or len(state[2]) != replicas:
            runners = [Runner(plan, scope.new_scope()) for _ in range(replicas)]
            pool = concurrent.futures.ThreadPoolExecutor(self._threads(replicas),
                                                         thread_name_prefix="fleet-replica")
            if state is not None:
                state[3].shutdown(wait=True)
            self._state = state = (plan, scope, runners, pool)
        return state[2]

    def _split(self, feed, replicas):
        block = self._program.global_block()
        if feed is None:
            feed = {}
        if isinstance(feed, (list, tuple)):  # one dict per replica, already split
            if len(feed) != replicas:
                raise DataError(f"feed is a list of {len(feed)} dicts but the program runs on {replicas} "
                                f"replicas (CPU_NUM or places); give one dict per replica or one dict "
                                f"to split")
            return [self._convert(block, part) for part in feed]
        whole = self._convert(block, feed)
        if not whole:
            return [whole]
        n = batch_size(whole)
        if n < replicas:
            raise DataError(f"the fed batch has {n} examples, fewer than the {replicas} replicas it is "
                            f"split across (CPU_NUM); feed at least {replicas} examples, or lower CPU_NUM")
        return split_batch(whole, replicas)

    @staticmethod
    def _convert(block, feed):
        if not isinstance(feed, dict):
            raise DataError(f"feed must be a dict of {{name: value}} (or a list of them, one per replica), "
                            f"got {type(feed).__name__}")
        out = {}
        for name, value in feed.items():
            if isinstance(name, Variable):
                name = name.name
            var = block.vars.get(name)
            if var is None:
                raise DataError(f"feed {name!r} is not a variable of this program; its inputs are "
                                f"{sorted(n for n, v in block.vars.items() if v.is_data) or 'none'}")
            out[name] = feed_value(var, value)
        return out

    def _fetch(self, runners, fetch_list, return_numpy, return_merged):
        out = []
        for item in fetch_list or []:
            name = item.name if isinstance(item, Variable) else item
            if not isinstance(name, str):
                raise ConfigError(f"fetch_list entries are variables or names, got {item!r}")
            values = []
            for r in runners:
                value = r.value(name)
                if value is None:
                    raise ConfigError(f"cannot fetch {name!r}: no op of this program produced it and it "
                                      f"is not in the scope; fetch a variable of the program you run")
                values.append(_as_array(value) if return_numpy or return_merged else value)
            if len(values) == 1:
                out.append(values[0] if return_merged else values)
            elif return_merged:
                out.append(_merge(name, values))
            else:
                out.append(values)
        return out

    def close(self):
        """Stops the replicas' threads (the program can run again afterwards)."""
        with self._lock:
            if self._state is not None:
                self._state[3].shutdown(wait=True)
                self._state = None


def _merge(name, values):
    if any(v.ndim == 0 for v in values):
        return np.stack(values)
    try:
        return np.concatenate(values, axis=0)
    except ValueError as e:
        raise DataError(f"cannot merge the replicas' values of {name!r} (shapes "
                        f"{[list(v.shape) for v in values]}): pass return_merged=False to get one value "
                        f"per replica") from e


def _as_array(value):
    if isinstance(value, LoDTensor):
        return np.array(value.values)
    if isinstance(value, SparseRows):
        return value.to_dense()
    return np.array(value)


def _check_type(value, cls, what):
    if value is not None and not isinstance(value, cls):
        raise ConfigError(f"{what} must be a fluid.{cls.__name__} (strategies.{cls.__name__}), got "
                          f"{type(value).__name__}")


def _has_backward(program):
    return any(op.type.endswith("_grad") for op in program.global_block().ops)


class ParallelExecutor:
    """Paddle's ``fluid.ParallelExecutor``: runs ``main_program`` data-parallel on CPU_NUM
    replicas (a ``CompiledProgram`` run by an ``Executor``).

    Args:
        use_cuda: True runs on the CPU too (fleet has no GPU kernels; a warning says so).
        loss_name: the loss variable's name (required to train).
        main_program: the program (default: the default main program).
        share_vars_from: another ParallelExecutor (parameters are shared in any case).
        exec_strategy / build_strategy: as ``CompiledProgram.with_data_parallel``.
        num_trainers / trainer_id: Paddle's NCCL2 (GPU) settings; only 1 / 0.
        scope: where parameters live (default: the global scope).

    Raises:
        ConfigError: num_trainers > 1, or a bad strategy.
        TypeError: share_vars_from is not a ParallelExecutor (Paddle's message).
    """

    def __init__(self, use_cuda, loss_name=None, main_program=None, share_vars_from=None,
                 exec_strategy=None, build_strategy=None, num_trainers=1, trainer_id=0, scope=None):
        if use_cuda:
            say_on_the_cpu("ParallelExecutor(use_cuda=True)")
        if num_trainers != 1 or trainer_id != 0:
            raise ConfigError(f"ParallelExecutor(num_trainers={num_trainers}, trainer_id={trainer_id}) is "
                              f"Paddle's NCCL2 (GPU) mode, which fleet does not run; train across "
                              f"processes with fleet.distributed_optimizer or fluid.DistributeTranspiler")
        if share_vars_from is not None and not isinstance(share_vars_from, ParallelExecutor):
            raise TypeError("share_vars_from must be ParallelExecutor.")
        from fleet.framework.executor import Executor  # noqa: PLC0415 (executor imports this module)

        program = main_program if main_program is not None else default_main_program()
        self._compiled = CompiledProgram(program).with_data_parallel(
            loss_name=loss_name, build_strategy=build_strategy, exec_strategy=exec_strategy,
            share_vars_from=share_vars_from._compiled if share_vars_from is not None else None)
        self._exe = Executor()
        self._scope = scope

    @property
    def device_count(self):
        """The number of replicas (CPU_NUM)."""
        return self._compiled.replica_count()

    def run(self, fetch_list, feed=None, feed_dict=None, return_numpy=True):
        """Runs one step; ``feed`` is split across the replicas (a dict), or gives each
        replica its own part (a list of dicts). Returns the fetched values, each the
        replicas' values concatenated along dim 0.

        Raises:
            DataError: a batch with fewer examples than replicas, or a feed list of the
                wrong length.
        """
        if feed is None and feed_dict is not None:
            feed = feed_dict
        return self._exe.run(self._compiled, feed=feed, fetch_list=fetch_list, scope=self._scope,
                             return_numpy=return_numpy)

    def drop_local_exe_scopes(self):
        """Drops the replicas' temporaries (they are made again on the next run)."""
        self._compiled.close()
