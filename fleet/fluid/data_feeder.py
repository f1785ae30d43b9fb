"""Paddle's ``fluid.DataFeeder``: turns a minibatch of samples (tuples, one value per
input) into the feed dict ``Executor.run`` takes."""
import numpy as np

from fleet.errors import DataError
from fleet.framework.program import Variable, default_main_program

_NP = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


class DataFeeder:
    """Converts samples to a feed dict.

    Args:
        feed_list: the input Variables (or their names, looked up in ``program``), in the
            order each sample lists its values.
        place: accepted (fleet runs on CPUs).
        program: where names are looked up (default: the default main program).

    Raises:
        DataError: a name that is not a variable of ``program``.
    """

    def __init__(self, feed_list, place=None, program=None):
        program = default_main_program() if program is None else program
        self.feed_vars = []
        for item in feed_list:
            if isinstance(item, Variable):
                self.feed_vars.append(item)
                continue
            var = program.global_block().vars.get(item)
            if var is None:
                raise DataError(f"DataFeeder: {item!r} is not a variable of the program; pass the "
                                f"input Variables (fluid.layers.data(...)) or their names")
            self.feed_vars.append(var)
        self.place = place

    def feed(self, iterable):
        """Returns {name: value} for a minibatch: a lod_level=0 input becomes an array
        [batch, *shape], a lod_level=1 input the list of the samples' sequences.

        Args:
            iterable: samples, each a tuple or list with one value per input.

        Raises:
            DataError: a sample with the wrong number of values, or values that do not
                fit the input's shape (names the input and the sample).
        """
        columns = [[] for _ in self.feed_vars]
        for i, sample in enumerate(iterable):
            if len(sample) != len(self.feed_vars):
                raise DataError(f"DataFeeder: sample {i} has {len(sample)} values but the feed list has "
                                f"{len(self.feed_vars)} inputs {[v.name for v in self.feed_vars]}")
            for column, value in zip(columns, sample):
                column.append(value)
        return {var.name: self._convert(var, column) for var, column in zip(self.feed_vars, columns)}

    @staticmethod
    def _convert(var, column):
        dtype = _NP[var.dtype]
        if var.lod_level:  # a list of sequences: the executor makes the LoDTensor
            row = tuple(var.shape[1:]) if tuple(var.shape[1:]) != (1,) else ()
            return [np.asarray(s, dtype=dtype).reshape((-1,) + row) for s in column]
        rest = [d for d in var.shape[1:]]
        try:
            arr = np.asarray(column, dtype=dtype)
            return arr.reshape([len(column)] + rest) if -1 not in rest else arr
        except ValueError as e:
            raise DataError(f"DataFeeder: the values of {var.name!r} do not fit its shape "
                            f"{list(var.shape)}: {e}") from e


def create_lod_tensor(data, recursive_seq_lens, place=None):
    """A lod_level=1 batch from its values and the sequences' lengths (Paddle's
    ``fluid.create_lod_tensor``; one LoD level only).

    Args:
        data: the values, [total, ...] (a numpy array or a list), or a list of sequences.
        recursive_seq_lens: [[length of each sequence]].
        place: accepted (fleet runs on CPUs).

    Raises:
        DataError: more than one LoD level, or lengths that do not add up to the values.
    """
    from fleet.framework.tensor import LoDTensor

    if (not isinstance(recursive_seq_lens, (list, tuple)) or len(recursive_seq_lens) != 1
            or not isinstance(recursive_seq_lens[0], (list, tuple, np.ndarray))):
        raise DataError(f"recursive_seq_lens={recursive_seq_lens!r}: fleet takes one LoD level, "
                        f"[[len_0, len_1, ...]]")
    lengths = np.asarray(recursive_seq_lens[0], dtype=np.int64)
    if isinstance(data, list) and data and all(isinstance(s, (list, tuple, np.ndarray)) for s in data):
        data = np.concatenate([np.asarray(s).reshape(len(s), -1) for s in data])
    values = np.asarray(data)
    if int(lengths.sum()) != len(values) or (lengths < 0).any():
        raise DataError(f"recursive_seq_lens {lengths.tolist()[:8]} sum to {int(lengths.sum())} but data has "
                        f"{len(values)} rows")
    if values.ndim == 2 and values.shape[1] == 1 and values.dtype.kind in "iu":
        values = values.reshape(-1)
    return LoDTensor.from_lengths(values, lengths)
