"""InMemoryDataset's side: loading every file with producer threads, passes from memory."""
import collections
import logging
import threading
import time

from fleet.dataset.block import ExampleBlock
from fleet.dataset.pipeline import POLL, Producers
from fleet.errors import FleetTimeoutError
from fleet.logs import WaitLog

logger = logging.getLogger("fleet.dataset")


class _Collector:
    """Keeps the blocks of each file, to be joined in file-list order (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.blocks = collections.defaultdict(list)

    def add(self, index, block):
        with self._lock:
            self.blocks[index].append(block)

    def finish(self):
        pass


class Loader:
    """Reads every file into one ExampleBlock with producer threads (InMemoryDataset).

    ``start`` returns at once; ``wait`` blocks until the load ends.
    """

    def __init__(self, config):
        self._config = config
        self._collector = _Collector()
        self._done = threading.Event()
        self._producers = Producers(config, lambda: self._collector, "fleet-loader",
                                     lambda _p: self._done.set())

    @property
    def slots(self):
        """The slots the examples were read for."""
        return self._config.slots

    def start(self):
        """Starts the producer threads; returns self at once."""
        self._producers.start()
        return self

    def wait(self, timeout):
        """Waits for the load and returns ``(block, report)``.

        Args:
            timeout: seconds without progress (no chunk parsed, no file started) after
                which the load is abandoned.

        Raises:
            DataError (or a producer's error): a file could not be read or parsed.
            FleetTimeoutError: no progress for ``timeout`` seconds; names the producers
                still reading and their files. The load is stopped.
        """
        p = self._producers
        wait = None
        while not self._done.wait(POLL):
            if p.error is not None:
                break
            if wait is None:
                wait = WaitLog("load_into_memory to read the files", logger=logger,
                               limit=f"giving up after {timeout:g} s without progress")
            if wait.next_due_s() == 0.0:
                wait.tick(f"{p.lines} lines read; producers: {p.describe_running()}")
            if time.monotonic() - p.last_progress > timeout:
                running = p.describe_running()
                p.stop()
                raise FleetTimeoutError(
                    f"dataset load: no progress for {timeout:g}s; producers still running: "
                    f"{running}")
        p.stop()
        if p.error is not None:
            raise p.error
        p.log_summary("dataset load")
        blocks = [b for i in sorted(self._collector.blocks) for b in self._collector.blocks[i]]
        block = ExampleBlock.concat(blocks) if blocks else ExampleBlock.empty(self._config.slots)
        return block, {"lines": p.lines, "examples": p.examples,
                       "bad_lines_skipped": p.bad.count, "files": p.files_done}

    def close(self):
        """Stops the load (bounded wait)."""
        self._producers.stop()


class MemorySource:
    """A pass over examples in memory: consecutive batches, the last one partial.

    Thread-safety: ``get`` may be called from many threads; it never blocks.
    """

    def __init__(self, block, slots, batch_size, load_report):
        self._block = block
        self._slots = slots
        self._size = batch_size
        self._load = load_report
        self._lock = threading.Lock()
        self._cursor = 0
        self._batches = 0
        self._examples = 0
        self._closed = False

    def get(self, timeout=None):
        """Returns the next batch, or None at the end of the pass (``timeout`` unused)."""
        with self._lock:
            if self._closed or self._cursor >= self._block.n:
                return None
            a = self._cursor
            b = min(self._block.n, a + self._size)
            self._cursor = b
            self._batches += 1
            self._examples += b - a
        return self._block.slice(a, b).to_feed(self._slots)

    def close(self):
        self._closed = True

    def report(self):
        """lines, bad_lines_skipped and files of the load; examples and batches served."""
        with self._lock:
            return {"lines": self._load["lines"], "examples": self._examples,
                    "batches": self._batches, "bad_lines_skipped": self._load["bad_lines_skipped"],
                    "files": self._load["files"]}
