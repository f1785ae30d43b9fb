"""Optimizer update kernels (SGD, Momentum, Adagrad, Adam), dense and by sparse rows.

All arithmetic is float32, as Paddle's CPU kernels: scalar hyper-parameters arrive as
Python floats and are rounded to float32 once, then every update is computed in float32
in the order the formulas below are written, so a kernel and its numpy twin agree bit
for bit. Everything updates in place and returns None.

- SGD: ``param -= lr * g``.
- Momentum: ``velocity = mu * velocity + g``; then ``param -= (g + mu * velocity) * lr``
  with ``nesterov``, else ``param -= lr * velocity``.
- Adagrad: ``moment += g * g``; ``param -= lr * g / (sqrt(moment) + epsilon)``.
- Adam: ``m1 = beta1 * m1 + (1 - beta1) * g``; ``m2 = beta2 * m2 + (1 - beta2) * g * g``;
  ``param -= lr_t * (m1 / (sqrt(m2) + eps_t))`` where the caller folds the bias
  correction in: ``lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)`` and
  ``eps_t = epsilon * sqrt(1 - beta2**t)``.

Dense kernels read their arrays flat (any shape, C-contiguous, same size). Row kernels
take ``param`` (and state) as [V, D], unique ``rows`` into it and ``grad`` [len(rows), D];
callers merge duplicate rows first. Row ids are not range-checked here.

The kernels release the GIL and run on the calling thread. They are not safe against
another thread writing the same rows at the same time (Hogwild callers accept that race
by design). None uses numba's ``parallel=True``: on this shared 2-core machine it was at
best 2x faster when the other core was idle, and 10-100x slower (a parallel region waits
a scheduler time slice, ~8 ms, for its descheduled second thread) when it was not.
"""
import numba
import numpy as np


@numba.njit(cache=True, nogil=True, error_model="numpy")
def sgd_dense(param, grad, lr):
    """``param -= lr * grad`` over the flattened arrays.

    Args:
        param: float32, C-contiguous, updated in place.
        grad: float32, C-contiguous, same size as ``param``.
        lr: Python float.
    """
    assert grad.size == param.size, "sgd_dense: grad must have param's size"
    p = param.reshape(param.size)
    g = grad.reshape(grad.size)
    lr32 = np.float32(lr)
    for i in range(p.shape[0]):
        p[i] -= lr32 * g[i]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def momentum_dense(param, velocity, grad, lr, mu, nesterov):
    """Paddle's momentum update over the flattened arrays.

    Args:
        param, velocity: float32, C-contiguous, same size, updated in place.
        grad: float32, C-contiguous, same size.
        lr, mu: Python floats.
        nesterov: Python int, nonzero for Nesterov momentum.
    """
    assert grad.size == param.size and velocity.size == param.size, "momentum_dense: sizes differ"
    p = param.reshape(param.size)
    v = velocity.reshape(velocity.size)
    g = grad.reshape(grad.size)
    lr32 = np.float32(lr)
    mu32 = np.float32(mu)
    for i in range(p.shape[0]):
        gi = g[i]
        vi = mu32 * v[i] + gi
        v[i] = vi
        if nesterov:
            p[i] -= (gi + mu32 * vi) * lr32
        else:
            p[i] -= lr32 * vi


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adagrad_dense(param, moment, grad, lr, epsilon):
    """Paddle's adagrad update over the flattened arrays.

    Args:
        param, moment: float32, C-contiguous, same size, updated in place.
        grad: float32, C-contiguous, same size.
        lr, epsilon: Python floats.
    """
    assert grad.size == param.size and moment.size == param.size, "adagrad_dense: sizes differ"
    p = param.reshape(param.size)
    m = moment.reshape(moment.size)
    g = grad.reshape(grad.size)
    lr32 = np.float32(lr)
    eps32 = np.float32(epsilon)
    for i in range(p.shape[0]):
        gi = g[i]
        mi = m[i] + gi * gi
        m[i] = mi
        p[i] -= lr32 * gi / (np.sqrt(mi) + eps32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _adam_span(p, a, b, pstart, g, gstart, count, lr32, b1, b2, eps32):
    """Adam on flat elements [pstart, pstart + count) of p, a, b with gradient
    g[gstart:gstart + count]; hyper-parameters already float32."""
    c1 = np.float32(1.0) - b1
    c2 = np.float32(1.0) - b2
    for j in range(count):
        # Unsigned indices tell numba they are never negative: no wrap-around test,
        # so the loop vectorizes (signed ones run 13x slower here).
        i = np.uint64(pstart + j)
        gi = g[np.uint64(gstart + j)]
        ai = b1 * a[i] + c1 * gi
        bi = b2 * b[i] + c2 * gi * gi
        a[i] = ai
        b[i] = bi
        p[i] -= lr32 * (ai / (np.sqrt(bi) + eps32))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _adam_span_zero(p, a, b, pstart, count, lr32, b1, b2, eps32):
    """:func:`_adam_span` with a zero gradient, written with the same operations so the
    result is bit-identical to passing zeros."""
    c1 = np.float32(1.0) - b1
    c2 = np.float32(1.0) - b2
    gi = np.float32(0.0)
    for j in range(count):
        i = np.uint64(pstart + j)
        ai = b1 * a[i] + c1 * gi
        bi = b2 * b[i] + c2 * gi * gi
        a[i] = ai
        b[i] = bi
        p[i] -= lr32 * (ai / (np.sqrt(bi) + eps32))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adam_dense(param, m1, m2, grad, lr_t, beta1, beta2, eps_t):
    """Paddle's Adam update over the flattened arrays.

    Args:
        param, m1, m2: float32, C-contiguous, same size, updated in place.
        grad: float32, C-contiguous, same size.
        lr_t, beta1, beta2, eps_t: Python floats (bias correction folded into lr_t, eps_t).
    """
    assert grad.size == param.size and m1.size == param.size and m2.size == param.size, (
        "adam_dense: sizes differ"
    )
    p = param.reshape(param.size)
    a = m1.reshape(m1.size)
    b = m2.reshape(m2.size)
    g = grad.reshape(grad.size)
    lr32 = np.float32(lr_t)
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    eps32 = np.float32(eps_t)
    _adam_span(p, a, b, 0, g, 0, p.shape[0], lr32, b1, b2, eps32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def sgd_rows(param, rows, grad, lr):
    """``param[rows] -= lr * grad`` for unique ``rows``.

    Args:
        param: float32 [V, D], updated in place.
        rows: int64 [n], unique, each in [0, V).
        grad: float32 [n, D].
        lr: Python float.
    """
    n = rows.shape[0]
    dim = param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "sgd_rows: grad must be [len(rows), D]"
    lr32 = np.float32(lr)
    for i in range(n):
        r = rows[i]
        for d in range(dim):
            param[r, d] -= lr32 * grad[i, d]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def momentum_rows(param, velocity, rows, grad, lr, mu, nesterov):
    """Paddle's momentum update on unique ``rows`` only.

    Args:
        param, velocity: float32 [V, D], updated in place.
        rows: int64 [n], unique, each in [0, V).
        grad: float32 [n, D].
        lr, mu: Python floats; nesterov: Python int, nonzero for Nesterov momentum.
    """
    n = rows.shape[0]
    dim = param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "momentum_rows: grad must be [len(rows), D]"
    lr32 = np.float32(lr)
    mu32 = np.float32(mu)
    for i in range(n):
        r = rows[i]
        for d in range(dim):
            gi = grad[i, d]
            vi = mu32 * velocity[r, d] + gi
            velocity[r, d] = vi
            if nesterov:
                param[r, d] -= (gi + mu32 * vi) * lr32
            else:
                param[r, d] -= lr32 * vi


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adagrad_rows(param, moment, rows, grad, lr, epsilon):
    """Paddle's adagrad update on unique ``rows`` only.

    Args:
        param, moment: float32 [V, D], updated in place.
        rows: int64 [n], unique, each in [0, V).
        grad: float32 [n, D].
        lr, epsilon: Python floats.
    """
    n = rows.shape[0]
    dim = param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "adagrad_rows: grad must be [len(rows), D]"
    lr32 = np.float32(lr)
    eps32 = np.float32(epsilon)
    for i in range(n):
        r = rows[i]
        for d in range(dim):
            gi = grad[i, d]
            mi = moment[r, d] + gi * gi
            moment[r, d] = mi
            param[r, d] -= lr32 * gi / (np.sqrt(mi) + eps32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adam_rows(param, m1, m2, rows, grad, lr_t, beta1, beta2, eps_t):
    """Paddle's lazy-mode Adam: only the unique ``rows`` and their moments change.

    Args:
        param, m1, m2: float32 [V, D], updated in place.
        rows: int64 [n], unique, each in [0, V).
        grad: float32 [n, D].
        lr_t, beta1, beta2, eps_t: Python floats (bias correction folded into lr_t, eps_t).
    """
    n = rows.shape[0]
    dim = param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "adam_rows: grad must be [len(rows), D]"
    lr32 = np.float32(lr_t)
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    c1 = np.float32(1.0) - b1
    c2 = np.float32(1.0) - b2
    eps32 = np.float32(eps_t)
    # A plain row loop: measured 1.4x faster than calling _adam_span per dim-10 row.
    for i in range(n):
        r = rows[i]
        for d in range(dim):
            gi = grad[i, d]
            ai = b1 * m1[r, d] + c1 * gi
            bi = b2 * m2[r, d] + c2 * gi * gi
            m1[r, d] = ai
            m2[r, d] = bi
            param[r, d] -= lr32 * (ai / (np.sqrt(bi) + eps32))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adam_rows_all(param, m1, m2, rows, grad, lr_t, beta1, beta2, eps_t):
    """Paddle's non-lazy sparse Adam: every row's moments decay, rows not given see g = 0.

    Equal, bit for bit, to :func:`adam_dense` with a gradient that is ``grad[i]`` on row
    ``rows[i]`` and zero elsewhere, at the cost of one sweep over the three arrays: rows
    between two gradient rows are one contiguous run updated by a vectorized loop.

    Args:
        param, m1, m2: float32 [V, D], C-contiguous, updated in place.
        rows: int64 [n], sorted ascending and unique, each in [0, V).
        grad: float32 [n, D], C-contiguous.
        lr_t, beta1, beta2, eps_t: Python floats (bias correction folded into lr_t, eps_t).
    """
    n = rows.shape[0]
    height = param.shape[0]
    dim = param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "adam_rows_all: grad must be [len(rows), D]"
    assert m1.shape == param.shape and m2.shape == param.shape, "adam_rows_all: m1, m2 must match param"
    p = param.reshape(param.size)
    a = m1.reshape(m1.size)
    b = m2.reshape(m2.size)
    g = grad.reshape(grad.size)
    lr32 = np.float32(lr_t)
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    eps32 = np.float32(eps_t)
    k = 0  # next gradient row
    r = 0  # next table row
    while r < height:
        nxt = rows[k] if k < n else height
        # rows [r, nxt) have no gradient: one flat run over contiguous memory
        _adam_span_zero(p, a, b, r * dim, (nxt - r) * dim, lr32, b1, b2, eps32)
        if nxt == height:
            break
        _adam_span(p, a, b, nxt * dim, g, k * dim, dim, lr32, b1, b2, eps32)
        k += 1
        r = nxt + 1


def _f32(x):
    return np.float32(x)


def sgd_dense_reference(param, grad, lr):
    """Numpy twin of :func:`sgd_dense`."""
    param -= _f32(lr) * grad


def momentum_dense_reference(param, velocity, grad, lr, mu, nesterov):
    """Numpy twin of :func:`momentum_dense`."""
    lr, mu = _f32(lr), _f32(mu)
    velocity[...] = mu * velocity + grad
    if nesterov:
        param -= (grad + mu * velocity) * lr
    else:
        param -= lr * velocity


def adagrad_dense_reference(param, moment, grad, lr, epsilon):
    """Numpy twin of :func:`adagrad_dense`."""
    moment += grad * grad
    param -= _f32(lr) * grad / (np.sqrt(moment) + _f32(epsilon))


def adam_dense_reference(param, m1, m2, grad, lr_t, beta1, beta2, eps_t):
    """Numpy twin of :func:`adam_dense`."""
    b1, b2 = _f32(beta1), _f32(beta2)
    m1[...] = b1 * m1 + (_f32(1.0) - b1) * grad
    m2[...] = b2 * m2 + (_f32(1.0) - b2) * grad * grad
    param -= _f32(lr_t) * (m1 / (np.sqrt(m2) + _f32(eps_t)))


def sgd_rows_reference(param, rows, grad, lr):
    """Numpy twin of :func:`sgd_rows` (rows unique)."""
    param[rows] -= _f32(lr) * grad


def momentum_rows_reference(param, velocity, rows, grad, lr, mu, nesterov):
    """Numpy twin of :func:`momentum_rows` (rows unique)."""
    p, v = param[rows], velocity[rows]
    momentum_dense_reference(p, v, grad, lr, mu, nesterov)
    param[rows], velocity[rows] = p, v


def adagrad_rows_reference(param, moment, rows, grad, lr, epsilon):
    """Numpy twin of :func:`adagrad_rows` (rows unique)."""
    p, m = param[rows], moment[rows]
    adagrad_dense_reference(p, m, grad, lr, epsilon)
    param[rows], moment[rows] = p, m


def adam_rows_reference(param, m1, m2, rows, grad, lr_t, beta1, beta2, eps_t):
    """Numpy twin of :func:`adam_rows` (rows unique)."""
    p, a, b = param[rows], m1[rows], m2[rows]
    adam_dense_reference(p, a, b, grad, lr_t, beta1, beta2, eps_t)
    param[rows], m1[rows], m2[rows] = p, a, b


def adam_rows_all_reference(param, m1, m2, rows, grad, lr_t, beta1, beta2, eps_t):
    """Numpy twin of :func:`adam_rows_all`: dense Adam with a zero-filled gradient."""
    dense = np.zeros_like(param)
    dense[rows] = grad
    adam_dense_reference(param, m1, m2, dense, lr_t, beta1, beta2, eps_t)

