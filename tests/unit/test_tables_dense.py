"""DenseTable: a dense block with its optimizer state; whole-block and row-wise updates."""
import threading

import numpy as np
import pytest

from fleet.errors import ConfigError, DataError
from fleet.rules import AdamRule, MomentumRule, SGDRule
from fleet.tables import ChangeTracker, DenseTable


def test_pull_returns_a_copy_of_the_initial_value():
    value = np.arange(6, dtype=np.float64).reshape(2, 3)
    table = DenseTable("w", value, SGDRule())
    pulled = table.pull()
    assert pulled.dtype == np.float32 and pulled.flags.c_contiguous
    np.testing.assert_array_equal(pulled, value)
    pulled[0, 0] = 100.0
    value[0, 1] = 100.0
    assert table.pull()[0, 0] == 0.0 and table.pull()[0, 1] == 1.0


def test_pull_after_n_pushes_of_v_from_w_workers_equals_the_sgd_value():
    table = DenseTable("w", np.full(1000, 3.0), SGDRule())
    grad = np.full(1000, 0.5, dtype=np.float32)
    threads = [threading.Thread(target=lambda: [table.push(grad, 0.125) for _ in range(20)]) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    np.testing.assert_array_equal(table.pull(), np.full(1000, 3.0 - 0.125 * 0.5 * 20 * 3, np.float32))


def test_push_applies_the_rule_with_its_state_like_a_local_update():
    rng = np.random.default_rng(0)
    value = rng.standard_normal((4, 5)).astype(np.float32)
    table = DenseTable("w", value, AdamRule())
    rule, param = AdamRule(), value.copy()
    state = rule.init_state(param.shape)
    for _ in range(3):
        grad = rng.standard_normal((4, 5)).astype(np.float32)
        table.push(grad, 0.01)
        rule.apply_dense(param, grad, state, 0.01)
    np.testing.assert_array_equal(table.pull(), param)
    np.testing.assert_array_equal(table.state_dict()["state.beta1_pow"], state["beta1_pow"])


def test_add_adds_a_delta_and_accepts_a_flat_delta():
    table = DenseTable("w", np.ones((2, 2)), SGDRule())
    table.add(np.full((2, 2), 0.5, np.float32))
    table.add(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(table.pull(), [[1.5, 2.5], [3.5, 4.5]])


def test_row_operations_pull_push_and_add_block_relative_rows():
    table = DenseTable("emb.block0", np.zeros((5, 2)), MomentumRule(0.9))
    table.add_rows(np.array([1, 1, 4]), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(table.pull_rows(np.array([1, 4, 0])), [[2, 2], [1, 1], [0, 0]])
    table.push_rows(np.array([0, 0]), np.ones((2, 2), np.float32), 0.5)
    np.testing.assert_array_equal(table.pull_rows(np.array([0])), [[-1.0, -1.0]])
    np.testing.assert_array_equal(table.state_dict()["state.velocity"][0], [2.0, 2.0])


def test_pull_changed_reports_rows_touched_since_the_workers_last_call():
    table = DenseTable("emb.block0", np.zeros((6, 2)), SGDRule(), track_workers=2)
    table.add_rows(np.array([4, 1]), np.ones((2, 2), np.float32))
    rows, values = table.pull_changed(0)
    assert rows.tolist() == [4, 1]
    np.testing.assert_array_equal(values, np.ones((2, 2)))
    assert table.pull_changed(0)[0].tolist() == []
    table.add(np.ones((6, 2), np.float32))
    assert table.pull_changed(0)[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert table.pull_changed(1)[0].tolist() == [4, 1, 0, 2, 3, 5]


def test_rows_out_of_range_are_refused_naming_the_row():
    table = DenseTable("emb.block0", np.zeros((5, 2)), SGDRule())
    with pytest.raises(DataError, match=r"row 5 is outside \[0, 5\); send block-relative row indices"):
        table.pull_rows(np.array([0, 5]))
    with pytest.raises(DataError, match=r"row -1 is outside"):
        table.add_rows(np.array([-1]), np.zeros((1, 2), np.float32))


def test_row_operations_need_a_two_dimensional_block():
    with pytest.raises(DataError, match=r"has shape \(4,\); row operations need a 2-D block"):
        DenseTable("b", np.zeros(4), SGDRule()).pull_rows(np.array([0]))


def test_a_gradient_of_the_wrong_shape_names_both_shapes():
    table = DenseTable("w", np.zeros((2, 3)), SGDRule())
    with pytest.raises(DataError, match=r"grad has shape \(3, 2\), expected \(2, 3\)"):
        table.push(np.zeros((3, 2), np.float32), 0.1)


def test_state_dict_round_trip_is_bit_exact():
    rng = np.random.default_rng(1)
    table = DenseTable("w", rng.standard_normal((3, 4)), AdamRule())
    for _ in range(3):
        table.push(rng.standard_normal((3, 4)).astype(np.float32), 0.1)
    saved = table.state_dict()
    other = DenseTable("w", np.zeros((3, 4)), AdamRule())
    other.load_state_dict(saved)
    for key, arr in other.state_dict().items():
        assert arr.dtype == saved[key].dtype
        np.testing.assert_array_equal(arr, saved[key])


def test_load_state_dict_names_a_missing_key_and_a_wrong_shape():
    table = DenseTable("w", np.zeros((3, 4)), AdamRule())
    with pytest.raises(ConfigError, match="the state to load has no 'state.moment1'"):
        table.load_state_dict({"value": np.zeros((3, 4), np.float32)})
    saved = table.state_dict()
    saved["value"] = np.zeros((4, 3), np.float32)
    with pytest.raises(ConfigError, match=r"'value' to load is float32\[4, 3\], expected float32\[3, 4\]"):
        table.load_state_dict(saved)


def test_change_tracker_refuses_zero_workers():
    with pytest.raises(ConfigError, match="needs at least 1 worker"):
        ChangeTracker(0)


def test_memory_bytes_counts_value_and_state():
    assert DenseTable("w", np.zeros((10, 10)), AdamRule()).memory_bytes() == 400 * 3 + 16
