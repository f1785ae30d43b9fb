"""Optimizers (Paddle's ``fluid.optimizer``): ``minimize(loss)`` appends the backward ops
and one update op per parameter. The update arithmetic is ``fleet.rules``,
the same code servers run."""
from fleet.errors import ConfigError
from fleet.framework.backward import append_backward
from fleet.framework.program import OPTIMIZE, Variable, default_startup_program
from fleet.initializer import Constant
from fleet.rules import AdagradRule, AdamRule, MomentumRule, SGDRule


class Optimizer:
    """Base class. ``type`` names the update op; ``rule`` holds the hyper-parameters and
    the arithmetic (the same rule object servers build from the op's attributes)."""

    type = None
    rule = SGDRule()

    def __init__(self, learning_rate, regularization=None, name=None):
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) or learning_rate < 0:
            raise ConfigError(
                f"learning_rate={learning_rate!r} must be a non-negative number "
                f"(learning-rate schedules are not supported)")
        if regularization is not None:
            raise ConfigError("regularization is not supported; add the penalty to the loss")
        self._learning_rate = float(learning_rate)
        self._name = name

    def get_lr(self):
        return self._learning_rate

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
            attrs = rule.attrs()
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


SGDOptimizer = SGD
MomentumOptimizer = Momentum
AdagradOptimizer = Adagrad
AdamOptimizer = Adam

__all__ = ["Optimizer", "SGD", "Momentum", "Adagrad", "Adam", "SGDOptimizer",
           "MomentumOptimizer", "AdagradOptimizer", "AdamOptimizer"]
