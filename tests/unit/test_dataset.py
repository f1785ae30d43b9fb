"""QueueDataset: settings, MultiSlot and Criteo reading, producers, pipes, bad data."""
import io
import logging
import os
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from fleet.data_generator import MultiSlotDataGenerator
from fleet.dataset import DatasetFactory
from fleet.errors import ConfigError, DataError, FleetTimeoutError
from fleet.framework.tensor import LoDTensor
from fleet.kernels import parse as K

TIMEOUT = 10.0


class Var:
    """Stand-in for a framework Variable: the four attributes datasets read."""

    def __init__(self, name, shape, dtype="int64", lod_level=0):
        self.name, self.shape, self.dtype, self.lod_level = name, tuple(shape), dtype, lod_level


DENSE = Var("dense", (-1, 3), "float32")
IDS = Var("ids", (-1, 1), "int64", 1)
WEIGHTS = Var("weights", (-1, 1), "float32", 1)
LABEL = Var("label", (-1, 1), "int64")
VARS = [DENSE, IDS, WEIGHTS, LABEL]


def make_examples(count, seed):
    """Random examples as {name: list} with float32-exact floats and int64 ids."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(1, 5))
        out.append({
            "dense": [float(x) for x in rng.standard_normal(3).astype(np.float32)],
            "ids": [int(x) for x in rng.integers(-2**63, 2**63 - 1, n)],
            "weights": [float(x) for x in (rng.standard_normal(n) * 1e-20).astype(np.float32)],
            "label": [int(rng.integers(0, 2))],
        })
    return out


class ExampleGenerator(MultiSlotDataGenerator):
    def __init__(self, examples):
        super().__init__()
        self.examples = examples

    def generate_sample(self, line):
        def reader():
            for ex in self.examples:
                yield [(name, ex[name]) for name in ("dense", "ids", "weights", "label")]
        return reader


def write_files(tmp_path, examples, parts):
    """Writes the examples as MultiSlot text with the data generator, in ``parts`` files."""
    files = []
    for i, chunk in enumerate(np.array_split(np.arange(len(examples)), parts)):
        out = io.StringIO()
        ExampleGenerator([examples[j] for j in chunk]).run_from_memory(stdout=out)
        path = tmp_path / f"part-{i:03d}"
        path.write_text(out.getvalue())
        files.append(str(path))
    return files


def as_tuples(batch, variables=VARS):
    """The examples of a batch as hashable tuples (floats compared bit for bit)."""
    size = len(batch[variables[-1].name])
    rows = [[] for _ in range(size)]
    for var in variables:
        value = batch[var.name]
        if isinstance(value, LoDTensor):
            assert value.offsets.dtype == np.int64 and len(value.offsets) == size + 1
            parts = [value.values[value.offsets[i]:value.offsets[i + 1]] for i in range(size)]
        else:
            assert value.flags.c_contiguous and value.shape == (size,) + var.shape[1:]
            parts = list(value.reshape(size, -1))
        for row, part in zip(rows, parts):
            assert part.dtype == np.dtype(var.dtype)
            row.append(tuple(part.view(np.uint32 if var.dtype == "float32" else np.int64).tolist()))
    return [tuple(r) for r in rows]


def expected_tuples(examples):
    return [tuple(tuple(np.array(ex[v.name], dtype=v.dtype).view(
        np.uint32 if v.dtype == "float32" else np.int64).tolist()) for v in VARS) for ex in examples]


def checksum(rows):
    """Order-independent checksum: the sum, modulo 2**64, of every value's bits times its slot."""
    total = 0
    for row in rows:
        for slot, values in enumerate(row, start=1):
            total += slot * sum(v % 2**64 for v in values)
    return total % 2**64


def drain(source, consumers=1):
    """All batches of a pass, read by ``consumers`` threads; closes the source."""
    batches, errors = [], []

    def consume():
        try:
            while (batch := source.get(TIMEOUT)) is not None:
                batches.append(batch)
        except Exception as e:  # collected for the test to inspect
            errors.append(e)

    threads = [threading.Thread(target=consume) for _ in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    source.close()
    if errors:
        raise errors[0]
    return batches


def queue_dataset(files, variables=VARS, batch_size=7, threads=3):
    dataset = DatasetFactory().create_dataset("QueueDataset")
    dataset.set_use_var(variables)
    dataset.set_batch_size(batch_size)
    dataset.set_thread(threads)
    dataset.set_filelist(files)
    return dataset


def reader_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("fleet-")]


# ---------------------------------------------------------------- settings

def test_factory_creates_both_datasets_and_rejects_unknown_names_like_paddle():
    factory = DatasetFactory()
    assert type(factory.create_dataset()).__name__ == "QueueDataset"
    assert type(factory.create_dataset("InMemoryDataset")).__name__ == "InMemoryDataset"
    with pytest.raises(ValueError, match=r"^datafeed class FooDataset does not exist; choose one "
                                         r"of \['InMemoryDataset', 'QueueDataset'\]$"):
        factory.create_dataset("FooDataset")


def test_set_use_var_rejects_other_dtypes_with_paddles_message():
    dataset = DatasetFactory().create_dataset()
    with pytest.raises(ConfigError) as info:
        dataset.set_use_var([Var("x", (-1, 2), "float64")])
    assert str(info.value) == ("Currently, fluid.dataset only supports dtype=float32 and "
                               "dtype=int64 (variable 'x' has dtype 'float64')")


@pytest.mark.parametrize("call, message", [
    (lambda d: d.set_batch_size(0), "batch_size must be a positive int, got 0"),
    (lambda d: d.set_batch_size(True), "batch_size must be a positive int, got True"),
    (lambda d: d.set_thread("2"), "thread_num must be a positive int, got '2'"),
    (lambda d: d.set_queue_num(-1), "queue_num must be a positive int, got -1"),
    (lambda d: d.set_filelist("a.txt"), "set_filelist takes a list of file paths (str), got 'a.txt'"),
    (lambda d: d.set_pipe_command(""), "pipe_command must be a non-empty shell command, got ''"),
    (lambda d: d.set_data_format("csv"),
     "data format 'csv' is not supported; choose one of ['multislot', 'criteo']"),
    (lambda d: d.set_data_format("criteo", hash_dim=0), "hash_dim must be a positive int, got 0"),
    (lambda d: d.set_skip_bad_lines("yes"), "set_skip_bad_lines takes True or False, got 'yes'"),
    (lambda d: d.set_use_var([Var("x", (-1, 1), "int64", 2)]),
     "set_use_var: variable 'x' has lod_level=2; datasets read lod_level 0 (dense) or 1 (sequences)"),
    (lambda d: d.set_use_var([LABEL, LABEL]), "set_use_var: variable 'label' is given twice"),
])
def test_setters_reject_bad_values_naming_them(call, message):
    with pytest.raises(ConfigError) as info:
        call(DatasetFactory().create_dataset())
    assert str(info.value) == message


def test_a_pass_names_a_missing_file(tmp_path):
    dataset = queue_dataset([str(tmp_path / "nope.txt")])
    with pytest.raises(ConfigError, match=r"dataset file '.*nope\.txt' does not exist or is not a "
                                          r"file \(working directory .*\); fix the list given to "
                                          r"set_filelist"):
        dataset._open_pass(1)


def test_a_pass_needs_variables_and_files():
    dataset = DatasetFactory().create_dataset()
    with pytest.raises(ConfigError, match=r"call set_use_var\(var_list\) first"):
        dataset._open_pass(1)
    dataset.set_use_var(VARS)
    with pytest.raises(ConfigError, match=r"call set_filelist\(files\) first"):
        dataset._open_pass(1)


def test_queue_dataset_shuffles_raise_paddles_messages():
    dataset = DatasetFactory().create_dataset("QueueDataset")
    with pytest.raises(NotImplementedError, match=r"^QueueDataset does not support local shuffle, "
                                                  r"please use InMemoryDataset for local_shuffle$"):
        dataset.local_shuffle()
    with pytest.raises(NotImplementedError, match=r"^QueueDataset does not support global shuffle, "
                                                  r"please use InMemoryDataset for global_shuffle$"):
        dataset.global_shuffle()


def test_desc_lists_slots_like_paddles_data_feed_desc():
    dataset = DatasetFactory().create_dataset()
    dataset.set_use_var([DENSE, IDS])
    text = dataset.desc()
    assert 'name: "MultiSlotDataFeed"' in text and "batch_size: 32" in text
    assert 'name: "ids"\n    type: "uint64"\n    is_dense: false' in text
    assert 'pipe_command: "cat"' in text


# ---------------------------------------------------------------- reading

def test_round_trip_over_several_producers_loses_and_duplicates_nothing(tmp_path):
    examples = make_examples(500, seed=1)
    files = write_files(tmp_path, examples, parts=5)
    source = queue_dataset(files, batch_size=7, threads=3)._open_pass(2)
    batches = drain(source, consumers=2)
    got = [t for b in batches for t in as_tuples(b)]
    want = expected_tuples(examples)
    assert len(got) == len(want) == 500
    assert sorted(got) == sorted(want)
    assert checksum(got) == checksum(want) and len(set(got)) == len(set(want))
    assert all(len(b["label"]) <= 7 for b in batches)
    # each of the 3 producers may end with one partial batch; all others are full
    assert sum(len(b["label"]) < 7 for b in batches) <= 3
    assert source.report() == {"lines": 500, "examples": 500, "batches": len(batches),
                               "bad_lines_skipped": 0, "files": 5}
    assert reader_threads() == []


def test_one_producer_keeps_file_order_and_delivers_the_last_partial_batch(tmp_path):
    examples = make_examples(23, seed=2)
    files = write_files(tmp_path, examples, parts=2)
    batches = drain(queue_dataset(files, batch_size=5, threads=1)._open_pass(1))
    assert [len(b["label"]) for b in batches] == [5, 5, 5, 5, 3]
    assert [t for b in batches for t in as_tuples(b)] == expected_tuples(examples)


def test_batches_span_chunk_boundaries_without_losing_examples(tmp_path):
    examples = make_examples(300, seed=3)
    files = write_files(tmp_path, examples, parts=1)
    dataset = queue_dataset(files, batch_size=16, threads=1)
    config = dataset._pass_config()
    config.chunk_bytes = 1000  # many chunks, lines cut at chunk ends
    from fleet.dataset.pipeline import StreamSource
    batches = drain(StreamSource(config, 4))
    assert [t for b in batches for t in as_tuples(b)] == expected_tuples(examples)


def test_empty_filelist_gives_an_empty_pass():
    source = queue_dataset([])._open_pass(1)
    assert source.get(TIMEOUT) is None and source.get(TIMEOUT) is None
    source.close()
    assert source.report()["files"] == 0


def test_lines_longer_than_a_chunk_are_read_whole(tmp_path):
    var = Var("ids", (-1, 1), "int64", 1)
    path = tmp_path / "long.txt"
    path.write_text("5000 " + " ".join(map(str, range(5000))) + "\n1 7")  # no final newline
    dataset = queue_dataset([str(path)], variables=[var], batch_size=10, threads=1)
    config = dataset._pass_config()
    config.chunk_bytes = 256
    from fleet.dataset.pipeline import StreamSource
    (batch,) = drain(StreamSource(config, 2))
    assert batch["ids"].offsets.tolist() == [0, 5000, 5001]
    assert batch["ids"].values[:5000].tolist() == list(range(5000)) and batch["ids"].values[-1] == 7


# ---------------------------------------------------------------- pipe commands

def test_pipe_command_cat_reads_the_same_examples(tmp_path):
    examples = make_examples(120, seed=4)
    dataset = queue_dataset(write_files(tmp_path, examples, parts=3), threads=2)
    dataset.set_pipe_command("cat")
    got = [t for b in drain(dataset._open_pass(1)) for t in as_tuples(b)]
    assert sorted(got) == sorted(expected_tuples(examples))


def test_pipe_command_runs_a_python_data_generator_script(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent("""
        from fleet.data_generator import MultiSlotDataGenerator

        class Gen(MultiSlotDataGenerator):
            def generate_sample(self, line):
                def reader():
                    a, b = line.split(",")
                    yield [("x", [float(a), float(a) / 4]), ("y", [int(b)] * int(b))]
                return reader

        Gen().run_from_stdin()
    """))
    raw = [tmp_path / "raw-0.csv", tmp_path / "raw-1.csv"]
    raw[0].write_text("1.5,2\n-3,1\n")
    raw[1].write_text("8,3\n")
    x, y = Var("x", (-1, 2), "float32"), Var("y", (-1, 1), "int64", 1)
    dataset = queue_dataset([str(p) for p in raw], variables=[x, y], batch_size=8, threads=2)
    dataset.set_pipe_command(f"{sys.executable} {script}")
    got = sorted(t for b in drain(dataset._open_pass(1)) for t in as_tuples(b, [x, y]))
    f32 = lambda *v: tuple(np.array(v, np.float32).view(np.uint32).tolist())  # noqa: E731
    assert got == sorted([(f32(1.5, 0.375), (2, 2)), (f32(-3, -0.75), (1,)), (f32(8, 2), (3, 3, 3))])


def test_a_bare_python_in_a_pipe_command_is_the_python_running_the_job(tmp_path, monkeypatch):
    # as `venv/bin/fleetrun` started without activating the venv: another Python comes
    # first on PATH (here one that fails)
    bindir = os.path.dirname(sys.executable)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    name = os.path.basename(sys.executable)
    (decoy / name).write_text("#!/bin/sh\necho not the Python of the job >&2\nexit 7\n")
    (decoy / name).chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(decoy), "/usr/bin", "/bin", bindir]))
    from fleet.dataset.reader import pipe_environment
    assert pipe_environment()["PATH"].split(os.pathsep) == [bindir, str(decoy), "/usr/bin", "/bin"]
    assert pipe_environment({"PATH": bindir})["PATH"] == bindir
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent("""
        import sys
        import fleet.data_generator  # the job's packages
        for line in sys.stdin:
            print("1 " + str(int(sys.executable == sys.argv[1])) + " 1 " + line.strip())
    """))
    (tmp_path / "raw").write_text("5\n")
    x, y = Var("x", (-1, 1), "int64", 1), Var("y", (-1, 1), "int64", 1)
    dataset = queue_dataset([str(tmp_path / "raw")], variables=[x, y], batch_size=8, threads=1)
    dataset.set_pipe_command(f"{name} {script} {sys.executable}")
    got = [t for b in drain(dataset._open_pass(1)) for t in as_tuples(b, [x, y])]
    assert got == [((1,), (5,))]


def _fake_hadoop(tmp_path, monkeypatch):
    """A `hadoop` on PATH that logs its arguments and serves hdfs://NAME from tmp_path/NAME."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "hadoop").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {tmp_path}/hadoop.log
        for last; do :; done
        exec cat "{tmp_path}/${{last#hdfs://}}"
    """))
    (bindir / "hadoop").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "hadoop.log"


def test_hdfs_files_are_read_through_hadoop_fs_text_with_the_hdfs_config(tmp_path, monkeypatch):
    examples = make_examples(40, seed=8)
    files = write_files(tmp_path, examples, parts=2)
    log = _fake_hadoop(tmp_path, monkeypatch)
    remote = ["hdfs://" + os.path.basename(f) for f in files]
    dataset = queue_dataset(remote, threads=2)
    dataset.set_hdfs_config("hdfs://namenode:9000", "user,passwd")
    dataset.set_pipe_command("cat")  # the pipe command gets the downloaded text
    got = [t for b in drain(dataset._open_pass(1)) for t in as_tuples(b)]
    assert sorted(got) == sorted(expected_tuples(examples))
    assert sorted(log.read_text().splitlines()) == [
        f"fs -D fs.default.name=hdfs://namenode:9000 -D hadoop.job.ugi=user,passwd -text {r}" for r in remote]


def test_a_download_command_reads_remote_files_and_its_failure_is_named(tmp_path, monkeypatch):
    examples = make_examples(20, seed=9)
    files = write_files(tmp_path, examples, parts=1)
    _fake_hadoop(tmp_path, monkeypatch)
    dataset = queue_dataset(["afs://x/" + os.path.basename(files[0])], threads=1)
    dataset.set_download_cmd(f"sh -c 'cat {tmp_path}/${{0##*/}}'")
    got = [t for b in drain(dataset._open_pass(1)) for t in as_tuples(b)]
    assert sorted(got) == sorted(expected_tuples(examples))
    dataset.set_download_cmd("sh -c 'echo no such file >&2; exit 4'")
    dataset.set_pipe_command("cat")  # succeeds on the empty text: the source's failure still counts
    with pytest.raises(DataError, match=r"source command .* failed on file 'afs://x/part-000' with exit code 4; end "
                                        r"of its stderr: 'no such file'"):
        drain(dataset._open_pass(1))
    with pytest.raises(ConfigError, match="download_cmd must be a non-empty shell command, got ''"):
        dataset.set_download_cmd("")
    with pytest.raises(ConfigError, match="set_hdfs_config fs_ugi must be a str, got None"):
        dataset.set_hdfs_config("hdfs://nn", None)


def test_gz_files_are_read_decompressed(tmp_path):
    import gzip
    examples = make_examples(30, seed=10)
    (path,) = write_files(tmp_path, examples, parts=1)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        g.write(f.read())
    got = [t for b in drain(queue_dataset([path + ".gz"], threads=1)._open_pass(1)) for t in as_tuples(b)]
    assert sorted(got) == sorted(expected_tuples(examples))


def test_failing_pipe_command_names_command_file_exit_code_and_stderr(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("1 5\n")
    dataset = queue_dataset([str(path)], variables=[IDS], threads=1)
    dataset.set_pipe_command("cat; echo 'bad things happened' >&2; exit 3")
    with pytest.raises(DataError) as info:
        drain(dataset._open_pass(1))
    assert str(info.value) == (
        f"pipe command \"cat; echo 'bad things happened' >&2; exit 3\" failed on file "
        f"{str(path)!r} with exit code 3; end of its stderr: 'bad things happened'")
    assert reader_threads() == []


def test_timeout_names_the_stuck_producer_and_close_kills_its_command(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("1 5\n")
    pid_file = tmp_path / "pid"
    dataset = queue_dataset([str(path)], variables=[IDS], threads=1)
    dataset.set_pipe_command(f"echo $$ > {pid_file}; exec sleep 60")
    source = dataset._open_pass(1)
    with pytest.raises(FleetTimeoutError, match=r"no batch arrived within 0.3s; producers still "
                                                r"running: fleet-reader-0 reading '.*data\.txt' "
                                                r"\(0 lines read\)"):
        source.get(0.3)
    deadline = time.monotonic() + TIMEOUT
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the pipe command never started"
        time.sleep(0.01)
    started = time.monotonic()
    source.close()
    assert time.monotonic() - started < 3.0
    assert reader_threads() == []
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_close_in_the_middle_of_a_pass_stops_blocked_producers(tmp_path):
    files = write_files(tmp_path, make_examples(400, seed=5), parts=4)
    source = queue_dataset(files, batch_size=2, threads=2)._open_pass(1)
    assert source.get(TIMEOUT) is not None
    time.sleep(0.1)  # producers fill the queue and block
    started = time.monotonic()
    source.close()
    assert time.monotonic() - started < 3.0 and reader_threads() == []
    assert source.get(TIMEOUT) is None


# ---------------------------------------------------------------- bad data

def write_lines(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


GOOD = "3 1 2 3 2 7 8 2 0.5 1.5 1 0"


def test_a_malformed_line_raises_data_error_naming_file_line_and_slot(tmp_path):
    path = write_lines(tmp_path, "bad.txt", [GOOD, GOOD, "3 1 2 3 2 7 x 2 0.5 1.5 1 0", GOOD])
    with pytest.raises(DataError) as info:
        drain(queue_dataset([path], threads=1)._open_pass(1))
    assert str(info.value) == (f"file {path!r}, line 3, slot 'ids': 'x' is not an integer id "
                               f"(int64 slots hold decimal integers)")


@pytest.mark.parametrize("line, message", [
    ("3 1 2 3 0 2 0.5 1.5 1 0",
     "slot 'ids': error: the number of ids can not be zero, you need padding it in data "
     "generator; or if there is something wrong with the data, please check if the data "
     "contains unresolvable characters."),
    ("2 1 2 2 7 8 2 0.5 1.5 1 0",
     "slot 'dense': a dense slot of shape [3] needs exactly 3 values, the line gives 2; write 3 "
     "values or declare the variable with lod_level=1"),
    ("3 1 2 3 2 7 8 2 0.5 1.5",
     "slot 'label': the line ends before this slot; every line needs all 4 slots given to "
     "set_use_var, in order: dense, ids, weights, label"),
    ("3 1 2 3 2 7 8 3 0.5 1.5",
     "slot 'weights': the line ends after 2 values but the slot's count announces more; the "
     "count and the values disagree"),
    ("3 1 2 3 2 7 8 2 0.5 1,5 1 0",
     "slot 'weights': '1,5' is not a float (C strtof syntax, e.g. 0.5 or -1.5e-3)"),
    ("3 1 2 3 2 7 8 2 0.5 1.5 1 0 9",
     "after the last slot: unexpected text '9'; the line has more values than the 4 slots "
     "given to set_use_var"),
    ("3 1 2 3 x 7 8 2 0.5 1.5 1 0",
     "slot 'ids': the number of values 'x' is not an integer in [1, 2**31); each slot is "
     "written as its count n followed by n values"),
])
def test_bad_line_messages_are_pinned(tmp_path, line, message):
    path = write_lines(tmp_path, "bad.txt", [GOOD, line])
    with pytest.raises(DataError) as info:
        drain(queue_dataset([path], threads=1)._open_pass(1))
    assert str(info.value) == f"file {path!r}, line 2, {message}"


def test_skip_policy_skips_and_counts_bad_lines_and_logs_them(tmp_path, caplog):
    bad = "3 1 2 3 0 2 0.5 1.5 1 0"
    files = [write_lines(tmp_path, "a.txt", [GOOD, bad, GOOD, "junk"]),
             write_lines(tmp_path, "b.txt", [bad, GOOD, "", GOOD])]
    dataset = queue_dataset(files, threads=2)
    dataset.set_skip_bad_lines(True)
    source = dataset._open_pass(1)
    with caplog.at_level(logging.INFO, logger="fleet.dataset"):
        batches = drain(source)
    assert sum(len(b["label"]) for b in batches) == 4
    assert source.report() == {"lines": 8, "examples": 4, "batches": len(batches),
                               "bad_lines_skipped": 3, "files": 2}
    assert "dataset pass skipped 3 bad lines; the first: file " in caplog.text


def test_every_consumer_sees_the_producers_error(tmp_path):
    path = write_lines(tmp_path, "bad.txt", ["junk"])
    source = queue_dataset([path], threads=1)._open_pass(2)
    errors = []

    def consume():
        try:
            source.get(TIMEOUT)
        except DataError as e:
            errors.append(e)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    source.close()
    assert len(errors) == 2 and all("line 1, slot 'dense'" in str(e) for e in errors)


# ---------------------------------------------------------------- Criteo

CRITEO_VARS = ([Var("dense_input", (-1, 13), "float32")]
               + [Var(f"C{i}", (-1, 1), "int64", 1) for i in range(1, 27)]
               + [Var("label", (-1, 1), "int64")])


def criteo_lines(count, seed):
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(count):
        fields = [str(rng.integers(0, 2))]
        fields += ["" if rng.random() < 0.2 else str(rng.integers(-3, 1000)) for _ in range(13)]
        fields += ["" if rng.random() < 0.1 else "%08x" % rng.integers(0, 2**32) for _ in range(26)]
        lines.append("\t".join(fields))
    return lines


def test_criteo_format_fills_the_ctr_dnn_inputs_with_reference_values(tmp_path):
    lines = criteo_lines(50, seed=6)
    path = write_lines(tmp_path, "day_0", lines)
    dataset = queue_dataset([path], variables=CRITEO_VARS, batch_size=20, threads=1)
    dataset.set_data_format("criteo", hash_dim=1000)
    batches = drain(dataset._open_pass(1))
    assert [len(b["label"]) for b in batches] == [20, 20, 10]
    text = ("\n".join(lines) + "\n").encode()
    label, dense, ids = np.zeros(50, np.int64), np.zeros((50, 13), np.float32), np.zeros((26, 50), np.int64)
    K.parse_criteo_reference(np.frombuffer(text + b"\0", np.uint8), 0, len(text), 1000,
                             K.CRITEO_CONT_MIN, K.CRITEO_CONT_DIFF, label, dense, ids,
                             np.zeros(K.ERR_SIZE, np.int64))
    assert all(b["dense_input"].flags.c_contiguous and b["label"].flags.c_contiguous
               and b["C1"].values.flags.c_contiguous for b in batches)
    got_dense = np.concatenate([b["dense_input"] for b in batches])
    assert got_dense.dtype == np.float32 and np.array_equal(got_dense, dense)
    assert np.array_equal(np.concatenate([b["label"] for b in batches]), label.reshape(-1, 1))
    for k in range(26):
        tensors = [b[f"C{k + 1}"] for b in batches]
        assert all(t.offsets.tolist() == list(range(len(t.offsets))) for t in tensors)
        assert np.array_equal(np.concatenate([t.values for t in tensors]), ids[k])
    assert ids.max() < 1000


def test_criteo_format_checks_the_variables_it_fills(tmp_path):
    path = write_lines(tmp_path, "day_0", criteo_lines(1, seed=7))
    dataset = queue_dataset([path], variables=CRITEO_VARS[:-1])
    dataset.set_data_format("criteo")
    expected = ("the 'criteo' data format fills 28 variables in this order: a float32 dense "
                "variable of shape [13] (I1..I13), 26 int64 lod_level=1 variables (C1..C26) and an "
                "int64 label of shape [1]")
    with pytest.raises(ConfigError) as info:
        dataset._open_pass(1)
    assert str(info.value) == expected + "; set_use_var was given 27 variables"
    dataset.set_use_var([CRITEO_VARS[0], *CRITEO_VARS[1:5], Var("C5", (-1, 1), "float32", 1),
                         *CRITEO_VARS[6:]])
    with pytest.raises(ConfigError) as info:
        dataset._open_pass(1)
    assert str(info.value) == expected + "; variable 6 (for C5) is 'C5' (float32, lod_level=1)"


def test_criteo_bad_field_is_named_by_column_and_variable(tmp_path):
    lines = criteo_lines(3, seed=8)
    fields = lines[1].split("\t")
    fields[16] = "nothex"
    lines[1] = "\t".join(fields)
    path = write_lines(tmp_path, "day_0", lines)
    dataset = queue_dataset([path], variables=CRITEO_VARS, threads=1)
    dataset.set_data_format("criteo")
    with pytest.raises(DataError) as info:
        drain(dataset._open_pass(1))
    assert str(info.value) == (f"file {path!r}, line 2, field C3 (column 17, variable 'C3'): "
                               f"'nothex' is not a hexadecimal value")
    lines[1] = "\t".join(fields[:30])
    path = write_lines(tmp_path, "day_1", lines)
    dataset.set_filelist([path])
    with pytest.raises(DataError) as info:
        drain(dataset._open_pass(1))
    assert str(info.value) == (f"file {path!r}, line 2, a Criteo line has 40 tab-separated fields "
                               f"(label, I1..I13, C1..C26; empty fields allowed), this one has 30")
