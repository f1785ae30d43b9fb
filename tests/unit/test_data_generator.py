"""Data generators: MultiSlot text output and Paddle's checks and messages."""
import io

import pytest

from fleet.data_generator import MultiSlotDataGenerator, MultiSlotStringDataGenerator
from fleet.errors import DataError


class LineGenerator(MultiSlotDataGenerator):
    """Turns "a,b" into words [a, b] and label [len]."""

    def generate_sample(self, line):
        def reader():
            if line.strip() == "skip":
                yield None
                return
            words = [int(w) for w in line.strip().split(",")]
            yield [("words", words), ("label", [len(words)])]
        return reader


class FixedGenerator(MultiSlotDataGenerator):
    def __init__(self, samples):
        super().__init__()
        self.samples = samples

    def generate_sample(self, line):
        def reader():
            yield from self.samples
        return reader


def generate(samples):
    out = io.StringIO()
    FixedGenerator(samples).run_from_memory(stdout=out)
    return out.getvalue()


def test_run_from_stdin_writes_one_multislot_line_per_sample():
    out = io.StringIO()
    LineGenerator().run_from_stdin(stdin=io.StringIO("1,2,3\nskip\n7\n"), stdout=out)
    assert out.getvalue() == "3 1 2 3 1 3\n1 7 1 1\n"


def test_floats_use_a_round_trip_text_and_ints_stay_integers():
    text = generate([[("x", [0.5, 1e-05, -2.0, 3]), ("flag", [True, 7])]])
    assert text == "4 0.5 1e-05 -2.0 3 2 1 7\n"


def test_generate_batch_sees_batches_of_set_batch_size():
    class Padding(LineGenerator):
        batches = []

        def generate_batch(self, samples):
            self.batches.append(len(samples))
            width = max(len(s[0][1]) for s in samples)

            def reader():
                for (name, words), label in samples:
                    yield [(name, words + [0] * (width - len(words))), label]
            return reader

    gen = Padding()
    gen.set_batch(2)
    out = io.StringIO()
    gen.run_from_stdin(stdin=io.StringIO("1\n2,3\n4,5,6\n"), stdout=out)
    assert Padding.batches == [2, 1]
    assert out.getvalue() == "2 1 0 1 1\n2 2 3 1 2\n3 4 5 6 1 3\n"


@pytest.mark.parametrize("samples, message", [
    ([[("words", [])]],
     "the elements of each field can not be empty, you need padding it in process()."),
    ([[("a", [1]), ("b", [2])], [("a", [1])]],
     "the complete field set of two given line are inconsistent."),
    ([[("a", [1]), ("b", [2])], [("a", [1]), ("c", [2])]],
     "the field name of two given line are not match: require<b>, get<c>."),
    ([{"a": [1]}], "the output of process() must be in list or tuple type, got dict. "
                   "Example: [('words', [1926, 8, 17]), ('label', [1])]"),
    ([[(1, [1])]], "name 1 must be in str type, got int"),
    ([[("a", (1, 2))]], "elements of 'a' must be in list type, got tuple"),
    ([[("a", ["x"])]], "the type of element 'x' of 'a' must be in int or float, got str"),
    ([[("a", [1], 2)]], "each field of a sample must be a (name, [values...]) pair, got "
                        "('a', [1], 2). Example: [('words', [1926, 8, 17]), ('label', [1])]"),
])
def test_paddles_checks_raise_with_their_messages(samples, message):
    with pytest.raises(DataError) as info:
        generate(samples)
    assert str(info.value) == message


def test_a_rejected_first_sample_does_not_fix_the_slots():
    gen = FixedGenerator([])
    with pytest.raises(DataError):
        gen._gen_str([("a", [1]), ("b", [])])
    assert gen._gen_str([("x", [1])]) == "1 1\n"


def test_string_generator_writes_strings_without_checks():
    class Strings(MultiSlotStringDataGenerator):
        def generate_sample(self, line):
            def reader():
                yield [("words", line.split()), ("label", ["1"])]
            return reader

    out = io.StringIO()
    Strings().run_from_stdin(stdin=io.StringIO("a b\nc\n"), stdout=out)
    assert out.getvalue() == "2 a b 1 1\n1 c 1 1\n"


def test_generate_sample_must_be_defined():
    with pytest.raises(TypeError, match="abstract"):
        MultiSlotDataGenerator()


def test_set_batch_rejects_non_positive_sizes():
    with pytest.raises(DataError, match="set_batch takes a positive int, got 0"):
        LineGenerator().set_batch(0)
