"""sequence_expand_as / sequence_expand and sequence_softmax on lod_level=1 inputs: values
per sequence (empty ones included), the LoD they give, gradients against central finite
differences (gradcheck.py), and the checks of their inputs."""
import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError, DataError
from fleet.framework.tensor import LoDTensor

from gradcheck import check_grads

LENGTHS = np.array([2, 0, 3, 1])
SEG = np.repeat(np.arange(4), LENGTHS)


def _r(seed, shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize("layer", ["sequence_expand_as", "sequence_expand"])
def test_sequence_expand_repeats_each_examples_row_once_per_id_and_sums_the_gradient_back(layer):
    target, hist = _r(1, (4, 3)), _r(2, (6, 3))

    def build():
        t = layers.data("target", shape=[3], stop_gradient=False)
        h = layers.data("hist", shape=[3], lod_level=1, stop_gradient=False)
        expanded = getattr(layers, layer)(t, h)
        assert expanded.lod_level == 1 and expanded.shape == (-1, 3)
        return h - expanded, [t, h]  # DIN: each history item against the target

    r = check_grads(build, {"target": target, "hist": (hist, LENGTHS)})
    np.testing.assert_allclose(r.out, hist - target[SEG], rtol=1e-6)
    assert not r.analytic["target"][1].any()  # the empty sequence repeats its row 0 times
    assert isinstance(r.raw["hist"], LoDTensor)


def test_sequence_softmax_normalizes_within_each_sequence_and_its_gradient_matches():
    scores = _r(3, (6, 1))

    def build():
        s = layers.data("s", shape=[1], lod_level=1, stop_gradient=False)
        weights = layers.sequence_softmax(s)
        assert weights.lod_level == 1
        return weights, [s]

    r = check_grads(build, {"s": (scores, LENGTHS)})
    expected = np.exp(scores[:, 0] - scores[:, 0].max())
    sums = np.zeros(4)
    np.add.at(sums, SEG, expected)
    np.testing.assert_allclose(r.out[:, 0], expected / sums[SEG], rtol=1e-5)
    np.testing.assert_allclose(np.bincount(SEG, r.out[:, 0], minlength=4), [1, 0, 1, 1], rtol=1e-6)


def test_sequence_layers_check_their_inputs():
    fw.reset_default_programs()
    seq = layers.data("seq", shape=[1], lod_level=1)
    dense = layers.data("dense", shape=[3])
    with pytest.raises(ConfigError, match="sequence_expand_as y 'dense' must be lod_level=1"):
        layers.sequence_expand_as(seq, dense)
    with pytest.raises(ConfigError, match="sequence_expand x 'seq' is lod_level=1: x must have one row per "
                                          "example; pool the sequence first"):
        layers.sequence_expand(seq, seq)
    with pytest.raises(ConfigError, match="sequence_expand ref_level=1: fleet sequences have one LoD level"):
        layers.sequence_expand(dense, seq, ref_level=1)
    with pytest.raises(ConfigError, match=r"sequence_softmax input 'dense' must be lod_level=1"):
        layers.sequence_softmax(dense)
    with pytest.raises(ConfigError, match=r"sequence_softmax input 'wide' \[-1, 2\] must have one value per row"):
        layers.sequence_softmax(layers.data("wide", shape=[2], lod_level=1))
    out = layers.sequence_expand_as(dense, seq)
    with pytest.raises(DataError, match="sequence_expand_as: x 'dense' has 2 rows but y 'seq' has 3 sequences"):
        fw.Executor().run(feed={"dense": np.zeros((2, 3), np.float32), "seq": ([1.0, 2.0], [1, 0, 1])},
                          fetch_list=[out], scope=fw.Scope())
    fw.reset_default_programs()
