"""Integer settings read from text (environment variables, role variables): one set of rules.

``parse_int`` accepts optional blanks around a decimal integer with an optional sign, and
checks a range; ``env_int`` reads a variable with a default. The messages name the
variable, the value seen, the range and what to set it to.
"""
import os

from fleet.errors import ConfigError


def parse_int(name, text, low, high, meaning, error=ConfigError):
    """Parse an integer that must lie in [low, high).

    Args:
        name: the variable name, for messages.
        text: the raw value.
        low: smallest allowed value.
        high: one past the largest allowed value, or None for no upper bound.
        meaning: what the value is, e.g. "the number of workers", for messages.
        error: the exception class to raise.

    Returns:
        int: the value.

    Raises:
        error: ``text`` is not a decimal integer or lies outside the range.
    """
    expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})"
    stripped = str(text).strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    value = int(stripped) if digits.isascii() and digits.isdigit() else None
    if value is None or value < low or (high is not None and value >= high):
        raise error(f"{name}={text!r} is not {expected}; set it to {meaning}")
    return value


def env_int(name, default, low=1, meaning="a positive integer", environ=None, error=ConfigError):
    """Read an integer environment variable that must be >= low.

    Args:
        name: the variable name.
        default: the value when the variable is unset or blank.
        low: the smallest allowed value.
        meaning: what to set it to, for the message.
        environ: the mapping to read (default ``os.environ``).
        error: the exception class to raise.

    Returns:
        int: the value, or ``default``.

    Raises:
        error: the variable is set to something other than an integer >= low; the message
            says to set it to ``meaning`` or unset it for ``default``.
    """
    text = (os.environ if environ is None else environ).get(name)
    if text is None or not text.strip():
        return default
    try:
        return parse_int(name, text, low, None, meaning, error)
    except error:
        raise error(f"{name}={text!r} is not an integer >= {low}; set {name} to {meaning}, or "
                    f"unset it to use the default {default}") from None
