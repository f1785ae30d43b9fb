"""Training threads cost no accuracy: N threads taking turns in one thread's batch order end
bit-identical to one thread (every parameter, table row, optimizer state and metric state);
Reduce splits each batch across the threads and equals one thread to float tolerance."""

import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.framework.trainer import split_batch
from fleet.framework.tensor import LoDTensor
from strategies import BuildStrategy, ReduceStrategy

SLOTS = 3
VOCAB = 300


def _write_data(path, n, seed):
    """MultiSlot lines: 2 dense values, SLOTS sequences of 1-3 ids, a label planted on slot 0."""
    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(7).normal(0, 1.5, VOCAB)
    with open(path, "w") as f:
        for _ in range(n):
            x = rng.normal(size=2)
            seqs = [rng.integers(0, VOCAB, rng.integers(1, 4)) for _ in range(SLOTS)]
            y = int(rng.random() < 1 / (1 + np.exp(-(weights[seqs[0][0]] + x[0]))))
            text = " ".join(f"{len(s)} " + " ".join(map(str, s)) for s in seqs)
            f.write(f"2 {x[0]:.5f} {x[1]:.5f} {text} 1 {y}\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("threads")
    paths = [str(d / f"part{i}") for i in range(2)]
    for i, p in enumerate(paths):
        _write_data(p, 700, i)  # 14 batches of 100 a pass: the last turn of 3 threads is short
    return paths


OPTIMIZERS = {
    "sgd": lambda: optimizer.SGD(0.05),
    "adam": lambda: optimizer.Adam(0.01),
    "adam_lazy": lambda: optimizer.Adam(0.01, lazy_mode=True),
    # a schedule (one counter step per batch, whatever the threads) and a regularizer
    "rmsprop_schedule": lambda: optimizer.RMSProp(layers.exponential_decay(0.01, 5, 0.5, staircase=True),
                                                  regularization=fleet.regularizer.L2Decay(1e-3)),
}


def _program(opt, reduce=False):
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[2])
        slots = [layers.data(f"s{i}", shape=[1], dtype="int64", lod_level=1) for i in range(SLOTS)]
        y = layers.data("y", shape=[1], dtype="int64")
        pooled = [layers.sequence_pool(layers.embedding(s, size=[VOCAB, 4], is_sparse=True, param_attr="table"),
                                       "sum") for s in slots]
        h = layers.fc(layers.concat(pooled + [x], axis=1), 8, act="relu")
        pred = layers.fc(h, 2, act="softmax")
        loss = layers.mean(layers.cross_entropy(pred, y))
        layers.auc(pred, y)
        optimizer_ = OPTIMIZERS[opt]()
        lr = optimizer_._learning_rate
        if isinstance(lr, fw.Variable):  # the forward reads the rate: it must be this step's
            loss = loss * (lr / lr)
        optimizer_.minimize(loss)
    startup.random_seed = 11
    if reduce:
        main._build_strategy = BuildStrategy()
        main._build_strategy.reduce_strategy = ReduceStrategy.Reduce
    return main, startup, [x, *slots, y]


def _train(files, opt, threads, reduce=False, epochs=2, producers=1, batch=100):
    """Trains and returns {name: copy} of everything the scope holds."""
    main, startup, inputs = _program(opt, reduce)
    scope = fw.Scope()
    exe = fw.Executor()
    exe.run(startup, scope=scope)
    ds = fleet.DatasetFactory().create_dataset("QueueDataset")
    ds.set_use_var(inputs)
    ds.set_batch_size(batch)
    ds.set_thread(producers)  # one producer: the batches come in one thread's order
    ds.set_filelist(files)
    for _ in range(epochs):
        summary = exe.train_from_dataset(main, ds, scope=scope, thread=threads, print_period=0)
        assert summary["examples"] == 1400
    return {name: np.array(scope.vars[name], copy=True) for name in scope.vars}


def _assert_bit_identical(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert np.array_equal(got[name], want[name]), f"{name} differs from one thread's"


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("threads", [2, 3])
def test_threads_taking_turns_end_bit_identical_to_one_thread(files, opt, threads, monkeypatch):
    want = _train(files, opt, 1)
    monkeypatch.setenv("FLEET_SERIAL_THREADS", "1")
    got = _train(files, opt, threads)
    # what is compared: parameters, the table, optimizer state and metric state
    assert {"table", "table_moment1_0", "table_beta1_pow_0"} <= set(want) or not opt.startswith("adam")
    assert any(name.startswith("auc") for name in want), sorted(want)
    _assert_bit_identical(got, want)
    if opt.startswith("adam"):  # 2 passes of 14 batches: 28 steps, each taken once
        assert got["table_beta1_pow_0"][0] == pytest.approx(0.9 ** 29)
    if opt == "rmsprop_schedule":  # the counter starts at -1: 28 batches end at 27
        assert got["@LR_DECAY_COUNTER@"][0] == 27


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("threads", [2, 3])
def test_reduce_threads_split_each_batch_and_equal_one_thread(files, opt, threads, monkeypatch):
    want = _train(files, opt, 1)
    got = _train(files, opt, threads, reduce=True)
    assert sorted(got) == sorted(want)
    for name in want:  # the sum over a batch split in parts rounds differently: not bit-exact
        if name.startswith("auc"):  # every example counted once
            assert got[name].sum() == want[name].sum(), name
        else:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # Reduce never depends on thread timing: taking turns gives the same bits
    monkeypatch.setenv("FLEET_SERIAL_THREADS", "1")
    _assert_bit_identical(_train(files, opt, threads, reduce=True), got)


def test_reduce_makes_one_update_per_batch(files):
    state = _train(files, "adam", 2, reduce=True, epochs=1)
    assert state["table_beta1_pow_0"][0] == pytest.approx(0.9 ** 15)  # 14 batches, 14 updates


def test_reduce_steps_the_learning_rate_counter_once_per_batch(files):
    state = _train(files, "rmsprop_schedule", 3, reduce=True, epochs=1)
    assert state["@LR_DECAY_COUNTER@"][0] == 13  # 14 batches from -1


def test_serial_threads_flag_is_validated(files, monkeypatch):
    monkeypatch.setenv("FLEET_SERIAL_THREADS", "yes")
    with pytest.raises(fleet.errors.ConfigError, match="FLEET_SERIAL_THREADS='yes' must be 0 or 1"):
        _train(files, "sgd", 2)


def test_split_batch_gives_consecutive_nearly_equal_parts():
    ids = LoDTensor(np.arange(9, dtype=np.int64), np.array([0, 1, 3, 3, 6, 7, 9], dtype=np.int64))
    feed = {"x": np.arange(12, dtype=np.float32).reshape(6, 2), "s": ids}
    parts = split_batch(feed, 4)
    assert [len(p["x"]) for p in parts] == [1, 2, 1, 2]
    np.testing.assert_array_equal(np.concatenate([p["x"] for p in parts]), feed["x"])
    assert [p["s"].offsets.tolist() for p in parts] == [[0, 1], [0, 2, 2], [0, 3], [0, 1, 3]]
    np.testing.assert_array_equal(np.concatenate([p["s"].values for p in parts]), ids.values)
    assert len(split_batch({"x": feed["x"][:2]}, 3)) == 2  # never an empty part


def test_hogwild_threads_never_update_one_parameter_at_the_same_time(files, monkeypatch):
    """Threads compute concurrently but each parameter's update runs alone: two Adam updates
    of one table interleaved element by element could leave one thread's first moment next
    to the other's second moment (m1 / sqrt(m2) unbounded where m2 ~ 0: rows of ~1e4)."""
    import threading
    import time
    from fleet.rules import AdamRule

    active, overlaps, updates = {}, [], []
    guard = threading.Lock()

    def watched(method):
        def run(self, param, *args):
            with guard:
                if active.get(id(param)):
                    overlaps.append(id(param))
                active[id(param)] = active.get(id(param), 0) + 1
                updates.append(threading.get_ident())
            time.sleep(0.002)  # widen the window in which another thread could enter
            try:
                return method(self, param, *args)
            finally:
                with guard:
                    active[id(param)] -= 1
        return run

    monkeypatch.setattr(AdamRule, "apply_sparse", watched(AdamRule.apply_sparse))
    monkeypatch.setattr(AdamRule, "apply_dense", watched(AdamRule.apply_dense))
    _train(files, "adam", 2, epochs=1)
    assert len(set(updates)) == 2, "both threads should have updated parameters"
    assert len(updates) == 14 * 5  # 14 batches x 5 parameters (table, 2 fc weights, 2 biases)
    assert overlaps == []
