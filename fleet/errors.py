"""The exception family of fleet.

Every error a user can see is one of these (or a builtin ``TypeError`` where Paddle
raises one and scripts may catch it). Each message names the bad value and the fix.
The classes also derive from the builtin Paddle raised in the same situation
(``ValueError``, ``RuntimeError``, ``TimeoutError``) so code written for Paddle that
catches those keeps working.
"""


class FleetError(Exception):
    """Base class of every fleet error."""


class EOFException(FleetError):
    """A started non-iterable reader (``fluid.io.PyReader`` / ``DataLoader.from_generator(
    iterable=False)``) has no batch left: ``exe.run`` raises it (Paddle's
    ``fluid.core.EOFException``); call the reader's ``reset()`` before starting it again."""


class ConfigError(FleetError, ValueError):
    """A setting (strategy, config, argument) has a value fleet cannot use."""


class RoleError(FleetError, ValueError):
    """The role of this process cannot be determined (bad or missing environment)."""


class DataError(FleetError, ValueError):
    """Input data is malformed; the message names file, line and field."""


class TransportError(FleetError, ConnectionError):
    """A message could not be sent, received or decoded."""


class FleetTimeoutError(TransportError, TimeoutError):
    """A blocking wait ran out of time; the message names who did not answer."""


class ServerLostError(FleetTimeoutError):
    """A parameter server stopped answering heartbeats: it is dead, stuck or unreachable.

    Args:
        endpoint: "host:port" of the server that went silent.
        message: the whole description (names the endpoint, how long and the setting).
    """

    def __init__(self, endpoint, message):
        self.endpoint = endpoint
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.endpoint, self.args[0]))


class ServerError(FleetError, RuntimeError):
    """A parameter server answered a request with an error.

    Args:
        endpoint: "host:port" of the server that answered.
        message: the server's own description of what went wrong.
    """

    def __init__(self, endpoint, message):
        self.endpoint = endpoint
        self.message = message
        super().__init__(f"server {endpoint} failed: {message}")

    def __reduce__(self):
        return (type(self), (self.endpoint, self.message))


class PeerLostError(FleetTimeoutError):
    """A worker of a worker group (``fleet.transport.group``) died or became unreachable.

    Args:
        rank: the rank of the worker that was lost.
        endpoint: its "host:port".
        message: the whole description (names the rank, the endpoint, how it was noticed
            and the setting that bounds it).
    """

    def __init__(self, rank, endpoint, message):
        self.rank = rank
        self.endpoint = endpoint
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.rank, self.endpoint, self.args[0]))


class RendezvousError(FleetError, ConnectionError):
    """The etcd rendezvous of ``fleetrun --elastic_server`` failed: etcd did not answer or
    refused a request, the job did not gather in time, or its membership changed. The
    message names etcd's endpoint and the job."""
