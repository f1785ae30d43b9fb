"""Transport settings read from the environment (listed in docs/env.md).

Every value is read when it is needed (not at import), so a test or a launcher can set
the variable before creating sockets.
"""
import ipaddress
import os

from fleet.envvars import env_int
from fleet.errors import ConfigError

RPC_TIMEOUT_MS_ENV = "FLEET_RPC_TIMEOUT_MS"
CONNECT_TIMEOUT_MS_ENV = "FLEET_CONNECT_TIMEOUT_MS"
MAX_MESSAGE_BYTES_ENV = "FLEET_MAX_MESSAGE_BYTES"
HEARTBEAT_MS_ENV = "FLEET_HEARTBEAT_MS"
HEARTBEAT_TIMEOUT_MS_ENV = "FLEET_HEARTBEAT_TIMEOUT_MS"
BIND_HOST_ENV = "FLEET_BIND_HOST"
WORKER_CONNECT_TIMEOUT_MS_ENV = "FLEET_WORKER_CONNECT_TIMEOUT_MS"

DEFAULT_RPC_TIMEOUT_MS = 60_000
DEFAULT_CONNECT_TIMEOUT_MS = 60_000
DEFAULT_WORKER_CONNECT_TIMEOUT_MS = 600_000
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
DEFAULT_HEARTBEAT_MS = 1_000
DEFAULT_HEARTBEAT_TIMEOUT_MS = 15_000


def rpc_timeout_ms():
    """Default time a request waits for its reply: FLEET_RPC_TIMEOUT_MS (60000)."""
    return _positive_int(RPC_TIMEOUT_MS_ENV, DEFAULT_RPC_TIMEOUT_MS)


def connect_timeout_ms():
    """Default time ``wait_for_servers`` waits for every server: FLEET_CONNECT_TIMEOUT_MS (60000)."""
    return _positive_int(CONNECT_TIMEOUT_MS_ENV, DEFAULT_CONNECT_TIMEOUT_MS)


def worker_connect_timeout_ms():
    """How long a server waits for each worker's first message before it fails the job
    naming the workers that never came: FLEET_WORKER_CONNECT_TIMEOUT_MS (600000; schedulers
    may start a job's processes minutes apart)."""
    return _positive_int(WORKER_CONNECT_TIMEOUT_MS_ENV, DEFAULT_WORKER_CONNECT_TIMEOUT_MS)


def max_message_bytes():
    """Largest message (header + arrays) sent or accepted: FLEET_MAX_MESSAGE_BYTES (1 GiB)."""
    return _positive_int(MAX_MESSAGE_BYTES_ENV, DEFAULT_MAX_MESSAGE_BYTES)


def bind_host():
    """FLEET_BIND_HOST: the address servers bind instead of their endpoint's host, or None.

    For an endpoint address the host is known by but does not carry (NAT, a Kubernetes
    Service name): "0.0.0.0" (or "::") binds every interface while workers keep connecting to
    the advertised endpoint. Unset (the default): bind the endpoint's own host.

    Raises:
        ConfigError: the value is not an IP address.
    """
    text = os.environ.get(BIND_HOST_ENV, "").strip()
    if not text:
        return None
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise ConfigError(f"{BIND_HOST_ENV}={text!r} is not an IP address; set it to 0.0.0.0 (every "
                          "IPv4 interface), :: or an address of this host, or unset it to bind the "
                          "endpoint's own host") from None


def heartbeat_ms():
    """How often a worker pings each server: FLEET_HEARTBEAT_MS (1000)."""
    return heartbeat_settings()[0]


def heartbeat_timeout_ms():
    """Silence after which a peer counts as dead: FLEET_HEARTBEAT_TIMEOUT_MS (15000)."""
    return heartbeat_settings()[1]


def heartbeat_settings():
    """Returns (interval_ms, timeout_ms) of the heartbeats, checked together.

    Raises:
        ConfigError: a value is not a positive integer, or the timeout is shorter than
            two intervals (one late heartbeat would then count as a dead peer).
    """
    interval = _positive_int(HEARTBEAT_MS_ENV, DEFAULT_HEARTBEAT_MS)
    timeout = _positive_int(HEARTBEAT_TIMEOUT_MS_ENV, DEFAULT_HEARTBEAT_TIMEOUT_MS)
    if timeout < 2 * interval:
        raise ConfigError(
            f"{HEARTBEAT_TIMEOUT_MS_ENV}={timeout} is shorter than two heartbeats of {HEARTBEAT_MS_ENV}={interval}: "
            f"one late heartbeat would count as a dead peer; make the timeout at least {2 * interval} "
            f"(the defaults are {DEFAULT_HEARTBEAT_MS} and {DEFAULT_HEARTBEAT_TIMEOUT_MS})")
    return interval, timeout


def _positive_int(name, default):
    return env_int(name, default, 1, _MEANINGS.get(name, "a positive integer"))


_MEANINGS = {
    RPC_TIMEOUT_MS_ENV: "the milliseconds a request waits for its reply",
    CONNECT_TIMEOUT_MS_ENV: "the milliseconds a worker waits for every server",
    MAX_MESSAGE_BYTES_ENV: "the largest message in bytes",
    HEARTBEAT_MS_ENV: "the milliseconds between heartbeats",
    HEARTBEAT_TIMEOUT_MS_ENV: "the milliseconds of silence after which a peer counts as dead",
    WORKER_CONNECT_TIMEOUT_MS_ENV: "the milliseconds a server waits for each worker's first message",
}
