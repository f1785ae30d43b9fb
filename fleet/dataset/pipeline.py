"""Producer threads: read files in parallel, parse them, hand batches or blocks on.

``StreamSource`` is a pass of a QueueDataset: batches through a bounded queue. It
implements the executor's contract (docs/internals.md): ``get(timeout)``, ``close()``,
``report()``. ``fleet.dataset.memory`` uses the same producers to load an
InMemoryDataset.
"""
import collections
import logging
import queue
import threading
import time

from fleet.dataset.block import ExampleBlock
from fleet.dataset.parsers import BadLines, CriteoParser, MultiSlotParser
from fleet.dataset.reader import CHUNK_BYTES, DEFAULT_FS_COMMAND, InputStream, kill_process_group, source_command
from fleet.errors import FleetTimeoutError
from fleet.logs import WaitLog

logger = logging.getLogger("fleet.dataset")

POLL = 0.05  # seconds between checks of stop / error flags while blocked
_JOIN_TIMEOUT = 5.0


class PassConfig:
    """What a pass reads, frozen when it starts (setters called later do not affect it)."""

    __slots__ = ("slots", "batch_size", "files", "pipe_command", "data_format", "hash_dim",
                 "skip_bad_lines", "threads", "chunk_bytes", "fs_command", "download_cmd")

    def __init__(self, slots, batch_size, files, pipe_command, data_format, hash_dim,
                 skip_bad_lines, threads, chunk_bytes=CHUNK_BYTES, fs_command=DEFAULT_FS_COMMAND,
                 download_cmd=None):
        self.slots = list(slots)
        self.batch_size = batch_size
        self.files = list(files)
        self.pipe_command = pipe_command
        self.data_format = data_format
        self.hash_dim = hash_dim
        self.skip_bad_lines = skip_bad_lines
        self.threads = threads
        self.chunk_bytes = chunk_bytes
        self.fs_command = fs_command      # how remote files are read (set_hdfs_config)
        self.download_cmd = download_cmd  # or this command (set_download_cmd)

    def make_parser(self):
        if self.data_format == "criteo":
            return CriteoParser(self.slots, self.skip_bad_lines, self.hash_dim)
        return MultiSlotParser(self.slots, self.skip_bad_lines, self.chunk_bytes)


class _Stopped(Exception):
    """Raised inside a producer when its pass was closed."""


class Producers:
    """Up to ``config.threads`` threads, each taking the next unread file from a shared list.

    Each thread parses its file chunk by chunk and calls ``sink.add(file_index, block)``
    on the sink ``make_sink()`` gave it, then ``sink.finish()`` when no file is left.
    The first exception stops every thread; ``error`` holds it. ``on_done`` runs once,
    in the last thread to end. Counters (lines, examples, files_done, bad) are updated
    under a lock and may be read from any thread.
    """

    def __init__(self, config, make_sink, name, on_done):
        self.config = config
        self.error = None
        self.lines = 0
        self.examples = 0
        self.files_done = 0
        self.bad = BadLines()
        self.last_progress = time.monotonic()
        self.stopped = threading.Event()
        self._make_sink = make_sink
        self._on_done = on_done
        self._lock = threading.Lock()
        self._files = collections.deque(enumerate(config.files))
        self._status = {}  # thread name -> [path, line]
        self._procs = set()
        count = min(config.threads, len(config.files))
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(count)]
        self._running = count

    def start(self):
        """Starts the threads (with no files, runs ``on_done`` at once). Does not block."""
        if not self._threads:
            self._on_done(self)
        for t in self._threads:
            t.start()

    def describe_running(self):
        """Names each producer still reading, its file and line, for timeout messages."""
        with self._lock:
            busy = [f"{name} reading {path!r} ({line} lines read)"
                    for name, (path, line) in sorted(self._status.items())]
            waiting = len(self._files)
        if not busy:
            busy = ["none"]
        tail = f"; {waiting} files not started" if waiting else ""
        return ", ".join(busy) + tail

    def stop(self):
        """Stops every thread and kills running pipe commands; joins with a time limit."""
        with self._lock:
            self.stopped.set()
            procs = list(self._procs)
        for proc in procs:
            if proc.returncode is None:
                kill_process_group(proc)
        deadline = time.monotonic() + _JOIN_TIMEOUT
        for t in self._threads:
            if t is not threading.current_thread() and t.ident is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.error("dataset producers %s did not stop within %.0fs", alive, _JOIN_TIMEOUT)

    def _next_file(self, name):
        with self._lock:
            if self.stopped.is_set() or not self._files:
                return None
            index, path = self._files.popleft()
            self._status[name] = [path, 0]
            self.last_progress = time.monotonic()
            return index, path

    def _register(self, proc):
        with self._lock:
            self._procs.add(proc)
            if not self.stopped.is_set():
                return
        kill_process_group(proc)

    def _run(self):
        name = threading.current_thread().name
        try:
            sink = self._make_sink()
            parser = self.config.make_parser()
            while True:
                item = self._next_file(name)
                if item is None:
                    break
                self._read(name, item[0], item[1], parser, sink)
            if not self.stopped.is_set():
                sink.finish()
        except _Stopped:
            pass
        except BaseException as e:  # handed to the consumer, which re-raises it
            with self._lock:
                if self.error is None and not self.stopped.is_set():
                    self.error = e
                self.stopped.set()
                procs = list(self._procs)
            for proc in procs:
                if proc.returncode is None:
                    kill_process_group(proc)
        finally:
            with self._lock:
                self._status.pop(name, None)
                self._running -= 1
                last = self._running == 0
            if last:
                self._on_done(self)

    def _read(self, name, index, path, parser, sink):
        cfg = self.config
        stream = InputStream(path, cfg.pipe_command, on_spawn=self._register,
                             source=source_command(path, cfg.fs_command, cfg.download_cmd))
        try:
            chunks = stream.chunks(self.config.chunk_bytes)
            line_base = 0
            while True:
                if self.stopped.is_set():
                    raise _Stopped()
                got = chunks.next_chunk()
                if got is None:
                    break
                blocks, lines = parser.parse(got[0], got[1], stream.where, line_base, self.bad)
                line_base += lines
                with self._lock:
                    self.lines += lines
                    self.examples += sum(b.n for b in blocks)
                    self._status[name][1] = line_base
                    self.last_progress = time.monotonic()
                for block in blocks:
                    sink.add(index, block)
            if self.stopped.is_set():
                raise _Stopped()
            stream.finish()
            with self._lock:
                self.files_done += 1
        finally:
            stream.close()
            with self._lock:
                self._procs.difference_update(stream.procs)

    def log_summary(self, what):
        """Logs the end of a pass: counts, and bad lines skipped with the first one."""
        logger.info("%s: %d files, %d lines, %d examples, %d bad lines skipped", what,
                    self.files_done, self.lines, self.examples, self.bad.count)
        if self.bad.count:
            logger.warning("%s skipped %d bad lines; the first: %s", what, self.bad.count,
                           self.bad.first)


class _Batcher:
    """Cuts one producer's blocks into batches; a batch may span blocks and files."""

    def __init__(self, slots, batch_size, put):
        self._slots = slots
        self._size = batch_size
        self._put = put
        self._pending = []
        self._pending_n = 0

    def add(self, _index, block):
        start = 0
        if self._pending_n:
            need = self._size - self._pending_n
            if block.n < need:
                self._pending.append(block)
                self._pending_n += block.n
                return
            self._pending.append(block.slice(0, need))
            self._put(ExampleBlock.concat(self._pending).to_feed(self._slots))
            self._pending, self._pending_n = [], 0
            start = need
        while block.n - start >= self._size:
            self._put(block.slice(start, start + self._size).to_feed(self._slots))
            start += self._size
        if start < block.n:
            self._pending = [block.slice(start, block.n)]
            self._pending_n = block.n - start

    def finish(self):
        """Hands on the last, partial batch: a pass never loses examples."""
        if self._pending_n:
            self._put(ExampleBlock.concat(self._pending).to_feed(self._slots))
            self._pending, self._pending_n = [], 0


_DONE = object()


class StreamSource:
    """A pass over files: producer threads parse batches into a bounded queue.

    Args:
        config: PassConfig. queue_capacity: batches the queue holds (>= 1).

    Thread-safety: ``get`` may be called from many consumer threads at once.
    """

    def __init__(self, config, queue_capacity):
        self._config = config
        self._queue = queue.Queue(queue_capacity)
        self._lock = threading.Lock()
        self._batches = 0
        self._closed = False
        self._producers = Producers(
            config, lambda: _Batcher(config.slots, config.batch_size, self._put),
            "fleet-reader", self._on_done)
        self._producers.start()

    def _put(self, item):
        while True:
            if self._producers.stopped.is_set():
                raise _Stopped()
            try:
                self._queue.put(item, timeout=POLL)
                return
            except queue.Full:
                continue

    def _on_done(self, producers):
        if producers.error is None and not producers.stopped.is_set():
            producers.log_summary("dataset pass")
            try:
                self._put(_DONE)
            except _Stopped:
                pass

    def get(self, timeout):
        """Returns the next batch (a feed dict), or None once every producer has finished.

        Blocks up to ``timeout`` seconds.

        Raises:
            DataError (or any error of a producer): a producer failed; every consumer
                that calls get afterwards gets it too.
            FleetTimeoutError: nothing arrived within ``timeout``; names the producers
                still reading and their files.
        """
        started = time.monotonic()
        deadline = started + timeout
        wait = None
        while True:
            error = self._producers.error
            if error is not None:
                raise error
            if self._closed:
                return None
            remaining = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=max(0.0, min(POLL, remaining)))
            except queue.Empty:
                if remaining <= 0:
                    raise FleetTimeoutError(
                        f"dataset: no batch arrived within {timeout:g}s; producers still "
                        f"running: {self._producers.describe_running()}") from None
                if wait is None:
                    wait = WaitLog("the dataset's next batch", limit=f"giving up after {timeout:g} s",
                                   logger=logger, started=started)
                if wait.next_due_s() == 0.0:
                    wait.tick(f"producers: {self._producers.describe_running()}")
                continue
            if item is _DONE:
                self._queue.put_nowait(_DONE)  # for the other consumers
                return None
            with self._lock:
                self._batches += 1
            return item

    def close(self):
        """Stops the producers, kills pipe commands and joins the threads (bounded wait).

        Idempotent; never blocks more than a few seconds.
        """
        self._closed = True
        self._producers.stopped.set()
        while True:  # wake producers blocked on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._producers.stop()

    def report(self):
        """Counts of this pass: lines, examples, batches, bad_lines_skipped, files."""
        p = self._producers
        with self._lock:
            batches = self._batches
        return {"lines": p.lines, "examples": p.examples, "batches": batches,
                "bad_lines_skipped": p.bad.count, "files": p.files_done}
