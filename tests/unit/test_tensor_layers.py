"""fluid.layers shape, argmax / argmin, zeros / ones (and _like), Paddle 1.x's one_hot,
cos_sim and l2_normalize: values against numpy, gradients against finite differences,
and the errors for bad arguments."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError, DataError

from gradcheck import check_grads

X = np.array([[1, 5, 2, 0], [3, -1, 3, 9], [-2, 0.5, 4, 1]], np.float32)
Y = np.array([[1, 1, 1, 1], [0, 2, 0, 1], [1, -1, 2, 0.5]], np.float32)


pytestmark = pytest.mark.usefixtures("fresh_programs")  # tests/unit/conftest.py


def _run(outs, feed):
    exe = fleet.Executor()
    exe.run(fw.default_startup_program())
    return exe.run(feed=feed, fetch_list=outs)


def test_shape_argmax_argmin_and_constants_give_numpys_values():
    x = layers.data("x", shape=[4])
    ids = layers.data("ids", shape=[1], dtype="int64")
    seq = layers.data("seq", shape=[1], dtype="int64", lod_level=1)
    outs = [layers.shape(x), layers.shape(seq), layers.argmax(x, 1), layers.argmin(x, axis=-1), layers.argmax(x),
            layers.zeros([2], "float32"), layers.ones([2, 1], "int64"), layers.zeros_like(x), layers.ones_like(ids)]
    got = _run(outs, {"x": X, "ids": np.array([[2], [0], [1]]), "seq": [[1, 3], [0], [2]]})
    assert got[0].tolist() == [3, 4] and got[0].dtype == np.int32
    assert got[1].tolist() == [4, 1]  # four ids in the batch's sequences, one per row
    assert got[2].tolist() == X.argmax(1).tolist() and got[3].tolist() == X.argmin(1).tolist()
    assert got[4].tolist() == X.argmax(0).tolist() and got[2].dtype == np.int64
    assert got[5].tolist() == [0.0, 0.0] and got[6].tolist() == [[1], [1]] and got[6].dtype == np.int64
    assert got[7].shape == (3, 4) and not got[7].any() and got[8].tolist() == [[1], [1], [1]]
    with pytest.raises(ConfigError, match=r"argmax: axis=2 must be an int in \[-2, 2\) for 'x' of shape \(-1, 4\)"):
        layers.argmax(x, 2)


def test_one_hot_replaces_the_last_dimension_of_1_by_depth():
    ids = layers.data("ids", shape=[1], dtype="int64")
    seq = layers.data("seq", shape=[1], dtype="int64", lod_level=1)
    dense, rows = layers.one_hot(ids, 3), layers.one_hot(seq, 4)
    assert dense.shape == (-1, 3) and rows.lod_level == 1
    a, b = _run([dense, rows], {"ids": np.array([[2], [0]]), "seq": [[1, 3], [0]]})
    assert a.tolist() == [[0, 0, 1], [1, 0, 0]]
    assert b.tolist() == [[0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]]
    with pytest.raises(DataError, match=r"id 3 is outside \[0, 3\); pass allow_out_of_range=True"):
        _run([dense], {"ids": np.array([[3]]), "seq": [[0]]})
    with pytest.raises(ConfigError, match=r"must have a last dimension of 1 \(ids \[N, 1\]\), got shape \(-1, 2\)"):
        layers.one_hot(layers.data("pairs", shape=[2], dtype="int64"), 3)


def test_cos_sim_and_l2_normalize_match_numpy_and_their_gradients_match_finite_differences():
    def cos():
        x = layers.data("x", shape=[4], stop_gradient=False)
        y = layers.data("y", shape=[4], stop_gradient=False)
        return layers.cos_sim(x, y), [x, y]

    r = check_grads(cos, {"x": X, "y": Y})
    ref = (X * Y).sum(1) / np.linalg.norm(X, axis=1) / np.linalg.norm(Y, axis=1)
    np.testing.assert_allclose(r.out.reshape(-1), ref, rtol=1e-5)

    fw.reset_default_programs()

    def norm():
        x = layers.data("x", shape=[4], stop_gradient=False)
        return layers.l2_normalize(x, axis=-1), [x]

    r = check_grads(norm, {"x": X})
    np.testing.assert_allclose(r.out, X / np.linalg.norm(X, axis=1, keepdims=True), rtol=1e-5)
    with pytest.raises(ConfigError, match="l2_normalize: axis=0: fleet normalizes along the last dimension"):
        layers.l2_normalize(layers.data("z", shape=[4]), axis=0)
    with pytest.raises(ConfigError, match=r"cos_sim: X 'z' \(-1, 4\) and Y 'w' \(-1, 3\) must be"):
        layers.cos_sim(fw.default_main_program().global_block().var("z"), layers.data("w", shape=[3]))


def test_cos_sim_compares_every_row_with_a_single_row_y():
    x = layers.data("x", shape=[4])
    y = layers.data("y", shape=[4])
    (got,) = _run([layers.cos_sim(x, y)], {"x": X, "y": Y[:1]})
    ref = (X @ Y[0]) / np.linalg.norm(X, axis=1) / np.linalg.norm(Y[0])
    np.testing.assert_allclose(got.reshape(-1), ref, rtol=1e-5)


def test_an_unknown_layer_points_at_the_porting_table():
    with pytest.raises(AttributeError, match=r"fleet.layers has no attribute 'topk': .*docs/porting.md"):
        layers.topk
