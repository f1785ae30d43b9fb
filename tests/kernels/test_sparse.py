"""fleet.kernels.sparse against its numpy twins: merge_rows, scatter_add, add_into, scale_into."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleet.kernels import sparse

SETTINGS = settings(max_examples=50, deadline=None)
FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)
INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def row_batches(draw, ids=None, max_rows=80):
    """Unsorted rows with duplicates (more than 32 of them reach the radix sort) and values."""
    ids = ids if ids is not None else st.integers(0, 20)
    rows = np.array(draw(st.lists(ids, max_size=max_rows)), dtype=np.int64)
    dim = draw(st.integers(1, 6))
    values = draw(hnp.arrays(np.float32, (len(rows), dim), elements=FLOATS))
    return rows, values


def _assert_merge_matches_reference(rows, values):
    uniq, summed = sparse.merge_rows(rows, values)
    with np.errstate(over="ignore", invalid="ignore"):
        ref_uniq, ref_summed = sparse.merge_rows_reference(rows, values)
    np.testing.assert_array_equal(uniq, ref_uniq)
    np.testing.assert_array_equal(summed, ref_summed)
    assert uniq.dtype == np.int64 and summed.dtype == np.float32
    assert summed.shape == (len(uniq), values.shape[1]) and summed.flags.c_contiguous


@SETTINGS
@given(row_batches())
def test_merge_rows_sums_duplicates_and_sorts_like_reference(batch):
    _assert_merge_matches_reference(*batch)


@SETTINGS
@given(row_batches(ids=INT64 | st.sampled_from([-(2**63), 2**63 - 1, -1, 0]), max_rows=60))
def test_merge_rows_orders_any_int64_ids_including_the_extremes(batch):
    _assert_merge_matches_reference(*batch)


@SETTINGS
@given(st.integers(0, 3), st.integers(33, 3000), st.sampled_from([2**11, 2**20, 2**40, 2**62]))
def test_merge_rows_radix_passes_agree_with_reference_on_large_batches(seed, n, span):
    rng = np.random.default_rng(seed)
    rows = rng.integers(-span, span, n, dtype=np.int64)
    rows[: n // 3] = rows[n // 3 : 2 * (n // 3)]  # plenty of duplicates
    rng.shuffle(rows)
    values = rng.standard_normal((n, 3)).astype(np.float32)
    _assert_merge_matches_reference(rows, values)


def test_merge_rows_skips_passes_where_every_id_shares_the_digit():
    rows = np.array([5 << 22, 3 << 22, 5 << 22] * 20, dtype=np.int64)  # low 22 bits all zero
    values = np.ones((60, 2), dtype=np.float32)
    uniq, summed = sparse.merge_rows(rows, values)
    np.testing.assert_array_equal(uniq, [3 << 22, 5 << 22])
    np.testing.assert_array_equal(summed, [[20, 20], [40, 40]])


def test_merge_rows_of_an_empty_batch_is_empty():
    uniq, summed = sparse.merge_rows(np.zeros(0, np.int64), np.zeros((0, 10), np.float32))
    assert uniq.shape == (0,) and summed.shape == (0, 10)


def test_merge_rows_adds_duplicates_in_the_order_they_appear():
    # float32 addition is not associative: 1e8 + 1 + -1e8 = 0, but 1e8 + -1e8 + 1 = 1
    rows = np.array([4, 4, 4], dtype=np.int64)
    values = np.array([[1e8], [1.0], [-1e8]], dtype=np.float32)
    _, summed = sparse.merge_rows(rows, values)
    assert summed[0, 0] == np.float32(np.float32(1e8) + np.float32(1.0)) - np.float32(1e8)


@SETTINGS
@given(row_batches(ids=st.sampled_from([0, 1, 7, 8]) | st.integers(0, 8)))
def test_scatter_add_accumulates_duplicates_like_reference(batch):
    rows, values = batch
    table = np.linspace(-1, 1, 9 * values.shape[1], dtype=np.float32).reshape(9, -1)
    expected = table.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        sparse.scatter_add_reference(expected, rows, values)
    sparse.scatter_add(table, rows, values)
    np.testing.assert_array_equal(table, expected)


def test_scatter_add_rejects_values_of_the_wrong_width():
    with pytest.raises(AssertionError, match="values must be"):
        sparse.scatter_add(np.zeros((4, 3), np.float32), np.array([1]), np.zeros((1, 2), np.float32))


@SETTINGS
@given(st.integers(0, 5000), st.sampled_from([(-1,), (-1, 2)]), st.integers(0, 3))
def test_add_into_matches_reference_for_any_size_reading_both_flat(n, shape, seed):
    n -= n % 2
    rng = np.random.default_rng(seed)
    out = rng.standard_normal(n).astype(np.float32).reshape(shape)
    x = rng.standard_normal(n).astype(np.float32)  # same size, other shape: read flat
    expected = out.copy()
    sparse.add_into_reference(expected, x)
    sparse.add_into(out, x)
    np.testing.assert_array_equal(out, expected)


def test_add_into_over_a_large_array_uses_every_element():
    out = np.ones((1 << 20,), dtype=np.float32)
    x = np.arange(1 << 20, dtype=np.float32)
    sparse.add_into(out, x)
    np.testing.assert_array_equal(out, x + 1)


def test_add_into_rejects_arrays_of_different_sizes():
    with pytest.raises(AssertionError, match="same number of elements"):
        sparse.add_into(np.zeros(4, np.float32), np.zeros(5, np.float32))


@SETTINGS
@given(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=8), elements=FLOATS),
    st.floats(-1e6, 1e6) | st.sampled_from([0.0, 1.0 / 3.0, 1e-30, 1e30]),
)
def test_scale_into_matches_reference_with_a_float32_factor(out, factor):
    expected = out.copy()
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        sparse.scale_into_reference(expected, factor)
    sparse.scale_into(out, factor)
    np.testing.assert_array_equal(out, expected)
