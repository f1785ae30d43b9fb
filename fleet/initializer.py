"""Parameter initializers (Paddle's ``fluid.initializer``): each appends one op to the
startup program that fills a parameter.

A ``seed`` of 0 means: derive the seed from the program's ``random_seed`` and the
parameter's name when the program has one, else draw fresh randomness.
"""
import math

from fleet.errors import ConfigError


class Initializer:
    """Base class: ``init(var, startup_block)`` appends the op that fills ``var``."""

    seed = 0

    def _append(self, block, var, op_type, **attrs):
        out = block.create_var(var.name, shape=var.shape, dtype=var.dtype, persistable=True)
        attrs.update(shape=list(var.shape), dtype=var.dtype)
        block.append_op(op_type, outputs={"Out": [out.name]}, attrs=attrs)

    def __call__(self, var, block):
        self.init(var, block)

    def spec(self, shape=None):
        """A plain tuple describing the distribution (used by servers' sparse tables)."""
        raise NotImplementedError


def _check_seed(seed):
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be a non-negative int (0: from the program's random_seed)")
    return seed


class Constant(Initializer):
    """Fills with ``value``."""

    def __init__(self, value=0.0, force_cpu=False):
        self.value = float(value)

    def init(self, var, block):
        self._append(block, var, "fill_constant", value=self.value)

    def spec(self, shape=None):
        return ("constant", self.value)


class Uniform(Initializer):
    """Uniform in [low, high)."""

    def __init__(self, low=-1.0, high=1.0, seed=0):
        if not low < high:
            raise ConfigError(f"Uniform(low={low}, high={high}): low must be less than high")
        self.low, self.high, self.seed = float(low), float(high), _check_seed(seed)

    def init(self, var, block):
        self._append(block, var, "uniform_random", min=self.low, max=self.high, seed=self.seed)

    def spec(self, shape=None):
        return ("uniform", self.low, self.high)


class Normal(Initializer):
    """Normal with mean ``loc`` and standard deviation ``scale``."""

    def __init__(self, loc=0.0, scale=1.0, seed=0):
        if scale < 0:
            raise ConfigError(f"Normal(scale={scale}): the standard deviation must be >= 0")
        self.loc, self.scale, self.seed = float(loc), float(scale), _check_seed(seed)

    def init(self, var, block):
        self._append(block, var, "gaussian_random", mean=self.loc, std=self.scale, seed=self.seed)

    def spec(self, shape=None):
        return ("normal", self.loc, self.scale)


class TruncatedNormal(Normal):
    """Normal resampled outside two standard deviations."""

    def init(self, var, block):
        self._append(block, var, "truncated_gaussian_random", mean=self.loc, std=self.scale, seed=self.seed)

    def spec(self, shape=None):
        return ("truncated_normal", self.loc, self.scale)


def _fans(shape):
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


class Xavier(Initializer):
    """Glorot: uniform in +-sqrt(6 / (fan_in + fan_out)), or normal with
    std sqrt(2 / (fan_in + fan_out)); Paddle's default for fc and embedding weights."""

    def __init__(self, uniform=True, fan_in=None, fan_out=None, seed=0):
        self.uniform, self.fan_in, self.fan_out, self.seed = bool(uniform), fan_in, fan_out, _check_seed(seed)

    def _limits(self, shape):
        f_in, f_out = _fans(shape)
        f_in = self.fan_in if self.fan_in is not None else f_in
        f_out = self.fan_out if self.fan_out is not None else f_out
        return f_in, f_out

    def init(self, var, block):
        f_in, f_out = self._limits(var.shape)
        if self.uniform:
            limit = math.sqrt(6.0 / (f_in + f_out))
            self._append(block, var, "uniform_random", min=-limit, max=limit, seed=self.seed)
        else:
            std = math.sqrt(2.0 / (f_in + f_out))
            self._append(block, var, "gaussian_random", mean=0.0, std=std, seed=self.seed)

    def spec(self, shape=None):
        f_in, f_out = self._limits(shape or (1, 1))
        if self.uniform:
            limit = math.sqrt(6.0 / (f_in + f_out))
            return ("uniform", -limit, limit)
        return ("normal", 0.0, math.sqrt(2.0 / (f_in + f_out)))


class MSRA(Initializer):
    """He: uniform in +-sqrt(6 / fan_in) or normal with std sqrt(2 / fan_in)."""

    def __init__(self, uniform=True, fan_in=None, seed=0):
        self.uniform, self.fan_in, self.seed = bool(uniform), fan_in, _check_seed(seed)

    def init(self, var, block):
        f_in = self.fan_in if self.fan_in is not None else _fans(var.shape)[0]
        if self.uniform:
            limit = math.sqrt(6.0 / f_in)
            self._append(block, var, "uniform_random", min=-limit, max=limit, seed=self.seed)
        else:
            self._append(block, var, "gaussian_random", mean=0.0, std=math.sqrt(2.0 / f_in), seed=self.seed)


# Paddle's aliases
ConstantInitializer = Constant
UniformInitializer = Uniform
NormalInitializer = Normal
TruncatedNormalInitializer = TruncatedNormal
XavierInitializer = Xavier
MSRAInitializer = MSRA

__all__ = ["Initializer", "Constant", "Uniform", "Normal", "TruncatedNormal", "Xavier", "MSRA",
           "ConstantInitializer", "UniformInitializer", "NormalInitializer",
           "TruncatedNormalInitializer", "XavierInitializer", "MSRAInitializer"]
