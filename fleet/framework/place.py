"""Places (Paddle's device handles). fleet runs on CPUs; CPUPlace exists so Paddle scripts
that pass ``fluid.CPUPlace()`` to the Executor run unchanged (and the GPU places of
fleet.fluid, which are CPUPlaces, so GPU scripts do)."""
import logging
import threading

log = logging.getLogger("fleet")
_said = threading.Event()


def say_on_the_cpu(what):
    """Warns, once per process, that ``what`` (a GPU place or option) runs on the CPU."""
    if not _said.is_set():
        _said.set()
        log.warning("%s: fleet has no GPU kernels; this process computes on its CPUs (fluid.CPUPlace() says so "
                    "without this warning; CPU_NUM sets the data-parallel replicas)", what)


class CPUPlace:
    """The CPU: the only place fleet runs on."""

    def __repr__(self):
        return "CPUPlace"
