"""Places (Paddle's device handles). fleet runs on CPUs; CPUPlace exists so Paddle scripts
that pass ``fluid.CPUPlace()`` to the Executor run unchanged."""


class CPUPlace:
    """The CPU: the only place fleet runs on."""

    def __repr__(self):
        return "CPUPlace"
