"""Update kernels of Paddle's Ftrl, RMSProp, DecayedAdagrad, Lamb, Adamax and Adadelta,
dense and by rows.

The conventions of ``fleet.kernels.optim`` hold: float32 arithmetic in the order the
formulas are written (scalars arrive as Python floats, rounded to float32 once), in place,
no GIL, dense kernels read their arrays flat, row kernels take [V, D] arrays, unique
``rows`` and ``grad`` [len(rows), D]. Each kernel has a plain-numpy ``*_reference`` twin
below, used by the tests.

Formulas (g the gradient, lr the learning rate; all per element):

- Ftrl (Paddle's ``ftrl`` op; ``l1`` and ``l2`` each get 1e-10 added, in float32, as
  Paddle does): ``new = sq + g*g``; ``lin += g - (new**-p - sq**-p) / lr * param`` (with
  ``p = lr_power``; for -0.5 the powers are square roots); ``param = (l1*sign(lin) - lin)
  / (new**-p / lr + 2*l2)`` where ``|lin| > l1``, else 0; ``sq = new``.
- RMSProp: ``ms = rho*ms + (1-rho)*g*g``; centered: ``mg = rho*mg + (1-rho)*g`` and
  ``mom = momentum*mom + lr*g / sqrt(ms - mg*mg + epsilon)``; else ``mom = momentum*mom +
  lr*g / sqrt(ms + epsilon)``; ``param -= mom``.
- DecayedAdagrad: ``moment = decay*moment + (1-decay)*g*g``; ``param -= lr*g /
  (sqrt(moment) + epsilon)``.
- Lamb (Paddle 1.x's ``lamb`` op, no bias correction): ``m1 = beta1*m1 + (1-beta1)*g``;
  ``m2 = beta2*m2 + (1-beta2)*g*g``; ``r = m1 / (sqrt(m2) + epsilon) + weight_decay*param``;
  then with ``pn = ||param||`` and ``rn = ||r||`` over the elements updated (the whole
  array for the dense kernel, the given rows for the row kernel, in that order; squares
  summed in float64, the root rounded to float32): ``param -= lr * (pn / rn if pn > 0 and rn > 0 else 1) * r``.
"""
import numba
import numpy as np


# ---------------------------------------------------------------------------- Ftrl
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _ftrl_at(p, sq, lin, i, g, lr32, l1, l2, power):
    s = sq[i]
    new = s + g * g
    if power == np.float32(-0.5):
        lin[i] += g - (np.sqrt(new) - np.sqrt(s)) / lr32 * p[i]
        y = np.sqrt(new) / lr32 + np.float32(2.0) * l2
    else:
        lin[i] += g - (new ** -power - s ** -power) / lr32 * p[i]
        y = new ** -power / lr32 + np.float32(2.0) * l2
    la = lin[i]
    if abs(la) > l1:
        x = (l1 if la >= np.float32(0.0) else -l1) - la
        p[i] = x / y
    else:
        p[i] = np.float32(0.0)
    sq[i] = new


@numba.njit(cache=True, nogil=True, error_model="numpy")
def ftrl_dense(param, squared, linear, grad, lr, l1, l2, lr_power):
    """Paddle's FTRL update over the flattened arrays.

    Args:
        param, squared, linear: float32, C-contiguous, same size, updated in place.
        grad: float32, C-contiguous, same size.
        lr, l1, l2, lr_power: Python floats (l1, l2 as the user gave them).
    """
    assert grad.size == param.size and squared.size == param.size and linear.size == param.size, \
        "ftrl_dense: sizes differ"
    p, s, q, g = param.reshape(param.size), squared.reshape(squared.size), linear.reshape(linear.size), \
        grad.reshape(grad.size)
    lr32 = np.float32(lr)
    l1_32 = np.float32(l1) + np.float32(1e-10)
    l2_32 = np.float32(l2) + np.float32(1e-10)
    power = np.float32(lr_power)
    for i in range(p.shape[0]):
        _ftrl_at(p, s, q, i, g[i], lr32, l1_32, l2_32, power)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def ftrl_rows(param, squared, linear, rows, grad, lr, l1, l2, lr_power):
    """:func:`ftrl_dense` on unique ``rows`` only (Paddle's sparse FTRL kernel).

    Args:
        param, squared, linear: float32 [V, D], C-contiguous, updated in place.
        rows: int64 [n], unique; grad: float32 [n, D]; scalars as ``ftrl_dense``.
    """
    n, dim = rows.shape[0], param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "ftrl_rows: grad must be [len(rows), D]"
    p, s, q = param.reshape(param.size), squared.reshape(squared.size), linear.reshape(linear.size)
    lr32 = np.float32(lr)
    l1_32 = np.float32(l1) + np.float32(1e-10)
    l2_32 = np.float32(l2) + np.float32(1e-10)
    power = np.float32(lr_power)
    for k in range(n):
        base = rows[k] * dim
        for d in range(dim):
            _ftrl_at(p, s, q, base + d, grad[k, d], lr32, l1_32, l2_32, power)


# ------------------------------------------------------------------------- RMSProp
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _rmsprop_at(p, ms, mom, mg, i, g, lr32, rho, eps, mu, centered):
    m = rho * ms[i] + (np.float32(1.0) - rho) * g * g
    ms[i] = m
    if centered:
        a = rho * mg[i] + (np.float32(1.0) - rho) * g
        mg[i] = a
        v = mu * mom[i] + lr32 * g / np.sqrt(m - a * a + eps)
    else:
        v = mu * mom[i] + lr32 * g / np.sqrt(m + eps)
    mom[i] = v
    p[i] -= v


@numba.njit(cache=True, nogil=True, error_model="numpy")
def rmsprop_dense(param, mean_square, moment, mean_grad, grad, lr, rho, epsilon, momentum, centered):
    """Paddle's RMSProp update over the flattened arrays.

    Args:
        param, mean_square, moment, mean_grad: float32, C-contiguous, same size, updated
            in place (mean_grad only when ``centered``).
        grad: float32, same size. lr, rho, epsilon, momentum: Python floats.
        centered: Python int, nonzero for the centered form.
    """
    assert grad.size == param.size and mean_square.size == param.size and moment.size == param.size \
        and mean_grad.size == param.size, "rmsprop_dense: sizes differ"
    p, ms, mom, mg = param.reshape(param.size), mean_square.reshape(param.size), \
        moment.reshape(param.size), mean_grad.reshape(param.size)
    g = grad.reshape(grad.size)
    lr32, rho32, eps32, mu32 = np.float32(lr), np.float32(rho), np.float32(epsilon), np.float32(momentum)
    for i in range(p.shape[0]):
        _rmsprop_at(p, ms, mom, mg, i, g[i], lr32, rho32, eps32, mu32, centered)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def rmsprop_rows(param, mean_square, moment, mean_grad, rows, grad, lr, rho, epsilon, momentum, centered):
    """:func:`rmsprop_dense` on unique ``rows`` only ([V, D] arrays, grad [n, D])."""
    n, dim = rows.shape[0], param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "rmsprop_rows: grad must be [len(rows), D]"
    p, ms, mom, mg = param.reshape(param.size), mean_square.reshape(param.size), \
        moment.reshape(param.size), mean_grad.reshape(param.size)
    lr32, rho32, eps32, mu32 = np.float32(lr), np.float32(rho), np.float32(epsilon), np.float32(momentum)
    for k in range(n):
        base = rows[k] * dim
        for d in range(dim):
            _rmsprop_at(p, ms, mom, mg, base + d, grad[k, d], lr32, rho32, eps32, mu32, centered)


# ------------------------------------------------------------------ DecayedAdagrad
@numba.njit(cache=True, nogil=True, error_model="numpy")
def decayed_adagrad_dense(param, moment, grad, lr, decay, epsilon):
    """Paddle's decayed Adagrad over the flattened arrays (param, moment in place)."""
    assert grad.size == param.size and moment.size == param.size, "decayed_adagrad_dense: sizes differ"
    p, m, g = param.reshape(param.size), moment.reshape(moment.size), grad.reshape(grad.size)
    lr32, dec, eps32 = np.float32(lr), np.float32(decay), np.float32(epsilon)
    for i in range(p.shape[0]):
        gi = g[i]
        mi = dec * m[i] + (np.float32(1.0) - dec) * gi * gi
        m[i] = mi
        p[i] -= lr32 * gi / (np.sqrt(mi) + eps32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def decayed_adagrad_rows(param, moment, rows, grad, lr, decay, epsilon):
    """:func:`decayed_adagrad_dense` on unique ``rows`` only ([V, D] arrays, grad [n, D])."""
    n, dim = rows.shape[0], param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "decayed_adagrad_rows: grad must be [len(rows), D]"
    lr32, dec, eps32 = np.float32(lr), np.float32(decay), np.float32(epsilon)
    for k in range(n):
        r = rows[k]
        for d in range(dim):
            gi = grad[k, d]
            mi = dec * moment[r, d] + (np.float32(1.0) - dec) * gi * gi
            moment[r, d] = mi
            param[r, d] -= lr32 * gi / (np.sqrt(mi) + eps32)


# ---------------------------------------------------------------------------- Lamb
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _lamb_moments_at(p, m1, m2, i, g, b1, b2, eps, wd):
    a = b1 * m1[i] + (np.float32(1.0) - b1) * g
    b = b2 * m2[i] + (np.float32(1.0) - b2) * g * g
    m1[i] = a
    m2[i] = b
    return a / (np.sqrt(b) + eps) + wd * p[i]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _lamb_scale(lr32, pn2, rn2):
    pn = np.float32(np.sqrt(pn2))
    rn = np.float32(np.sqrt(rn2))
    if pn > np.float32(0.0) and rn > np.float32(0.0):
        return np.float32(lr32 * np.float32(pn / rn))
    return np.float32(lr32)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def lamb_dense(param, m1, m2, grad, lr, beta1, beta2, epsilon, weight_decay):
    """Paddle 1.x's Lamb over the flattened arrays; the trust ratio is over the whole array.

    Args:
        param, m1, m2: float32, C-contiguous, same size, updated in place.
        grad: float32, same size. lr, beta1, beta2, epsilon, weight_decay: Python floats.
    """
    assert grad.size == param.size and m1.size == param.size and m2.size == param.size, "lamb_dense: sizes differ"
    p, a, b, g = param.reshape(param.size), m1.reshape(param.size), m2.reshape(param.size), grad.reshape(grad.size)
    b1, b2, eps, wd = np.float32(beta1), np.float32(beta2), np.float32(epsilon), np.float32(weight_decay)
    r = np.empty(p.shape[0], dtype=np.float32)
    pn2 = 0.0
    rn2 = 0.0
    for i in range(p.shape[0]):
        ri = _lamb_moments_at(p, a, b, i, g[i], b1, b2, eps, wd)
        r[i] = ri
        pn2 += np.float64(p[i]) * np.float64(p[i])  # float() keeps float32 in numba
        rn2 += np.float64(ri) * np.float64(ri)
    step = np.float32(_lamb_scale(np.float32(lr), pn2, rn2))  # float32, as the twin
    for i in range(p.shape[0]):
        p[i] -= step * r[i]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def lamb_rows(param, m1, m2, rows, grad, lr, beta1, beta2, epsilon, weight_decay):
    """:func:`lamb_dense` on unique ``rows`` only, the trust ratio over those rows
    ([V, D] arrays, grad [n, D])."""
    n, dim = rows.shape[0], param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "lamb_rows: grad must be [len(rows), D]"
    p, a, b = param.reshape(param.size), m1.reshape(param.size), m2.reshape(param.size)
    b1, b2, eps, wd = np.float32(beta1), np.float32(beta2), np.float32(epsilon), np.float32(weight_decay)
    r = np.empty(n * dim, dtype=np.float32)
    pn2 = 0.0
    rn2 = 0.0
    for k in range(n):
        base = rows[k] * dim
        for d in range(dim):
            ri = _lamb_moments_at(p, a, b, base + d, grad[k, d], b1, b2, eps, wd)
            r[k * dim + d] = ri
            pn2 += np.float64(p[base + d]) * np.float64(p[base + d])
            rn2 += np.float64(ri) * np.float64(ri)
    step = np.float32(_lamb_scale(np.float32(lr), pn2, rn2))  # float32, as the twin
    for k in range(n):
        base = rows[k] * dim
        for d in range(dim):
            p[base + d] -= step * r[k * dim + d]


# -------------------------------------------------------------------------- Adamax
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _adamax_at(p, m, u, i, g, lr32, b1, b2, eps):
    a = b1 * m[i] + (np.float32(1.0) - b1) * g
    n = max(abs(g), b2 * u[i] + eps)
    m[i] = a
    u[i] = n
    p[i] -= lr32 * (a / n)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adamax_dense(param, moment, inf_norm, grad, lr_t, beta1, beta2, epsilon):
    """Paddle's Adamax over the flattened arrays (lr_t has the bias correction folded in)."""
    assert grad.size == param.size and moment.size == param.size and inf_norm.size == param.size, \
        "adamax_dense: sizes differ"
    p, m, u, g = param.reshape(param.size), moment.reshape(param.size), inf_norm.reshape(param.size), \
        grad.reshape(grad.size)
    lr32, b1, b2, eps = np.float32(lr_t), np.float32(beta1), np.float32(beta2), np.float32(epsilon)
    for i in range(p.shape[0]):
        _adamax_at(p, m, u, i, g[i], lr32, b1, b2, eps)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adamax_rows(param, moment, inf_norm, rows, grad, lr_t, beta1, beta2, epsilon):
    """:func:`adamax_dense` on unique ``rows`` only ([V, D] arrays, grad [n, D])."""
    n, dim = rows.shape[0], param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "adamax_rows: grad must be [len(rows), D]"
    p, m, u = param.reshape(param.size), moment.reshape(param.size), inf_norm.reshape(param.size)
    lr32, b1, b2, eps = np.float32(lr_t), np.float32(beta1), np.float32(beta2), np.float32(epsilon)
    for k in range(n):
        base = rows[k] * dim
        for d in range(dim):
            _adamax_at(p, m, u, base + d, grad[k, d], lr32, b1, b2, eps)


# ------------------------------------------------------------------------ Adadelta
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _adadelta_at(p, g2, u2, i, g, rho, eps):
    a = rho * g2[i] + (np.float32(1.0) - rho) * g * g
    update = -np.sqrt((u2[i] + eps) / (a + eps)) * g
    g2[i] = a
    u2[i] = rho * u2[i] + (np.float32(1.0) - rho) * update * update
    p[i] += update


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adadelta_dense(param, avg_squared_grad, avg_squared_update, grad, rho, epsilon):
    """Paddle 1.x's Adadelta over the flattened arrays (no learning rate)."""
    assert grad.size == param.size and avg_squared_grad.size == param.size \
        and avg_squared_update.size == param.size, "adadelta_dense: sizes differ"
    p, a, b, g = param.reshape(param.size), avg_squared_grad.reshape(param.size), \
        avg_squared_update.reshape(param.size), grad.reshape(grad.size)
    rho32, eps = np.float32(rho), np.float32(epsilon)
    for i in range(p.shape[0]):
        _adadelta_at(p, a, b, i, g[i], rho32, eps)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def adadelta_rows(param, avg_squared_grad, avg_squared_update, rows, grad, rho, epsilon):
    """:func:`adadelta_dense` on unique ``rows`` only ([V, D] arrays, grad [n, D])."""
    n, dim = rows.shape[0], param.shape[1]
    assert grad.shape[0] == n and grad.shape[1] == dim, "adadelta_rows: grad must be [len(rows), D]"
    p, a, b = param.reshape(param.size), avg_squared_grad.reshape(param.size), avg_squared_update.reshape(param.size)
    rho32, eps = np.float32(rho), np.float32(epsilon)
    for k in range(n):
        base = rows[k] * dim
        for d in range(dim):
            _adadelta_at(p, a, b, base + d, grad[k, d], rho32, eps)


# ---------------------------------------------------------------- numpy twins
_F = np.float32


def ftrl_dense_reference(param, squared, linear, grad, lr, l1, l2, lr_power):
    """Numpy twin of :func:`ftrl_dense`."""
    lr, power = _F(lr), _F(lr_power)
    l1, l2 = _F(l1) + _F(1e-10), _F(l2) + _F(1e-10)
    new = squared + grad * grad
    if power == _F(-0.5):
        linear += grad - (np.sqrt(new) - np.sqrt(squared)) / lr * param
        y = np.sqrt(new) / lr + _F(2.0) * l2
    else:
        linear += grad - (new ** -power - squared ** -power) / lr * param
        y = new ** -power / lr + _F(2.0) * l2
    x = np.where(linear >= 0, l1, -l1).astype(np.float32) - linear
    param[...] = np.where(np.abs(linear) > l1, x / y, _F(0.0))
    squared[...] = new


def ftrl_rows_reference(param, squared, linear, rows, grad, lr, l1, l2, lr_power):
    """Numpy twin of :func:`ftrl_rows` (rows unique)."""
    p, s, q = param[rows], squared[rows], linear[rows]
    ftrl_dense_reference(p, s, q, grad, lr, l1, l2, lr_power)
    param[rows], squared[rows], linear[rows] = p, s, q


def rmsprop_dense_reference(param, mean_square, moment, mean_grad, grad, lr, rho, epsilon, momentum, centered):
    """Numpy twin of :func:`rmsprop_dense`."""
    lr, rho, eps, mu = _F(lr), _F(rho), _F(epsilon), _F(momentum)
    mean_square[...] = rho * mean_square + (_F(1.0) - rho) * grad * grad
    if centered:
        mean_grad[...] = rho * mean_grad + (_F(1.0) - rho) * grad
        moment[...] = mu * moment + lr * grad / np.sqrt(mean_square - mean_grad * mean_grad + eps)
    else:
        moment[...] = mu * moment + lr * grad / np.sqrt(mean_square + eps)
    param -= moment


def rmsprop_rows_reference(param, mean_square, moment, mean_grad, rows, grad, lr, rho, epsilon, momentum,
                           centered):
    """Numpy twin of :func:`rmsprop_rows` (rows unique)."""
    arrays = [a[rows] for a in (param, mean_square, moment, mean_grad)]
    rmsprop_dense_reference(*arrays, grad, lr, rho, epsilon, momentum, centered)
    for full, part in zip((param, mean_square, moment, mean_grad), arrays):
        full[rows] = part


def decayed_adagrad_dense_reference(param, moment, grad, lr, decay, epsilon):
    """Numpy twin of :func:`decayed_adagrad_dense`."""
    dec = _F(decay)
    moment[...] = dec * moment + (_F(1.0) - dec) * grad * grad
    param -= _F(lr) * grad / (np.sqrt(moment) + _F(epsilon))


def decayed_adagrad_rows_reference(param, moment, rows, grad, lr, decay, epsilon):
    """Numpy twin of :func:`decayed_adagrad_rows` (rows unique)."""
    p, m = param[rows], moment[rows]
    decayed_adagrad_dense_reference(p, m, grad, lr, decay, epsilon)
    param[rows], moment[rows] = p, m


def _sum_squares(a):
    """Sum of squares in float64, element by element in order (as the kernels add)."""
    total = 0.0
    for v in a.reshape(-1).tolist():
        total += v * v
    return total


def lamb_dense_reference(param, m1, m2, grad, lr, beta1, beta2, epsilon, weight_decay):
    """Numpy twin of :func:`lamb_dense`."""
    b1, b2 = _F(beta1), _F(beta2)
    m1[...] = b1 * m1 + (_F(1.0) - b1) * grad
    m2[...] = b2 * m2 + (_F(1.0) - b2) * grad * grad
    r = m1 / (np.sqrt(m2) + _F(epsilon)) + _F(weight_decay) * param
    pn = _F(np.sqrt(_sum_squares(param)))
    rn = _F(np.sqrt(_sum_squares(r)))
    step = _F(lr) * (pn / rn) if pn > 0 and rn > 0 else _F(lr)
    param -= step * r


def lamb_rows_reference(param, m1, m2, rows, grad, lr, beta1, beta2, epsilon, weight_decay):
    """Numpy twin of :func:`lamb_rows` (rows unique)."""
    p, a, b = param[rows], m1[rows], m2[rows]
    lamb_dense_reference(p, a, b, grad, lr, beta1, beta2, epsilon, weight_decay)
    param[rows], m1[rows], m2[rows] = p, a, b


def adamax_dense_reference(param, moment, inf_norm, grad, lr_t, beta1, beta2, epsilon):
    """Numpy twin of :func:`adamax_dense`."""
    b1, b2 = _F(beta1), _F(beta2)
    moment[...] = b1 * moment + (_F(1.0) - b1) * grad
    inf_norm[...] = np.maximum(np.abs(grad), b2 * inf_norm + _F(epsilon))
    param -= _F(lr_t) * (moment / inf_norm)


def adamax_rows_reference(param, moment, inf_norm, rows, grad, lr_t, beta1, beta2, epsilon):
    """Numpy twin of :func:`adamax_rows` (rows unique)."""
    p, m, u = param[rows], moment[rows], inf_norm[rows]
    adamax_dense_reference(p, m, u, grad, lr_t, beta1, beta2, epsilon)
    param[rows], moment[rows], inf_norm[rows] = p, m, u


def adadelta_dense_reference(param, avg_squared_grad, avg_squared_update, grad, rho, epsilon):
    """Numpy twin of :func:`adadelta_dense`."""
    rho, eps = _F(rho), _F(epsilon)
    avg_squared_grad[...] = rho * avg_squared_grad + (_F(1.0) - rho) * grad * grad
    update = -np.sqrt((avg_squared_update + eps) / (avg_squared_grad + eps)) * grad
    avg_squared_update[...] = rho * avg_squared_update + (_F(1.0) - rho) * update * update
    param += update


def adadelta_rows_reference(param, avg_squared_grad, avg_squared_update, rows, grad, rho, epsilon):
    """Numpy twin of :func:`adadelta_rows` (rows unique)."""
    p, a, b = param[rows], avg_squared_grad[rows], avg_squared_update[rows]
    adadelta_dense_reference(p, a, b, grad, rho, epsilon)
    param[rows], avg_squared_grad[rows], avg_squared_update[rows] = p, a, b
