"""How a worker runs its program: `ExecutionStrategy` (threads) and `BuildStrategy`
(how the threads' gradients are combined)."""
import enum
import numbers

from strategies._env import read_cpu_num
from strategies._fields import Field, Settings, invalid, boolean, integer


class ExecutionStrategy(Settings):
    """Threads of a worker's executor (Paddle's ``fluid.ExecutionStrategy``).

    Fields:
        num_threads: training threads (default CPU_NUM, or 1 when unset).
        use_thread_barrier: the threads meet at a barrier each step (half-async, sync).
        num_iteration_per_drop_scope: steps between clearing per-thread temporary
            variables (default 100).
        num_iteration_per_run: steps per executor call (default 1).

    Raises:
        ConfigError: CPU_NUM is not a positive int, or an assigned value is invalid.
    """

    num_threads = Field(
        1, integer(1, "set it to the number of training threads, e.g. 4"),
        "Training threads per worker (default: CPU_NUM).", factory=read_cpu_num,
    )
    use_thread_barrier = Field(False, boolean(), "Threads meet at a barrier every step.")
    num_iteration_per_drop_scope = Field(
        100, integer(1, "set it to a positive number of steps, e.g. 100"),
        "Steps between clearing per-thread temporaries.",
    )
    num_iteration_per_run = Field(
        1, integer(1, "set it to a positive number of steps, e.g. 1"), "Steps per executor call."
    )


class ReduceStrategy(enum.IntEnum):
    """How a worker combines its threads' gradients (Paddle's values)."""

    AllReduce = 0  # every thread applies its own gradient to the shared parameters (Hogwild)
    Reduce = 1  # the threads' gradients are summed by a kernel and applied once


def _check_reduce_strategy(owner, name, value, obj):
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value in (0, 1):
        return ReduceStrategy(value)
    raise invalid(
        owner, name, value, "BuildStrategy.ReduceStrategy.AllReduce or .Reduce",
        "e.g. build_strategy.reduce_strategy = BuildStrategy.ReduceStrategy.Reduce",
    )


class BuildStrategy(Settings):
    """How a worker's program is built (Paddle's ``fluid.BuildStrategy``).

    Fields:
        reduce_strategy: ``BuildStrategy.ReduceStrategy.AllReduce`` (default: threads
            update shared parameters Hogwild-style) or ``.Reduce`` (the threads' gradients
            are reduced and applied once; the distributed strategies choose it when
            CPU_NUM > 1).
        async_mode: the program sends through a communicator (set by every strategy).
    """

    ReduceStrategy = ReduceStrategy

    reduce_strategy = Field(
        ReduceStrategy.AllReduce, _check_reduce_strategy,
        "AllReduce (Hogwild, default) or Reduce (reduce the threads' gradients, apply once).",
    )
    async_mode = Field(False, boolean(), "The program sends gradients through a communicator.")
