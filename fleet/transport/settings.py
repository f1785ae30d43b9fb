"""Transport settings read from the environment (listed in docs/env.md).

Every value is read when it is needed (not at import), so a test or a launcher can set
the variable before creating sockets.
"""
import ipaddress
import os

from fleet.errors import ConfigError

RPC_TIMEOUT_MS_ENV = "FLEET_RPC_TIMEOUT_MS"
CONNECT_TIMEOUT_MS_ENV = "FLEET_CONNECT_TIMEOUT_MS"
MAX_MESSAGE_BYTES_ENV = "FLEET_MAX_MESSAGE_BYTES"
HEARTBEAT_MS_ENV = "FLEET_HEARTBEAT_MS"
HEARTBEAT_TIMEOUT_MS_ENV = "FLEET_HEARTBEAT_TIMEOUT_MS"
BIND_HOST_ENV = "FLEET_BIND_HOST"

DEFAULT_RPC_TIMEOUT_MS = 60_000
DEFAULT_CONNECT_TIMEOUT_MS = 60_000
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
DEFAULT_HEARTBEAT_MS = 1_000
DEFAULT_HEARTBEAT_TIMEOUT_MS = 15_000


def rpc_timeout_ms():
    """Default time a request waits for its reply: FLEET_RPC_TIMEOUT_MS (60000)."""
    return _positive_int(RPC_TIMEOUT_MS_ENV, DEFAULT_RPC_TIMEOUT_MS)


def connect_timeout_ms():
    """Default time ``wait_for_servers`` waits for every server: FLEET_CONNECT_TIMEOUT_MS (60000)."""
    return _positive_int(CONNECT_TIMEOUT_MS_ENV, DEFAULT_CONNECT_TIMEOUT_MS)


def max_message_bytes():
    """Largest message (header + arrays) sent or accepted: FLEET_MAX_MESSAGE_BYTES (1 GiB)."""
    return _positive_int(MAX_MESSAGE_BYTES_ENV, DEFAULT_MAX_MESSAGE_BYTES)


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


def bind_host():
    """The address a server binds instead of its endpoint's host: FLEET_BIND_HOST (unset).

    In Kubernetes a server's endpoint is its pod's DNS name, which ZeroMQ cannot bind (it
    binds addresses and interface names, never names it would have to resolve), and which
    exists only once the pod has an IP; such a server binds ``0.0.0.0`` while its endpoint,
    as workers know it, stays the DNS name.

    Returns:
        str | None: an IPv4 address, or None to bind the endpoint's own host.

    Raises:
        ConfigError: the value is not an IPv4 address.
    """
    text = os.environ.get(BIND_HOST_ENV, "").strip()
    if not text:
        return None
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        raise ConfigError(
            f"{BIND_HOST_ENV}={text!r} is not an IPv4 address; set it to 0.0.0.0 (every interface of this "
            "machine) or to one of its addresses, or unset it to bind the host of the server's endpoint"
        ) from None
    return text


def _positive_int(name, default):
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{name}={text!r} is not a positive integer; unset it to use the default {default}")
    return value
