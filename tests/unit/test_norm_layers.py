"""dropout, batch_norm and layer_norm: Paddle's training and test behaviour and defaults,
their persistable state, and gradients against central finite differences (gradcheck.py,
with the training forward where test time differs)."""
import numpy as np
import pytest

import fleet
import fleet.framework as fw
from fleet import layers, optimizer
from fleet.errors import ConfigError
from fleet.framework.tensor import LoDTensor
from role_makers import LocalRoleMaker

from gradcheck import check_grads


def _r(seed, shape, scale=1.0, loc=0.0):
    return (np.random.default_rng(seed).normal(loc, scale, size=shape)).astype(np.float32)


def _run(build, feed, seed=0):
    """Builds ``build()`` -> fetch list; returns (main, startup, scope, exe, fetch)."""
    fw.unique_name.reset()
    main, startup = fw.Program(), fw.Program()
    with fw.program_guard(main, startup):
        fetch = build()
    main.random_seed = seed
    scope, exe = fw.Scope(), fw.Executor()
    exe.run(startup, scope=scope)
    return main, scope, exe, fetch


# ------------------------------------------------------------------ dropout
@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
def test_dropout_keeps_one_minus_p_of_the_elements_and_scales_as_paddle_in_training_and_test(impl):
    x = _r(1, (200, 100), loc=3.0)

    def build():
        xv = layers.data("x", shape=[100])
        return [layers.dropout(xv, dropout_prob=0.3, dropout_implementation=impl)]

    main, scope, exe, fetch = _run(build, {})
    (out,) = exe.run(main, feed={"x": x}, fetch_list=fetch, scope=scope)
    kept = out != 0
    assert abs(kept.mean() - 0.7) < 0.01
    factor = 1 / 0.7 if impl == "upscale_in_train" else 1.0
    np.testing.assert_allclose(out[kept], x[kept] * factor, rtol=1e-6)
    (test_out,) = exe.run(main.clone(for_test=True), feed={"x": x}, fetch_list=fetch, scope=scope)
    np.testing.assert_allclose(test_out, x if impl == "upscale_in_train" else x * np.float32(0.7), rtol=1e-6)


@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
def test_dropout_with_a_seed_drops_the_same_elements_every_run_and_its_gradient_is_the_mask(impl):
    x = _r(2, (6, 5))

    def build():
        xv = layers.data("x", shape=[5], stop_gradient=False)
        return layers.dropout(xv, 0.4, seed=11, dropout_implementation=impl), [xv]

    r = check_grads(build, {"x": x}, train_forward=True)
    kept = r.out != 0
    assert 0 < kept.sum() < kept.size
    factor = 1 / 0.6 if impl == "upscale_in_train" else 1.0
    np.testing.assert_allclose(r.out[kept], x[kept] * factor, rtol=1e-6)
    assert not r.analytic["x"][~kept].any() and r.analytic["x"][kept].all()


def test_dropout_draws_a_new_mask_every_run_and_the_programs_seed_makes_the_masks_repeatable():
    x = np.ones((50, 40), np.float32)

    def masks(seed):
        main, scope, exe, fetch = _run(lambda: [layers.dropout(layers.data("x", shape=[40]), 0.5)], {}, seed)
        return [exe.run(main, feed={"x": x}, fetch_list=fetch, scope=scope)[0] != 0 for _ in range(2)]

    first, second = masks(seed=5)
    assert (first != second).mean() > 0.3
    again = masks(seed=5)
    np.testing.assert_array_equal(first, again[0])
    np.testing.assert_array_equal(second, again[1])


def test_dropout_on_a_sequence_keeps_its_lod_and_refuses_bad_arguments():
    def build():
        xv = layers.data("x", shape=[3], lod_level=1)
        out = layers.dropout(xv, 0.5, is_test=True)
        assert out.lod_level == 1
        return [out]

    main, scope, exe, fetch = _run(build, {})
    (out,) = exe.run(main, feed={"x": (np.ones((4, 3), np.float32), [1, 3])}, fetch_list=fetch, scope=scope,
                     return_numpy=False)
    assert isinstance(out, LoDTensor) and np.all(out.values == 0.5)
    with pytest.raises(ConfigError, match=r"dropout dropout_prob=1.5 must be a number in \[0, 1\]"):
        layers.dropout(layers.data("y", shape=[3]), 1.5)
    with pytest.raises(ConfigError, match="dropout dropout_implementation='scale'; use 'downgrade_in_infer' or "
                                          "'upscale_in_train'"):
        layers.dropout(layers.data("z", shape=[3]), 0.1, dropout_implementation="scale")


# ------------------------------------------------------------------ batch_norm
def _bn_reference(x, axis, scale, bias, mean, var, eps=1e-5):
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    r = lambda a: a.reshape(shape)  # noqa: E731
    return (x - r(mean)) / np.sqrt(r(var) + eps) * r(scale) + r(bias)


@pytest.mark.parametrize("shape,layout,axis", [((8, 3), "NCHW", 1), ((4, 3, 2, 2), "NCHW", 1),
                                               ((4, 2, 2, 3), "NHWC", 3)])
def test_batch_norm_trains_on_batch_statistics_and_moves_its_moving_mean_and_variance(shape, layout, axis):
    x = _r(3, shape, scale=2.0, loc=1.0)
    reduce = tuple(i for i in range(x.ndim) if i != axis)

    def build():
        xv = layers.data("x", shape=list(shape), append_batch_size=False)
        return [layers.batch_norm(xv, data_layout=layout)]

    main, scope, exe, fetch = _run(build, {})
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    (y,) = exe.run(main, feed={"x": x}, fetch_list=fetch, scope=scope)
    mean, var = x.mean(axis=reduce), x.var(axis=reduce)
    np.testing.assert_allclose(y, _bn_reference(x, axis, ones, zeros, mean, var), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scope["batch_norm_0.w_1"], 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(scope["batch_norm_0.w_2"], 0.9 + 0.1 * var, rtol=1e-5)
    moving = scope["batch_norm_0.w_1"].copy(), scope["batch_norm_0.w_2"].copy()
    (y_test,) = exe.run(main.clone(for_test=True), feed={"x": x}, fetch_list=fetch, scope=scope)
    np.testing.assert_allclose(y_test, _bn_reference(x, axis, ones, zeros, *moving), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(scope["batch_norm_0.w_1"], moving[0])  # test runs leave them alone


@pytest.mark.parametrize("shape", [(6, 3), (3, 3, 2, 2)])
@pytest.mark.parametrize("global_stats", [False, True])
def test_batch_norm_gradients_of_input_scale_and_bias_match_finite_differences(shape, global_stats):
    x = _r(4, shape, scale=1.5, loc=0.5)

    def build():
        xv = layers.data("x", shape=list(shape), append_batch_size=False, stop_gradient=False)
        out = layers.batch_norm(xv, param_attr="s", bias_attr="b", moving_mean_name="m",
                                moving_variance_name="v", use_global_stats=global_stats)
        return out, [xv, "s", "b"]

    params = {"s": _r(5, (3,), loc=1.0), "b": _r(6, (3,)), "m": _r(7, (3,)), "v": np.float32([0.5, 1.5, 2.0])}
    r = check_grads(build, {"x": x}, params=params, train_forward=True)
    reduce = tuple(i for i in range(x.ndim) if i != 1)
    stats = (params["m"], params["v"]) if global_stats else (x.mean(axis=reduce), x.var(axis=reduce))
    np.testing.assert_allclose(r.out, _bn_reference(x, 1, params["s"], params["b"], *stats), rtol=1e-4,
                               atol=1e-5)


def test_batch_norm_parameters_have_paddles_names_initializers_and_only_scale_and_bias_train():
    fw.reset_default_programs()
    x = layers.data("x", shape=[4])
    loss = layers.mean(layers.batch_norm(x, act="relu"))
    optimizer.SGD(0.1).minimize(loss)
    params = {p.name: p for p in fleet.default_main_program().all_parameters()}
    assert sorted(params) == ["batch_norm_0.b_0", "batch_norm_0.w_0", "batch_norm_0.w_1", "batch_norm_0.w_2"]
    assert [params[n].trainable for n in sorted(params)] == [True, True, False, False]
    assert all(p.persistable and p.shape == (4,) for p in params.values())
    init = {op.output("Out")[0]: op.attr("value") for op in fleet.default_startup_program().global_block().ops}
    assert init == {"batch_norm_0.w_0": 1.0, "batch_norm_0.b_0": 0.0, "batch_norm_0.w_1": 0.0,
                    "batch_norm_0.w_2": 1.0}
    updated = {op.input("Param")[0] for op in fleet.default_main_program().global_block().ops if op.type == "sgd"}
    assert updated == {"batch_norm_0.w_0", "batch_norm_0.b_0"}
    fw.reset_default_programs()


def test_batch_norm_moving_statistics_are_saved_and_loaded_with_the_persistables(tmp_path, fresh_fleet):
    fleet.init(LocalRoleMaker())
    x = layers.data("x", shape=[3])
    loss = layers.mean(layers.square(layers.fc(layers.batch_norm(x, moving_mean_name="mm"), 1)))
    fleet.distributed_optimizer(optimizer.SGD(0.1)).minimize(loss)
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    for seed in range(3):
        exe.run(fleet.main_program, feed={"x": _r(seed, (5, 3), loc=2.0)}, fetch_list=[loss])
    saved = fleet.global_scope()["mm"].copy()
    assert np.all(saved > 0.3)  # 2 * (1 - 0.9 ** 3) on average
    fleet.save_persistables(exe, str(tmp_path / "ckpt"))
    exe.run(fleet.main_program, feed={"x": _r(9, (5, 3), loc=-4.0)}, fetch_list=[loss])
    assert not np.allclose(fleet.global_scope()["mm"], saved)
    assert "mm" in fleet.load_persistables(exe, str(tmp_path / "ckpt"))
    np.testing.assert_array_equal(fleet.global_scope()["mm"], saved)


def test_an_inference_model_with_dropout_and_batch_norm_predicts_like_the_test_clone(tmp_path, fresh_fleet):
    fleet.init(LocalRoleMaker())
    x = layers.data("x", shape=[3])
    hidden = layers.dropout(layers.batch_norm(layers.fc(x, 4), act="relu"), 0.3)
    pred = layers.fc(hidden, 1, act="sigmoid")
    loss = layers.mean(layers.square(pred))
    fleet.distributed_optimizer(optimizer.SGD(0.1)).minimize(loss)
    exe = fleet.Executor()
    exe.run(fleet.startup_program)
    for seed in range(3):
        exe.run(fleet.main_program, feed={"x": _r(seed, (6, 3))}, fetch_list=[loss])
    feed = {"x": _r(7, (5, 3))}
    (expected,) = exe.run(fleet.main_program.clone(for_test=True), feed=feed, fetch_list=[pred])
    target = fleet.save_inference_model(exe, str(tmp_path / "model"), ["x"], [pred])
    fw.reset_default_programs()
    with fw.scope_guard(fw.Scope()):
        program, feeds, fetch = fleet.load_inference_model(target)
        types = [op.type for op in program.global_block().ops]
        assert "dropout" in types and "batch_norm" in types
        (got,) = fleet.Executor().run(program, feed=feed, fetch_list=fetch)
    np.testing.assert_array_equal(got, expected)


# ------------------------------------------------------------------ layer_norm
@pytest.mark.parametrize("shape,axis,scale,shift", [((4, 5), 1, True, True), ((3, 2, 4), 1, True, False),
                                                    ((3, 2, 4), 2, False, True), ((3, 4), 1, False, False)])
def test_layer_norm_normalizes_each_example_and_its_gradients_match(shape, axis, scale, shift):
    x = _r(8, shape, scale=2.0, loc=1.0)
    right = int(np.prod(shape[axis:]))

    def build():
        xv = layers.data("x", shape=list(shape), append_batch_size=False, stop_gradient=False)
        out = layers.layer_norm(xv, scale=scale, shift=shift, begin_norm_axis=axis, param_attr="s", bias_attr="b")
        return out, [xv] + (["s"] if scale else []) + (["b"] if shift else [])

    params = {k: _r(i, (right,), loc=1.0 if k == "s" else 0.0) for i, k in ((9, "s"), (10, "b"))
              if (k == "s" and scale) or (k == "b" and shift)}
    r = check_grads(build, {"x": x}, params=params)
    rows = x.reshape(-1, right)
    expected = (rows - rows.mean(1, keepdims=True)) / np.sqrt(rows.var(1, keepdims=True) + 1e-5)
    expected = expected * params.get("s", 1.0) + params.get("b", 0.0)
    np.testing.assert_allclose(r.out, expected.reshape(shape), rtol=1e-4, atol=1e-5)


def test_layer_norm_on_a_sequence_normalizes_each_id_and_keeps_the_lod():
    values = _r(11, (5, 4), loc=3.0)

    def build():
        xv = layers.data("x", shape=[4], lod_level=1, stop_gradient=False)
        out = layers.layer_norm(xv, param_attr="s", bias_attr="b")
        assert out.lod_level == 1
        return out, [xv, "s", "b"]

    r = check_grads(build, {"x": (values, [2, 3])})
    assert isinstance(r.raw["x"], LoDTensor)
    np.testing.assert_allclose(r.out.mean(1), np.zeros(5), atol=1e-5)
    fw.reset_default_programs()
    with pytest.raises(ConfigError, match=r"layer_norm begin_norm_axis=0 must be in \[1, 2\)"):
        layers.layer_norm(layers.data("y", shape=[4]), begin_norm_axis=0)
    fw.reset_default_programs()
