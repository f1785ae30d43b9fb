"""Places: fleet runs on CPUs. ``CPUPlace`` is accepted wherever Paddle takes a place;
asking for a GPU is an error that says so."""
from fleet.errors import ConfigError
from fleet.framework.place import CPUPlace
from strategies._env import read_cpu_num

_CPU_ONLY = "fleet runs on CPUs only; use fluid.CPUPlace() (threads: CPU_NUM)"


class CUDAPlace:
    """Paddle's GPU place: refused, fleet has no GPU kernels.

    Raises:
        ConfigError: always.
    """

    def __init__(self, device_id=0):
        raise ConfigError(f"fluid.CUDAPlace({device_id}): {_CPU_ONLY}")


class CUDAPinnedPlace:
    """Paddle's pinned host memory for GPU copies: refused as CUDAPlace."""

    def __init__(self):
        raise ConfigError(f"fluid.CUDAPinnedPlace(): {_CPU_ONLY}")


def cuda_places(device_ids=None):
    """Refused: fleet has no GPUs.

    Raises:
        ConfigError: always.
    """
    raise ConfigError(f"fluid.cuda_places({device_ids!r}): {_CPU_ONLY}")


def cpu_places(device_count=None):
    """``device_count`` CPUPlaces (default CPU_NUM, or 1 when unset): the replicas of a
    data-parallel program (``with_data_parallel(places=...)``)."""
    count = read_cpu_num() if device_count is None else int(device_count)
    if count < 1:
        raise ConfigError(f"cpu_places(device_count={device_count!r}) must be >= 1")
    return [CPUPlace() for _ in range(count)]


def is_compiled_with_cuda():
    """False: fleet has no GPU support."""
    return False
