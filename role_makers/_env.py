"""Parsing helpers for role variables: endpoints, ports and indices, with RoleError messages.

Every message names the variable, the value seen and what was expected.
"""
from fleet.errors import RoleError

_EXAMPLE_LIST = "'127.0.0.1:6170,127.0.0.1:6171'"


def endpoint_problem(text):
    """Say what is wrong with one "host:port" string.

    Args:
        text: the candidate endpoint.

    Returns:
        str | None: a short description of the problem, or None if ``text`` is a valid
        "host:port" with a port in 1..65535.
    """
    if not text:
        return "an entry is empty"
    if text.count(":") != 1:
        return f"entry {text!r} must have exactly one ':' between host and port"
    host, port = text.split(":")
    if not host or host != host.strip():
        return f"entry {text!r} has an empty or blank-padded host"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return f"entry {text!r} has port {port!r}, expected an integer in 1..65535"
    return None


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
    entries = [part.strip() for part in text.split(",")]
    seen = set()
    for entry in entries:
        problem = endpoint_problem(entry)
        if problem is None and entry in seen:
            problem = f"entry {entry!r} appears twice"
        if problem is not None:
            raise RoleError(
                f"{name}={text!r} is not a comma list of host:port: {problem}; "
                f"set it like {_EXAMPLE_LIST}"
            )
        seen.add(entry)
    return entries


def parse_int(name, text, low, high, meaning):
    """Parse an integer variable that must lie in [low, high).

    Args:
        name: the variable name, for messages.
        text: the raw value.
        low: smallest allowed value.
        high: one past the largest allowed value, or None for no upper bound.
        meaning: what the variable is, e.g. "the number of workers", for messages.

    Returns:
        int: the value.

    Raises:
        RoleError: ``text`` is not a decimal integer or lies outside the range.
    """
    expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})"
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    value = int(stripped) if digits.isascii() and digits.isdigit() else None
    if value is None or value < low or (high is not None and value >= high):
        raise RoleError(f"{name}={text!r} is not {expected}; set it to {meaning}")
    return value


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
