"""Ftrl, RMSProp, DecayedAdagrad, Lamb, regularizers and learning-rate schedules through
minimize() + Executor.run, against Paddle's formulas written out in float64."""
import math

import numpy as np
import pytest

import fleet.framework as fw
from fleet import layers, optimizer, regularizer
from fleet.errors import ConfigError
from fleet.param_attr import ParamAttr
from test_optimizers import B0, W0, Linear, _batches, _grads


def _replay(kind, steps, lrs=None, reg=None, **hp):
    """Paddle's update formulas in float64 from the known gradients; ``lrs`` per step."""
    params = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
    state = {k: {} for k in params}
    for t, (x, c) in enumerate(steps):
        lr = lrs[t] if lrs is not None else hp["lr"]
        gw, gb = _grads(x, c)
        for name, g in (("w", gw), ("b", gb)):
            p, s = params[name], state[name]
            if reg is not None and reg.get(name):
                kind_r, coeff = reg[name]
                g = g + coeff * (np.sign(p) if kind_r == "l1" else p)
            if kind == "sgd":
                p -= lr * g
            elif kind == "ftrl":
                l1, l2 = hp["l1"] + 1e-10, hp["l2"] + 1e-10
                sq, lin = s.get("sq", 0.0), s.get("lin", 0.0)
                new = sq + g * g
                lin = lin + g - (np.sqrt(new) - np.sqrt(sq)) / lr * p
                y = np.sqrt(new) / lr + 2 * l2
                p[...] = np.where(np.abs(lin) > l1, (l1 * np.sign(lin) - lin) / y, 0.0)
                s["sq"], s["lin"] = new, lin
            elif kind == "rmsprop":
                rho, eps, mu = hp["rho"], hp["epsilon"], hp["momentum"]
                ms = rho * s.get("ms", 0.0) + (1 - rho) * g * g
                mg = rho * s.get("mg", 0.0) + (1 - rho) * g
                denom = ms - mg * mg + eps if hp["centered"] else ms + eps
                mom = mu * s.get("mom", 0.0) + lr * g / np.sqrt(denom)
                s.update(ms=ms, mg=mg, mom=mom)
                p -= mom
            elif kind == "decayed_adagrad":
                m = hp["decay"] * s.get("m", 0.0) + (1 - hp["decay"]) * g * g
                s["m"] = m
                p -= lr * g / (np.sqrt(m) + hp["epsilon"])
            elif kind == "adamax":
                b1, b2, eps = hp["beta1"], hp["beta2"], hp["epsilon"]
                m = b1 * s.get("m", 0.0) + (1 - b1) * g
                u = np.maximum(np.abs(g), b2 * s.get("u", 0.0) + eps)
                s["m"], s["u"] = m, u
                p -= lr / (1 - b1 ** (t + 1)) * m / u
            elif kind == "adadelta":  # Paddle 1.x's op has no learning rate
                rho, eps = hp["rho"], hp["epsilon"]
                g2 = rho * s.get("g2", 0.0) + (1 - rho) * g * g
                upd = -np.sqrt((s.get("u2", 0.0) + eps) / (g2 + eps)) * g
                s["g2"], s["u2"] = g2, rho * s.get("u2", 0.0) + (1 - rho) * upd * upd
                p += upd
            elif kind == "lamb":
                b1, b2, eps = hp["beta1"], hp["beta2"], hp["epsilon"]
                wd = 0.0 if name in hp.get("excluded", ()) else hp["weight_decay"]
                m1 = b1 * s.get("m1", 0.0) + (1 - b1) * g
                m2 = b2 * s.get("m2", 0.0) + (1 - b2) * g * g
                s["m1"], s["m2"] = m1, m2
                r = m1 / (np.sqrt(m2) + eps) + wd * p
                pn, rn = np.linalg.norm(p), np.linalg.norm(r)
                p -= lr * (pn / rn if pn > 0 and rn > 0 else 1.0) * r
    return params


def _check(model, want, rtol=2e-5):
    np.testing.assert_allclose(model["w"], want["w"], rtol=rtol, atol=1e-5)
    np.testing.assert_allclose(model["b"], want["b"], rtol=rtol, atol=1e-5)


def _train(opt, steps, **kw):
    model = Linear(opt, **kw)
    for x, c in steps:
        model.step(x, c)
    return model


@pytest.mark.parametrize("make, kind, hp", [
    (lambda: optimizer.Ftrl(0.1, l1=0.01, l2=0.02), "ftrl", dict(lr=0.1, l1=0.01, l2=0.02)),
    (lambda: optimizer.FtrlOptimizer(0.5, l1=0.0, l2=0.0), "ftrl", dict(lr=0.5, l1=0.0, l2=0.0)),
    (lambda: optimizer.RMSProp(0.01, rho=0.9, epsilon=1e-6, momentum=0.5), "rmsprop",
     dict(lr=0.01, rho=0.9, epsilon=1e-6, momentum=0.5, centered=False)),
    (lambda: optimizer.RMSPropOptimizer(0.01, centered=True, momentum=0.9), "rmsprop",
     dict(lr=0.01, rho=0.95, epsilon=1e-6, momentum=0.9, centered=True)),
    (lambda: optimizer.DecayedAdagrad(0.1, decay=0.9), "decayed_adagrad", dict(lr=0.1, decay=0.9, epsilon=1e-6)),
    (lambda: optimizer.LambOptimizer(0.01, lamb_weight_decay=0.02), "lamb",
     dict(lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-6, weight_decay=0.02)),
    (lambda: optimizer.AdamaxOptimizer(0.01, beta1=0.8), "adamax", dict(lr=0.01, beta1=0.8, beta2=0.999, epsilon=1e-8)),
    (lambda: optimizer.Adadelta(123.0, rho=0.9), "adadelta", dict(lr=None, rho=0.9, epsilon=1e-6)),
    (lambda: optimizer.Lamb(0.01, exclude_from_weight_decay_fn=lambda p: p.name == "b"), "lamb",
     dict(lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-6, weight_decay=0.01, excluded=("b",))),
])
def test_new_optimizers_match_paddles_formulas_over_three_steps(make, kind, hp):
    steps = _batches()
    _check(_train(make(), steps), _replay(kind, steps, **hp))


def test_optimizer_state_uses_paddles_accumulator_names():
    model = _train(optimizer.RMSProp(0.01, centered=True), _batches(1))
    for key in ("mean_square", "momentum", "mean_grad"):
        assert model[f"w_{key}_0"].shape == (3, 2)
    model = _train(optimizer.Ftrl(0.1), _batches(1))
    assert model["w_squared_0"].shape == model["w_linear_0"].shape == (3, 2)


# ----------------------------------------------------------------------------- regularizers
def test_optimizer_l2_regularization_adds_coeff_times_param_to_every_gradient():
    steps = _batches()
    model = _train(optimizer.SGD(0.1, regularization=regularizer.L2Decay(0.5)), steps)
    _check(model, _replay("sgd", steps, lr=0.1, reg={"w": ("l2", 0.5), "b": ("l2", 0.5)}))


def test_param_attr_regularizer_wins_over_the_optimizers_and_l1_uses_the_sign():
    steps = _batches()
    opt = optimizer.SGD(0.1, regularization=regularizer.L2DecayRegularizer(regularization_coeff=0.5))
    model = _train(opt, steps, w_attr=ParamAttr(name="w", regularizer=regularizer.L1Decay(0.25)))
    _check(model, _replay("sgd", steps, lr=0.1, reg={"w": ("l1", 0.25), "b": ("l2", 0.5)}))


def test_one_sgd_step_with_l2_decay_equals_the_hand_computed_value():
    x = np.array([[1, 0, 0]] * 4, dtype=np.float32)
    c = np.zeros((4, 2), np.float32)  # the loss's gradient is zero: only the decay moves w
    model = Linear(optimizer.SGD(0.5, regularization=regularizer.L2Decay(0.25)))
    model.step(x, c)
    np.testing.assert_array_equal(model["w"], W0 - np.float32(0.5) * (np.float32(0.25) * W0))


def test_sparse_gradients_are_regularized_on_their_rows_only():
    main, startup, scope = fw.Program(), fw.Program(), fw.Scope()
    with fw.program_guard(main, startup):
        ids = layers.data("ids", shape=[1], dtype="int64", lod_level=1)
        emb = layers.embedding(ids, size=[5, 2], is_sparse=True,
                               param_attr=ParamAttr(name="t", regularizer=regularizer.L2Decay(0.5)))
        loss = layers.reduce_sum(layers.sequence_pool(emb, "sum"))
        optimizer.SGD(0.1).minimize(loss)
    exe = fw.Executor()
    exe.run(startup, scope=scope)
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    scope["t"][...] = table
    exe.run(main, feed={"ids": [[1, 3, 1]]}, scope=scope)
    want = table.copy()
    grad = {1: 2.0, 3: 1.0}  # id 1 twice: its rows sum, the decay is added once
    for row, g in grad.items():
        want[row] -= np.float32(0.1) * (np.float32(g) + np.float32(0.5) * table[row])
    np.testing.assert_allclose(scope["t"], want, rtol=1e-6)


def test_bad_regularizers_and_hyper_parameters_are_refused_with_the_value_named():
    with pytest.raises(ConfigError, match=r"regularization=0\.1 must be a fleet.regularizer"):
        optimizer.SGD(0.1, regularization=0.1)
    with pytest.raises(ConfigError, match="ParamAttr regularizer='l2'"):
        ParamAttr(regularizer="l2")
    with pytest.raises(ConfigError, match=r"RMSProp rho=1\.5"):
        optimizer.RMSProp(0.1, rho=1.5)
    with pytest.raises(ConfigError, match=r"Ftrl l1=-1"):
        optimizer.Ftrl(0.1, l1=-1)


# ----------------------------------------------------------------------------- schedules
def _closed_form(kind, t, **a):
    if kind == "exponential_decay":
        div = math.floor(t / a["decay_steps"]) if a.get("staircase") else t / a["decay_steps"]
        return a["learning_rate"] * a["decay_rate"] ** div
    if kind == "natural_exp_decay":
        return a["learning_rate"] * math.exp(-a["decay_rate"] * t / a["decay_steps"])
    if kind == "inverse_time_decay":
        return a["learning_rate"] / (1 + a["decay_rate"] * math.floor(t / a["decay_steps"]))
    if kind == "polynomial_decay":
        if a.get("cycle"):
            steps = a["decay_steps"] * max(math.ceil(t / a["decay_steps"]), 1)
        else:
            steps, t = a["decay_steps"], min(t, a["decay_steps"])
        return (a["learning_rate"] - a["end_learning_rate"]) * (1 - t / steps) ** a["power"] + a["end_learning_rate"]
    if kind == "piecewise_decay":
        return next((v for b, v in zip(a["boundaries"], a["values"]) if t < b), a["values"][-1])
    if kind == "noam_decay":
        return a["learning_rate"] * a["d_model"] ** -0.5 * min(t ** -0.5, a["warmup_steps"] ** -1.5 * t)
    if kind == "cosine_decay":
        return a["learning_rate"] * 0.5 * (math.cos(math.floor(t / a["step_each_epoch"]) * math.pi / a["epochs"]) + 1)
    raise AssertionError(kind)


SCHEDULES = [
    ("exponential_decay", dict(learning_rate=0.1, decay_steps=3, decay_rate=0.5)),
    ("exponential_decay", dict(learning_rate=0.1, decay_steps=3, decay_rate=0.5, staircase=True)),
    ("natural_exp_decay", dict(learning_rate=0.1, decay_steps=2, decay_rate=0.3)),
    ("inverse_time_decay", dict(learning_rate=0.1, decay_steps=2, decay_rate=0.5, staircase=True)),
    ("polynomial_decay", dict(learning_rate=0.1, decay_steps=4, end_learning_rate=0.01, power=2.0)),
    ("polynomial_decay", dict(learning_rate=0.1, decay_steps=3, end_learning_rate=0.0, power=1.0, cycle=True)),
    ("piecewise_decay", dict(boundaries=[2, 5], values=[0.1, 0.05, 0.01])),
    ("noam_decay", dict(d_model=16, warmup_steps=3, learning_rate=2.0)),
    ("cosine_decay", dict(learning_rate=0.1, step_each_epoch=2, epochs=4)),
]


def _schedule_program(kind, args, opt=optimizer.SGD):
    model = Linear.__new__(Linear)
    model.main, model.startup, model.scope = fw.Program(), fw.Program(), fw.Scope()
    model.exe = fw.Executor()
    with fw.program_guard(model.main, model.startup):
        x = layers.data("x", shape=[3])
        c = layers.data("c", shape=[2])
        out = layers.fc(x, 2, param_attr="w", bias_attr="b")
        loss = layers.reduce_sum(layers.elementwise_mul(out, c))
        lr = getattr(layers, kind)(**args)
        model.lr, model.opt = lr, opt(lr)
        model.opt.minimize(loss)
    model.exe.run(model.startup, scope=model.scope)
    model.scope["w"][...] = W0
    model.scope["b"][...] = B0
    return model


@pytest.mark.parametrize("kind, args", SCHEDULES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SCHEDULES)])
def test_each_schedule_gives_its_closed_form_at_every_step_and_sgd_uses_it(kind, args):
    model = _schedule_program(kind, args)
    begin = 1 if kind == "noam_decay" else 0
    steps = _batches(8)
    lrs = []
    for t, (x, c) in enumerate(steps, start=begin):
        lr, = model.exe.run(model.main, feed={"x": x, "c": c}, fetch_list=[model.lr], scope=model.scope)
        want = _closed_form(kind, t, **args)
        np.testing.assert_allclose(lr, [want], rtol=1e-6, err_msg=f"step {t}")
        lrs.append(float(lr[0]))
    assert int(model.scope["@LR_DECAY_COUNTER@"][0]) == begin + len(steps) - 1
    _check(model, _replay("sgd", steps, lrs=lrs))


def test_linear_lr_warmup_over_a_piecewise_schedule_and_get_lr():
    main, startup, scope = fw.Program(), fw.Program(), fw.global_scope()
    with fw.program_guard(main, startup):
        x = layers.data("x", shape=[3])
        loss = layers.reduce_sum(layers.fc(x, 1))
        inner = layers.piecewise_decay([4, 6], [0.1, 0.01, 0.001])
        lr = layers.linear_lr_warmup(inner, warmup_steps=3, start_lr=1 / 3, end_lr=0.1)
        opt = optimizer.Adam(lr)
        opt.minimize(loss)
    exe = fw.Executor()
    with pytest.raises(ConfigError, match="has no value yet"):
        opt.get_lr()
    exe.run(startup)
    assert opt.get_lr() == 0.0  # a global variable, 0 until the first step (as Paddle's)
    got = []
    for _ in range(8):
        exe.run(main, feed={"x": np.ones((2, 3), np.float32)})
        got.append(opt.get_lr())
    warm = [1 / 3 + (0.1 - 1 / 3) * t / 3 for t in range(3)]
    np.testing.assert_allclose(got, warm + [0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)
    test_prog = main.clone(for_test=True)
    assert not any(op.type in ("increment", "lr_schedule") for op in test_prog.global_block().ops)


def test_schedules_refuse_bad_arguments():
    with fw.program_guard(fw.Program(), fw.Program()):
        with pytest.raises(ConfigError, match="len\\(values\\) - len\\(boundaries\\) should be 1"):
            layers.piecewise_decay([1, 2], [0.1])
        with pytest.raises(ConfigError, match="decay_steps=0 must be a positive number"):
            layers.exponential_decay(0.1, 0, 0.5)


def test_paddle_names_reach_the_same_objects_through_fleet_fluid():
    import fleet.fluid as fluid
    assert fluid.regularizer.L2DecayRegularizer is regularizer.L2Decay
    assert fluid.regularizer.L1Decay is regularizer.L1DecayRegularizer
    for name in ("FtrlOptimizer", "RMSPropOptimizer", "DecayedAdagradOptimizer", "LambOptimizer", "AdamaxOptimizer",
                 "AdadeltaOptimizer"):
        assert getattr(fluid.optimizer, name) is getattr(optimizer, name[:-len("Optimizer")])
    assert fluid.layers.noam_decay is layers.noam_decay
