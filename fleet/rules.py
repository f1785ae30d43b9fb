"""Optimizer update rules: one object per optimizer, shared by local training and servers.

A rule updates a parameter in place from a dense gradient (``apply_dense``) or from
gradient rows (``apply_sparse``). Its state (moments, velocities, beta powers) lives in a
dict of arrays that the caller owns: the local executor keeps it in the scope, a server
keeps it next to its block or sparse table. The numba kernels of ``fleet.kernels.optim``
do the arithmetic; this module only decides which kernel runs with which scalars.

Thread-safety: a rule object holds no mutable state; calls on different parameters may
run concurrently. Concurrent calls on the same parameter race (Hogwild), as in Paddle.
"""
import math

import numpy as np

from fleet.errors import ConfigError
from fleet.kernels import adaptive, optim, sparse


class Rule:
    """Base of the optimizer rules.

    Attributes:
        type: Paddle's optimizer op type ("sgd", "momentum", "adagrad", "adam").
        state_names: every state entry ``init_state`` creates.
        row_state_names: the entries shaped like the parameter (one row per parameter row);
            the others are small scalar arrays (e.g. Adam's beta powers).
    """

    type = None
    state_names = ()
    row_state_names = ()
    attr_names = ()  # the hyper-parameters, as the constructor's keyword arguments

    def attrs(self):
        """Returns the hyper-parameters as a plain dict (what ``make_rule`` takes back)."""
        return {name: getattr(self, name) for name in self.attr_names}

    def init_state(self, shape):
        """Returns fresh state arrays for a parameter of ``shape``."""
        return {name: np.zeros(shape, dtype=np.float32) for name in self.row_state_names}

    def apply_dense(self, param, grad, state, lr):
        """Updates ``param`` in place from a dense gradient of the same shape."""
        raise NotImplementedError

    def apply_sparse(self, param, rows, values, state, lr):
        """Updates rows of the 2-D ``param`` in place; ``rows`` may repeat (summed first)."""
        raise NotImplementedError

    def apply_sparse_unique(self, param, rows, values, state, lr):
        """``apply_sparse`` for ``rows`` the caller knows are unique (any order): the same
        result without merging; rules whose rows update independently skip the merge."""
        self.apply_sparse(param, rows, values, state, lr)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.attrs().items())
        return f"{type(self).__name__}({args})"


def unique_rows_update(rule):
    """Returns ``rule.apply_sparse_unique`` when it may stand in for ``rule.apply_sparse``, else None.

    Only when both come from the same class: a subclass that overrides ``apply_sparse``
    alone (to add to it) keeps its own update.
    """
    def owner(name):
        return next((cls for cls in type(rule).__mro__ if name in cls.__dict__), None)

    if owner("apply_sparse_unique") is None or owner("apply_sparse_unique") is not owner("apply_sparse"):
        return None
    return rule.apply_sparse_unique


def _flat(a):
    return a.reshape(-1)


def _merged(rows, values):
    return sparse.merge_rows(np.ascontiguousarray(rows, dtype=np.int64),
                             np.ascontiguousarray(values, dtype=np.float32))


class SGDRule(Rule):
    """param -= lr * grad."""

    type = "sgd"

    def apply_dense(self, param, grad, state, lr):
        optim.sgd_dense(_flat(param), _flat(grad), float(lr))

    def apply_sparse(self, param, rows, values, state, lr):
        if len(rows):
            uniq, summed = _merged(rows, values)
            optim.sgd_rows(param, uniq, summed, float(lr))

    def apply_sparse_unique(self, param, rows, values, state, lr):
        if len(rows):
            optim.sgd_rows(param, rows, values, float(lr))


class MomentumRule(Rule):
    """velocity = mu * velocity + grad; param -= lr * velocity (or Nesterov's form)."""

    type = "momentum"
    state_names = row_state_names = ("velocity",)
    attr_names = ("momentum", "use_nesterov")

    def __init__(self, momentum, use_nesterov=False):
        self.momentum = float(momentum)
        self.use_nesterov = bool(use_nesterov)


    def apply_dense(self, param, grad, state, lr):
        optim.momentum_dense(_flat(param), _flat(state["velocity"]), _flat(grad), float(lr),
                             self.momentum, int(self.use_nesterov))

    def apply_sparse(self, param, rows, values, state, lr):
        if len(rows):
            uniq, summed = _merged(rows, values)
            optim.momentum_rows(param, state["velocity"], uniq, summed, float(lr),
                                self.momentum, int(self.use_nesterov))


class AdagradRule(Rule):
    """moment += grad^2; param -= lr * grad / (sqrt(moment) + epsilon)."""

    type = "adagrad"
    state_names = row_state_names = ("moment",)
    attr_names = ("epsilon", "initial_accumulator_value")

    def __init__(self, epsilon=1e-6, initial_accumulator_value=0.0):
        self.epsilon = float(epsilon)
        self.initial_accumulator_value = float(initial_accumulator_value)


    def init_state(self, shape):
        return {"moment": np.full(shape, self.initial_accumulator_value, dtype=np.float32)}

    def apply_dense(self, param, grad, state, lr):
        optim.adagrad_dense(_flat(param), _flat(state["moment"]), _flat(grad), float(lr), self.epsilon)

    def apply_sparse(self, param, rows, values, state, lr):
        if len(rows):
            uniq, summed = _merged(rows, values)
            optim.adagrad_rows(param, state["moment"], uniq, summed, float(lr), self.epsilon)

    def apply_sparse_unique(self, param, rows, values, state, lr):
        if len(rows):
            optim.adagrad_rows(param, state["moment"], rows, values, float(lr), self.epsilon)


class AdamRule(Rule):
    """Paddle's Adam; with ``lazy_mode`` a sparse update touches only the batch's rows.

    Without lazy mode every row's moments decay at every sparse step (rows outside the
    batch see a zero gradient), exactly like a dense Adam on the scattered gradient.
    """

    type = "adam"
    state_names = ("moment1", "moment2", "beta1_pow", "beta2_pow")
    row_state_names = ("moment1", "moment2")
    attr_names = ("beta1", "beta2", "epsilon", "lazy_mode")

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-8, lazy_mode=False):
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.epsilon = float(epsilon)
        self.lazy_mode = bool(lazy_mode)

    def init_state(self, shape):
        state = super().init_state(shape)
        # Paddle starts the powers at beta (step 1) and multiplies after every update.
        state["beta1_pow"] = np.full(1, self.beta1, dtype=np.float64)
        state["beta2_pow"] = np.full(1, self.beta2, dtype=np.float64)
        return state

    def _step_scalars(self, state, lr):
        b1p, b2p = float(state["beta1_pow"][0]), float(state["beta2_pow"][0])
        lr_t = float(lr) * math.sqrt(1.0 - b2p) / (1.0 - b1p)
        eps_t = self.epsilon * math.sqrt(1.0 - b2p)
        state["beta1_pow"][0] = b1p * self.beta1
        state["beta2_pow"][0] = b2p * self.beta2
        return lr_t, eps_t

    def apply_dense(self, param, grad, state, lr):
        lr_t, eps_t = self._step_scalars(state, lr)
        optim.adam_dense(_flat(param), _flat(state["moment1"]), _flat(state["moment2"]), _flat(grad),
                         lr_t, self.beta1, self.beta2, eps_t)

    def apply_sparse(self, param, rows, values, state, lr):
        if self.lazy_mode and not len(rows):
            return
        uniq, summed = _merged(rows, values)
        lr_t, eps_t = self._step_scalars(state, lr)
        kernel = optim.adam_rows if self.lazy_mode else optim.adam_rows_all
        kernel(param, state["moment1"], state["moment2"], uniq, summed, lr_t, self.beta1,
               self.beta2, eps_t)


class _RowsRule(Rule):
    """A rule whose sparse form updates only the (merged) rows of the gradient."""

    _dense = _rows = None  # kernel names in fleet.kernels.adaptive

    def _scalars(self):
        raise NotImplementedError

    def _states(self, state):
        return [state[name] for name in self.row_state_names]

    def apply_dense(self, param, grad, state, lr):
        getattr(adaptive, self._dense)(_flat(param), *[_flat(a) for a in self._states(state)], _flat(grad),
                                       float(lr), *self._scalars())

    def apply_sparse(self, param, rows, values, state, lr):
        if len(rows):
            uniq, summed = _merged(rows, values)
            getattr(adaptive, self._rows)(param, *self._states(state), uniq, summed, float(lr), *self._scalars())


class FtrlRule(_RowsRule):
    """Paddle's FTRL-Proximal (l1, l2, lr_power); sparse: only the gradient's rows, as Paddle."""

    type = "ftrl"
    state_names = row_state_names = ("squared", "linear")
    attr_names = ("l1", "l2", "lr_power")
    _dense, _rows = "ftrl_dense", "ftrl_rows"

    def __init__(self, l1=0.0, l2=0.0, lr_power=-0.5):
        self.l1, self.l2, self.lr_power = float(l1), float(l2), float(lr_power)

    def _scalars(self):
        return self.l1, self.l2, self.lr_power


class RMSPropRule(_RowsRule):
    """Paddle's RMSProp (op attribute ``decay`` is the optimizer's rho). Sparse: only the
    gradient's rows (Paddle's kernel also decays every other row with a zero gradient)."""

    type = "rmsprop"
    state_names = row_state_names = ("mean_square", "momentum", "mean_grad")
    attr_names = ("decay", "epsilon", "momentum", "centered")
    _dense, _rows = "rmsprop_dense", "rmsprop_rows"

    def __init__(self, decay=0.95, epsilon=1e-6, momentum=0.0, centered=False):
        self.decay, self.epsilon, self.momentum = float(decay), float(epsilon), float(momentum)
        self.centered = bool(centered)

    def _scalars(self):
        return self.decay, self.epsilon, self.momentum, int(self.centered)


class DecayedAdagradRule(_RowsRule):
    """Paddle's decayed Adagrad. Sparse: only the gradient's rows (Paddle's op takes dense
    gradients only)."""

    type = "decayed_adagrad"
    state_names = row_state_names = ("moment",)
    attr_names = ("decay", "epsilon")
    _dense, _rows = "decayed_adagrad_dense", "decayed_adagrad_rows"

    def __init__(self, decay=0.95, epsilon=1e-6):
        self.decay, self.epsilon = float(decay), float(epsilon)

    def _scalars(self):
        return self.decay, self.epsilon


class LambRule(_RowsRule):
    """Paddle 1.x's Lamb (no bias correction; ``weight_decay`` is 0 for parameters the
    optimizer's exclude function names). The trust ratio is over the whole array (a
    server: its block or shard); sparse: over the gradient's rows, and only they change
    (Paddle's kernel updates every row, those outside the batch with a zero gradient)."""

    type = "lamb"
    state_names = row_state_names = ("moment1", "moment2")
    attr_names = ("beta1", "beta2", "epsilon", "weight_decay")
    _dense, _rows = "lamb_dense", "lamb_rows"

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-6, weight_decay=0.01):
        self.beta1, self.beta2 = float(beta1), float(beta2)
        self.epsilon, self.weight_decay = float(epsilon), float(weight_decay)

    def _scalars(self):
        return self.beta1, self.beta2, self.epsilon, self.weight_decay


class AdamaxRule(_RowsRule):
    """Paddle's Adamax: ``lr / (1 - beta1_pow)`` with ``beta1_pow`` (scalar state, starting
    at beta1) multiplied by beta1 after each update. Sparse: only the gradient's rows (an
    empty gradient is no update); Paddle's op takes dense gradients only."""

    type = "adamax"
    state_names = ("moment", "inf_norm", "beta1_pow")
    row_state_names = ("moment", "inf_norm")
    attr_names = ("beta1", "beta2", "epsilon")
    _dense, _rows = "adamax_dense", "adamax_rows"

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-8):
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def init_state(self, shape):
        state = super().init_state(shape)
        state["beta1_pow"] = np.full(1, self.beta1, dtype=np.float64)
        return state

    def _lr_t(self, state, lr):
        b1p = float(state["beta1_pow"][0])
        state["beta1_pow"][0] = b1p * self.beta1
        return float(lr) / (1.0 - b1p)

    def _scalars(self):
        return self.beta1, self.beta2, self.epsilon

    def apply_dense(self, param, grad, state, lr):
        super().apply_dense(param, grad, state, self._lr_t(state, lr))

    def apply_sparse(self, param, rows, values, state, lr):
        if len(rows):
            super().apply_sparse(param, rows, values, state, self._lr_t(state, lr))


class AdadeltaRule(_RowsRule):
    """Paddle 1.x's Adadelta, whose op has no learning rate (``lr`` is ignored). Sparse:
    only the gradient's rows; Paddle's op takes dense gradients only."""

    type = "adadelta"
    state_names = row_state_names = ("avg_squared_grad", "avg_squared_update")
    attr_names = ("rho", "epsilon")

    def __init__(self, rho=0.95, epsilon=1e-6):
        self.rho, self.epsilon = float(rho), float(epsilon)

    def apply_dense(self, param, grad, state, lr):
        adaptive.adadelta_dense(_flat(param), *[_flat(a) for a in self._states(state)], _flat(grad),
                                self.rho, self.epsilon)

    def apply_sparse(self, param, rows, values, state, lr):
        if len(rows):
            uniq, summed = _merged(rows, values)
            adaptive.adadelta_rows(param, *self._states(state), uniq, summed, self.rho, self.epsilon)


REGULARIZER_ATTRS = ("regularizer", "regularizer_coeff")


class RegularizedRule:
    """A rule whose gradient first gets the weight-decay term of Paddle's L1Decay
    (``coeff * sign(param)``) or L2Decay (``coeff * param``), in float32.

    Sparse gradients are merged first and regularized on their rows only (Paddle 1.8
    adds the dense decay of the whole table, making the gradient dense). Everything else
    (state, attributes) is the wrapped rule's.
    """

    def __init__(self, rule, kind, coeff):
        if kind not in ("l1", "l2"):
            raise ConfigError(f"regularizer={kind!r} is not 'l1' or 'l2'")
        self.rule, self.kind, self.coeff = rule, kind, float(coeff)

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def attrs(self):
        out = self.rule.attrs()
        out.update(regularizer=self.kind, regularizer_coeff=self.coeff)
        return out

    def _decay(self, param):
        c = np.float32(self.coeff)
        return c * (np.sign(param) if self.kind == "l1" else param)

    def apply_dense(self, param, grad, state, lr):
        grad = np.asarray(grad, dtype=np.float32).reshape(param.shape) + self._decay(param)
        self.rule.apply_dense(param, grad, state, lr)

    def apply_sparse(self, param, rows, values, state, lr):
        if not len(rows):
            return self.rule.apply_sparse(param, rows, values, state, lr)
        uniq, summed = _merged(rows, values)
        summed += self._decay(param[uniq])
        self.rule.apply_sparse(param, uniq, summed, state, lr)

    def apply_sparse_unique(self, param, rows, values, state, lr):
        # not forwarded to the wrapped rule (__getattr__ would): the decay must apply
        self.apply_sparse(param, rows, values, state, lr)

    def __repr__(self):
        return f"RegularizedRule({self.rule!r}, {self.kind}, {self.coeff})"


_RULES = {cls.type: cls for cls in (SGDRule, MomentumRule, AdagradRule, AdamRule, FtrlRule, RMSPropRule,
                                    DecayedAdagradRule, LambRule, AdamaxRule, AdadeltaRule)}


def rule_from_op_attrs(op_type, attrs):
    """Builds the rule of an optimizer op from its attributes, ignoring the others
    (learning_rate, op_role, ...): how both local update ops and servers get their rule."""
    cls = _RULES.get(op_type)
    names = (cls.attr_names if cls is not None else ()) + REGULARIZER_ATTRS
    return make_rule(op_type, {k: attrs[k] for k in names if k in attrs})


def make_rule(op_type, attrs=None):
    """Builds the rule of optimizer ``op_type`` (one of ``_RULES``); attributes
    ``regularizer`` ("l1" / "l2" / "") and ``regularizer_coeff`` wrap it in a
    ``RegularizedRule``.

    Raises:
        ConfigError: the type is unknown (Paddle: "Not supported optimizer for distributed
            training: %s"), or an unknown regularizer.
    """
    cls = _RULES.get(op_type)
    if cls is None:
        raise ConfigError(
            f"Not supported optimizer for distributed training: {op_type}; "
            f"use one of {sorted(_RULES)}"
        )
    attrs = dict(attrs or {})
    kind = attrs.pop("regularizer", "") or ""
    coeff = attrs.pop("regularizer_coeff", 0.0)
    rule = cls(**attrs)
    return RegularizedRule(rule, kind, coeff) if kind else rule
