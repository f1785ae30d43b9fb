"""Parsing helpers for role variables: endpoints, ports and indices, with RoleError messages.

The rules are fleet's one set (`fleet.endpoints`, `fleet.envvars`); these wrappers only
make the errors RoleErrors. Every message names the variable, the value seen and what was
expected.
"""
import fleet.endpoints as endpoints
import fleet.envvars as envvars
from fleet.errors import RoleError

endpoint_problem = endpoints.endpoint_problem


def parse_endpoint_list(name, text):
    """Parse a comma list of "host:port" (spaces around entries are ignored).

    Args:
        name: the variable the text came from, for messages.
        text: the raw value.

    Returns:
        list[str]: the endpoints, in order, each "host:port".

    Raises:
        RoleError: an entry is empty or not host:port, a port is outside 1..65535, or an
            endpoint appears twice.
    """
    return endpoints.parse_endpoint_list(text, name, RoleError)


def parse_int(name, text, low, high, meaning):
    """Parse an integer variable that must lie in [low, high) (RoleError otherwise).

    See `fleet.envvars.parse_int`.
    """
    return envvars.parse_int(name, text, low, high, meaning, RoleError)


def require(environ, name, needed_by, meaning):
    """Read a variable that must be set.

    Args:
        environ: the environment mapping (usually ``os.environ``).
        name: the variable name.
        needed_by: who needs it, e.g. "TRAINING_ROLE=TRAINER", for messages.
        meaning: what to set it to, for messages.

    Returns:
        str: the raw value.

    Raises:
        RoleError: the variable is not set.
    """
    value = environ.get(name)
    if value is None:
        raise RoleError(f"{name} is not set, but {needed_by} needs it; set it to {meaning}")
    return value
