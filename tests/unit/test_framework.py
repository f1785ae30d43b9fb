"""The static-program engine's behaviour: program_guard, clone(for_test), random_seed,
feeding and fetching, live scopes, startup ordering, id checks and the metric ops."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError, DataError
from fleet.framework.program import BACKWARD, LOSS, OPTIMIZE
from fleet.initializer import Uniform
from fleet.param_attr import ParamAttr


pytestmark = pytest.mark.usefixtures("fresh_programs")  # every test: new programs, names, scope


def _model(opt=None, table_rows=10):
    """A small CTR-like model on the default programs; returns its variables."""
    x = layers.data("x", shape=[3])
    ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
    y = layers.data("y", shape=[1], dtype="int64")
    emb = layers.sequence_pool(layers.embedding(ids, size=[table_rows, 2], is_sparse=True,
                                                param_attr="table"), "sum")
    pred = layers.fc(layers.concat([emb, x], axis=1), 2, act="softmax", param_attr="w", bias_attr="b")
    loss = layers.mean(layers.cross_entropy(pred, y))
    if opt is not None:
        opt.minimize(loss)
    return {"x": x, "ids": ids, "y": y, "pred": pred, "loss": loss}


def _feed(seed=0, batch=4):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 3, batch)
    return {"x": rng.normal(size=(batch, 3)).astype(np.float32),
            "ids": (rng.integers(0, 10, int(lengths.sum())), lengths),
            "y": rng.integers(0, 2, (batch, 1))}


# ------------------------------------------------------------------------------- programs
def test_program_guard_sends_layers_and_initializers_to_the_given_programs():
    main, startup = fleet.Program(), fleet.Program()
    with fleet.program_guard(main, startup):
        x = layers.data("x", shape=[3])
        layers.fc(x, 2, param_attr="w")
        assert fleet.default_main_program() is main
        assert fleet.default_startup_program() is startup
    assert x.block.program is main
    assert {"x", "w"} <= set(main.global_block().vars)
    assert [op.type for op in main.global_block().ops] == ["fc"]
    assert {op.output("Out")[0] for op in startup.global_block().ops} == {"w", "fc_0.b_0"}
    assert not fleet.default_main_program().global_block().ops
    assert not fleet.default_startup_program().global_block().ops
    assert not fleet.default_main_program().global_block().vars
    layers.data("x", shape=[3])  # back on the defaults: no clash with main's "x"
    assert fleet.default_main_program().global_block().has_var("x")


def test_program_guard_restores_the_defaults_when_the_block_raises():
    before = fleet.default_main_program()
    with pytest.raises(RuntimeError):
        with fleet.program_guard(fleet.Program(), fleet.Program()):
            raise RuntimeError("boom")
    assert fleet.default_main_program() is before


def test_program_guard_rejects_what_is_not_a_program():
    with pytest.raises(TypeError, match="main_program must be a fleet.Program, got int"):
        with fleet.program_guard(1):
            pass


def test_clone_for_test_drops_backward_and_optimizer_ops_and_leaves_parameters_unchanged():
    v = _model(optimizer.Adam(0.1))
    main = fleet.default_main_program()
    test = main.clone(for_test=True)
    roles = {op.attr("op_role") for op in test.global_block().ops}
    assert not roles & {BACKWARD, OPTIMIZE, LOSS}
    assert not any(op.type.endswith("_grad") or op.type == "adam" for op in test.global_block().ops)
    assert not any("@GRAD" in n for n in test.global_block().vars)
    assert any(op.type == "adam" for op in main.global_block().ops)  # the original is intact

    exe = fleet.Executor()
    exe.run(fleet.default_startup_program())
    scope = fleet.global_scope()
    before = {n: np.array(scope[n]) for n in ("w", "b", "table")}
    feed = _feed()
    (test_loss,) = exe.run(test, feed=feed, fetch_list=[v["loss"]])
    for n, value in before.items():
        np.testing.assert_array_equal(scope[n], value)
    (train_loss,) = exe.run(main, feed=feed, fetch_list=[v["loss"]])
    np.testing.assert_array_equal(test_loss, train_loss)  # same forward, before the update
    assert not np.array_equal(scope["w"], before["w"])


def test_clone_without_for_test_keeps_every_op():
    _model(optimizer.SGD(0.1))
    main = fleet.default_main_program()
    copy = main.clone()
    assert [op.type for op in copy.global_block().ops] == [op.type for op in main.global_block().ops]
    assert copy.global_block() is not main.global_block()


# ------------------------------------------------------------------------------- seeds
def _init_values(seed, seed_on="main"):
    fw.reset_default_programs()
    program = fleet.default_main_program() if seed_on == "main" else fleet.default_startup_program()
    program.random_seed = seed
    _model()
    scope = fleet.Scope()
    fleet.Executor().run(fleet.default_startup_program(), scope=scope)
    return {n: np.array(scope[n]) for n in ("w", "table")}


@pytest.mark.parametrize("seed_on", ["main", "startup"])
def test_random_seed_makes_startup_repeatable_and_different_seeds_differ(seed_on):
    first, second, other = _init_values(7, seed_on), _init_values(7, seed_on), _init_values(8, seed_on)
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
        assert not np.array_equal(first[name], other[name])


def test_without_random_seed_two_builds_get_different_values():
    a, b = _init_values(0), _init_values(0)
    assert not np.array_equal(a["w"], b["w"])


def test_two_parameters_of_the_same_shape_get_different_values_under_one_seed():
    fleet.default_main_program().random_seed = 3
    x = layers.data("x", shape=[4])
    layers.fc(layers.fc(x, 4, param_attr="w1"), 4, param_attr="w2")
    scope = fleet.Scope()
    fleet.Executor().run(fleet.default_startup_program(), scope=scope)
    assert scope["w1"].shape == scope["w2"].shape == (4, 4)
    assert not np.array_equal(scope["w1"], scope["w2"])


def test_an_initializer_seed_wins_over_the_program_seed():
    values = []
    for program_seed in (1, 2):
        fw.reset_default_programs()
        fleet.default_main_program().random_seed = program_seed
        x = layers.data("x", shape=[4])
        layers.fc(x, 3, param_attr=ParamAttr(name="w", initializer=Uniform(-1, 1, seed=11)))
        scope = fleet.Scope()
        fleet.Executor().run(fleet.default_startup_program(), scope=scope)
        values.append(np.array(scope["w"]))
    np.testing.assert_array_equal(values[0], values[1])
    assert values[0].min() >= -1 and values[0].max() < 1


# ------------------------------------------------------------------------------- feeding
@pytest.fixture
def ready():
    v = _model(optimizer.SGD(0.1))
    exe = fleet.Executor()
    exe.run(fleet.default_startup_program())
    return exe, v


def test_an_unknown_feed_name_is_refused_with_the_programs_inputs_listed(ready):
    exe, v = ready
    with pytest.raises(DataError, match=r"feed 'z' is not a variable of this program; its inputs "
                                        r"are \['ids', 'x', 'y'\]"):
        exe.run(feed=dict(_feed(), z=np.zeros(3)), fetch_list=[v["loss"]])


def test_a_feed_of_the_wrong_shape_is_refused_with_both_shapes(ready):
    exe, v = ready
    with pytest.raises(DataError, match=r"feed 'x' has shape \[4, 4\] but the variable is \[-1, 3\]; "
                                        r"feed an array of shape \[batch, 3\]"):
        exe.run(feed=dict(_feed(), x=np.zeros((4, 4), np.float32)), fetch_list=[v["loss"]])


def test_a_flat_feed_of_the_right_size_is_reshaped_to_the_variable(ready):
    exe, v = ready
    feed = _feed()
    (a,) = exe.run(fleet.default_main_program().clone(for_test=True), feed=feed, fetch_list=[v["pred"]])
    feed["x"] = feed["x"].reshape(4, 3, 1)
    (b,) = exe.run(fleet.default_main_program().clone(for_test=True), feed=feed, fetch_list=[v["pred"]])
    np.testing.assert_array_equal(a, b)


def test_a_lod_input_is_fed_as_values_and_lengths_or_as_a_list_of_sequences(ready):
    exe, v = ready
    test = fleet.default_main_program().clone(for_test=True)
    feed = _feed()
    values, lengths = feed["ids"]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    sequences = [values[a:b].tolist() for a, b in zip(offsets, offsets[1:])]
    (by_pair,) = exe.run(test, feed=feed, fetch_list=[v["pred"]])
    (by_list,) = exe.run(test, feed=dict(feed, ids=sequences), fetch_list=[v["pred"]])
    (by_tensor,) = exe.run(test, feed=dict(feed, ids=fleet.LoDTensor.from_lengths(values, lengths)),
                           fetch_list=[v["pred"]])
    np.testing.assert_array_equal(by_pair, by_list)
    np.testing.assert_array_equal(by_pair, by_tensor)


def test_lod_lengths_that_do_not_add_up_are_refused_with_the_sum_and_the_count(ready):
    exe, v = ready
    with pytest.raises(DataError, match=r"feed 'ids': lengths \[1, 1, 1, 1\] sum to 4 but there are "
                                        r"5 values; feed \(values, lengths\) with one length per example"):
        exe.run(feed=dict(_feed(), ids=(np.arange(5), [1, 1, 1, 1])), fetch_list=[v["loss"]])


def test_a_plain_array_for_a_lod_input_is_refused_with_the_accepted_forms(ready):
    exe, v = ready
    with pytest.raises(DataError, match=r"feed 'ids' is a lod_level=1 input; got ndarray. Feed a "
                                        r"\(values, lengths\) pair, a list of per-example sequences"):
        exe.run(feed=dict(_feed(), ids=np.arange(4)), fetch_list=[v["loss"]])


def test_an_input_left_out_of_the_feed_is_named():
    v = _model(optimizer.SGD(0.1))
    exe = fleet.Executor()
    exe.run(fleet.default_startup_program())
    feed = _feed()
    del feed["y"]
    with pytest.raises(ConfigError, match=r"input 'y' of op 'cross_entropy' was not fed; pass it in "
                                          r"feed=\{'y': ...\}"):
        exe.run(feed=feed, fetch_list=[v["loss"]])


def test_a_run_that_raised_does_not_leave_its_feed_behind_for_the_next_run():
    v = _model(optimizer.SGD(0.1))
    exe = fleet.Executor()
    exe.run(fleet.default_startup_program())
    with pytest.raises(ConfigError):
        exe.run(feed=_feed(), fetch_list=["no_such_var"])
    feed = _feed()
    del feed["y"]
    with pytest.raises(ConfigError, match="input 'y' of op 'cross_entropy' was not fed"):
        exe.run(feed=feed, fetch_list=[v["loss"]])


def test_fetching_an_unknown_variable_names_it(ready):
    exe, _ = ready
    with pytest.raises(ConfigError, match=r"cannot fetch 'no_such_var': no op of this program "
                                          r"produced it and it is not in the scope"):
        exe.run(feed=_feed(), fetch_list=["no_such_var"])


def test_fetch_accepts_variables_and_names_and_returns_numpy_copies(ready):
    exe, v = ready
    test = fleet.default_main_program().clone(for_test=True)
    a, b, w = exe.run(test, feed=_feed(), fetch_list=[v["pred"], v["pred"].name, "w"])
    np.testing.assert_array_equal(a, b)
    w[...] = 0
    assert fleet.global_scope()["w"].any()


def test_running_main_before_startup_says_to_run_the_startup_program():
    v = _model(optimizer.SGD(0.1))
    with pytest.raises(ConfigError, match=r"has no value in the scope; run the startup program "
                                          r"\(exe.run\(fleet.startup_program\)\) before the main program"):
        fleet.Executor().run(feed=_feed(), fetch_list=[v["loss"]])


@pytest.mark.parametrize("bad_id", [10, 12345, -1])
def test_an_embedding_id_out_of_range_is_a_data_error_naming_the_table_and_the_id(ready, bad_id):
    exe, v = ready
    with pytest.raises(DataError, match=rf"embedding 'table' has 10 rows but got id {bad_id} \(input "
                                        rf"'ids'\); ids must be in \[0, 10\)"):
        exe.run(feed=dict(_feed(), ids=([1, bad_id, 2, 3], [1, 1, 1, 1])), fetch_list=[v["loss"]])


def test_a_label_out_of_range_is_a_data_error_naming_the_label(ready):
    exe, v = ready
    with pytest.raises(DataError, match=r"cross_entropy label 'y' values must be class ids in "
                                        r"\[0, 2\), got 5"):
        exe.run(feed=dict(_feed(), y=[[0], [5], [1], [0]]), fetch_list=[v["loss"]])


# ------------------------------------------------------------------------------- scopes
def test_global_scope_entries_are_the_live_parameters(ready):
    exe, v = ready
    scope = fleet.global_scope()
    w = scope["w"]
    before = w.copy()
    exe.run(feed=_feed(), fetch_list=[v["loss"]])
    assert scope["w"] is w  # updated in place
    assert not np.array_equal(w, before)
    w[...] = 0
    scope["b"][...] = 0
    test = fleet.default_main_program().clone(for_test=True)
    (pred,) = exe.run(test, feed=_feed(), fetch_list=[v["pred"]])
    np.testing.assert_allclose(pred, 0.5)  # zero weights and bias: softmax of zeros
    assert "w" in scope and "nope" not in scope
    with pytest.raises(KeyError, match="'nope' is not in the scope; run the startup program first"):
        scope["nope"]


def test_scope_guard_and_the_scope_argument_keep_runs_apart():
    v = _model(optimizer.SGD(0.5))
    exe = fleet.Executor()
    mine = fleet.Scope()
    fleet.default_startup_program().random_seed = 5
    exe.run(fleet.default_startup_program())
    exe.run(fleet.default_startup_program(), scope=mine)
    np.testing.assert_array_equal(mine["w"], fleet.global_scope()["w"])
    exe.run(feed=_feed(), fetch_list=[v["loss"]], scope=mine)
    assert not np.array_equal(mine["w"], fleet.global_scope()["w"])


# ------------------------------------------------------------------------------- metrics
def _auc_program(slide_steps=1):
    p = layers.data("p", shape=[2])
    y = layers.data("y", shape=[1], dtype="int64")
    auc, batch_auc, states = layers.auc(p, y, slide_steps=slide_steps)
    exe = fleet.Executor()
    exe.run(fleet.default_startup_program())
    return exe, auc, batch_auc, states


def _probs(p1):
    p1 = np.asarray(p1, dtype=np.float32)
    return np.stack([1 - p1, p1], axis=1)


SEPARABLE = {"p": _probs([0.9, 0.8, 0.2, 0.1, 0.7, 0.3]), "y": [[1], [1], [0], [0], [1], [0]]}
REVERSED = {"p": SEPARABLE["p"], "y": [[0], [0], [1], [1], [0], [1]]}


def test_auc_of_a_perfectly_separable_batch_is_one_and_of_a_reversed_batch_zero():
    exe, auc, batch_auc, _ = _auc_program()
    a, b = exe.run(feed=SEPARABLE, fetch_list=[auc, batch_auc])
    assert a[0] == 1.0 and b[0] == 1.0
    fw.reset_default_programs()
    exe, auc, batch_auc, _ = _auc_program()
    a, b = exe.run(feed=REVERSED, fetch_list=[auc, batch_auc])
    assert a[0] == 0.0 and b[0] == 0.0


def _numpy_auc(scores, labels):
    """Mann-Whitney AUC, ties counted half."""
    scores, labels = np.asarray(scores), np.asarray(labels).reshape(-1)
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def test_auc_accumulates_over_batches_and_batch_auc_covers_the_last_slide_steps():
    exe, auc, batch_auc, _ = _auc_program(slide_steps=2)
    batches = [SEPARABLE, REVERSED, REVERSED]
    seen = []
    results = [exe.run(feed=b, fetch_list=[auc, batch_auc]) for b in batches]
    for k, (a, b) in enumerate(results):
        seen.append(batches[k])
        scores = np.concatenate([s["p"][:, 1] for s in seen])
        labels = np.concatenate([np.reshape(s["y"], -1) for s in seen])
        assert a[0] == pytest.approx(_numpy_auc(scores, labels))
        window = seen[-2:]
        w_scores = np.concatenate([s["p"][:, 1] for s in window])
        w_labels = np.concatenate([np.reshape(s["y"], -1) for s in window])
        assert b[0] == pytest.approx(_numpy_auc(w_scores, w_labels))
    assert [r[1][0] for r in results] == [1.0, 0.5, 0.0]


def test_auc_with_slide_steps_0_gives_a_batch_auc_over_every_batch_since_the_start():
    exe, auc, batch_auc, states = _auc_program(slide_steps=0)
    results = [exe.run(feed=b, fetch_list=[auc, batch_auc]) for b in [SEPARABLE, REVERSED, REVERSED]]
    # the batch AUC of all batches so far (the window of 2 would give 0.0 at the third)
    assert [r[1][0] for r in results] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert [r[0][0] for r in results] == [r[1][0] for r in results]
    assert fleet.global_scope()[states[0].name][0, 0] == 3  # steps counted


def test_zeroing_the_auc_state_in_the_scope_resets_the_metric():
    exe, auc, batch_auc, states = _auc_program(slide_steps=3)
    exe.run(feed=REVERSED, fetch_list=[auc])
    scope = fleet.global_scope()
    for var in states:
        assert scope[var.name].any()
        scope[var.name][...] = 0
    a, b = exe.run(feed=SEPARABLE, fetch_list=[auc, batch_auc])
    assert a[0] == 1.0 and b[0] == 1.0


def test_paddles_scope_idioms_read_and_reset_the_auc_state():
    """np.array(scope.find_var(name).get_tensor()) reads a copy; Paddle's set_zero
    (scope.var(name).get_tensor(), _get_dims(), set(array, place)) resets the metric."""
    exe, auc, batch_auc, states = _auc_program(slide_steps=3)
    exe.run(feed=REVERSED, fetch_list=[auc])
    scope = fleet.global_scope()
    stat_pos = np.array(scope.find_var(states[2].name).get_tensor())
    assert type(stat_pos) is np.ndarray and stat_pos.sum() == 3  # the 3 positives
    stat_pos[...] = 0  # a copy: the state keeps its counts
    assert scope[states[2].name].sum() == 3
    for var in states:
        param = scope.var(var.name).get_tensor()
        param.set(np.zeros(param._get_dims()).astype("int64"), fleet.CPUPlace())
        assert not scope[var.name].any() and scope[var.name].dtype == np.int64
    a, b = exe.run(feed=SEPARABLE, fetch_list=[auc, batch_auc])
    assert a[0] == 1.0 and b[0] == 1.0


def test_scope_find_var_gives_the_live_array_with_paddles_tensor_calls():
    scope = fw.Scope()
    scope["w"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert scope.find_var("missing") is None
    w = scope.find_var("w")
    assert w.get_tensor() is w and w._get_dims() == [2, 3]
    assert type(w * 2) is np.ndarray and type(np.asarray(w)) is np.ndarray  # results are plain arrays
    w[0, 0] = 7  # the live array
    assert scope["w"][0, 0] == 7
    w.set(np.array([[1, 1, 1], [2, 2, 2]], np.float32), None)  # same shape and dtype: in place
    assert scope["w"].tolist() == [[1, 1, 1], [2, 2, 2]] and w.tolist() == [[1, 1, 1], [2, 2, 2]]
    assert scope["w"] is scope.vars["w"] and np.shares_memory(w, scope["w"])
    w.set([[3, 3, 3], [4, 4, 4]], None)  # int64 values: the variable takes their dtype, as in Paddle
    assert scope["w"].dtype == np.int64 and scope["w"].tolist() == [[3, 3, 3], [4, 4, 4]]
    w.set(np.ones(4, np.int64), None)  # another shape: the scope gets the new value
    assert scope["w"].tolist() == [1, 1, 1, 1] and scope["w"].dtype == np.int64
    child = scope.new_scope()
    child.find_var("w").set(np.zeros(2), None)  # replaced where it lives, not in the child
    assert scope["w"].tolist() == [0.0, 0.0] and "w" not in child.vars
    created = scope.var("new")
    assert created.shape == (0,) and "new" in scope
    created.set(np.full(3, 2.5, np.float32), None)
    assert scope["new"].tolist() == [2.5, 2.5, 2.5]
    with pytest.raises(ConfigError, match=r"set\(\): an array of shape \(2,\) and dtype float64 cannot replace "
                                          r"this one \(\(3,\), float32\): it is not a scope variable's array"):
        (scope.find_var("new") + 1).view(type(w)).set(np.zeros(2), None)


def test_auc_state_is_persistable_int64_and_not_a_parameter():
    _, _, _, states = _auc_program()
    for var in states:
        assert var.persistable and var.dtype == "int64"
        assert not isinstance(var, fleet.Parameter)


def test_accuracy_counts_top_k_hits():
    out = layers.data("out", shape=[3])
    label = layers.data("label", shape=[1], dtype="int64")
    acc1 = layers.accuracy(out, label, k=1)
    acc2 = layers.accuracy(out, label, k=2)
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.6, 0.1, 0.3]], np.float32)
    labels = np.array([[1], [1], [0], [2]])
    exe = fleet.Executor()
    a1, a2 = exe.run(feed={"out": scores, "label": labels}, fetch_list=[acc1, acc2])
    assert a1[0] == pytest.approx(0.25)  # only row 0
    assert a2[0] == pytest.approx(0.75)  # rows 0, 1 and 3
