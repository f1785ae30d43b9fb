"""Weight-decay regularizers (Paddle's ``fluid.regularizer``).

A regularizer adds the gradient of a penalty to a parameter's gradient before the
optimizer uses it: ``L2Decay(c)`` adds ``c * param``, ``L1Decay(c)`` adds ``c *
sign(param)``. Set one per parameter (``ParamAttr(regularizer=...)``) or for every
parameter (the optimizer's ``regularization=``); the ParamAttr's wins, as in Paddle.

The decay is part of the update op (attributes ``regularizer``, ``regularizer_coeff``),
so servers apply it exactly once per update, to the averaged or merged gradient they
apply, in every mode; GEO workers apply it in their local optimizer, as Paddle's GEO
trainers do. A sparse (row) gradient gets the decay of its rows only; Paddle 1.8 adds
the decay of the whole table and so makes the gradient dense.
"""
from fleet.errors import ConfigError


class WeightDecayRegularizer:
    """Base class: ``kind`` ("l1" / "l2") and ``coeff`` say what the update op adds."""

    kind = None

    def __init__(self, regularization_coeff=0.0):
        if regularization_coeff is None or isinstance(regularization_coeff, bool) \
                or not isinstance(regularization_coeff, (int, float)):
            raise ConfigError(f"regularization_coeff={regularization_coeff!r} must be a number "
                              f"(e.g. L2Decay(regularization_coeff=1e-4))")
        self._regularization_coeff = float(regularization_coeff)

    @property
    def coeff(self):
        return self._regularization_coeff

    def __str__(self):
        return f"{type(self).__name__[:7]}, regularization_coeff={self._regularization_coeff:f}"

    def __repr__(self):
        return f"{type(self).__name__}(regularization_coeff={self._regularization_coeff!r})"


class L2DecayRegularizer(WeightDecayRegularizer):
    """L2 weight decay: the gradient gets ``regularization_coeff * param``.

    Args:
        regularization_coeff: the coefficient (default 0.0).

    Raises:
        ConfigError: the coefficient is not a number.
    """

    kind = "l2"


class L1DecayRegularizer(WeightDecayRegularizer):
    """L1 weight decay: the gradient gets ``regularization_coeff * sign(param)``.

    Args:
        regularization_coeff: the coefficient (default 0.0).

    Raises:
        ConfigError: the coefficient is not a number.
    """

    kind = "l1"


L1Decay = L1DecayRegularizer
L2Decay = L2DecayRegularizer


def check_regularizer(value, what):
    """Returns ``value`` if it is None or a regularizer.

    Raises:
        ConfigError: anything else (names ``what`` and the fix).
    """
    if value is None or isinstance(value, WeightDecayRegularizer):
        return value
    raise ConfigError(f"{what}={value!r} must be a fleet.regularizer object "
                      f"(fleet.regularizer.L2Decay(1e-4) or L1Decay(...)) or None")


__all__ = ["L1Decay", "L2Decay", "L1DecayRegularizer", "L2DecayRegularizer", "WeightDecayRegularizer"]
