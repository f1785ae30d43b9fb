"""Shape layers: values as numpy computes them, Paddle's shape rules, gradients against
central finite differences (gradcheck.py), and which ones a sequence (lod_level=1) takes."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers
from fleet.errors import ConfigError

from gradcheck import check_grads


def _x(seed=0, shape=(2, 3, 4)):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _data(name, shape, **kw):
    return layers.data(name, shape=list(shape), append_batch_size=False, stop_gradient=False, **kw)


_CASES = {
    "transpose": (lambda v: layers.transpose(v, [2, 0, 1]), lambda a: a.transpose(2, 0, 1)),
    "unsqueeze": (lambda v: layers.unsqueeze(v, [0, -1]), lambda a: a[None, ..., None]),
    "unsqueeze_middle": (lambda v: layers.unsqueeze(v, axes=[1, 3]), lambda a: a[:, None, :, None]),
    "expand": (lambda v: layers.expand(v, [2, 1, 3]), lambda a: np.tile(a, (2, 1, 3))),
    "slice": (lambda v: layers.slice(v, axes=[1, 2], starts=[1, -3], ends=[100, 3]), lambda a: a[:, 1:, 1:3]),
    "flatten": (lambda v: layers.flatten(v, axis=2), lambda a: a.reshape(6, 4)),
    "flatten0": (lambda v: layers.flatten(v, axis=0), lambda a: a.reshape(1, 24)),
    "index": (lambda v: v[:, 1, :], lambda a: a[:, 1, :]),
    "index_range": (lambda v: v[1, 0:2], lambda a: a[1, 0:2]),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_shape_layers_compute_numpys_values_and_shapes_and_their_gradients_match(case):
    layer, reference = _CASES[case]
    x = _x()

    def build():
        xv = _data("x", x.shape)
        out = layer(xv)
        assert out.shape == reference(x).shape
        return out, [xv]

    r = check_grads(build, {"x": x})
    np.testing.assert_array_equal(r.out, reference(x))


def test_squeeze_removes_the_listed_dims_of_one_or_all_of_them():
    x = _x(1, (2, 1, 3, 1))

    def build():
        xv = _data("x", x.shape)
        a, b = layers.squeeze(xv, [1]), layers.squeeze(xv, axes=[])
        assert a.shape == (2, 3, 1) and b.shape == (2, 3)
        return layers.elementwise_add(a, layers.unsqueeze(b, [2])), [xv]

    r = check_grads(build, {"x": x})
    np.testing.assert_array_equal(r.out, 2 * x.reshape(2, 3, 1))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stack_and_split_are_inverse_and_their_gradients_match(axis):
    a, b, c = _x(2, (2, 3)), _x(3, (2, 3)), _x(4, (2, 3))

    def build():
        vs = [_data(n, (2, 3)) for n in "abc"]
        stacked = layers.stack(vs, axis=axis)
        assert stacked.shape == np.stack([a, b, c], axis=axis).shape
        parts = layers.split(stacked, 3, dim=axis)
        assert [p.shape for p in parts] == [tuple(1 if i == axis % 3 else d
                                                  for i, d in enumerate(stacked.shape))] * 3
        # weigh the parts differently so each input's gradient is its own
        return layers.sums([parts[0], layers.scale(parts[1], 2.0), layers.scale(parts[2], -3.0)]), vs

    r = check_grads(build, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(r.out.reshape(2, 3), a + 2 * b - 3 * c, rtol=1e-6)
    np.testing.assert_allclose(r.analytic["b"], -2 / 3 * r.analytic["c"], rtol=1e-5)


def test_split_by_sections_with_one_inferred_and_an_unused_part():
    x = _x(5, (2, 7))

    def build():
        xv = _data("x", x.shape)
        first, second, third = layers.split(xv, [2, -1, 1], dim=1)
        assert (first.shape, second.shape, third.shape) == ((2, 2), (2, 4), (2, 1))
        return layers.concat([third, first], axis=1), [xv]  # the middle part reaches no loss

    r = check_grads(build, {"x": x})
    np.testing.assert_array_equal(r.out, np.concatenate([x[:, 6:], x[:, :2]], axis=1))
    assert not r.analytic["x"][:, 2:6].any()


def test_slice_and_split_along_columns_keep_the_lod_of_a_sequence():
    values = _x(6, (5, 4)).reshape(5, 4)

    def build():
        xv = layers.data("x", shape=[4], stop_gradient=False, lod_level=1)
        head = layers.slice(xv, axes=[1], starts=[0], ends=[2])
        tail = layers.split(xv, 2, dim=1)[1]
        out = layers.elementwise_mul(head, tail)
        assert head.lod_level == tail.lod_level == out.lod_level == 1
        return layers.sequence_pool(out, "sum"), [xv]

    r = check_grads(build, {"x": (values, [2, 3])})
    prod = values[:, :2] * values[:, 2:]
    np.testing.assert_allclose(r.out, [prod[:2].sum(0), prod[2:].sum(0)], rtol=1e-5)


# ------------------------------------------------------------------ build-time rules
@pytest.fixture
def x():
    fw.reset_default_programs()
    yield layers.data("x", shape=[3, 4])
    fw.reset_default_programs()


def test_shape_layers_infer_unknown_batch_dims_as_paddle(x):
    assert layers.transpose(x, [0, 2, 1]).shape == (-1, 4, 3)
    assert layers.slice(x, axes=[0, 2], starts=[0, 1], ends=[2, 10]).shape == (-1, 3, 3)
    assert layers.flatten(x).shape == (-1, 12)
    assert layers.expand(x, [1, 2, 1]).shape == (-1, 6, 4)
    assert x[:, 0].shape == (-1, 4) and x[:, :, -1].shape == (-1, 3)


def test_shape_layers_refuse_bad_arguments_naming_them(x):
    with pytest.raises(ConfigError, match=r"transpose perm=\[0, 1\] is not a permutation of the 3 dims of 'x'"):
        layers.transpose(x, [0, 1])
    with pytest.raises(ConfigError, match=r"squeeze axis 1 of 'x' \[-1, 3, 4\] is not a dim of size 1"):
        layers.squeeze(x, [1])
    with pytest.raises(ConfigError, match=r"split of 'x' dim 2 \(size 4\) into 3 equal parts: pick a number of "
                                          r"parts that divides 4"):
        layers.split(x, 3, dim=2)
    with pytest.raises(ConfigError, match=r"split sections \[1, 2\] do not add up to dim 2 \(size 4\)"):
        layers.split(x, [1, 2], dim=-1)
    with pytest.raises(ConfigError, match=r"slice of 'x' dim 1 \(size 3\) from 2 to 1 is empty"):
        layers.slice(x, axes=[1], starts=[2], ends=[1])
    with pytest.raises(ConfigError, match=r"expand expand_times=\[2, 2\] must hold one positive int per dim"):
        layers.expand(x, [2, 2])
    with pytest.raises(ConfigError, match="indexing a Variable with a step"):
        x[:, ::2]


def test_a_sequence_is_refused_by_shape_layers_that_move_its_rows():
    fw.reset_default_programs()
    seq = layers.embedding(layers.data("ids", shape=[1], dtype="int64", lod_level=1), size=[10, 4])
    for build, what in [(lambda: layers.transpose(seq, [1, 0]), r"perm \[1, 0\]"),
                        (lambda: layers.unsqueeze(seq, [0]), r"axes \[0\]"),
                        (lambda: layers.stack([seq, seq]), "axis 0"),
                        (lambda: layers.slice(seq, axes=[0], starts=[0], ends=[1]), "slicing along axis 0")]:
        with pytest.raises(ConfigError, match=rf"^\w+ of 'embedding.tmp_0' \(lod_level=1, one row per id\): "
                                              rf"{what} would move dim 0, the rows \(one per id\); pool"):
            build()
    assert layers.stack([seq, seq], axis=1).lod_level == 1
    assert layers.unsqueeze(seq, [1]).lod_level == 1
    fw.reset_default_programs()


def test_create_tensor_makes_a_variable_accuracy_can_count_into():
    fw.reset_default_programs()
    total = layers.create_tensor(dtype="int64")
    p = layers.data("p", shape=[2])
    acc = layers.accuracy(p, layers.data("y", shape=[1], dtype="int64"), total=total)
    scope = fleet.Scope()
    got = fleet.Executor().run(feed={"p": np.array([[0.9, 0.1], [0.2, 0.8]], np.float32),
                                     "y": np.array([[0], [0]])}, fetch_list=[acc, total], scope=scope)
    assert got[0][0] == pytest.approx(0.5) and int(got[1].reshape(-1)[0]) == 2
    fw.reset_default_programs()
