"""Transport settings read from the environment (listed in docs/env.md).

Every value is read when it is needed (not at import), so a test or a launcher can set
the variable before creating sockets.
"""
import os

from fleet.errors import ConfigError

RPC_TIMEOUT_MS_ENV = "FLEET_RPC_TIMEOUT_MS"
CONNECT_TIMEOUT_MS_ENV = "FLEET_CONNECT_TIMEOUT_MS"
MAX_MESSAGE_BYTES_ENV = "FLEET_MAX_MESSAGE_BYTES"

DEFAULT_RPC_TIMEOUT_MS = 60_000
DEFAULT_CONNECT_TIMEOUT_MS = 60_000
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


def rpc_timeout_ms():
    """Default time a request waits for its reply: FLEET_RPC_TIMEOUT_MS (60000)."""
    return _positive_int(RPC_TIMEOUT_MS_ENV, DEFAULT_RPC_TIMEOUT_MS)


def connect_timeout_ms():
    """Default time ``wait_for_servers`` waits for every server: FLEET_CONNECT_TIMEOUT_MS (60000)."""
    return _positive_int(CONNECT_TIMEOUT_MS_ENV, DEFAULT_CONNECT_TIMEOUT_MS)


def max_message_bytes():
    """Largest message (header + arrays) sent or accepted: FLEET_MAX_MESSAGE_BYTES (1 GiB)."""
    return _positive_int(MAX_MESSAGE_BYTES_ENV, DEFAULT_MAX_MESSAGE_BYTES)


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
