"""InMemoryDataset: loading, passes from memory, local and global shuffles, sizes."""
import threading

import numpy as np
import pytest

from fleet.dataset import DatasetFactory
from fleet.dataset.block import ExampleBlock
from fleet.errors import ConfigError, DataError, FleetTimeoutError
from fleet.framework.tensor import LoDTensor

TIMEOUT = 10.0


class Var:
    def __init__(self, name, shape, dtype="int64", lod_level=0):
        self.name, self.shape, self.dtype, self.lod_level = name, tuple(shape), dtype, lod_level


VARS = [Var("x", (-1, 2), "float32"), Var("ids", (-1, 1), "int64", 1), Var("label", (-1, 1))]


def write_files(tmp_path, count, parts, start=0, prefix="part"):
    """``count`` distinct examples (ids encode the example number) in ``parts`` files."""
    files = []
    for p, chunk in enumerate(np.array_split(np.arange(start, start + count), parts)):
        lines = []
        for i in chunk:
            ids = " ".join(str(i * 10 + k) for k in range(i % 3 + 1))
            lines.append(f"2 {i * 0.5} {-i} {i % 3 + 1} {ids} 1 {i % 2}\n")
        path = tmp_path / f"{prefix}-{p}"
        path.write_text("".join(lines))
        files.append(str(path))
    return files


def in_memory(files, batch_size=8, threads=2, seed=None):
    dataset = DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_use_var(VARS)
    dataset.set_batch_size(batch_size)
    dataset.set_thread(threads)
    dataset.set_filelist(files)
    if seed is not None:
        dataset.set_shuffle_seed(seed)
    return dataset


def example_numbers(dataset):
    """The example numbers of one pass, in order (read back from the first id)."""
    source = dataset._open_pass(2)
    out = []
    while (batch := source.get(TIMEOUT)) is not None:
        ids = batch["ids"]
        assert isinstance(ids, LoDTensor)
        firsts = ids.values[ids.offsets[:-1]] // 10
        assert np.array_equal(batch["x"][:, 0], firsts * 0.5)
        assert np.array_equal(batch["label"][:, 0], firsts % 2)
        assert np.array_equal(ids.lengths, firsts % 3 + 1)
        out += firsts.tolist()
    source.close()
    return out


def test_load_into_memory_keeps_file_order_and_serves_batches(tmp_path):
    dataset = in_memory(write_files(tmp_path, 50, parts=4))
    assert dataset.get_memory_data_size() == 0
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 50
    assert example_numbers(dataset) == list(range(50))
    source = dataset._open_pass(1)
    sizes = []
    while (batch := source.get(TIMEOUT)) is not None:
        sizes.append(len(batch["label"]))
    assert sizes == [8] * 6 + [2]
    assert source.report() == {"lines": 50, "examples": 50, "batches": 7, "bad_lines_skipped": 0,
                               "files": 4}


def test_preload_then_wait_gives_the_same_data(tmp_path):
    dataset = in_memory(write_files(tmp_path, 30, parts=3))
    dataset.preload_into_memory(thread_num=3)
    with pytest.raises(ConfigError, match=r"the preload is still running; call "
                                          r"wait_preload_done\(\) first"):
        dataset.local_shuffle()
    dataset.wait_preload_done(timeout=TIMEOUT)
    assert example_numbers(dataset) == list(range(30))
    with pytest.raises(ConfigError, match=r"no preload is running; call preload_into_memory\(\)"):
        dataset.wait_preload_done()


def test_load_errors_surface_from_load_into_memory(tmp_path):
    files = write_files(tmp_path, 10, parts=2)
    with open(files[1], "a") as f:
        f.write("2 1.0 2.0 1 5 1 1 9\n")
    dataset = in_memory(files)
    with pytest.raises(DataError, match=r"part-1', line 6, after the last slot: unexpected text '9'"):
        dataset.load_into_memory()


def test_load_times_out_naming_the_stuck_file(tmp_path):
    dataset = in_memory(write_files(tmp_path, 4, parts=1))
    dataset.set_pipe_command("sleep 60")
    with pytest.raises(FleetTimeoutError, match=r"dataset load: no progress for 0.3s; producers "
                                                r"still running: fleet-loader-0 reading "
                                                r"'.*part-0' \(0 lines read\)"):
        dataset.load_into_memory(timeout=0.3)
    assert [t for t in threading.enumerate() if t.name.startswith("fleet-")] == []


def test_passes_and_shuffles_need_loaded_data(tmp_path):
    dataset = in_memory(write_files(tmp_path, 4, parts=1))
    with pytest.raises(ConfigError, match=r"^local_shuffle: nothing is loaded; call "
                                          r"load_into_memory\(\) first$"):
        dataset.local_shuffle()
    with pytest.raises(ConfigError, match=r"^train_from_dataset: nothing is loaded"):
        dataset._open_pass(1)


def test_local_shuffle_permutes_reproducibly_with_a_seed(tmp_path):
    files = write_files(tmp_path, 40, parts=2)
    orders = []
    for _ in range(2):
        dataset = in_memory(files, seed=7)
        dataset.load_into_memory()
        dataset.local_shuffle()
        first = example_numbers(dataset)
        dataset.local_shuffle()
        orders.append((first, example_numbers(dataset)))
    assert orders[0] == orders[1]                       # same seed, same orders
    first, second = orders[0]
    assert sorted(first) == sorted(second) == list(range(40))
    assert first != list(range(40)) and second != first  # each shuffle differs
    assert dataset.get_shuffle_data_size() == 40


def test_release_memory_drops_the_examples(tmp_path):
    dataset = in_memory(write_files(tmp_path, 5, parts=1))
    dataset.load_into_memory()
    dataset.release_memory()
    assert dataset.get_memory_data_size() == 0 and dataset.get_shuffle_data_size() == 0


# ---------------------------------------------------------------- between workers

class Exchange:
    """In-process all-to-all between worker threads (a barrier-based exchange)."""

    def __init__(self, workers):
        self.workers = workers
        self.barrier = threading.Barrier(workers, timeout=TIMEOUT)
        self.outbox = [None] * workers

    def all_to_all(self, me, blobs):
        assert len(blobs) == self.workers and all(isinstance(b, bytes) for b in blobs)
        self.outbox[me] = blobs
        self.barrier.wait()
        received = [self.outbox[j][me] for j in range(self.workers)]
        self.barrier.wait()
        return received


class FakeFleet:
    def __init__(self, exchange, index):
        self.exchange, self.index = exchange, index

    def worker_num(self):
        return self.exchange.workers

    def worker_index(self):
        return self.index

    def barrier_worker(self):
        self.exchange.barrier.wait()

    def _all_to_all(self, blobs):
        return self.exchange.all_to_all(self.index, blobs)


def run_workers(workers, body):
    """Runs ``body(fleet)`` in one thread per worker; returns their results in order."""
    exchange = Exchange(workers)
    results, errors = [None] * workers, []

    def run(i):
        try:
            results[i] = body(FakeFleet(exchange, i))
        except Exception as e:  # re-raised below
            errors.append(e)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    if errors:
        raise errors[0]
    return results


def test_global_shuffle_across_two_workers_keeps_the_multiset_and_moves_examples(tmp_path):
    shares = {0: write_files(tmp_path, 200, parts=2, prefix="w0"),
              1: write_files(tmp_path, 150, parts=3, start=200, prefix="w1")}

    def worker(fleet):
        dataset = in_memory(shares[fleet.worker_index()], seed=11)
        dataset.load_into_memory()
        before = example_numbers(dataset)
        total = dataset.get_memory_data_size(fleet)
        dataset.global_shuffle(fleet)
        after = example_numbers(dataset)
        return before, after, total, dataset.get_memory_data_size(fleet), \
            dataset.get_shuffle_data_size(fleet), dataset.get_shuffle_data_size()

    (before0, after0, total0, size0, shuf0, local0), (before1, after1, total1, size1, shuf1, local1) = \
        run_workers(2, worker)
    assert total0 == total1 == size0 == size1 == shuf0 == shuf1 == 350
    assert local0 == len(after0) and local1 == len(after1)
    assert sorted(after0 + after1) == list(range(350))      # nothing lost or duplicated
    assert set(after0) != set(before0) and set(after1) != set(before1)
    assert set(after0) & set(before1) and set(after1) & set(before0)  # examples crossed over
    assert 100 < len(after0) < 250                             # a random share, not all of it


def test_global_shuffle_is_reproducible_with_a_seed(tmp_path):
    shares = {0: write_files(tmp_path, 60, parts=1, prefix="a"),
              1: write_files(tmp_path, 60, parts=1, start=60, prefix="b")}

    def worker(fleet):
        dataset = in_memory(shares[fleet.worker_index()], seed=3)
        dataset.load_into_memory()
        dataset.global_shuffle(fleet)
        return example_numbers(dataset)

    assert run_workers(2, worker) == run_workers(2, worker)


def test_global_shuffle_without_fleet_is_a_local_shuffle(tmp_path):
    dataset = in_memory(write_files(tmp_path, 30, parts=1), seed=5)
    dataset.load_into_memory()
    dataset.global_shuffle()
    order = example_numbers(dataset)
    assert sorted(order) == list(range(30)) and order != list(range(30))


def test_global_shuffle_rejects_an_object_that_cannot_exchange(tmp_path):
    dataset = in_memory(write_files(tmp_path, 3, parts=1))
    dataset.load_into_memory()
    with pytest.raises(ConfigError, match=r"global_shuffle\(fleet=\.\.\.\) needs the fleet object"
                                          r".* has no _all_to_all\(\)"):
        dataset.global_shuffle(fleet=type("F", (), {"worker_num": lambda s: 2,
                                                    "worker_index": lambda s: 0})())


def test_blocks_survive_serialization_for_the_exchange():
    values = np.arange(6, dtype=np.int64)
    block = ExampleBlock(3, [(np.arange(6, dtype=np.float32).reshape(3, 2), None),
                             (values, np.array([0, 1, 3, 6], dtype=np.int64)),
                             (np.array([[1], [0], [1]], dtype=np.int64), None)])
    back = ExampleBlock.from_bytes(block.to_bytes())
    assert back.n == 3
    for (v1, o1), (v2, o2) in zip(block.columns, back.columns):
        assert v1.dtype == v2.dtype and np.array_equal(v1, v2)
        assert (o1 is None and o2 is None) or np.array_equal(o1, o2)
    with pytest.raises(DataError, match="starts with b'JUNK', not b'FLDB'"):
        ExampleBlock.from_bytes(b"JUNK" + bytes(8))


def _pass_rows(dataset):
    """Per example of one pass: (x[0], the id sequence, label), in order."""
    source = dataset._open_pass(1)
    rows = []
    while (batch := source.get(TIMEOUT)) is not None:
        ids = batch["ids"]
        for i in range(len(batch["label"])):
            rows.append((float(batch["x"][i, 0]), tuple(ids.values[ids.offsets[i]:ids.offsets[i + 1]].tolist()),
                         int(batch["label"][i, 0])))
    source.close()
    return rows


def test_slots_shuffle_moves_one_slots_values_between_examples_within_pools(tmp_path):
    dataset = in_memory(write_files(tmp_path, 40, parts=2), seed=4)
    dataset.load_into_memory()
    before = _pass_rows(dataset)
    with pytest.raises(ConfigError, match=r"slots_shuffle needs feature evaluation on: call "
                                          r"set_fea_eval\(record_candidate_size, True\) first"):
        dataset.slots_shuffle(["ids"])
    dataset.set_fea_eval(10, True)
    dataset.slots_shuffle(["ids"])
    after = _pass_rows(dataset)
    assert [(x, y) for x, _, y in after] == [(x, y) for x, _, y in before]  # other slots stay
    assert [s for _, s, _ in after] != [s for _, s, _ in before]             # this one moved ...
    for pool in range(4):                                                     # ... within its pool of 10
        assert sorted(s for _, s, _ in after[pool * 10:(pool + 1) * 10]) == \
            sorted(s for _, s, _ in before[pool * 10:(pool + 1) * 10])
    dataset.slots_shuffle(["x"])  # starts again from the unshuffled examples
    again = _pass_rows(dataset)
    assert [s for _, s, _ in again] == [s for _, s, _ in before]
    assert sorted(x for x, _, _ in again) == sorted(x for x, _, _ in before) and \
        [x for x, _, _ in again] != [x for x, _, _ in before]
    with pytest.raises(ConfigError, match=r"slots_shuffle: \['nope'\] are not slots of this dataset; its slots "
                                          r"are \['x', 'ids', 'label'\]"):
        dataset.slots_shuffle(["nope"])
    dataset.set_fea_eval(10, False)
    with pytest.raises(ConfigError, match="slots_shuffle needs feature evaluation on"):
        dataset.slots_shuffle(["x"])


def test_paddles_in_memory_settings_are_accepted_or_refused_with_the_reason(tmp_path):
    dataset = in_memory(write_files(tmp_path, 4, parts=1))
    dataset.set_fleet_send_batch_size(1024)
    dataset.set_fleet_send_sleep_seconds(0)
    dataset.set_parse_ins_id(False)
    dataset.set_parse_content(False)
    with pytest.raises(ConfigError, match=r"set_parse_ins_id\(True\): fleet's datasets do not read lines that start "
                                          r"with an instance id; leave it False"):
        dataset.set_parse_ins_id(True)
    with pytest.raises(ConfigError, match="fleet_send_batch_size must be a positive int, got 0"):
        dataset.set_fleet_send_batch_size(0)
    with pytest.raises(ConfigError, match="fleet_send_sleep_seconds must be an int >= 0, got -1"):
        dataset.set_fleet_send_sleep_seconds(-1)
    with pytest.raises(ConfigError, match="record_candidate_size must be a positive int, got 0"):
        dataset.set_fea_eval(0)
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 4
