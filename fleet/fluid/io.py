"""Paddle 1.x's ``fluid.io``: saving and loading variables and inference models.

Saves are fleet's (``fleet.framework.io``): written to a temporary directory and renamed
into place when complete, one file per variable named as the variable (or all in
``filename``), with ``MANIFEST.json`` holding every checksum. So a save replaces
``dirname`` as a whole, where Paddle adds files into it (save the inference model and the
parameters in one call), and a load checks every file.

A distributed trainer's program (``fleet.main_program``, or
``DistributeTranspiler.get_trainer_program()``) saves and loads through its runtime, as
``fleet.save_persistables`` does: parameters pulled whole from the servers.
"""
import os
import threading

import numpy as np

from fleet.base import Fleet, check_saved_filename
from fleet.errors import ConfigError, DataError, EOFException
from fleet.framework import inference
from fleet.framework import io as fio
from fleet.framework.compiler import check_cpu_places
from fleet.framework.executor import Executor, start_reader, stop_reader
from fleet.framework.program import Parameter, Program, Variable, default_main_program
from fleet.framework.scope import global_scope

__all__ = ["save_vars", "save_params", "save_persistables", "load_vars", "load_params",
           "load_persistables", "save_inference_model", "load_inference_model", "is_parameter",
           "is_persistable", "DataLoader", "PyReader"]


def is_parameter(var):
    """True for a trainable parameter (Paddle's ``fluid.io.is_parameter``)."""
    return isinstance(var, Parameter)


def is_persistable(var):
    """True for a variable kept across steps: parameters, optimizer state, metric state."""
    return bool(var.persistable) and not var.is_data


def _program(main_program):
    program = default_main_program() if main_program is None else main_program
    if type(program).__name__ == "CompiledProgram":
        program = program.program
    if not isinstance(program, Program):
        raise TypeError(f"main_program should be a Program, got {type(program).__name__}")
    return program


def _check_executor(executor):
    if not isinstance(executor, Executor):
        raise TypeError(f"executor must be a fluid.Executor, got {type(executor).__name__}")


def _select(program, vars, predicate):
    if vars is not None:
        names = [v.name if isinstance(v, Variable) else v for v in vars]
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise ConfigError(f"vars must be Variables or names, got {bad[:3]}")
        return names
    predicate = predicate or (lambda v: True)
    return [v.name for v in program.list_vars() if predicate(v)]


def save_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None):
    """Saves the variables ``vars`` (or those of ``main_program`` ``predicate`` accepts)
    from the global scope to ``dirname``, atomically.

    Args:
        executor: a fluid.Executor.
        dirname: the directory to write (replaced as a whole).
        main_program: where variables are chosen (default: the default main program).
        vars: Variables or names to save (instead of ``predicate``).
        predicate: var -> bool.
        filename: one file for every variable (default: a file per variable).

    Returns:
        The directory written.

    Raises:
        ConfigError: a chosen variable has no value (run the startup program first), or
            on a distributed worker lives only on the servers (save_persistables pulls it).
    """
    _check_executor(executor)
    program = _program(main_program)
    names = _select(program, vars, predicate)
    scope = global_scope()
    runtime = _runtime(program)
    held = runtime.server_held() if runtime is not None else set()
    arrays = {}
    for name in names:
        value = scope.value(name)
        if value is None and name in held:
            raise ConfigError(f"cannot save {name!r} from this worker: it lives on the servers; "
                              f"fluid.io.save_persistables(exe, dirname, program) pulls it whole")
        if value is None:
            raise ConfigError(f"cannot save {name!r}: it has no value in the global scope; run the startup "
                              f"program (and train) before saving")
        arrays[name] = np.asarray(value)
    return fio.write_vars(dirname, arrays, {"kind": "vars", "mode": "local"}, filename)


def save_params(executor, dirname, main_program=None, filename=None):
    """Saves the parameters of ``main_program`` (not the optimizer state)."""
    return save_vars(executor, dirname, main_program, predicate=is_parameter, filename=filename)


def save_persistables(executor, dirname, main_program=None, filename=None):
    """Saves every persistable variable of ``main_program`` (parameters, optimizer and
    metric state), as ``fleet.save_persistables``; a distributed trainer's program pulls
    the parameters from the servers."""
    _check_executor(executor)
    program = _program(main_program)
    runtime = _runtime(program)
    if runtime is not None:
        meta = {"kind": "persistables"}
        return runtime.save_persistables(dirname, program, meta, filename)
    return Fleet().save_persistables(executor, dirname, program, filename=filename)


def load_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None):
    """Loads the variables ``vars`` (or those of ``main_program`` ``predicate`` accepts)
    saved in ``dirname`` into the global scope (in place where an array of that shape
    exists).

    Returns:
        The names loaded.

    Raises:
        ConfigError: a chosen variable is not in the save, or ``filename`` is not the
            save's layout. DataError: a damaged file.
    """
    _check_executor(executor)
    program = _program(main_program)
    check_saved_filename(dirname, filename)
    names = _select(program, vars, predicate)
    saved = fio.read_manifest(dirname)["vars"]
    missing = [n for n in names if n not in saved]
    if missing:
        raise ConfigError(f"{dirname!r} lacks {missing[:5]}: it was saved from a different model or "
                          f"with other variables")
    values = fio.read_vars(dirname, names)
    scope = global_scope()
    for name, value in values.items():
        current = scope.value(name)
        if isinstance(current, np.ndarray) and current.shape == value.shape:
            current[...] = value
        else:
            scope[name] = np.array(value)
    return sorted(values)


def load_params(executor, dirname, main_program=None, filename=None):
    """Loads the parameters of ``main_program`` saved in ``dirname``."""
    return load_vars(executor, dirname, main_program, predicate=is_parameter, filename=filename)


def load_persistables(executor, dirname, main_program=None, filename=None):
    """Loads every persistable variable of ``main_program``, as ``fleet.load_persistables``
    (a distributed trainer's program loads only what the trainer itself holds)."""
    _check_executor(executor)
    program = _program(main_program)
    runtime = _runtime(program)
    if runtime is not None:
        check_saved_filename(dirname, filename)
        return runtime.load_persistables(dirname, program)
    return Fleet().load_persistables(executor, dirname, program, filename)


def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None,
                         model_filename=None, params_filename=None, export_for_deployment=True,
                         program_only=False):
    """Saves the program pruned to ``target_vars`` with the parameters it reads (Paddle's
    ``fluid.io.save_inference_model``; note the argument order: dirname first).

    Returns:
        The names of the fetch targets, as Paddle's (fleet's ``__model__`` is its own
        JSON format).
    """
    _check_executor(executor)
    program = _program(main_program)
    runtime = _runtime(program)
    if runtime is not None:  # prune the program as built, before its ops were split for servers
        pruned, feeds, fetches = inference.inference_program(_origin(program), feeded_var_names, target_vars,
                                                             export_for_deployment)
        runtime.save_inference_model(dirname, pruned, feeds, fetches, model_filename, params_filename,
                                     program_only)
        return list(fetches)
    return inference.save_inference_model(dirname, feeded_var_names, target_vars, program,
                                          export_for_deployment=export_for_deployment,
                                          model_filename=model_filename, params_filename=params_filename,
                                          program_only=program_only)


def load_inference_model(dirname, executor, model_filename=None, params_filename=None,
                         pserver_endpoints=None):
    """Loads an inference model: returns [program, feed_names, fetch_targets].

    Raises:
        ConfigError: ``pserver_endpoints`` given (a saved fleet model holds its tables, so
            predicting needs no servers), or not an inference model.
    """
    if pserver_endpoints is not None:
        raise ConfigError("load_inference_model(pserver_endpoints=...): a fleet inference model holds "
                          "its distributed tables, so it predicts without servers; drop the argument")
    if not os.path.isdir(dirname):
        raise ConfigError(f"There is no directory named '{dirname}'")
    return inference.load_inference_model(dirname, executor, model_filename, params_filename)


def _runtime(program):
    """The distributed worker runtime behind ``program``, or None for a local program."""
    runtime = getattr(program, "_fleet_runtime", None)
    if runtime is not None:
        return runtime
    from fleet.base import fleet  # the fleet API's singleton

    ours = fleet._runtime
    if ours is not None and getattr(ours, "program", None) is program:
        return ours
    return None


def _origin(program):
    """The program a distributed trainer's program was made from (before minimize split it)."""
    origin = getattr(program, "_fleet_origin_program", None)
    if origin is not None:
        return origin
    from fleet.base import fleet

    return fleet._origin_program or program


class DataLoader:
    """Paddle 1.8's ``fluid.io.DataLoader``: ``from_generator``, iterable or not."""

    @staticmethod
    def from_generator(feed_list=None, capacity=None, use_double_buffer=True, iterable=True, return_list=False,
                       use_multiprocess=False, drop_last=True):
        """A loader that turns a Python reader into feed dicts for ``exe.run``::

            loader = fluid.io.DataLoader.from_generator(feed_list=[x, y], capacity=16)
            loader.set_sample_list_generator(paddle_batched_reader, places=fluid.cpu_places())
            for data in loader():
                exe.run(program, feed=data, fetch_list=[loss])

        Each item is a list with one feed dict per place (consecutive batches go to
        consecutive places; a trailing group with fewer batches than places is dropped
        when ``drop_last``): ``exe.run`` takes a one-dict list for a Program and one dict
        per replica for a data-parallel CompiledProgram.

        With ``iterable=False`` (Paddle's start / reset mode) the loop does not feed::

            loader.start()
            try:
                while True:
                    exe.run(program, fetch_list=[loss])   # takes the loader's next batch
            except fluid.core.EOFException:
                loader.reset()

        ``exe.run`` without a feed takes the next item of the newest started loader
        whose inputs the program has, and raises ``fluid.core.EOFException`` when there
        is none left.

        Args:
            feed_list: the input Variables, in the order a sample lists its values.
            capacity: batches Paddle buffers ahead (an int > 0); fleet makes each batch
                when the loop asks for it, in the loop's thread, so nothing is buffered.
            use_double_buffer, use_multiprocess: accepted (no device copies to overlap).
            iterable: False for the start() / reset() mode above.
            return_list: must be False (lists of arrays are for Paddle's dygraph mode).
            drop_last: see above.

        Raises:
            ConfigError: return_list=True, no feed_list, or a capacity that is not a
                positive int.
        """
        return GeneratorLoader(feed_list, capacity, iterable, return_list, drop_last)


class GeneratorLoader:
    """What ``DataLoader.from_generator`` returns (see there). Iterate it (``loader()`` or
    ``loader``), or with iterable=False start() it and run without a feed, from one thread
    at a time."""

    def __init__(self, feed_list, capacity, iterable, return_list, drop_last):
        if return_list:
            raise ConfigError("DataLoader.from_generator(return_list=True) gives lists of arrays for dygraph "
                              "mode, which fleet does not have; pass return_list=False (feed dicts)")
        if not feed_list:
            raise ConfigError("DataLoader.from_generator needs feed_list: the input Variables, in the order a "
                              "sample lists its values")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ConfigError(f"DataLoader.from_generator(capacity={capacity!r}): The capacity must be greater "
                              f"than 0.")
        from fleet.fluid.data_feeder import DataFeeder

        self._feeder = DataFeeder(feed_list)
        self._names = [v.name for v in self._feeder.feed_vars]
        self._drop_last = bool(drop_last)
        self._batches = None
        self._places = 1
        self._iterable = bool(iterable)
        self._running = None  # between start() and reset(): the iterator of items, or the end
        self._lock = threading.Lock()

    @property
    def feed_names(self):
        """The names of the inputs it feeds."""
        return list(self._names)

    def start(self):
        """Starts a non-iterable loader: until reset(), ``exe.run`` without a feed takes its
        next batch (and raises fluid.core.EOFException after the last).

        Raises:
            ConfigError: the loader is iterable, or was started and not reset. (One
                without data fails at the first run that reads it.)
        """
        if self._iterable:
            raise ConfigError("start() is for a loader made with iterable=False; iterate this one: for data in "
                              "loader(): exe.run(program, feed=data)")
        with self._lock:
            if self._running is not None:
                raise ConfigError("this loader was started already; call reset() after its EOFException (or "
                                  "to stop early) before start()")
            self._running = iter(self)
        start_reader(self)

    def reset(self):
        """Stops a non-iterable loader (after its EOFException, or early): ``exe.run``
        without a feed no longer reads it; start() reads the data again from the start."""
        stop_reader(self)
        with self._lock:
            running, self._running = self._running, None
        if running is not None:
            running.close()  # the generator of items

    def next_feed(self):
        """The next item of a started loader (one dict, or one per place).

        Raises:
            fluid.core.EOFException: no item is left (call reset()).
        """
        with self._lock:
            if self._running is None:
                raise ConfigError("this loader is not started; call start() first")
            item = next(self._running, None)
        if item is None:
            raise EOFException("There is no next data: the loader's generator is exhausted; call reset() "
                               "(then start() to read it again)")
        return item if len(item) > 1 else item[0]

    def _set(self, batches, places):
        if places is not None:
            self._places = len(check_cpu_places(places, "fluid.cpu_places() or fluid.CPUPlace()"))
        self._batches = batches
        return self

    def set_sample_generator(self, reader, batch_size, drop_last=True, places=None):
        """``reader()`` yields samples (one value per input); they are grouped into
        batches of ``batch_size`` (a shorter last batch is dropped when ``drop_last``)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"set_sample_generator(batch_size={batch_size!r}) must be an int >= 1")

        def batches():
            batch = []
            for sample in reader():
                batch.append(sample)
                if len(batch) == batch_size:
                    yield self._feeder.feed(batch)
                    batch = []
            if batch and not drop_last:
                yield self._feeder.feed(batch)

        return self._set(batches, places)

    def set_sample_list_generator(self, reader, places=None):
        """``reader()`` yields batches as lists of samples (what ``paddle.batch`` makes)."""
        return self._set(lambda: (self._feeder.feed(samples) for samples in reader()), places)

    def set_batch_generator(self, reader, places=None):
        """``reader()`` yields batches as one array (or LoDTensor, or list of sequences)
        per input, in ``feed_list`` order.

        Raises:
            DataError: a batch with another number of values than inputs.
        """
        def batches():
            for i, batch in enumerate(reader()):
                if isinstance(batch, dict):
                    yield batch
                    continue
                if len(batch) != len(self._names):
                    raise DataError(f"batch {i} of the batch generator has {len(batch)} values but feed_list "
                                    f"has {len(self._names)} inputs {self._names}")
                yield dict(zip(self._names, batch))

        return self._set(batches, places)

    def __call__(self):
        if not self._iterable:
            raise ConfigError("this loader was made with iterable=False: call start(), run the program without a "
                              "feed until fluid.core.EOFException, then reset()")
        return iter(self)

    def __iter__(self):
        if self._batches is None:
            raise ConfigError("this DataLoader has no data: call set_sample_generator, set_sample_list_generator "
                              "or set_batch_generator first")
        group = []
        for feed in self._batches():
            group.append(feed)
            if len(group) == self._places:
                yield group
                group = []
        if group and not self._drop_last:
            yield group


class PyReader(GeneratorLoader):
    """Paddle 1.x's ``fluid.io.PyReader(feed_list, capacity, use_double_buffer, iterable,
    return_list)``: a DataLoader.from_generator with PyReader's method names
    (``decorate_sample_generator``, ``decorate_sample_list_generator``,
    ``decorate_batch_generator``); iterable by default, start() / reset() with
    iterable=False (see DataLoader.from_generator)."""

    def __init__(self, feed_list=None, capacity=None, use_double_buffer=True, iterable=True, return_list=False):
        super().__init__(feed_list, capacity, iterable, return_list, drop_last=True)

    def decorate_sample_generator(self, sample_generator, batch_size, drop_last=True, places=None):
        return self.set_sample_generator(sample_generator, batch_size, drop_last, places)

    def decorate_sample_list_generator(self, reader, places=None):
        return self.set_sample_list_generator(reader, places)

    def decorate_batch_generator(self, reader, places=None):
        return self.set_batch_generator(reader, places)
