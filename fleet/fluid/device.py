"""Places: fleet runs on CPUs. ``CPUPlace`` is accepted wherever Paddle takes a place.
The GPU places are accepted too, so GPU scripts (a collective "NCCL2" job's
``fluid.CUDAPlace(int(os.environ["FLAGS_selected_gpus"]))``) run unchanged: they are the
CPU, and the first one a process makes says so in a warning."""
import operator
import os

from fleet.errors import ConfigError
from fleet.framework.place import CPUPlace, say_on_the_cpu
from strategies._env import read_cpu_num


def _device_id(value, what):
    try:
        device = operator.index(value)
    except TypeError:
        device = -1
    if isinstance(value, bool) or device < 0:
        raise ConfigError(f"{what}: the device id {value!r} must be an int >= 0")
    return device


class CUDAPlace(CPUPlace):
    """Paddle's GPU place, run on the CPU (see the module's doc).

    Raises:
        ConfigError: ``device_id`` is not an int >= 0.
    """

    def __init__(self, device_id=0):
        self.device_id = _device_id(device_id, f"fluid.CUDAPlace({device_id!r})")
        say_on_the_cpu(f"fluid.CUDAPlace({self.device_id})")

    def __repr__(self):
        return f"CUDAPlace({self.device_id}) on the CPU"


class CUDAPinnedPlace(CPUPlace):
    """Paddle's pinned host memory for GPU copies: host memory, as every place here."""

    def __repr__(self):
        return "CUDAPinnedPlace (host memory)"


def cuda_places(device_ids=None):
    """One CUDAPlace (run on the CPU) per device: ``device_ids``, else those of
    FLAGS_selected_gpus (a comma-separated list; fleetrun --collective gives each worker
    its rank on the host, as Paddle's launcher its GPU), else device 0. As replicas of a
    data-parallel program they are that many CPU replicas.

    Raises:
        ConfigError: an id is not an int >= 0, or FLAGS_selected_gpus is not such a list.
    """
    if device_ids is None:
        text = os.environ.get("FLAGS_selected_gpus", "").strip()
        try:
            device_ids = [int(part) for part in text.split(",")] if text else [0]
        except ValueError:
            raise ConfigError(f"FLAGS_selected_gpus={text!r} must be comma-separated device ids such as "
                              "'0' or '0,1'") from None
    elif not isinstance(device_ids, (list, tuple)):
        device_ids = [device_ids]
    return [CUDAPlace(_device_id(d, f"fluid.cuda_places({device_ids!r})")) for d in device_ids]


def cpu_places(device_count=None):
    """``device_count`` CPUPlaces (default CPU_NUM, or 1 when unset): the replicas of a
    data-parallel program (``with_data_parallel(places=...)``)."""
    count = read_cpu_num() if device_count is None else int(device_count)
    if count < 1:
        raise ConfigError(f"cpu_places(device_count={device_count!r}) must be >= 1")
    return [CPUPlace() for _ in range(count)]


def is_compiled_with_cuda():
    """False: fleet has no GPU kernels (a script that asks picks fluid.CPUPlace())."""
    return False
