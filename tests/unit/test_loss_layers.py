"""softmax_with_cross_entropy, square_error_cost and mse_loss: Paddle's values, shapes and
defaults, gradients against central finite differences (gradcheck.py)."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError, DataError

from gradcheck import check_grads


def _r(seed, shape, scale=1.0):
    return np.random.default_rng(seed).normal(0, scale, size=shape).astype(np.float32)


def _log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_softmax_with_cross_entropy_of_class_ids_is_minus_log_softmax_and_its_gradient_matches():
    logits = _r(1, (5, 4), scale=3.0)
    label = np.array([[0], [3], [1], [-100], [2]], dtype=np.int64)

    def build():
        x = layers.data("logits", shape=[4], stop_gradient=False)
        y = layers.data("label", shape=[1], dtype="int64")
        loss = layers.softmax_with_cross_entropy(x, y)
        assert loss.shape == (-1, 1)
        return loss, [x]

    r = check_grads(build, {"logits": logits, "label": label})
    log_p = _log_softmax(logits.astype(np.float64))
    expected = -log_p[np.arange(5), np.maximum(label[:, 0], 0)]
    expected[3] = 0  # ignore_index -100 (Paddle's default)
    np.testing.assert_allclose(r.out[:, 0], expected, rtol=1e-5, atol=1e-6)
    assert not r.analytic["logits"][3].any()


def test_softmax_with_cross_entropy_of_soft_labels_and_its_softmax_output():
    logits = _r(2, (3, 4))
    soft = np.random.default_rng(3).dirichlet(np.ones(4), 3).astype(np.float32)

    def build():
        x = layers.data("logits", shape=[4], stop_gradient=False)
        y = layers.data("soft", shape=[4])
        loss, softmax = layers.softmax_with_cross_entropy(x, y, soft_label=True, return_softmax=True)
        assert softmax.shape == (-1, 4)
        return layers.elementwise_add(loss, layers.reduce_sum(softmax, dim=1, keep_dim=True)), [x]

    r = check_grads(build, {"logits": logits, "soft": soft})
    log_p = _log_softmax(logits.astype(np.float64))
    np.testing.assert_allclose(r.out[:, 0], -(soft * log_p).sum(1) + 1.0, rtol=1e-5)


def test_softmax_with_cross_entropy_stays_finite_for_huge_logits():
    fw.reset_default_programs()
    x = layers.data("x", shape=[2])
    y = layers.data("y", shape=[1], dtype="int64")
    loss = layers.softmax_with_cross_entropy(x, y)
    (got,) = fw.Executor().run(feed={"x": np.array([[1000.0, -1000.0]], np.float32), "y": np.array([[1]])},
                               fetch_list=[loss], scope=fw.Scope())
    assert got[0, 0] == pytest.approx(2000.0)
    with pytest.raises(DataError, match=r"softmax_with_cross_entropy label 'y' values must be class ids in "
                                        r"\[0, 2\), got 5"):
        fw.Executor().run(feed={"x": np.zeros((1, 2), np.float32), "y": np.array([[5]])}, fetch_list=[loss],
                          scope=fw.Scope())
    with pytest.raises(ConfigError, match="softmax_with_cross_entropy label 'f' must be int64 class ids"):
        layers.softmax_with_cross_entropy(x, layers.data("f", shape=[1]))
    fw.reset_default_programs()


def test_square_error_cost_and_mse_loss_match_numpy_and_their_gradients_match():
    pred, label = _r(4, (6, 1)), _r(5, (6, 1))

    def build():
        p = layers.data("p", shape=[1], stop_gradient=False)
        y = layers.data("y", shape=[1])
        cost, mse = layers.square_error_cost(p, y), layers.mse_loss(p, y)
        assert cost.shape == (-1, 1) and mse.shape == (1,)
        return layers.elementwise_add(cost, mse), [p]

    r = check_grads(build, {"p": pred, "y": label})
    sq = (pred - label) ** 2
    np.testing.assert_allclose(r.out, sq + sq.mean(), rtol=1e-5)
