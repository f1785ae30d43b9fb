"""ParamAttr: how a layer names, initializes and trains its parameter."""
from fleet.errors import ConfigError
from fleet.initializer import Initializer
from fleet.regularizer import check_regularizer


class ParamAttr:
    """Settings of a parameter (Paddle's ``fluid.ParamAttr``).

    Args:
        name: the parameter's name; layers given the same name share one parameter.
        initializer: a ``fleet.initializer`` object (default: the layer's own default).
        learning_rate: multiplies the optimizer's learning rate for this parameter.
        regularizer: a ``fleet.regularizer`` object (L1Decay / L2Decay); it takes
            precedence over the optimizer's ``regularization`` for this parameter.
        trainable: False freezes it.

    Raises:
        ConfigError: a value of the wrong kind (names it).
    """

    def __init__(self, name=None, initializer=None, learning_rate=1.0, regularizer=None,
                 trainable=True, do_model_average=False):
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"ParamAttr name must be a str, got {name!r}")
        if initializer is not None and not isinstance(initializer, Initializer):
            raise ConfigError(
                f"ParamAttr initializer must be a fleet.initializer object (e.g. "
                f"fleet.initializer.Uniform(-1, 1)), got {initializer!r}")
        if learning_rate < 0:
            raise ConfigError(f"ParamAttr learning_rate={learning_rate} must be >= 0")
        self.regularizer = check_regularizer(regularizer, "ParamAttr regularizer")
        self.name = name
        self.initializer = initializer
        self.learning_rate = float(learning_rate)
        self.trainable = bool(trainable)

    @staticmethod
    def to_attr(arg):
        """Normalizes what layers accept: None, a name, a ParamAttr, or False (no param)."""
        if arg is None:
            return ParamAttr()
        if isinstance(arg, ParamAttr):
            return arg
        if isinstance(arg, str):
            return ParamAttr(name=arg)
        if arg is False:
            return False
        if isinstance(arg, Initializer):
            return ParamAttr(initializer=arg)
        raise ConfigError(f"param_attr must be None, a name, a ParamAttr or False, got {arg!r}")

    def __repr__(self):
        return (f"ParamAttr(name={self.name!r}, initializer={self.initializer!r}, "
                f"learning_rate={self.learning_rate}, regularizer={self.regularizer!r}, "
                f"trainable={self.trainable})")
