"""Layer 2: admission entries (Paddle 2.x names), the CTR accessor config and the admission filter.

An entry says when a sparse table creates the row of an id it has not seen before:

- ``CountFilterEntry(count_filter)``: once the id was seen ``count_filter`` times in
  training lookups (the lookup reaching the count creates the row);
- ``ProbabilityEntry(probability)``: each training lookup of an id without a row creates
  it with that probability (a deterministic hash coin, so runs repeat);
- ``ShowClickEntry(show_name, click_name)``: show and click come from two model inputs;
  a lookup creates the row by the CTR accessor's rule on the batch's show and click
  sums for the id: score <= 0 never, >= 1 always, in between with probability score.

``_to_attr()`` gives Paddle's attribute strings ("count_filter_entry:10",
"probability_entry:0.1", "show_click_entry:show:click") and ``entry_from_attr`` parses
them back. ``CtrAccessorConfig`` holds Paddle's CtrCommonAccessor parameters with its
defaults. ``AdmissionFilter`` counts the candidates of one table in a fixed-memory
count-min sketch (``fleet.kernels.admission``: uint8 counters, ``depth`` x ``width``
bytes) and decides admissions.
"""
import dataclasses
import math
import numbers

import numpy as np

from fleet.errors import ConfigError, DataError
from fleet.kernels import admission

DEFAULT_SKETCH_WIDTH = 1 << 22
"""Counters per sketch row: 4 rows x 4 Mi x 1 byte = 16 MiB per table (and server shard)."""
DEFAULT_SKETCH_DEPTH = 4
"""Sketch rows (hash functions)."""


class _Entry:
    """Base of the entries (each defines ``_to_attr``): equality and repr by the attribute string."""

    def __eq__(self, other):
        return isinstance(other, _Entry) and self._to_attr() == other._to_attr()

    def __hash__(self):
        return hash(self._to_attr())

    def __repr__(self):
        return f"entry_from_attr({self._to_attr()!r})"


class CountFilterEntry(_Entry):
    """Creates a row once its id was seen ``count_filter`` times in training lookups.

    Args:
        count_filter: int, 1 .. 255 (the sketch's counters saturate at 255).

    Raises:
        ConfigError: ``count_filter`` is not such an int.
    """

    def __init__(self, count_filter):
        if (isinstance(count_filter, bool) or not isinstance(count_filter, numbers.Integral)
                or not 1 <= count_filter <= admission.MAX_COUNT):
            raise ConfigError(
                f"CountFilterEntry(count_filter={count_filter!r}): count_filter must be an int from 1 to "
                f"{admission.MAX_COUNT} (the number of sightings that creates a row); e.g. CountFilterEntry(2)"
            )
        self._name = "count_filter_entry"
        self._count_filter = int(count_filter)

    @property
    def count_filter(self):
        return self._count_filter

    def _to_attr(self):
        return f"{self._name}:{self._count_filter}"


class ProbabilityEntry(_Entry):
    """Each training lookup of an id without a row creates it with probability ``probability``.

    Args:
        probability: a number, 0 < probability <= 1.

    Raises:
        ConfigError: ``probability`` is not such a number.
    """

    def __init__(self, probability):
        if (isinstance(probability, bool) or not isinstance(probability, numbers.Real)
                or not 0.0 < float(probability) <= 1.0):
            raise ConfigError(
                f"ProbabilityEntry(probability={probability!r}): probability must be a number in (0, 1] "
                f"(the chance that a lookup creates the row); e.g. ProbabilityEntry(0.1)"
            )
        self._name = "probability_entry"
        self._probability = float(probability)

    @property
    def probability(self):
        return self._probability

    def _to_attr(self):
        return f"{self._name}:{self._probability}"


class ShowClickEntry(_Entry):
    """Statistics from the model inputs ``show_name`` and ``click_name``; admission by CTR score.

    Args:
        show_name, click_name: names of two float or int [batch, 1] inputs (no ":" in them).

    Raises:
        ConfigError: a name is not a non-empty str without ":".
    """

    def __init__(self, show_name, click_name):
        for what, name in (("show_name", show_name), ("click_name", click_name)):
            if not isinstance(name, str) or not name or ":" in name:
                raise ConfigError(
                    f"ShowClickEntry({what}={name!r}): {what} must be the name (a non-empty str "
                    f"without ':') of a model input; e.g. ShowClickEntry('show', 'click')"
                )
        self._name = "show_click_entry"
        self._show_name = show_name
        self._click_name = click_name

    @property
    def show_name(self):
        return self._show_name

    @property
    def click_name(self):
        return self._click_name

    def _to_attr(self):
        return f"{self._name}:{self._show_name}:{self._click_name}"


_ATTR_FORMS = '"count_filter_entry:N", "probability_entry:P" or "show_click_entry:SHOW:CLICK"'


def entry_from_attr(attr):
    """Returns the entry an attribute string describes (the inverse of ``_to_attr``).

    ``None``, "" and "none" give None (no entry).

    Raises:
        ConfigError: the string is none of the forms (the message shows them).
    """
    if attr is None or attr in ("", "none"):
        return None
    if not isinstance(attr, str):
        raise ConfigError(f"entry attribute {attr!r} is not a str; use {_ATTR_FORMS}")
    name, _, rest = attr.partition(":")
    try:
        if name == "count_filter_entry" and rest.isdigit():
            return CountFilterEntry(int(rest))
        if name == "probability_entry" and rest:
            return ProbabilityEntry(float(rest))
        if name == "show_click_entry" and rest.count(":") == 1:
            return ShowClickEntry(*rest.split(":"))
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"entry attribute {attr!r} has a bad value: {e}") from e
    raise ConfigError(f"entry attribute {attr!r} is not one of {_ATTR_FORMS}")


# ------------------------------------------------------------------------ CTR accessor config


@dataclasses.dataclass(frozen=True)
class CtrAccessorConfig:
    """Paddle's CtrCommonAccessor parameters (its defaults); frozen and validated.

    score(show, click) = (show - click) * nonclk_coeff + click * click_coeff.
    ``shrink`` decays show and click by ``show_click_decay_rate``, ages unseen_days and
    deletes rows with score < ``delete_threshold`` or unseen_days >
    ``delete_after_unseen_days``; a base save (mode 2) keeps rows with score >=
    ``base_threshold`` and unseen_days <= ``delta_keep_days``. ``delta_threshold`` is
    kept for Paddle compatibility (its delta saves filter on it; ours save every changed row).

    Raises:
        ConfigError: a field is not a finite number >= 0, or the decay rate is not in (0, 1].
    """

    nonclk_coeff: float = 0.1
    click_coeff: float = 1.0
    base_threshold: float = 1.5
    delta_threshold: float = 0.25
    delta_keep_days: float = 16
    show_click_decay_rate: float = 0.98
    delete_threshold: float = 0.8
    delete_after_unseen_days: float = 30

    def __post_init__(self):
        defaults = CtrAccessorConfig.__dataclass_fields__
        for field in defaults:
            value = getattr(self, field)
            if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                    or not math.isfinite(value) or value < 0):
                raise ConfigError(
                    f"CtrAccessorConfig {field}={value!r}: must be a finite number >= 0 "
                    f"(default {defaults[field].default})"
                )
            object.__setattr__(self, field, float(value))
        if not 0.0 < self.show_click_decay_rate <= 1.0:
            raise ConfigError(
                f"CtrAccessorConfig show_click_decay_rate={self.show_click_decay_rate!r}: must be in (0, 1] "
                f"(the factor show and click are multiplied by per shrink; default 0.98)"
            )

    @classmethod
    def field_names(cls):
        """The field names, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, fields):
        """Returns a config from {name: value}; names may carry Paddle 2.x's "sparse_" prefix.

        Raises:
            ConfigError: an unknown name (the message lists the valid ones), a name given
                twice (with and without the prefix), or a bad value.
        """
        valid = cls.field_names()
        kwargs = {}
        for key, value in dict(fields).items():
            name = key[len("sparse_"):] if isinstance(key, str) and key.startswith("sparse_") else key
            if name not in valid:
                raise ConfigError(
                    f"CTR accessor field {key!r} is unknown; valid fields are {', '.join(valid)} "
                    f"(each also with a 'sparse_' prefix)"
                )
            if name in kwargs:
                raise ConfigError(f"CTR accessor field {name!r} is given twice (with and without 'sparse_')")
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self):
        """Returns {field: value}."""
        return dataclasses.asdict(self)

    def replace(self, **fields):
        """Returns a copy with ``fields`` changed (validated; "sparse_" names accepted)."""
        merged = self.to_dict()
        for key, value in fields.items():
            merged[key[len("sparse_"):] if isinstance(key, str) and key.startswith("sparse_") else key] = value
        return self.from_dict(merged)

    def score(self, show, click):
        """Returns (show - click) * nonclk_coeff + click * click_coeff (numbers or arrays)."""
        return (show - click) * self.nonclk_coeff + click * self.click_coeff


# ------------------------------------------------------------------------- admission filter


class AdmissionFilter:
    """Decides which ids without a row a training lookup creates, counting candidates in a sketch.

    Not thread-safe: the owning table calls it under its lock. Memory is fixed:
    ``depth * width`` bytes whatever the number of candidates.

    Args:
        entry: a CountFilterEntry, ProbabilityEntry or ShowClickEntry.
        seed: the table's seed (hashes and coins derive from it, so runs repeat).
        accessor: CtrAccessorConfig for ShowClickEntry's score (None: the defaults).
        width: counters per sketch row, a power of two >= 16.
        depth: sketch rows, 1 .. 16.

    Raises:
        ConfigError: not an entry, or a bad width or depth.
    """

    def __init__(self, entry, seed=0, accessor=None, width=DEFAULT_SKETCH_WIDTH, depth=DEFAULT_SKETCH_DEPTH):
        if not isinstance(entry, _Entry):
            raise ConfigError(f"entry {entry!r} is not a CountFilterEntry, ProbabilityEntry or ShowClickEntry")
        width, depth = int(width), int(depth)
        if width < 16 or width & (width - 1):
            raise ConfigError(f"admission sketch width {width} must be a power of two >= 16; e.g. {1 << 22}")
        if not 1 <= depth <= 16:
            raise ConfigError(f"admission sketch depth {depth} must be from 1 to 16; e.g. 4")
        self.entry = entry
        self.seed = int(seed)
        self.accessor = accessor if accessor is not None else CtrAccessorConfig()
        self.width, self.depth = width, depth
        self._skey = admission.sketch_key(self.seed)
        self._ckey = admission.coin_key(self.seed)
        self._counters = np.zeros((depth, width), dtype=np.uint8)
        if isinstance(entry, CountFilterEntry):
            self._kind, self._count, self._p = admission.ENTRY_COUNT_FILTER, entry.count_filter, 0.0
        elif isinstance(entry, ProbabilityEntry):
            self._kind, self._count, self._p = admission.ENTRY_PROBABILITY, 0, entry.probability
        else:
            self._kind, self._count, self._p = admission.ENTRY_SHOW_CLICK, 0, 0.0

    def admit(self, ids, shows=None, clicks=None):
        """Returns a bool [n] mask: which ids (unique, none with a row) this lookup creates.

        Counts the ids not admitted as candidates (see ``fleet.kernels.admission.admit_ids``).

        Args:
            ids: int64 [n] unique ids that have no row.
            shows: float32 [n] sightings (occurrences or the show input's sum; None: 1 each).
            clicks: float32 [n] (None: 0).
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        shows = float_column(shows, len(ids), 1.0)
        clicks = float_column(clicks, len(ids), 0.0)
        out = np.empty(len(ids), dtype=np.bool_)
        admission.admit_ids(self._counters, self._skey, self._ckey, self._kind, ids, shows, clicks,
                            self._count, self._p, self.accessor.nonclk_coeff, self.accessor.click_coeff, out)
        return out

    def estimate(self, ids):
        """Returns int64 [n]: each id's counted sightings (an upper bound until saturation or decay)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty(len(ids), dtype=np.int64)
        admission.sketch_estimate(self._counters, self._skey, ids, out)
        return out

    def decay(self, rate):
        """Multiplies every counter by ``rate`` (in [0, 1]), rounding down, so old candidates fade.

        Raises:
            ConfigError: ``rate`` is outside [0, 1].
        """
        rate = float(rate)
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"admission sketch decay rate {rate} must be in [0, 1]")
        admission.sketch_decay(self._counters, rate)

    def memory_bytes(self):
        """Bytes of the sketch (fixed: depth * width)."""
        return self._counters.nbytes

    def state_dict(self):
        """Returns {"sketch": uint8 [depth, width] copy}."""
        return {"sketch": self._counters.copy()}

    def load_state_dict(self, state):
        """Restores the counters of ``state_dict()``.

        Raises:
            ConfigError: no "sketch", or its shape or dtype differs from this filter's.
        """
        if "sketch" not in state:
            raise ConfigError(f"admission state has no 'sketch'; keys are {sorted(state)}")
        sketch = np.asarray(state["sketch"])
        if sketch.shape != self._counters.shape or sketch.dtype != np.uint8:
            raise ConfigError(
                f"admission sketch to load is {sketch.dtype}{list(sketch.shape)}, expected "
                f"uint8{list(self._counters.shape)} (same width and depth)"
            )
        self._counters[...] = sketch

    def __repr__(self):
        return f"AdmissionFilter({self.entry!r}, seed={self.seed}, width={self.width}, depth={self.depth})"


def float_column(values, n, default, what="shows/clicks", owner=""):
    """float32 [n] of ``values`` (None: ``default`` for every id), for the shows or clicks of
    ``n`` ids; ``owner`` prefixes the error (e.g. "sparse table 'emb': ").

    Raises:
        DataError: not one value per id (names ``what`` and the counts).
    """
    if values is None:
        return np.full(n, default, dtype=np.float32)
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    if len(values) != n:
        raise DataError(f"{owner}{what} has {len(values)} entries for {n} ids; give one per id")
    return values
