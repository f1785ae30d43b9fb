"""fleet.layers build the right variables, parameters and initializers, and refuse bad
arguments with messages naming the value (the numbers they compute are checked in
test_ops_grad.py)."""
import math

import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import initializer, layers
from fleet.errors import ConfigError
from fleet.param_attr import ParamAttr


@pytest.fixture(autouse=True)
def fresh_programs():
    fw.reset_default_programs()
    yield
    fw.reset_default_programs()


def _startup_ops():
    return {op.output("Out")[0]: op for op in fleet.default_startup_program().global_block().ops}


def _run_startup(seed=1):
    fleet.default_main_program().random_seed = seed
    scope = fleet.Scope()
    fleet.Executor().run(fleet.default_startup_program(), scope=scope)
    return scope


def _ids(name="ids", lod_level=1):
    return layers.data(name, shape=[1], dtype="int64", lod_level=lod_level)


# ------------------------------------------------------------------------------- data
def test_data_prepends_the_batch_dimension_unless_told_not_to():
    assert layers.data("a", shape=[3]).shape == (-1, 3)
    assert layers.data("b", shape=[-1, 3]).shape == (-1, 3)
    assert layers.data("c", shape=[2, 3], append_batch_size=False).shape == (2, 3)
    d = layers.data("d", shape=[1], dtype="int64", lod_level=1)
    assert d.lod_level == 1 and d.dtype == "int64" and d.is_data and d.stop_gradient
    assert layers.data("e", shape=[None, 13]).shape == (-1, 13)  # fluid.data's None batch dim


def test_data_refuses_a_duplicate_name_and_unsupported_lod_levels():
    layers.data("x", shape=[1])
    with pytest.raises(ConfigError, match="data 'x' is declared twice in this program"):
        layers.data("x", shape=[1])
    with pytest.raises(ConfigError, match="data 'y': lod_level=2 is not supported; use 0 or 1"):
        layers.data("y", shape=[1], lod_level=2)
    with pytest.raises(ConfigError, match="data name must be a non-empty str, got ''"):
        layers.data("", shape=[1])
    with pytest.raises(ConfigError, match="dtype 'complex64' is not supported"):
        layers.data("z", shape=[1], dtype="complex64")


def test_layers_refuse_arguments_that_are_not_variables():
    with pytest.raises(ConfigError, match="fc: input must be a fleet Variable \\(from fleet.layers\\), got ndarray"):
        layers.fc(np.zeros((2, 3)), 2)
    with pytest.raises(ConfigError, match="relu: x must be a fleet Variable"):
        layers.relu([1.0])


# ------------------------------------------------------------------------------- fc
def test_fc_names_its_parameters_and_initializes_weights_with_xavier_and_bias_with_zeros():
    x = layers.data("x", shape=[6])
    out = layers.fc(x, 4)
    assert out.shape == (-1, 4)
    params = {p.name: p for p in fleet.default_main_program().all_parameters()}
    assert sorted(params) == ["fc_0.b_0", "fc_0.w_0"]
    assert params["fc_0.w_0"].shape == (6, 4) and params["fc_0.b_0"].shape == (4,)
    ops = _startup_ops()
    limit = math.sqrt(6.0 / (6 + 4))
    assert ops["fc_0.w_0"].type == "uniform_random"
    assert ops["fc_0.w_0"].attr("min") == pytest.approx(-limit) and ops["fc_0.w_0"].attr("max") == pytest.approx(limit)
    assert ops["fc_0.b_0"].type == "fill_constant" and ops["fc_0.b_0"].attr("value") == 0.0
    scope = _run_startup()
    w = scope["fc_0.w_0"]
    assert w.dtype == np.float32 and np.abs(w).max() <= limit and w.std() > limit / 4
    np.testing.assert_array_equal(scope["fc_0.b_0"], np.zeros(4, np.float32))


def test_fc_param_attr_sets_name_initializer_and_bias_attr_false_drops_the_bias():
    x = layers.data("x", shape=[3])
    layers.fc(x, 2, param_attr=ParamAttr(name="dense_w", initializer=initializer.Normal(0.5, 0.0)),
              bias_attr=False)
    assert [p.name for p in fleet.default_main_program().all_parameters()] == ["dense_w"]
    assert [op.input("Bias") for op in fleet.default_main_program().global_block().ops] == [[]]
    np.testing.assert_array_equal(_run_startup()["dense_w"], np.full((3, 2), 0.5, np.float32))


def test_fc_validates_act_size_and_input_shape():
    x = layers.data("x", shape=[3])
    with pytest.raises(ConfigError, match=r"fc act='gelu' is not supported; use one of \(None, 'relu'"):
        layers.fc(x, 2, act="gelu")
    with pytest.raises(ConfigError, match="fc size=0 must be a positive int"):
        layers.fc(x, 0)
    with pytest.raises(ConfigError, match=r"fc input 'x' has shape \[-1, 3\]; the dims after num_flatten_dims=2"):
        layers.fc(x, 2, num_flatten_dims=2)


# ------------------------------------------------------------------------------- embedding
def test_embedding_output_follows_the_input_shape_and_lod_level():
    seq = layers.embedding(_ids("a"), size=[100, 8])
    assert seq.shape == (-1, 8) and seq.lod_level == 1
    flat = layers.embedding(_ids("b", lod_level=0), size=[100, 8])
    assert flat.shape == (-1, 8) and flat.lod_level == 0
    table = fleet.default_main_program().all_parameters()[0]
    assert table.shape == (100, 8) and not table.is_sparse


def test_layers_sharing_a_param_attr_name_share_one_table_and_one_initializer():
    attr = ParamAttr(name="SparseFeatFactors", initializer=initializer.Uniform(-1.0, 1.0))
    outs = [layers.embedding(_ids(f"C{i}"), size=[50, 4], is_sparse=True, param_attr=attr) for i in range(3)]
    params = fleet.default_main_program().all_parameters()
    assert [p.name for p in params] == ["SparseFeatFactors"]
    assert params[0].is_sparse and not params[0].is_distributed
    assert list(_startup_ops()) == ["SparseFeatFactors"]
    tables = {op.input("W")[0] for op in fleet.default_main_program().global_block().ops}
    assert tables == {"SparseFeatFactors"} and len({o.name for o in outs}) == 3


def test_a_shared_table_is_sparse_if_any_use_says_so():
    layers.embedding(_ids("a"), size=[10, 2], param_attr="t")
    layers.embedding(_ids("b"), size=[10, 2], is_distributed=True, param_attr="t")
    (table,) = fleet.default_main_program().all_parameters()
    assert table.is_sparse and table.is_distributed


def test_sharing_a_name_with_another_shape_is_refused_with_both_shapes():
    layers.embedding(_ids("a"), size=[10, 2], param_attr="t")
    with pytest.raises(ConfigError, match=r"parameter 't' is shared with shape \[10, 2\] float32 but requested "
                                          r"as \[10, 3\]"):
        layers.embedding(_ids("b"), size=[10, 3], param_attr="t")


def test_embedding_validates_ids_size_and_padding_idx():
    with pytest.raises(ConfigError, match="embedding input 'f' must be int64 ids, got float32"):
        layers.embedding(layers.data("f", shape=[1]), size=[10, 2])
    ids = _ids()
    with pytest.raises(ConfigError, match=r"embedding size=\[10\] must be \[rows, width\] of positive ints"):
        layers.embedding(ids, size=[10])
    with pytest.raises(ConfigError, match=r"embedding padding_idx=10 must be in \[-10, 10\)"):
        layers.embedding(ids, size=[10, 2], padding_idx=10)


def test_embedding_default_initializer_is_xavier_on_the_table_shape():
    layers.embedding(_ids(), size=[30, 6], param_attr="t")
    op = _startup_ops()["t"]
    limit = math.sqrt(6.0 / 36)
    assert op.type == "uniform_random" and op.attr("max") == pytest.approx(limit)


# ------------------------------------------------------------------------------- pooling, concat
def test_sequence_pool_validates_pool_type_and_lod_level():
    emb = layers.embedding(_ids(), size=[10, 3])
    assert layers.sequence_pool(emb, "sum").shape == (-1, 3)
    with pytest.raises(ConfigError, match=r"sequence_pool pool_type='median'; use one of \['sum', 'average', "
                                          r"'max', 'sqrt', 'first', 'last'\]"):
        layers.sequence_pool(emb, "median")
    with pytest.raises(ConfigError, match="sequence_pool input 'x' must have lod_level=1"):
        layers.sequence_pool(layers.data("x", shape=[3]), "sum")


def test_max_pooling_records_its_argmax_as_a_second_output():
    emb = layers.embedding(_ids(), size=[10, 3])
    layers.sequence_pool(emb, "MAX")
    op = fleet.default_main_program().global_block().ops[-1]
    assert op.attr("pooltype") == "MAX" and op.output("MaxIndex")


def test_concat_infers_the_joined_width_and_refuses_mismatched_shapes():
    a, b = layers.data("a", shape=[3]), layers.data("b", shape=[5])
    assert layers.concat([a, b], axis=1).shape == (-1, 8)
    assert layers.concat([a, b], axis=-1).shape == (-1, 8)
    c = layers.data("c", shape=[2, 3], append_batch_size=False)
    d = layers.data("d", shape=[4, 3], append_batch_size=False)
    assert layers.concat([c, d], axis=0).shape == (6, 3)
    with pytest.raises(ConfigError, match=r"concat inputs must match except on axis 0: a is \[-1, 3\], b is \[-1, 5\]"):
        layers.concat([a, b], axis=0)
    with pytest.raises(ConfigError, match="concat input must be a non-empty list of Variables"):
        layers.concat([], axis=1)


# ------------------------------------------------------------------------------- math, losses, metrics
def test_reduction_shapes():
    x = layers.data("x", shape=[3, 4, 2], append_batch_size=False)
    assert layers.mean(x).shape == (1,)
    assert layers.reduce_sum(x).shape == (1,)
    assert layers.reduce_sum(x, keep_dim=True).shape == (1, 1, 1)
    assert layers.reduce_sum(x, dim=1).shape == (3, 2)
    assert layers.reduce_sum(x, dim=[0, -1], keep_dim=True).shape == (1, 4, 1)


def test_softmax_only_on_the_last_axis():
    x = layers.data("x", shape=[3])
    assert layers.softmax(x).shape == (-1, 3)
    with pytest.raises(ConfigError, match="softmax axis=0: only the last axis is supported"):
        layers.softmax(x, axis=0)


def test_cross_entropy_needs_int64_labels_unless_soft():
    p = layers.data("p", shape=[2])
    with pytest.raises(ConfigError, match="cross_entropy label 'y' must be int64 class ids \\(or use soft_label=True\\)"):
        layers.cross_entropy(p, layers.data("y", shape=[1]))
    assert layers.cross_entropy(p, layers.data("s", shape=[2]), soft_label=True).shape == (-1, 1)


def test_auc_creates_four_zeroed_int64_states_with_4096_buckets():
    p = layers.data("p", shape=[2])
    y = layers.data("y", shape=[1], dtype="int64")
    auc, batch_auc, states = layers.auc(p, y, slide_steps=20)
    assert auc.shape == batch_auc.shape == (1,)
    assert [s.shape for s in states] == [(21, 4096), (21, 4096), (4096,), (4096,)]
    ops = _startup_ops()
    for s in states:
        assert ops[s.name].type == "fill_constant" and ops[s.name].attr("dtype") == "int64"
    with pytest.raises(ConfigError, match="auc curve='PR': only 'ROC' is supported"):
        layers.auc(p, y, curve="PR")
    with pytest.raises(ConfigError, match="auc slide_steps=-1 must be an int >= 0"):
        layers.auc(p, y, slide_steps=-1)
    with pytest.raises(ConfigError, match="auc slide_steps=2.0 must be an int >= 0"):
        layers.auc(p, y, slide_steps=2.0)
    # Paddle's slide_steps=0: no window, one accumulating row after the step counter's
    assert [s.shape for s in layers.auc(p, y, slide_steps=0)[2]] == [(2, 4096), (2, 4096), (4096,), (4096,)]


# ------------------------------------------------------------------------------- ParamAttr, initializers
def test_param_attr_validates_its_arguments():
    with pytest.raises(ConfigError, match="ParamAttr name must be a str, got 3"):
        ParamAttr(name=3)
    with pytest.raises(ConfigError, match="ParamAttr initializer must be a fleet.initializer object"):
        ParamAttr(initializer="uniform")
    with pytest.raises(ConfigError, match="ParamAttr learning_rate=-1 must be >= 0"):
        ParamAttr(learning_rate=-1)
    with pytest.raises(ConfigError, match="param_attr must be None, a name, a ParamAttr or False, got 3"):
        ParamAttr.to_attr(3)
    assert ParamAttr.to_attr("w").name == "w"
    assert isinstance(ParamAttr.to_attr(initializer.Constant(1.0)).initializer, initializer.Constant)


def test_initializers_validate_their_arguments():
    with pytest.raises(ConfigError, match=r"Uniform\(low=1.0, high=1.0\): low must be less than high"):
        initializer.Uniform(1.0, 1.0)
    with pytest.raises(ConfigError, match=r"Normal\(scale=-1\): the standard deviation must be >= 0"):
        initializer.Normal(0.0, -1)
    with pytest.raises(ConfigError, match="seed=-3 must be a non-negative int"):
        initializer.Uniform(seed=-3)


@pytest.mark.parametrize("init,check", [
    (initializer.Constant(0.25), lambda v: np.all(v == np.float32(0.25))),
    (initializer.Uniform(-0.5, 0.5), lambda v: v.min() >= -0.5 and v.max() < 0.5 and v.std() > 0.2),
    (initializer.Normal(1.0, 0.1), lambda v: abs(v.mean() - 1.0) < 0.02 and abs(v.std() - 0.1) < 0.02),
    (initializer.TruncatedNormal(0.0, 1.0), lambda v: np.abs(v).max() <= 2.0 and v.std() > 0.7),
    (initializer.Xavier(uniform=False), lambda v: abs(v.std() - math.sqrt(2.0 / 300)) < 0.01),
    (initializer.MSRA(), lambda v: np.abs(v).max() <= math.sqrt(6.0 / 100)),
], ids=["constant", "uniform", "normal", "truncated_normal", "xavier_normal", "msra"])
def test_initializers_fill_parameters_with_their_distribution(init, check):
    layers.create_parameter([100, 200], name="p", default_initializer=init)
    value = _run_startup()["p"]
    assert value.dtype == np.float32 and value.shape == (100, 200)
    assert check(value)
