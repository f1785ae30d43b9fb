"""fleet.kernels.embedding against its numpy twins: gather + pooling, gradient, id checks."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fleet.kernels import embedding as emb

SETTINGS = settings(max_examples=50, deadline=None)
POOLS = [emb.POOL_SUM, emb.POOL_AVERAGE, emb.POOL_MAX, emb.POOL_SQRT]
# Any finite float32: huge magnitudes (sums may overflow to inf), subnormals, signed zeros.
FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)
WIDE = 50  # out / dout are column slices [:, 10:10 + D] of a C-contiguous [B, WIDE] buffer


@st.composite
def lookups(draw):
    """A table and a batch of id sequences: empty ones, duplicates, ids 0 and V-1, padding."""
    height = draw(st.integers(1, 40))
    dim = draw(st.integers(1, 12))
    table = draw(hnp.arrays(np.float32, (height, dim), elements=FLOATS))
    edge_or_any = st.one_of(st.sampled_from([0, height - 1]), st.integers(0, height - 1))
    seqs = draw(st.lists(st.lists(edge_or_any, max_size=5), max_size=12))
    ids = np.array([i for s in seqs for i in s], dtype=np.int64)
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    padding_idx = draw(st.one_of(st.just(-1), st.integers(0, height - 1)))
    return table, ids, offsets, padding_idx


def _column_view(batch, dim, fill):
    big = np.full((batch, WIDE), fill, dtype=np.float32)
    return big, big[:, 10 : 10 + dim]


def _pool_both(table, ids, offsets, pool, padding_idx, out_view):
    batch, dim = len(offsets) - 1, table.shape[1]
    if out_view:
        big, out = _column_view(batch, dim, 7.0)
    else:
        big, out = None, np.full((batch, dim), 7.0, dtype=np.float32)
    argmax = np.full((batch, dim), -7, dtype=np.int64)
    emb.gather_pool(table, ids, offsets, pool, padding_idx, out, argmax)
    ref_out = np.full((batch, dim), 7.0, dtype=np.float32)
    ref_argmax = np.full((batch, dim), -7, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        emb.gather_pool_reference(table, ids, offsets, pool, padding_idx, ref_out, ref_argmax)
    return big, out, argmax, ref_out, ref_argmax


@SETTINGS
@given(lookups(), st.sampled_from(POOLS), st.booleans())
def test_gather_pool_matches_reference_for_every_pool(lookup, pool, out_view):
    table, ids, offsets, padding_idx = lookup
    big, out, argmax, ref_out, ref_argmax = _pool_both(table, ids, offsets, pool, padding_idx, out_view)
    np.testing.assert_array_equal(out, ref_out)
    if pool == emb.POOL_MAX:
        np.testing.assert_array_equal(argmax, ref_argmax)
    else:
        assert (argmax == -7).all(), "non-max pools must leave argmax untouched"
    if out_view:
        assert (big[:, :10] == 7.0).all() and (big[:, 10 + table.shape[1] :] == 7.0).all()


@SETTINGS
@given(lookups(), st.sampled_from(POOLS), st.booleans())
def test_gather_pool_grad_matches_reference_for_every_pool(lookup, pool, dout_view):
    table, ids, offsets, padding_idx = lookup
    batch, dim = len(offsets) - 1, table.shape[1]
    _, _, argmax, _, _ = _pool_both(table, ids, offsets, pool, padding_idx, False)
    rng = np.random.default_rng(len(ids))
    dense_dout = rng.standard_normal((batch, dim)).astype(np.float32) * np.float32(1e20)
    if dout_view:
        _, dout = _column_view(batch, dim, 0.0)
        dout[...] = dense_dout
    else:
        dout = dense_dout
    values = np.full((len(ids), dim), 7.0, dtype=np.float32)
    emb.gather_pool_grad(dout, ids, offsets, pool, padding_idx, argmax, values)
    ref = np.full((len(ids), dim), 7.0, dtype=np.float32)
    emb.gather_pool_grad_reference(dense_dout, ids, offsets, pool, padding_idx, argmax, ref)
    np.testing.assert_array_equal(values, ref)
    assert (values[ids == padding_idx] == 0).all()


@SETTINGS
@given(lookups(), st.sampled_from([emb.POOL_SUM, emb.POOL_AVERAGE, emb.POOL_SQRT]))
def test_linear_pool_gradient_is_the_adjoint_of_the_forward_pass(lookup, pool):
    # <dout, pool(T)> == <scatter(grad rows), T> for every table T when pooling is linear.
    _, ids, offsets, padding_idx = lookup
    height, batch = max(int(ids.max(initial=0)) + 1, 1), len(offsets) - 1
    rng = np.random.default_rng(3)
    table = rng.standard_normal((height, 4)).astype(np.float32)
    dout = rng.standard_normal((batch, 4)).astype(np.float32)
    out = np.empty((batch, 4), dtype=np.float32)
    emb.gather_pool(table, ids, offsets, pool, padding_idx, out, np.zeros((0, 0), np.int64))
    values = np.empty((len(ids), 4), dtype=np.float32)
    emb.gather_pool_grad(dout, ids, offsets, pool, padding_idx, np.zeros((0, 0), np.int64), values)
    grad_table = np.zeros((height, 4))
    np.add.at(grad_table, ids, values.astype(np.float64))
    lhs = float(np.sum(dout.astype(np.float64) * out))
    rhs = float(np.sum(grad_table * table))
    assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-4)


def test_pools_of_one_sequence_have_paddles_values():
    table = np.array([[1.0, -2.0], [3.0, 4.0], [9.0, 9.0]], dtype=np.float32)
    ids = np.array([0, 1, 2, 1], dtype=np.int64)
    offsets = np.array([0, 4, 4], dtype=np.int64)  # one sequence of 4 (id 2 is padding), one empty
    expected = {
        emb.POOL_SUM: [7.0, 6.0],
        emb.POOL_AVERAGE: [7.0 / 4, 6.0 / 4],
        emb.POOL_MAX: [3.0, 4.0],
        emb.POOL_SQRT: [7.0 / 2, 6.0 / 2],
    }
    for pool, row in expected.items():
        out = np.full((2, 2), 5.0, dtype=np.float32)
        argmax = np.zeros((2, 2), dtype=np.int64)
        emb.gather_pool(table, ids, offsets, pool, 2, out, argmax)
        np.testing.assert_allclose(out, [row, [0.0, 0.0]], rtol=1e-7)
        if pool == emb.POOL_MAX:
            np.testing.assert_array_equal(argmax, [[1, 1], [-1, -1]])  # first of the tied 1s wins


def test_max_pool_with_padding_lets_the_zero_row_win_over_negatives():
    table = np.array([[-1.0, 2.0], [0.0, 0.0]], dtype=np.float32)
    ids = np.array([0, 1], dtype=np.int64)
    out = np.empty((1, 2), dtype=np.float32)
    argmax = np.empty((1, 2), dtype=np.int64)
    emb.gather_pool(table, ids, np.array([0, 2]), emb.POOL_MAX, 1, out, argmax)
    np.testing.assert_array_equal(out, [[0.0, 2.0]])
    np.testing.assert_array_equal(argmax, [[1, 0]])
    values = np.empty((2, 2), dtype=np.float32)
    emb.gather_pool_grad(np.array([[5.0, 6.0]], np.float32), ids, np.array([0, 2]), emb.POOL_MAX, 1,
                         argmax, values)
    np.testing.assert_array_equal(values, [[0.0, 6.0], [0.0, 0.0]])  # padding position gets zeros


@pytest.mark.parametrize("pool", POOLS)
def test_empty_batch_pools_and_differentiates_to_nothing(pool):
    table = np.ones((3, 4), dtype=np.float32)
    ids = np.zeros(0, dtype=np.int64)
    offsets = np.zeros(1, dtype=np.int64)
    out = np.empty((0, 4), dtype=np.float32)
    argmax = np.empty((0, 4), dtype=np.int64)
    emb.gather_pool(table, ids, offsets, pool, -1, out, argmax)
    values = np.empty((0, 4), dtype=np.float32)
    emb.gather_pool_grad(out, ids, offsets, pool, -1, argmax, values)
    assert out.shape == (0, 4) and values.shape == (0, 4)


def test_gather_pool_rejects_an_out_of_the_wrong_shape():
    with pytest.raises(AssertionError, match="out must be"):
        emb.gather_pool(np.ones((3, 4), np.float32), np.zeros(2, np.int64), np.array([0, 1, 2]),
                        emb.POOL_SUM, -1, np.empty((2, 3), np.float32), np.zeros((0, 0), np.int64))


@SETTINGS
@given(lookups())
def test_gather_rows_matches_reference_with_padding(lookup):
    table, ids, _, padding_idx = lookup
    out = np.full((len(ids), table.shape[1]), 7.0, dtype=np.float32)
    emb.gather_rows(table, ids, padding_idx, out)
    ref = np.empty_like(out)
    emb.gather_rows_reference(table, ids, padding_idx, ref)
    np.testing.assert_array_equal(out, ref)


@SETTINGS
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-2, 12), max_size=30),
    st.integers(0, 10),
)
def test_check_ids_finds_the_first_id_outside_the_table(ids, height):
    ids = np.array(ids, dtype=np.int64)
    assert emb.check_ids(ids, height) == emb.check_ids_reference(ids, height)


def test_check_ids_accepts_the_edges_and_flags_height_itself():
    assert emb.check_ids(np.array([0, 9, 5], dtype=np.int64), 10) == -1
    assert emb.check_ids(np.array([0, 9, 10, -1], dtype=np.int64), 10) == 2
    assert emb.check_ids(np.zeros(0, dtype=np.int64), 10) == -1


@SETTINGS
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 40) | st.integers(0, 2**20).map(lambda x: x << 40),
             max_size=60),
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 40), max_size=20),
    st.booleans(),
)
def test_positions_in_sorted_equal_searchsorted_for_present_absent_and_repeated_ids(table, extra, unique):
    sorted_ids = np.unique(np.array(table, dtype=np.int64)) if unique else np.sort(np.array(table, dtype=np.int64))
    ids = np.concatenate([sorted_ids[::-1], np.array(extra, dtype=np.int64), sorted_ids[::3]])
    out = np.full(len(ids), -7, dtype=np.int64)
    emb.positions_in_sorted(sorted_ids, emb.index_sorted_ids(sorted_ids), ids, out)
    np.testing.assert_array_equal(out, emb.positions_in_sorted_reference(sorted_ids, ids))


def test_index_sorted_ids_holds_every_position_once_at_load_at_most_half():
    sorted_ids = np.arange(0, 3000, 3, dtype=np.int64)
    slots = emb.index_sorted_ids(sorted_ids)
    assert len(slots) == 2048 and slots.dtype == np.int32
    np.testing.assert_array_equal(np.sort(slots[slots >= 0]), np.arange(1000))
    assert len(emb.index_sorted_ids(np.zeros(0, dtype=np.int64))) == 2
