"""Endpoints ("host:port"): the one parser role makers, strategies, transport and launch share.

Rules, everywhere an endpoint is read:

- ``host:port`` with exactly one ``:`` between them; an IPv6 host goes in brackets
  (``[fd00::1]:6170``), and ``split_endpoint`` returns it without them;
- the host is not empty and has no blanks; a name (``server-0.job``) is fine, it is
  resolved by whoever connects;
- the port is decimal digits in 1..65535 (0, "any free port", only where a caller asks
  for it: a socket bound for a test).

Each caller words its own error (a role maker names the variable, fleetrun the option);
the problem phrases come from `endpoint_problem`, so the same text gets the same verdict.
"""
from fleet.errors import ConfigError

EXAMPLE = "127.0.0.1:6170"


def split_endpoint(text):
    """(host, port text) of an endpoint, brackets of an IPv6 host removed; no checks.

    Args:
        text: the endpoint.

    Returns:
        (str, str), or None when the text has no ``:`` separating a port.
    """
    text = str(text)
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1:close + 2] != ":":
            return None
        return text[1:close], text[close + 2:]
    host, sep, port = text.rpartition(":")
    return (host, port) if sep else None


def endpoint_problem(text, allow_port_zero=False):
    """What is wrong with one "host:port" text, as a phrase, or None if nothing is.

    Args:
        text: the candidate endpoint.
        allow_port_zero: accept port 0 ("any free port", for sockets bound in tests).

    Returns:
        str | None: e.g. "entry '10.0.0.1' must have exactly one ':' between host and port".
    """
    if not isinstance(text, str):
        return f"entry {text!r} is not a string"
    if not text:
        return "an entry is empty"
    parts = split_endpoint(text)
    if parts is None or (not text.startswith("[") and text.count(":") != 1):
        return (f"entry {text!r} must have exactly one ':' between host and port "
                "(an IPv6 host goes in brackets: [fd00::1]:6170)")
    host, port = parts
    if not host or any(c.isspace() for c in host):
        return f"entry {text!r} has an empty or blank-padded host"
    low = 0 if allow_port_zero else 1
    if not (port.isascii() and port.isdigit()) or not low <= int(port) <= 65535:
        return f"entry {text!r} has port {port!r}, expected an integer in {low}..65535"
    return None


def parse_endpoint(text, what="endpoint", error=ConfigError, allow_port_zero=False):
    """Split a checked "host:port" into (host, port).

    Args:
        text: the endpoint.
        what: how to name it in an error, e.g. "--servers entry" or "server 1's endpoint".
        error: the exception class to raise (a FleetError subclass).
        allow_port_zero: accept port 0.

    Returns:
        (str, int): the host (IPv6 without brackets) and the port.

    Raises:
        error: the text breaks a rule; the message names it and shows an example.
    """
    problem = endpoint_problem(text, allow_port_zero)
    if problem is not None:
        raise error(f"{what} {text!r} is not host:port: {problem}; write it like {EXAMPLE}")
    host, port = split_endpoint(text)
    return host, int(port)


def join_endpoint(host, port):
    """"host:port", an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint_list(text, what, error=ConfigError):
    """A comma list of "host:port" (blanks around entries ignored), each once.

    Args:
        text: the raw list.
        what: how to name it in an error, e.g. "PADDLE_TRAINER_ENDPOINTS" or "--servers".
        error: the exception class to raise.

    Returns:
        list[str]: the endpoints, in order.

    Raises:
        error: an entry is malformed or appears twice.
    """
    entries = [part.strip() for part in str(text).split(",")]
    seen = set()
    for entry in entries:
        problem = endpoint_problem(entry)
        if problem is None and entry in seen:
            problem = f"entry {entry!r} appears twice"
        if problem is not None:
            raise error(f"{what}={text!r} is not a comma list of host:port: {problem}; "
                        f"set it like '{EXAMPLE},127.0.0.1:6171'")
        seen.add(entry)
    return entries
