"""Reading integer settings from the environment (CPU_NUM, FLAGS_*), with ConfigErrors."""
from fleet.envvars import env_int


def read_env_int(name, default, minimum=1, meaning="a positive integer"):
    """Read an integer environment variable (`fleet.envvars.env_int`).

    Args:
        name: the variable name, e.g. "CPU_NUM".
        default: the value when the variable is unset.
        minimum: the smallest allowed value.
        meaning: what the value is, for the message.

    Returns:
        int: the value, or ``default`` when unset.

    Raises:
        ConfigError: the variable is set but is not a decimal integer >= minimum.
    """
    return env_int(name, default, minimum, meaning)


def read_cpu_num():
    """Read CPU_NUM, the number of training threads per worker (default 1).

    Returns:
        int: CPU_NUM, at least 1.

    Raises:
        ConfigError: CPU_NUM is set but is not a positive integer.
    """
    return read_env_int("CPU_NUM", 1, 1, "the number of training threads per worker (e.g. CPU_NUM=4)")
