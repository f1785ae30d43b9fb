"""Datasets as in Paddle Fleet 1.x: DatasetFactory, QueueDataset and InMemoryDataset.

A dataset is configured with setters, then handed to ``Executor.train_from_dataset``,
which opens a pass with ``dataset._open_pass(consumers)`` (docs/internals.md).

Configure a dataset from one thread; passes it opens may be consumed from many.
"""
import operator
import os
import shlex

import numpy as np

from fleet.dataset.block import ExampleBlock
from fleet.dataset.memory import Loader, MemorySource
from fleet.dataset.pipeline import PassConfig, StreamSource
from fleet.dataset.reader import DEFAULT_FS_COMMAND, is_remote
from fleet.dataset.shuffle import shuffle_globally, shuffle_locally, sum_over_workers
from fleet.dataset.slots import check_criteo_layout, slots_from_vars
from fleet.errors import ConfigError

DATA_FORMATS = ("multislot", "criteo")
DEFAULT_HASH_DIM = 1000001
DEFAULT_LOAD_TIMEOUT = 600.0


def _positive_int(value, what):
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigError(f"{what} must be a positive int, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return int(number)


class DatasetBase:
    """Settings shared by both datasets. Create datasets with ``DatasetFactory``.

    Attributes:
        thread_num: producer threads (and, by default, training threads), set_thread's value.
    """

    def __init__(self):
        self.thread_num = 1
        self._batch_size = 32
        self._slots = None
        self._filelist = None
        self._pipe_command = None
        self._queue_num = None
        self._data_format = "multislot"
        self._hash_dim = DEFAULT_HASH_DIM
        self._skip_bad_lines = False
        self._fs_command = DEFAULT_FS_COMMAND
        self._download_cmd = None

    def set_use_var(self, var_list):
        """Declares the variables each line fills, in order (one slot each).

        Args:
            var_list: variables from ``layers.data``; dtype float32 or int64, lod_level
                0 (dense: a fixed number of values) or 1 (a sequence of any length >= 1).

        Raises:
            ConfigError (a ValueError): Paddle's "Currently, fluid.dataset only supports
                dtype=float32 and dtype=int64" for other dtypes, or another bad variable.
        """
        self._slots = slots_from_vars(var_list)

    def set_batch_size(self, batch_size):
        """Examples per batch (a positive int, default 32). The last batch may be smaller."""
        self._batch_size = _positive_int(batch_size, "batch_size")

    def set_thread(self, thread_num):
        """Producer threads, at most one per file (a positive int, default 1)."""
        self.thread_num = _positive_int(thread_num, "thread_num")

    def set_filelist(self, filelist):
        """The files to read, each by one producer thread at a time.

        Raises:
            ConfigError: not a list of paths. (Missing files are reported when a pass
                starts.)
        """
        if not isinstance(filelist, (list, tuple)) or not all(
                isinstance(f, (str, os.PathLike)) for f in filelist):
            raise ConfigError(
                f"set_filelist takes a list of file paths (str), got {filelist!r}")
        self._filelist = [os.fspath(f) for f in filelist]

    def set_pipe_command(self, pipe_command):
        """Runs each file through ``sh -c pipe_command`` (the file on its stdin).

        Its stdout is parsed in the dataset's data format (MultiSlot text by default). A
        command that exits non-zero fails the pass with a DataError naming the command,
        the file, the exit code and the end of its stderr. Without a pipe command files
        are read directly, which is what Paddle's default "cat" does.
        """
        if not isinstance(pipe_command, str) or not pipe_command.strip():
            raise ConfigError(f"pipe_command must be a non-empty shell command, got {pipe_command!r}")
        self._pipe_command = pipe_command

    def set_hdfs_config(self, fs_name, fs_ugi):
        """Where files named ``hdfs:...`` or ``afs:...`` are read from, as in Paddle: such a
        file is read by ``hadoop fs -D fs.default.name=<fs_name> -D hadoop.job.ugi=<fs_ugi>
        -text "<file>"`` (the Hadoop client must be on PATH), unless set_download_cmd
        gives another command. Local files are read as they are.

        Raises:
            ConfigError: fs_name or fs_ugi is not a str.
        """
        for what, value in (("fs_name", fs_name), ("fs_ugi", fs_ugi)):
            if not isinstance(value, str):
                raise ConfigError(f"set_hdfs_config {what} must be a str, got {value!r}")
        options = "".join(f" -D {key}={shlex.quote(value)}" for key, value in
                          (("fs.default.name", fs_name), ("hadoop.job.ugi", fs_ugi)) if value)
        self._fs_command = DEFAULT_FS_COMMAND + options

    def set_download_cmd(self, download_cmd):
        """Reads each ``hdfs:...`` / ``afs:...`` file through ``sh -c '<download_cmd>
        "<file>"'`` (its stdout is the file's text; Paddle's customized download command,
        e.g. a client of your storage) instead of ``hadoop fs -text``. The pipe command,
        if any, gets that text. A command that exits non-zero fails the pass, naming it.

        Raises:
            ConfigError: not a non-empty str.
        """
        if not isinstance(download_cmd, str) or not download_cmd.strip():
            raise ConfigError(f"download_cmd must be a non-empty shell command, got {download_cmd!r}")
        self._download_cmd = download_cmd

    def set_queue_num(self, queue_num):
        """Capacity, in batches, of the queue between producers and training threads.

        Default: ``max(4, 2 * max(thread_num, training threads))``. (Passes of an
        InMemoryDataset read from memory and use no queue.)
        """
        self._queue_num = _positive_int(queue_num, "queue_num")

    def set_data_format(self, data_format, hash_dim=DEFAULT_HASH_DIM):
        """Chooses the text format: "multislot" (Paddle's, the default) or "criteo".

        "criteo" reads raw Criteo lines (label, I1..I13, C1..C26, tab-separated, empty
        fields allowed) into 28 variables given to set_use_var in this order: dense
        float32 [13] (Paddle's normalisation (x - min) / diff, empty -> 0), 26 int64
        lod_level=1 slots holding ``splitmix64((k << 33) | int(C_k, 16)) % hash_dim``
        (2**32 for an empty field; docs/internals.md) and the int64 label [1].

        Raises:
            ConfigError: unknown format or a hash_dim that is not a positive int.
        """
        if data_format not in DATA_FORMATS:
            raise ConfigError(
                f"data format {data_format!r} is not supported; choose one of {list(DATA_FORMATS)}")
        hash_dim = _positive_int(hash_dim, "hash_dim")
        if hash_dim >= 1 << 63:
            raise ConfigError(f"hash_dim must be below 2**63, got {hash_dim}")
        self._data_format = data_format
        self._hash_dim = hash_dim

    def set_skip_bad_lines(self, skip=True):
        """With True, malformed lines are skipped and counted instead of failing the pass.

        The count is in the pass's ``report()["bad_lines_skipped"]`` and logged (with the
        first bad line's message) at the end of the pass. Default False: the first bad
        line raises DataError naming file, line and field.
        """
        if not isinstance(skip, bool):
            raise ConfigError(f"set_skip_bad_lines takes True or False, got {skip!r}")
        self._skip_bad_lines = skip

    def desc(self):
        """A text description of the settings, in the shape of Paddle's DataFeedDesc."""
        lines = [f'name: "{self._feed_name}"', f"batch_size: {self._batch_size}",
                 "multi_slot_desc {"]
        for slot in self._slots or []:
            kind = "float" if slot.is_float else "uint64"
            lines += ["  slots {", f'    name: "{slot.name}"', f'    type: "{kind}"',
                      f"    is_dense: {str(slot.is_dense).lower()}", "    is_used: true"]
            if slot.is_dense:
                lines += [f"    shape: {d}" for d in slot.shape]
            lines.append("  }")
        lines += ["}", f'pipe_command: "{self._pipe_command or "cat"}"',
                  f'data_format: "{self._data_format}"']
        return "\n".join(lines) + "\n"

    def batches(self, timeout=600.0):
        """Yields one pass over the data as feed dicts, in the calling thread.

        For evaluation loops: ``for feed in dataset.batches(): exe.run(test_program,
        feed=feed, ...)``. Producer threads still parse ahead; leaving the loop early stops
        them.

        Args:
            timeout: seconds to wait for a batch before the error naming the stuck files.
        """
        return _iterate(self, timeout)

    def _describe_empty_pass(self, report):
        """Why a pass over this dataset ran no example, for the trainer's DataError."""
        files = self._filelist or []
        if not files:
            return f"the dataset's file list is empty (set_filelist([])); {_SPLIT_HINT}"
        lines = _lines_phrase(report.get("lines", 0), report.get("bad_lines_skipped", 0))
        return f"the dataset's {_files_phrase(files)} held {lines}; {_CHECK_HINT}"

    def _pass_config(self, threads=None):
        """Checks the settings and freezes them for one pass or load."""
        if self._slots is None:
            raise ConfigError("the dataset has no variables; call set_use_var(var_list) first")
        if self._filelist is None:
            raise ConfigError("the dataset has no files; call set_filelist(files) first")
        for path in self._filelist:
            if not is_remote(path) and not os.path.isfile(path):
                raise ConfigError(
                    f"dataset file {path!r} does not exist or is not a file (working directory "
                    f"{os.getcwd()!r}); fix the list given to set_filelist")
        if self._data_format == "criteo":
            check_criteo_layout(self._slots)
        return PassConfig(self._slots, self._batch_size, self._filelist, self._pipe_command,
                          self._data_format, self._hash_dim, self._skip_bad_lines,
                          threads or self.thread_num, fs_command=self._fs_command,
                          download_cmd=self._download_cmd)


_SPLIT_HINT = ("give every worker at least one file (fleet.split_files(files) gives a worker none when there "
               "are fewer files than workers)")
_CHECK_HINT = "check the files (and the pipe command, if one is set)"


def _files_phrase(files):
    """'2 files ['a', 'b']' (at most 3 names shown)."""
    shown = files if len(files) <= 3 else files[:3] + [f"... {len(files) - 3} more"]
    return f"{len(files)} file{'' if len(files) == 1 else 's'} {shown}"


def _lines_phrase(lines, skipped):
    """'0 lines' / '2 lines, every one skipped as malformed (set_skip_bad_lines)'."""
    text = f"{lines} line{'' if lines == 1 else 's'}"
    if lines and skipped >= lines:
        text += ", every one skipped as malformed (set_skip_bad_lines)"
    return text


def _refuse_in_elastic_job():
    """Raises in a worker of an elastic job: its data comes in work units that a
    QueueDataset takes from the servers; an InMemoryDataset would load every file."""
    from fleet.elastic import elastic_range

    limits = elastic_range()
    if limits is None or os.environ.get("TRAINING_ROLE") != "TRAINER":
        return
    raise ConfigError(
        f"InMemoryDataset loads its files whole, but in an elastic job (FLEET_ELASTIC={limits[0]}:{limits[1]}) "
        f"every worker gets the whole file list and takes its share as work units while it trains: use "
        f"DatasetFactory().create_dataset('QueueDataset'), or a fixed --worker_num")


def _iterate(dataset, timeout):
    source = dataset._open_pass(1)
    try:
        while True:
            batch = source.get(timeout)
            if batch is None:
                return
            yield batch
    finally:
        source.close()


class QueueDataset(DatasetBase):
    """Streams the files each pass: producer threads parse while training runs."""

    _feed_name = "MultiSlotDataFeed"

    def _open_pass(self, consumers):
        """Starts a pass for ``consumers`` training threads; returns its source.

        The source's ``get(timeout)`` returns batches until None; ``close()`` stops the
        producers; ``report()`` counts lines, examples, batches, bad lines and files.

        Raises:
            ConfigError: settings missing or a file that does not exist.
        """
        config = self._pass_config()
        capacity = self._queue_num or max(4, 2 * max(config.threads, int(consumers)))
        return StreamSource(config, capacity)

    def _open_elastic_pass(self, consumers, hooks):
        """A training pass of an elastic job: work units from server 0's queue
        (``fleet.dataset.elastic``; ``hooks`` is the program's communicator), or None
        when this worker is not in an elastic job."""
        from fleet.dataset.elastic import open_elastic_pass

        return open_elastic_pass(self, consumers, hooks)

    def local_shuffle(self):
        """Not available: a QueueDataset streams its files."""
        raise NotImplementedError(
            "QueueDataset does not support local shuffle, please use InMemoryDataset for "
            "local_shuffle")

    def global_shuffle(self, fleet=None):
        """Not available: a QueueDataset streams its files."""
        raise NotImplementedError(
            "QueueDataset does not support global shuffle, please use InMemoryDataset for "
            "global_shuffle")


class InMemoryDataset(DatasetBase):
    """Loads the files into memory once; passes, local and global shuffles work on that."""

    _feed_name = "MultiSlotInMemoryDataFeed"

    def __init__(self):
        super().__init__()
        self._block = None
        self._block_slots = None
        self._load_report = None
        self._loader = None
        self._shuffle_seed = None
        self._shuffles = 0
        self._shuffled = 0
        self._loading_files = self._loaded_files = []
        self._fea_eval_size = None  # set_fea_eval's record_candidate_size, None: off
        self._before_slots_shuffle = None  # the examples as loaded or shuffled, for slots_shuffle

    def set_fea_eval(self, record_candidate_size, fea_eval=True):
        """Turns on (or off) Paddle's feature evaluation: ``slots_shuffle`` then shuffles
        a slot's values within pools of ``record_candidate_size`` consecutive examples.

        Raises:
            ConfigError: record_candidate_size is not a positive int or fea_eval not a bool.
        """
        size = _positive_int(record_candidate_size, "record_candidate_size")
        if not isinstance(fea_eval, bool):
            raise ConfigError(f"set_fea_eval fea_eval must be True or False, got {fea_eval!r}")
        self._fea_eval_size = size if fea_eval else None

    def slots_shuffle(self, slots):
        """Shuffles the values of each slot named in ``slots`` between the examples in
        memory (each slot on its own, within pools of set_fea_eval's size), leaving the
        other slots and the labels where they are: a pass's metric then shows how much the
        model relies on those slots (Paddle's feature importance evaluation). Every call
        starts from the examples as loaded or last shuffled by local/global_shuffle, so
        slots are evaluated one call at a time. Reproducible after set_shuffle_seed.

        Raises:
            ConfigError: set_fea_eval(size, True) was not called, nothing is loaded, or a
                name is not one of set_use_var's variables.
        """
        if self._fea_eval_size is None:
            raise ConfigError("slots_shuffle needs feature evaluation on: call "
                              "set_fea_eval(record_candidate_size, True) first")
        if isinstance(slots, str) or not isinstance(slots, (list, tuple, set, frozenset)):
            raise ConfigError(f"slots_shuffle takes a list of slot (variable) names, got {slots!r}")
        self._loaded("slots_shuffle")
        names = [slot.name for slot in self._block_slots]
        unknown = sorted(str(n) for n in slots if n not in names)
        if unknown:
            raise ConfigError(f"slots_shuffle: {unknown} are not slots of this dataset; its slots are {names}")
        if self._before_slots_shuffle is None:
            self._before_slots_shuffle = self._block
        base = self._before_slots_shuffle
        rng = self._rng()
        columns = list(base.columns)
        for i, name in enumerate(names):
            if name not in slots:
                continue
            order = np.arange(base.n, dtype=np.int64)
            for start in range(0, base.n, self._fea_eval_size):
                end = min(start + self._fea_eval_size, base.n)
                order[start:end] = start + rng.permutation(end - start)
            columns[i] = ExampleBlock(base.n, [columns[i]]).take(order).columns[0]
        self._block = ExampleBlock(base.n, columns)

    def set_fleet_send_batch_size(self, fleet_send_batch_size=1024):
        """Paddle's examples per message of global_shuffle's sender; accepted for
        compatibility: fleet's global_shuffle sends each worker's share in one all-to-all.

        Raises:
            ConfigError: not a positive int.
        """
        _positive_int(fleet_send_batch_size, "fleet_send_batch_size")

    def set_fleet_send_sleep_seconds(self, fleet_send_sleep_seconds=0):
        """Paddle's pause between global_shuffle's messages; accepted for compatibility
        (fleet's global_shuffle sends one all-to-all, with nothing to pause between).

        Raises:
            ConfigError: not an int >= 0.
        """
        if isinstance(fleet_send_sleep_seconds, bool) or not isinstance(fleet_send_sleep_seconds, int) \
                or fleet_send_sleep_seconds < 0:
            raise ConfigError(f"fleet_send_sleep_seconds must be an int >= 0, got {fleet_send_sleep_seconds!r}")

    def set_parse_ins_id(self, parse_ins_id):
        """Paddle's instance ids at the start of each line: fleet's MultiSlot lines have
        none, so only False (Paddle's default) is accepted.

        Raises:
            ConfigError: True.
        """
        _only_false(parse_ins_id, "set_parse_ins_id", "lines that start with an instance id")

    def set_parse_content(self, parse_content):
        """Paddle's content field after the instance id: only False (the default) is
        accepted, as set_parse_ins_id.

        Raises:
            ConfigError: True.
        """
        _only_false(parse_content, "set_parse_content", "lines with a content field")

    def set_shuffle_seed(self, seed):
        """Makes local_shuffle and global_shuffle reproducible (None: fresh randomness).

        Successive shuffles of one dataset still differ from each other.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigError(f"shuffle seed must be a non-negative int or None, got {seed!r}")
        self._shuffle_seed = seed

    def _rng(self, worker=0):
        self._shuffles += 1
        if self._shuffle_seed is None:
            return np.random.default_rng()
        return np.random.default_rng([self._shuffle_seed, worker, self._shuffles])

    def load_into_memory(self, timeout=DEFAULT_LOAD_TIMEOUT):
        """Reads every file with ``thread_num`` producer threads; blocks until done.

        Args:
            timeout: seconds without progress after which the load fails.

        Raises:
            ConfigError: settings missing or a missing file.
            DataError: a malformed line (unless skipping) or a failed pipe command.
            FleetTimeoutError: no progress for ``timeout`` seconds (names the files).
        """
        self.preload_into_memory()
        self.wait_preload_done(timeout)

    def preload_into_memory(self, thread_num=None):
        """Starts loading in the background and returns at once; see wait_preload_done.

        Args:
            thread_num: producer threads for this load (default: thread_num).
        """
        if self._loader is not None:
            raise ConfigError("a preload is already running; call wait_preload_done() first")
        _refuse_in_elastic_job()
        threads = None if thread_num is None else _positive_int(thread_num, "thread_num")
        config = self._pass_config(threads)
        self._loader = Loader(config).start()
        self._loading_files = list(config.files)

    def wait_preload_done(self, timeout=DEFAULT_LOAD_TIMEOUT):
        """Blocks until the load started by preload_into_memory ends.

        Args:
            timeout: seconds without progress after which the load is stopped and fails.

        Raises:
            ConfigError: no preload is running.
            DataError, FleetTimeoutError: as for load_into_memory.
        """
        if self._loader is None:
            raise ConfigError("no preload is running; call preload_into_memory() first")
        loader, self._loader = self._loader, None
        self._block, self._load_report = loader.wait(timeout)
        self._before_slots_shuffle = None
        self._block_slots = loader.slots
        self._loaded_files = self._loading_files
        self._shuffled = 0

    def _loaded(self, what):
        if self._loader is not None:
            raise ConfigError(f"{what}: the preload is still running; call wait_preload_done() first")
        if self._block is None:
            raise ConfigError(f"{what}: nothing is loaded; call load_into_memory() first")
        return self._block

    def local_shuffle(self):
        """Permutes the examples in memory (reproducibly after set_shuffle_seed)."""
        self._block = shuffle_locally(self._loaded("local_shuffle"), self._rng())
        self._before_slots_shuffle = None
        self._shuffled = self._block.n

    def global_shuffle(self, fleet=None, thread_num=12):
        """Sends every example to a random worker; each ends with a random share of all.

        A collective call: every worker must call it. Without ``fleet`` it is a local
        shuffle. ``thread_num`` is accepted for compatibility (the exchange is one
        all-to-all of serialized columns).

        Blocks until every worker has taken part (the fleet's exchange timeout applies).

        Raises:
            ConfigError: nothing loaded, or ``fleet`` cannot exchange data.
        """
        block = self._loaded("global_shuffle")
        if fleet is None:
            self.local_shuffle()
            return
        rng = self._rng(int(fleet.worker_index()) + 1)
        self._block = shuffle_globally(block, fleet, rng)
        self._before_slots_shuffle = None
        self._shuffled = self._block.n

    def release_memory(self):
        """Drops the examples in memory."""
        self._block = self._before_slots_shuffle = None
        self._load_report = None
        self._shuffled = 0

    def get_memory_data_size(self, fleet=None):
        """Examples in memory: this worker's, or with ``fleet`` the sum over workers.

        With ``fleet`` this is a collective call (every worker must call it).
        """
        count = 0 if self._block is None else self._block.n
        return count if fleet is None else sum_over_workers(count, fleet, "get_memory_data_size")

    def get_shuffle_data_size(self, fleet=None):
        """Examples held after the last local or global shuffle (0 if none since loading).

        With ``fleet`` the sum over workers (a collective call).
        """
        count = self._shuffled
        return count if fleet is None else sum_over_workers(count, fleet, "get_shuffle_data_size")

    def _describe_empty_pass(self, report):
        load = self._load_report or {}
        lines, skipped = load.get("lines", 0), load.get("bad_lines_skipped", 0)
        if not self._loaded_files:
            return (f"the InMemoryDataset holds 0 examples: its file list was empty when it was loaded "
                    f"(set_filelist([])); {_SPLIT_HINT}")
        if lines and skipped < lines:
            return ("the InMemoryDataset holds 0 examples although its load read some (global_shuffle gave "
                    "this worker none of them)")
        return (f"the InMemoryDataset holds 0 examples: load_into_memory read {_files_phrase(self._loaded_files)}, "
                f"which held {_lines_phrase(lines, skipped)}; {_CHECK_HINT}")

    def _open_pass(self, consumers):
        """A pass over the examples in memory, in their current order; see QueueDataset."""
        block = self._loaded("train_from_dataset")
        return MemorySource(block, self._block_slots, self._batch_size, self._load_report)


def _only_false(value, what, feature):
    if not isinstance(value, bool):
        raise ConfigError(f"{what} takes True or False, got {value!r}")
    if value:
        raise ConfigError(f"{what}(True): fleet's datasets do not read {feature}; leave it False (Paddle's "
                          "default) and give lines of slots only")


class DatasetFactory:
    """Creates datasets by class name, as Paddle's ``fluid.DatasetFactory``."""

    _CLASSES = {"QueueDataset": QueueDataset, "InMemoryDataset": InMemoryDataset}

    def create_dataset(self, datafeed_class="QueueDataset"):
        """Returns a new QueueDataset or InMemoryDataset.

        Raises:
            ConfigError (a ValueError): Paddle's "datafeed class %s does not exist" for an
                unknown name.
        """
        cls = self._CLASSES.get(datafeed_class)
        if cls is None:
            raise ConfigError(
                f"datafeed class {datafeed_class} does not exist; choose one of "
                f"{sorted(self._CLASSES)}")
        return cls()
