"""Optimizers (Paddle's ``fluid.optimizer``): ``minimize(loss)`` appends the backward ops
and one update op per parameter. The update arithmetic is ``fleet.rules``,
the same code servers run."""
import numpy as np

from fleet.errors import ConfigError
from fleet.framework.backward import append_backward
from fleet.framework.program import OPTIMIZE, Variable, default_startup_program
from fleet.framework.scope import global_scope
from fleet.initializer import Constant
from fleet.regularizer import check_regularizer
from fleet.rules import (AdadeltaRule, AdagradRule, AdamaxRule, AdamRule, DecayedAdagradRule, FtrlRule,
                         LambRule, MomentumRule, RMSPropRule, SGDRule)


class Optimizer:
    """Base class. ``type`` names the update op; ``rule`` holds the hyper-parameters and
    the arithmetic (the same rule object servers build from the op's attributes).

    Args:
        learning_rate: a non-negative float, or a float32 [1] Variable such as a
            ``fleet.layers`` learning-rate schedule returns.
        regularization: a ``fleet.regularizer`` object for every parameter whose
            ParamAttr has none.
        name: unused (Paddle's name prefix).

    Raises:
        ConfigError: a negative or non-number rate, or a regularization of the wrong kind.
    """

    type = None
    rule = SGDRule()

    def __init__(self, learning_rate, regularization=None, name=None):
        if isinstance(learning_rate, Variable):
            if learning_rate.dtype not in ("float32", "float64"):
                raise ConfigError(f"learning_rate variable {learning_rate.name!r} is {learning_rate.dtype}; "
                                  f"it must be float32 [1] (e.g. fleet.layers.exponential_decay(...))")
        elif isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or learning_rate < 0:
            raise ConfigError(
                f"learning_rate={learning_rate!r} must be a non-negative number or a learning-rate "
                f"Variable (e.g. fleet.layers.exponential_decay(...))")
        else:
            learning_rate = float(learning_rate)
        self.regularization = check_regularizer(regularization, "regularization")
        self._learning_rate = learning_rate
        self._name = name

    def get_lr(self):
        """The current learning rate: the float given, or the value the schedule's
        Variable holds in the global scope (its value at the last run).

        Raises:
            ConfigError: the schedule has not run yet (no value in the global scope).
        """
        if not isinstance(self._learning_rate, Variable):
            return self._learning_rate
        value = global_scope().value(self._learning_rate.name)
        if value is None:
            raise ConfigError(f"learning rate {self._learning_rate.name!r} has no value yet: run the startup "
                              f"program and a step of the main program first")
        return float(np.asarray(value).reshape(-1)[0])

    current_step_lr = get_lr

    def _regularizer_attrs(self, param):
        reg = getattr(param, "regularizer", None) or self.regularization
        if reg is None:
            return {}
        return {"regularizer": reg.kind, "regularizer_coeff": reg.coeff}

    def _rule_attrs(self, param):
        """The update op's hyper-parameters for ``param`` (Lamb excludes some from decay)."""
        return self.rule.attrs()

    def backward(self, loss, startup_program=None, parameter_list=None, no_grad_set=None,
                 callbacks=None):
        """Appends the gradient ops of ``loss``; returns [(param, grad)]."""
        return append_backward(loss, parameter_list, no_grad_set)

    def apply_gradients(self, params_grads):
        """Appends one update op per (param, grad) and its state's initializers."""
        ops = []
        rule = self.rule
        for param, grad in params_grads:
            if grad is None or not getattr(param, "trainable", True):
                continue
            block = param.block
            startup = (param.program._paired or default_startup_program()).global_block()
            inputs = {"Param": [param.name], "Grad": [grad.name]}
            state = rule.init_state(param.shape)
            for key, value in state.items():
                name = f"{param.name}_{key}_0"
                dtype = "float64" if value.dtype.name == "float64" else "float32"
                shape = value.shape
                block.create_var(name, shape=shape, dtype=dtype, persistable=True, stop_gradient=True)
                if name not in startup.vars:
                    fill = float(value.reshape(-1)[0]) if value.size else 0.0
                    var = block.vars[name]
                    Constant(fill)(var, startup)
                inputs[key] = [name]
            attrs = self._rule_attrs(param)
            attrs.update(self._regularizer_attrs(param))
            if isinstance(self._learning_rate, Variable):
                inputs["LearningRate"] = [self._learning_rate.name]
                attrs["learning_rate"] = param.learning_rate  # the multiplier of the variable's rate
            else:
                attrs["learning_rate"] = self._learning_rate * param.learning_rate
            attrs["op_role"] = OPTIMIZE
            ops.append(block.append_op(self.type, inputs=inputs, outputs={"ParamOut": [param.name]}, attrs=attrs))
        return ops

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        """Appends backward and update ops for ``loss``.

        Returns:
            (optimize_ops, params_grads).

        Raises:
            ConfigError: ``loss`` is not a variable or has no trainable parameter.
        """
        if isinstance(loss, (list, tuple)):
            raise TypeError("minimize takes one loss Variable, not a list")
        if not isinstance(loss, Variable):
            raise ConfigError(f"loss must be a fleet Variable, got {type(loss).__name__}")
        params_grads = self.backward(loss, startup_program, parameter_list, no_grad_set)
        return self.apply_gradients(params_grads), params_grads


class SGD(Optimizer):
    """param -= learning_rate * grad."""

    type = "sgd"


class Momentum(Optimizer):
    """velocity = momentum * velocity + grad; param -= learning_rate * velocity."""

    type = "momentum"

    def __init__(self, learning_rate, momentum, use_nesterov=False, regularization=None, name=None):
        super().__init__(learning_rate, regularization, name)
        self.rule = MomentumRule(momentum, use_nesterov)


class Adagrad(Optimizer):
    """Adagrad with Paddle's epsilon and initial accumulator."""

    type = "adagrad"

    def __init__(self, learning_rate, epsilon=1e-6, regularization=None, name=None,
                 initial_accumulator_value=0.0):
        super().__init__(learning_rate, regularization, name)
        self.rule = AdagradRule(epsilon, initial_accumulator_value)


class Adam(Optimizer):
    """Adam; ``lazy_mode=True`` updates only the rows of a sparse gradient (large tables)."""

    type = "adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 regularization=None, name=None, lazy_mode=False):
        super().__init__(learning_rate, regularization, name)
        for label, v in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"Adam {label}={v} must be in [0, 1)")
        self.rule = AdamRule(beta1, beta2, epsilon, lazy_mode)


def _check_range(label, value, low, high, high_open=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            low <= value < high if high_open else low <= value <= high):
        bracket = ")" if high_open else "]"
        raise ConfigError(f"{label}={value!r} must be in [{low}, {high}{bracket}")


class Ftrl(Optimizer):
    """FTRL-Proximal (Paddle's FtrlOptimizer).

    Args:
        learning_rate, regularization, name: as ``Optimizer``.
        l1, l2: the L1 / L2 penalties (>= 0; Paddle 1.x's op gets l1 for both, fleet
            uses l2 as given). lr_power: the power of the summed squared gradients in the
            per-coordinate rate (-0.5: 1 / sqrt).

    Raises:
        ConfigError: a negative penalty (named).
    """

    type = "ftrl"

    def __init__(self, learning_rate, l1=0.0, l2=0.0, lr_power=-0.5, regularization=None, name=None):
        super().__init__(learning_rate, regularization, name)
        for label, v in (("l1", l1), ("l2", l2)):
            _check_range(f"Ftrl {label}", v, 0.0, float("inf"))
        self.rule = FtrlRule(l1, l2, lr_power)


class RMSProp(Optimizer):
    """RMSProp (Paddle's RMSPropOptimizer).

    Args:
        learning_rate, regularization, name: as ``Optimizer``.
        rho: decay of the mean square (the op's ``decay``). epsilon: added under the root.
        momentum: decay of the step. centered: also subtract the squared mean gradient.

    Raises:
        ConfigError: rho or momentum outside [0, 1], a negative epsilon (named).
    """

    type = "rmsprop"

    def __init__(self, learning_rate, rho=0.95, epsilon=1.0e-6, momentum=0.0, centered=False,
                 regularization=None, name=None):
        super().__init__(learning_rate, regularization, name)
        _check_range("RMSProp rho", rho, 0.0, 1.0, high_open=False)
        _check_range("RMSProp momentum", momentum, 0.0, 1.0, high_open=False)
        _check_range("RMSProp epsilon", epsilon, 0.0, float("inf"))
        self.rule = RMSPropRule(rho, epsilon, momentum, centered)


class DecayedAdagrad(Optimizer):
    """Adagrad whose squared-gradient sum decays by ``decay`` each step (Paddle's
    DecayedAdagradOptimizer).

    Args:
        learning_rate, regularization, name: as ``Optimizer``. decay: in [0, 1] (Paddle
            1.x's op ignores it and uses 0.95; fleet uses it). epsilon: added to the root.

    Raises:
        ConfigError: decay outside [0, 1] (named).
    """

    type = "decayed_adagrad"

    def __init__(self, learning_rate, decay=0.95, epsilon=1.0e-6, regularization=None, name=None):
        super().__init__(learning_rate, regularization, name)
        _check_range("DecayedAdagrad decay", decay, 0.0, 1.0, high_open=False)
        self.rule = DecayedAdagradRule(decay, epsilon)


class Lamb(Optimizer):
    """LAMB (Paddle 1.x's LambOptimizer): Adam's moments without bias correction plus
    ``lamb_weight_decay * param``, the step scaled by ``||param|| / ||update||``.

    Args:
        learning_rate, regularization, name: as ``Optimizer``.
        lamb_weight_decay: the decay added to the update. beta1, beta2: in [0, 1).
        epsilon: added to the root.
        exclude_from_weight_decay_fn: a function of a Parameter; True gives it no
            lamb weight decay.

    Raises:
        ConfigError: a beta outside [0, 1) or an exclude function that is not callable.
    """

    type = "lamb"

    def __init__(self, learning_rate=0.001, lamb_weight_decay=0.01, beta1=0.9, beta2=0.999, epsilon=1e-6,
                 regularization=None, exclude_from_weight_decay_fn=None, name=None):
        super().__init__(learning_rate, regularization, name)
        for label, v in (("beta1", beta1), ("beta2", beta2)):
            _check_range(f"Lamb {label}", v, 0.0, 1.0)
        if exclude_from_weight_decay_fn is not None and not callable(exclude_from_weight_decay_fn):
            raise ConfigError(f"exclude_from_weight_decay_fn={exclude_from_weight_decay_fn!r} must be a function "
                              f"of a parameter returning True to exclude it")
        self.rule = LambRule(beta1, beta2, epsilon, lamb_weight_decay)
        self._exclude_from_weight_decay_fn = exclude_from_weight_decay_fn

    def _rule_attrs(self, param):
        attrs = self.rule.attrs()
        if self._exclude_from_weight_decay_fn is not None and self._exclude_from_weight_decay_fn(param):
            attrs["weight_decay"] = 0.0
        return attrs


class Adamax(Optimizer):
    """Adamax (Paddle's AdamaxOptimizer): Adam with the infinity norm of the gradients.

    Args:
        learning_rate, regularization, name: as ``Optimizer``. beta1, beta2: in [0, 1).
        epsilon: added to the infinity norm.

    Raises:
        ConfigError: a beta outside [0, 1) (named).
    """

    type = "adamax"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, regularization=None,
                 name=None):
        super().__init__(learning_rate, regularization, name)
        for label, v in (("beta1", beta1), ("beta2", beta2)):
            _check_range(f"Adamax {label}", v, 0.0, 1.0)
        self.rule = AdamaxRule(beta1, beta2, epsilon)


class Adadelta(Optimizer):
    """Adadelta (Paddle 1.x's AdadeltaOptimizer). As in Paddle 1.x, the update op does not
    use ``learning_rate`` (it must still be given).

    Args:
        learning_rate, regularization, name: as ``Optimizer``. epsilon: added in both
            roots. rho: decay of both averages, in [0, 1].

    Raises:
        ConfigError: rho outside [0, 1] (named).
    """

    type = "adadelta"

    def __init__(self, learning_rate, epsilon=1.0e-6, rho=0.95, regularization=None, name=None):
        super().__init__(learning_rate, regularization, name)
        _check_range("Adadelta rho", rho, 0.0, 1.0, high_open=False)
        self.rule = AdadeltaRule(rho, epsilon)


SGDOptimizer = SGD
MomentumOptimizer = Momentum
AdagradOptimizer = Adagrad
AdamOptimizer = Adam
FtrlOptimizer = Ftrl
RMSPropOptimizer = RMSProp
DecayedAdagradOptimizer = DecayedAdagrad
LambOptimizer = Lamb
AdamaxOptimizer = Adamax
AdadeltaOptimizer = Adadelta

__all__ = ["Optimizer", "SGD", "Momentum", "Adagrad", "Adam", "Ftrl", "RMSProp", "DecayedAdagrad", "Lamb",
           "Adamax", "Adadelta", "SGDOptimizer", "MomentumOptimizer", "AdagradOptimizer", "AdamOptimizer",
           "FtrlOptimizer", "RMSPropOptimizer", "DecayedAdagradOptimizer", "LambOptimizer", "AdamaxOptimizer",
           "AdadeltaOptimizer"]
