"""Runtime settings read from the environment: `TrainerRuntimeConfig` (the communicator's
flags) and `ServerRuntimeConfig` (the servers' RPC thread counts).

Keys, defaults and variables are Paddle 1.7's (generation G2): every communicator flag
``communicator_<x>`` defaults per mode (some to CPU_NUM) and is overridden by the
environment variable ``FLAGS_communicator_<x>``.
"""
import collections.abc
import numbers

import numpy as np

from fleet.errors import ConfigError
from strategies._env import read_cpu_num, read_env_int
from strategies._fields import Field, Settings, integer

MODES = ("sync", "async", "half_async", "geo", "collective", "hybrid")

_CPU = "CPU_NUM"  # marker: the default is the CPU_NUM environment variable

# key -> (default, minimum, maximum or None)
_BASE_FLAGS = {
    "rpc_deadline": (180000, 1, None),
    "rpc_retry_times": (3, 0, None),
}
_QUEUE_FLAGS = {
    "communicator_max_merge_var_num": (_CPU, 1, None),
    "communicator_send_queue_size": (_CPU, 1, None),
    "communicator_send_wait_times": (5, 1, None),
    "communicator_thread_pool_size": (10, 1, None),
}
_MODE_FLAGS = {
    "sync": _QUEUE_FLAGS,
    "half_async": _QUEUE_FLAGS,
    "async": {
        **_QUEUE_FLAGS,
        "communicator_independent_recv_thread": (0, 0, 1),
        "communicator_min_send_grad_num_before_recv": (_CPU, 1, None),
        "communicator_is_sgd_optimizer": (1, 0, 1),
    },
    "geo": {
        "communicator_send_wait_times": (5, 1, None),
        "communicator_thread_pool_size": (10, 1, None),
    },
}
_MODE_FLAGS["hybrid"] = _MODE_FLAGS["async"]  # its tables go through the async communicator
_MODE_FLAGS["collective"] = {}  # no servers: only the base flags


def _expected(minimum, maximum):
    if maximum == 1 and minimum == 0:
        return "0 or 1"
    return f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"


def _flag_value(key, value, minimum, maximum):
    """Normalise one flag value (an int, a decimal str as Paddle stored them, or a bool
    for 0/1 flags) or raise a ConfigError naming key, value and fix."""
    number = None
    if isinstance(value, (bool, np.bool_)):
        number = int(value) if maximum == 1 else None
    elif isinstance(value, numbers.Integral):
        number = int(value)
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise ConfigError(
            f"TrainerRuntimeConfig.runtime_configs[{key!r}]={value!r} is invalid: expected "
            f"{_expected(minimum, maximum)}; set it (or FLAGS_{key}) to such a value"
        )
    return number


class _FlagTable(collections.abc.MutableMapping):
    """The ``runtime_configs`` mapping: fixed keys, every assignment validated."""

    def __init__(self, bounds, values):
        self._bounds = bounds
        self._values = values

    def __getitem__(self, key):
        return self._values[key]

    def __setitem__(self, key, value):
        if key not in self._bounds:
            raise ConfigError(
                f"TrainerRuntimeConfig doesn't have key: {key}; valid keys: {', '.join(self._bounds)}"
            )
        _, minimum, maximum = self._bounds[key]
        self._values[key] = _flag_value(key, value, minimum, maximum)

    def __delitem__(self, key):
        raise ConfigError(f"TrainerRuntimeConfig keys cannot be removed ({key!r}); set a value instead")

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return repr(self._values)


class TrainerRuntimeConfig:
    """The communicator's flags for one training mode (Paddle 1.7's G2 table).

    Keys: ``rpc_deadline`` (ms, FLAGS_rpc_deadline, 180000) and ``rpc_retry_times``
    (FLAGS_rpc_retry_times, 3) in every mode, plus per mode:

    ==============================================  ====  =====  ==========  ===
    communicator_...                                sync  async  half_async  geo
    ==============================================  ====  =====  ==========  ===
    max_merge_var_num                               CPU   CPU    CPU         -
    send_queue_size                                 CPU   CPU    CPU         -
    send_wait_times                                 5     5      5           5
    thread_pool_size                                10    10     10          10
    independent_recv_thread (0/1)                   -     0      -           -
    min_send_grad_num_before_recv                   -     CPU    -           -
    is_sgd_optimizer (0/1)                          -     1      -           -
    ==============================================  ====  =====  ==========  ===

    CPU is the CPU_NUM environment variable (default 1). Each ``communicator_<x>`` is
    overridden by the environment variable ``FLAGS_communicator_<x>``.

    Args:
        mode: None (only the rpc keys, Paddle's plain ``TrainerRuntimeConfig()``) or one
            of "sync", "async", "half_async", "geo". The strategies pass their mode.

    Raises:
        ConfigError: unknown mode, or CPU_NUM / a FLAGS_ variable is not a valid int.

    Attributes:
        runtime_configs: mapping key -> int; assigning validates the value, unknown keys
            are refused with "TrainerRuntimeConfig doesn't have key: <key>".
    """

    def __init__(self, mode=None):
        if mode is not None and mode not in MODES:
            raise ConfigError(
                f"TrainerRuntimeConfig mode={mode!r} is invalid: expected None or one of {MODES}"
            )
        self._mode = mode
        bounds = dict(_BASE_FLAGS)
        bounds.update(_MODE_FLAGS.get(mode, {}))
        cpu_num = read_cpu_num() if mode is not None else 1
        values = {}
        for key, (default, minimum, maximum) in bounds.items():
            default = cpu_num if default == _CPU else default
            values[key] = read_env_int(
                f"FLAGS_{key}", default, minimum, f"{_expected(minimum, maximum)} (default {default})"
            )
            if maximum is not None and values[key] > maximum:
                raise ConfigError(
                    f"FLAGS_{key}={values[key]!r} is not {_expected(minimum, maximum)}; "
                    f"set FLAGS_{key} to 0 or 1 or unset it"
                )
        self.runtime_configs = _FlagTable(bounds, values)

    @property
    def mode(self):
        """The mode these flags are for: None, "sync", "async", "half_async", "geo", "collective"
        or "hybrid"."""
        return self._mode

    def update(self, mapping):
        """Set several flags from a dict, all or nothing.

        Args:
            mapping: dict of key -> value (int, a decimal str, or a bool for 0/1 flags).

        Raises:
            ConfigError: a key is not one of this mode's keys ("TrainerRuntimeConfig
                doesn't have key: <key>" plus the valid keys) or a value is invalid;
                nothing is changed then.
        """
        trial = _FlagTable(self.runtime_configs._bounds, dict(self.runtime_configs))
        for key, value in mapping.items():
            trial[key] = value
        for key in mapping:
            self.runtime_configs._values[key] = trial[key]

    def get_communicator_flags(self):
        """Returns: a new dict of every key -> int value (the communicator reads this)."""
        return dict(self.runtime_configs)

    def __repr__(self):
        title = f"TrainerRuntimeConfig Overview (mode: {self._mode})"
        width = max(len(title), *(len(k) for k in self.runtime_configs)) + 2
        border, rule = "=" * (width + 12), "-" * (width + 12)
        lines = [border, f"{title:<{width}}Value", rule]
        lines += [f"{key:<{width}}{value}" for key, value in self.runtime_configs.items()]
        lines.append(border)
        return "\n".join(lines)


def _alias(field_name):
    return property(
        lambda self: getattr(self, field_name),
        lambda self, value: setattr(self, field_name, value),
        doc=f"Paddle's name for `{field_name}`.",
    )


def _env_threads(name):
    return lambda: read_env_int(name, 12, 1, "a number of RPC threads (default 12)")


class ServerRuntimeConfig(Settings):
    """The parameter servers' RPC thread counts (Paddle's ServerRuntimeConfig).

    Each field defaults to the environment variable ``FLAGS_<field>`` or 12. Paddle's
    underscored names (``_rpc_send_thread_num`` ...) are accepted as aliases.

    Raises:
        ConfigError: a FLAGS_ variable or an assigned value is not a positive int.
    """

    _FIX = "set it to a positive number of threads, e.g. 12"
    rpc_send_thread_num = Field(
        12, integer(1, _FIX), "Threads serving pushes (sends).",
        factory=_env_threads("FLAGS_rpc_send_thread_num"),
    )
    rpc_get_thread_num = Field(
        12, integer(1, _FIX), "Threads serving pulls (gets).",
        factory=_env_threads("FLAGS_rpc_get_thread_num"),
    )
    rpc_prefetch_thread_num = Field(
        12, integer(1, _FIX), "Threads serving sparse-row prefetches.",
        factory=_env_threads("FLAGS_rpc_prefetch_thread_num"),
    )
    _rpc_send_thread_num = _alias("rpc_send_thread_num")
    _rpc_get_thread_num = _alias("rpc_get_thread_num")
    _rpc_prefetch_thread_num = _alias("rpc_prefetch_thread_num")
    _ALIASES = {
        "_rpc_send_thread_num": "rpc_send_thread_num",
        "_rpc_get_thread_num": "rpc_get_thread_num",
        "_rpc_prefetch_thread_num": "rpc_prefetch_thread_num",
    }
