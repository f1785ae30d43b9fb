"""Finite-difference gradient checks for fleet ops, run through the real engine.

``check_grads(build, feed, ...)`` builds a tiny program with ``build()`` (inside a fresh
``program_guard``), then appends the loss ``reduce_sum(out * W)`` where ``W`` is a fixed
random float tensor fed as data (so every output element gets its own non-trivial
weight), appends the backward ops with ``append_backward`` and compares the analytic
gradient of every requested variable (a parameter, or an input declared with
``stop_gradient=False``) with central finite differences::

    numeric[i] = (L(v + eps * e_i) - L(v - eps * e_i)) / (2 * eps)

where ``L`` is evaluated by re-running the forward ops only (a ``clone(for_test=True)``
of the program) after perturbing the parameter in its scope, or the fed array.

Tolerances. The engine computes in float32; ``L`` is accumulated in float64 from the
fetched float32 output, so the rounding error of one finite difference is about
``1e-7 * sum|W * out| / eps``. With the defaults (``eps=1e-2``, ``rtol=1e-2``,
``atol=1e-3``) that is far below the tolerance for the few dozen outputs of these
programs, and the truncation error (``eps**2 * f''' / 6``) is below 1e-4 for smooth ops
on inputs of order one. Ops with kinks (relu, max pooling) are checked with inputs at
least ``10 * eps`` away from the kink (the callers assert the margin), so no finite
difference crosses one.
"""
import numpy as np

import fleet.framework as fw
from fleet import layers
from fleet.framework.program import Parameter
from fleet.framework.tensor import LoDTensor, SparseRows

EPS = 1e-2
RTOL = 1e-2
ATOL = 1e-3
LOSS_WEIGHT = "gradcheck_loss_weight"


class GradResult:
    """What ``check_grads`` computed, for tests that assert more than the comparison.

    Attributes:
        analytic: {name: dense float64 gradient} (SparseRows converted with to_dense).
        raw: {name: the gradient value as the engine produced it (SparseRows, LoDTensor
            or ndarray)}.
        numeric: {name: (flat indices checked, numeric gradient at those indices)}.
        out: the forward output value (numpy) at the unperturbed point.
        main, scope: the program (with backward ops) and the scope it ran in.
    """

    def __init__(self):
        self.analytic, self.raw, self.numeric = {}, {}, {}
        self.out = None
        self.main = self.scope = None


def _values(value):
    """The float array of a fed value (for perturbing) and a function rebuilding the feed."""
    if isinstance(value, tuple):
        vals = np.array(value[0], dtype=np.float32)
        return vals, lambda v: (v, value[1])
    if isinstance(value, LoDTensor):
        vals = np.array(value.values, dtype=np.float32)
        return vals, lambda v: LoDTensor(v, value.offsets)
    vals = np.array(value, dtype=np.float32)
    return vals, lambda v: v


def _dense(grad):
    if isinstance(grad, SparseRows):
        return grad.to_dense().astype(np.float64)
    if isinstance(grad, LoDTensor):
        return np.asarray(grad.values, dtype=np.float64)
    return np.asarray(grad, dtype=np.float64)


def _check_shape(var, value):
    """The layer's inferred shape must match the computed value (-1 matches anything)."""
    got = np.asarray(value.values if isinstance(value, LoDTensor) else value).shape
    want = var.shape
    ok = len(got) == len(want) and all(w == -1 or w == g for w, g in zip(want, got))
    assert ok, f"{var.name}: inferred shape {list(want)} but the op computed {list(got)}"


def check_grads(build, feed, eps=EPS, rtol=RTOL, atol=ATOL, max_checks=40, params=None,
                indices=None, seed=0, train_forward=False):
    """Checks the backward of the ops ``build()`` appends against finite differences.

    Args:
        build: called under a fresh ``program_guard``; returns ``(out, wrt)``: the output
            Variable to put in the loss and the Variables (or names) to differentiate.
        feed: {name: value} for the program's inputs (arrays, ``(values, lengths)``).
        eps, rtol, atol: finite-difference step and comparison tolerances.
        max_checks: at most this many elements per variable are perturbed (a seeded
            random subset when larger).
        params: {parameter name: value} assigned in the scope after the startup program.
        indices: {name: flat indices} to perturb instead of a random subset.
        seed: seeds the program's initializers, the loss weights and the subsets.
        train_forward: evaluate the finite differences with the training forward (ops keep
            their own ``is_test``) instead of the test clone's; for ops that behave
            differently at test time (dropout with a fixed seed, batch_norm).

    Returns:
        A GradResult.

    Raises:
        AssertionError: a gradient disagrees with its finite difference (the message
            names the variable), or a layer inferred a wrong output shape.
    """
    rng = np.random.default_rng(seed)
    main, startup, scope, exe = fw.Program(), fw.Program(), fw.Scope(), fw.Executor()
    main.random_seed = seed + 1
    with fw.program_guard(main, startup):
        out, wrt = build()
    wrt = [w if isinstance(w, str) else w.name for w in wrt]
    exe.run(startup, scope=scope)
    for name, value in (params or {}).items():
        scope[name][...] = value
    feed = dict(feed)
    (value,) = exe.run(main, feed=feed, fetch_list=[out], scope=scope, return_numpy=False)
    _check_shape(out, value)
    out_values = np.array(value.values if isinstance(value, LoDTensor) else value, dtype=np.float32)
    weight = rng.uniform(0.5, 1.5, out_values.shape) * rng.choice([-1.0, 1.0], out_values.shape)
    # a lod_level=1 output gets a weight with its LoD (one row per id, like the output)
    feed[LOSS_WEIGHT] = (LoDTensor(weight.astype(np.float32), value.offsets)
                         if isinstance(value, LoDTensor) else weight.astype(np.float32))
    with fw.program_guard(main, startup):
        w = layers.data(LOSS_WEIGHT, shape=list(out.shape), dtype="float32", append_batch_size=False,
                        lod_level=out.lod_level)
        loss = layers.reduce_sum(layers.elementwise_mul(out, w))
        is_test = [op.attrs.get("is_test") for op in main.global_block().ops]
        fw.append_backward(loss, parameter_list=wrt)
    test = main.clone(for_test=True)
    if train_forward:  # the clone keeps the forward ops in order
        for op, flag in zip(test.global_block().ops, is_test):
            op.attrs["is_test"] = bool(flag)

    result = GradResult()
    result.out, result.main, result.scope = out_values, main, scope
    grads = exe.run(main, feed=feed, fetch_list=[n + "@GRAD" for n in wrt], scope=scope,
                    return_numpy=False)
    w64 = weight.astype(np.float64)

    def loss_at(fd):
        (o,) = exe.run(test, feed=fd, fetch_list=[out], scope=scope)
        return float(np.sum(o.astype(np.float64) * w64))

    block = main.global_block()
    for name, grad in zip(wrt, grads):
        result.raw[name] = grad
        analytic = _dense(grad)
        result.analytic[name] = analytic
        is_param = isinstance(block.var(name), Parameter)
        if is_param:
            target = scope[name]
            base = target
        else:
            base, rebuild = _values(feed[name])
            target = base
        assert analytic.size == target.size, (
            f"{name}@GRAD has {analytic.size} elements, {name} has {target.size}")
        if indices and name in indices:
            idx = np.asarray(indices[name], dtype=np.int64)
        elif target.size <= max_checks:
            idx = np.arange(target.size)
        else:
            idx = np.sort(rng.choice(target.size, max_checks, replace=False))
        flat = target.reshape(-1)
        numeric = np.empty(len(idx))
        for k, i in enumerate(idx):
            orig = flat[i]
            losses = []
            for sign in (1.0, -1.0):
                flat[i] = orig + np.float32(sign * eps)
                fd = feed if is_param else dict(feed, **{name: rebuild(base.copy())})
                losses.append(loss_at(fd))
            flat[i] = orig
            # the step actually taken in float32
            step = float(np.float32(orig + np.float32(eps))) - float(np.float32(orig - np.float32(eps)))
            numeric[k] = (losses[0] - losses[1]) / step
        result.numeric[name] = (idx, numeric)
        np.testing.assert_allclose(
            analytic.reshape(-1)[idx], numeric, rtol=rtol, atol=atol,
            err_msg=f"analytic gradient of {name!r} disagrees with central finite differences")
    return result
