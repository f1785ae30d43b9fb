"""Data generators: base classes for pipe-command scripts that write MultiSlot text.

As Paddle's ``incubate.data_generator``: subclass ``MultiSlotDataGenerator``, define
``generate_sample(line)`` returning a function that yields samples
``[(name, [values...]), ...]`` (slots in ``set_use_var`` order), and call
``run_from_stdin()``; the dataset runs the script with ``set_pipe_command``::

    class CriteoGenerator(MultiSlotDataGenerator):
        def generate_sample(self, line):
            def reader():
                fields = line.rstrip("\\n").split("\\t")
                yield [("dense_input", dense(fields)), ("C1", [hash1(fields)]), ...]
            return reader

    if __name__ == "__main__":
        CriteoGenerator().run_from_stdin()

Nothing else may be written to stdout: it is the data.
"""
import abc
import numbers
import sys

from fleet.errors import DataError

_EXAMPLE = "Example: [('words', [1926, 8, 17]), ('label', [1])]"


class DataGenerator(abc.ABC):
    """Reads raw lines, lets ``generate_sample`` / ``generate_batch`` make samples, writes text.

    Not thread-safe: one generator per process (it remembers the first sample's slots).
    """

    def __init__(self):
        self._proto_info = None
        self.batch_size_ = 32

    def set_batch(self, batch_size):
        """Samples handed together to ``generate_batch`` (default 32)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"set_batch takes a positive int, got {batch_size!r}")
        self.batch_size_ = batch_size

    @abc.abstractmethod
    def generate_sample(self, line):
        """Returns a function yielding the samples of one raw line (None: none).

        Override this. A sample is a list or tuple of ``(name, [values...])`` pairs.
        ``line`` is None under ``run_from_memory``.
        """

    def generate_batch(self, samples):
        """Returns a function yielding the samples to write for a batch (default: as given).

        Override it for batch-level processing (e.g. padding to the batch's longest).
        """
        def local_iter():
            yield from samples
        return local_iter

    @abc.abstractmethod
    def _gen_str(self, line):
        """Formats one sample as a line of text."""

    def run_from_stdin(self, stdin=None, stdout=None):
        """Reads lines from stdin and writes one text line per sample to stdout.

        Args:
            stdin, stdout: text streams (default ``sys.stdin`` / ``sys.stdout``).

        Raises:
            DataError (a ValueError): a sample that breaks the format's rules.
        """
        stdin = sys.stdin if stdin is None else stdin
        self._run((line for line in stdin), stdout)

    def run_from_memory(self, stdout=None):
        """Calls ``generate_sample(None)`` once and writes its samples to stdout."""
        self._run(iter([None]), stdout)

    def _run(self, lines, stdout):
        out = sys.stdout if stdout is None else stdout
        batch = []
        for line in lines:
            for sample in _iterate(self.generate_sample(line)):
                if sample is None:
                    continue
                batch.append(sample)
                if len(batch) == self.batch_size_:
                    self._write_batch(batch, out)
                    batch = []
        if batch:
            self._write_batch(batch, out)
        out.flush()

    def _write_batch(self, batch, out):
        out.write("".join(self._gen_str(sample) for sample in _iterate(self.generate_batch(batch))))


def _iterate(result):
    """Paddle's generators return an iterator factory; a plain iterable works too."""
    return result() if callable(result) else (result or ())


def _check_sample(line):
    if not isinstance(line, (list, tuple)):
        raise DataError(
            f"the output of process() must be in list or tuple type, got "
            f"{type(line).__name__}. {_EXAMPLE}")
    for item in line:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise DataError(
                f"each field of a sample must be a (name, [values...]) pair, got {item!r}. "
                f"{_EXAMPLE}")


class MultiSlotDataGenerator(DataGenerator):
    """Writes Paddle's MultiSlot text: per slot ``n v1 .. vn``, with Paddle's checks.

    Values are ints (uint64 slots) or floats (a float anywhere makes the slot float);
    every sample must have the same slot names, in the same order, as the first one.
    """

    def _gen_str(self, line):
        _check_sample(line)
        first = self._proto_info is None
        proto = [] if first else self._proto_info
        if not first and len(line) != len(proto):
            raise DataError("the complete field set of two given line are inconsistent.")
        parts = []
        for index, (name, elements) in enumerate(line):
            if not isinstance(name, str):
                raise DataError(f"name {name!r} must be in str type, got {type(name).__name__}")
            if not isinstance(elements, list):
                raise DataError(
                    f"elements of {name!r} must be in list type, got {type(elements).__name__}")
            if not elements:
                raise DataError(
                    "the elements of each field can not be empty, you need padding it in "
                    "process().")
            if first:
                proto.append((name, "uint64"))
            elif name != proto[index][0]:
                raise DataError(
                    "the field name of two given line are not match: require<%s>, get<%s>."
                    % (proto[index][0], name))
            parts.append(str(len(elements)))
            for elem in elements:
                if isinstance(elem, numbers.Integral):
                    parts.append(str(int(elem)))  # int(): True -> "1", np.int64 -> plain
                elif isinstance(elem, numbers.Real):
                    proto[index] = (name, "float")
                    parts.append(str(elem))
                else:
                    raise DataError(
                        f"the type of element {elem!r} of {name!r} must be in int or float, "
                        f"got {type(elem).__name__}")
        self._proto_info = proto  # the first sample fixes the slots of all later ones
        return " ".join(parts) + "\n"


class MultiSlotStringDataGenerator(DataGenerator):
    """Writes MultiSlot text from values that are already strings, without checks (fast)."""

    def _gen_str(self, line):
        if not isinstance(line, (list, tuple)):
            raise DataError(
                f"the output of process() must be in list or tuple type, got "
                f"{type(line).__name__}. {_EXAMPLE}")
        parts = []
        for _name, elements in line:
            parts.append(str(len(elements)))
            parts.extend(elements)
        return " ".join(parts) + "\n"
