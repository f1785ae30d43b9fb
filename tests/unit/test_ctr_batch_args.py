"""examples/ctr_dnn/train.py: how many examples each training thread reads per step
(--batch_size: examples per update, divided by what an update averages; --batch_per_thread:
Paddle 1.x's per-thread batch in every strategy)."""
import importlib.util
import os
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ctr_dnn")


@pytest.fixture()
def train(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLE)
    spec = importlib.util.spec_from_file_location("ctr_train_under_test", os.path.join(EXAMPLE, "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # a job of 2 workers (not local)
    monkeypatch.setattr(module.fleet, "is_local", lambda: False)
    monkeypatch.setattr(module.fleet, "worker_num", lambda: 2)
    yield module
    sys.modules.pop("ctr_train_under_test", None)


@pytest.mark.parametrize("strategy, threads, expected", [
    ("sync", 2, 250), ("hybrid", 1, 500), ("collective", 1, 500), ("async", 2, 1000), ("half_async", 2, 500),
    ("geo", 1, 500)])
def test_batch_size_is_examples_per_update(train, strategy, threads, expected):
    args = train.parse_args(["--strategy", strategy, "--threads", str(threads), "--batch_size", "1000"])
    assert train.thread_batch_size(args) == expected


@pytest.mark.parametrize("strategy", ["sync", "async", "half_async", "geo", "hybrid", "collective"])
def test_batch_per_thread_is_the_same_in_every_strategy(train, strategy):
    args = train.parse_args(["--strategy", strategy, "--threads", "2", "--batch_per_thread", "700"])
    assert train.thread_batch_size(args) == 700


def test_batch_per_thread_below_one_is_refused_with_the_value(train):
    args = train.parse_args(["--strategy", "sync", "--batch_per_thread", "0"])
    with pytest.raises(SystemExit, match="--batch_per_thread 0: give at least 1 example"):
        train.thread_batch_size(args)


def test_online_options_without_batch_per_thread_get_the_division(train, monkeypatch):
    """online.py shares thread_batch_size and has no --batch_per_thread option."""
    spec = importlib.util.spec_from_file_location("ctr_online_under_test", os.path.join(EXAMPLE, "online.py"))
    online = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(online)
    try:
        args = online.parse_args(["--strategy", "sync", "--threads", "2", "--batch_size", "1000"])
        assert not hasattr(args, "batch_per_thread")
        assert train.thread_batch_size(args) == 250
    finally:
        sys.modules.pop("ctr_online_under_test", None)
