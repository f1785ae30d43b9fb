"""Validated settings: the `Field` descriptor and the `Settings` base of every config class.

A config class declares its public keys as `Field`s. Assigning a field validates the value
(a `ConfigError` names the field, the value and the fix); assigning a public name that is
not a field is refused with Paddle's "<Class> doesn't have key: <name>" message, so a typo
never passes silently. Names starting with "_" are free for internal use.
"""
import copy
import numbers

import numpy as np

from fleet.errors import ConfigError


class Field:
    """A validated public setting of a `Settings` class.

    Args:
        default: the initial value (used when ``factory`` is None).
        check: ``check(owner_name, field_name, value, obj) -> value`` validating and
            normalising an assigned value; raises `ConfigError`.
        doc: one line on what the field means (shown by ``help()``).
        factory: optional zero-argument callable computing the initial value when an
            object is created (e.g. from the environment); replaces ``default``.
    """

    def __init__(self, default, check, doc="", factory=None):
        self.default = default
        self.factory = factory
        self.check = check
        self.__doc__ = doc
        self.name = None

    def __set_name__(self, owner, name):
        self.name = name

    def initial(self):
        """Returns: the initial value (from the factory when there is one)."""
        return self.factory() if self.factory is not None else self.default

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return obj.__dict__[self.name]

    def __set__(self, obj, value):
        obj.__dict__[self.name] = self.check(type(obj).__name__, self.name, value, obj)


class Settings:
    """Base of the config classes: fields, key checks, dict updates, a readable repr.

    Not thread-safe: configure before training starts.
    """

    # Extra names accepted by `update` (and as attributes): alias -> field name.
    _ALIASES = {}

    def __init__(self):
        for name, field in self._fields().items():
            # Defaults are trusted: written raw, so cross-field checks see a complete object.
            self.__dict__[name] = field.initial()

    @classmethod
    def _fields(cls):
        fields = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Field):
                    fields[name] = value
        return fields

    @classmethod
    def keys(cls):
        """Returns: the list of valid keys (field names), in declaration order."""
        return list(cls._fields())

    def _unknown_key(self, key):
        return ConfigError(
            f"{type(self).__name__} doesn't have key: {key}; valid keys: {', '.join(self.keys())}"
        )

    def __setattr__(self, name, value):
        if not name.startswith("_") and name not in self._fields():
            if not isinstance(getattr(type(self), name, None), property):
                raise self._unknown_key(name)
        object.__setattr__(self, name, value)

    def update(self, mapping):
        """Set several fields from a dict, all or nothing, in the dict's order.

        Args:
            mapping: dict of key -> value; keys are field names (or aliases).

        Raises:
            ConfigError: a key is not a field ("<Class> doesn't have key: <key>" plus the
                valid keys), or a value is invalid; nothing is changed then.
        """
        trial = copy.copy(self)
        for target in (trial, self):
            for key, value in mapping.items():
                if not isinstance(key, str):
                    raise self._unknown_key(repr(key))
                name = self._ALIASES.get(key, key)
                if name not in self._fields():
                    raise self._unknown_key(key)
                setattr(target, name, value)

    def to_dict(self):
        """Returns: a new dict of every field's current value."""
        return {name: getattr(self, name) for name in self._fields()}

    def __eq__(self, other):
        return type(other) is type(self) and other.to_dict() == self.to_dict()

    __hash__ = None

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({body})"


def invalid(owner, name, value, expected, fix):
    """The ConfigError for a bad field value: names owner.field, the value, what was expected, the fix."""
    return ConfigError(f"{owner}.{name}={value!r} is invalid: expected {expected}; {fix}")


def boolean(fix=None):
    """A check accepting True/False (also numpy bools and the ints 0 and 1)."""

    def check(owner, name, value, obj):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)
        raise invalid(owner, name, value, "True or False", fix or f"set {name} = True or False")

    return check


def integer(minimum, fix, maximum=None):
    """A check accepting an int (not a bool) in [minimum, maximum]."""
    expected = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"

    def check(owner, name, value, obj):
        if (
            isinstance(value, numbers.Integral)
            and not isinstance(value, (bool, np.bool_))
            and value >= minimum
            and (maximum is None or value <= maximum)
        ):
            return int(value)
        raise invalid(owner, name, value, expected, fix)

    return check


def choice(options, fix):
    """A check accepting one of ``options`` (compared with ==)."""

    def check(owner, name, value, obj):
        if any(type(value) is type(option) and value == option for option in options):
            return value
        expected = "one of " + ", ".join(repr(o) for o in options)
        raise invalid(owner, name, value, expected, fix)

    return check
