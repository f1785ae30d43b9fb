"""fleet.entries: Paddle 2.x entries and their attribute strings, the CTR accessor config, admission."""
import math

import numpy as np
import pytest

from fleet.entries import (
    AdmissionFilter,
    CountFilterEntry,
    CtrAccessorConfig,
    ProbabilityEntry,
    ShowClickEntry,
    entry_from_attr,
)
from fleet.errors import ConfigError


def test_entries_give_paddles_attribute_strings_and_parse_back():
    cases = {
        "count_filter_entry:10": CountFilterEntry(10),
        "probability_entry:0.1": ProbabilityEntry(0.1),
        "probability_entry:1.0": ProbabilityEntry(1),
        "show_click_entry:show:click": ShowClickEntry("show", "click"),
    }
    for attr, entry in cases.items():
        assert entry._to_attr() == attr
        assert entry_from_attr(attr) == entry
    assert entry_from_attr(None) is None and entry_from_attr("none") is None
    assert CountFilterEntry(3).count_filter == 3 and ProbabilityEntry(0.5).probability == 0.5
    assert ShowClickEntry("s", "c").show_name == "s" and ShowClickEntry("s", "c").click_name == "c"


@pytest.mark.parametrize("make,message", [
    (lambda: CountFilterEntry(0), "CountFilterEntry(count_filter=0): count_filter must be an int from 1 to 255"),
    (lambda: CountFilterEntry(2.5), "count_filter=2.5"),
    (lambda: CountFilterEntry(True), "count_filter=True"),
    (lambda: CountFilterEntry(256), "from 1 to 255"),
    (lambda: ProbabilityEntry(0), "ProbabilityEntry(probability=0): probability must be a number in (0, 1]"),
    (lambda: ProbabilityEntry(1.5), "probability=1.5"),
    (lambda: ProbabilityEntry("0.1"), "probability='0.1'"),
    (lambda: ShowClickEntry("show", 3), "ShowClickEntry(click_name=3): click_name must be the name"),
    (lambda: ShowClickEntry("a:b", "c"), "show_name='a:b'"),
    (lambda: entry_from_attr("count_entry:3"), "entry attribute 'count_entry:3' is not one of"),
    (lambda: entry_from_attr("probability_entry:2"), "entry attribute 'probability_entry:2' has a bad value"),
    (lambda: entry_from_attr("count_filter_entry:x"), "is not one of"),
])
def test_bad_entries_raise_config_errors_that_are_value_errors_naming_the_value(make, message):
    with pytest.raises(ConfigError) as info:
        make()
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_ctr_accessor_config_has_paddles_defaults_and_score():
    config = CtrAccessorConfig()
    assert config.to_dict() == {
        "nonclk_coeff": 0.1, "click_coeff": 1.0, "base_threshold": 1.5, "delta_threshold": 0.25,
        "delta_keep_days": 16.0, "show_click_decay_rate": 0.98, "delete_threshold": 0.8,
        "delete_after_unseen_days": 30.0,
    }
    assert config.score(10.0, 2.0) == pytest.approx(8 * 0.1 + 2.0)
    np.testing.assert_allclose(config.score(np.array([1.0, 5.0]), np.array([0.0, 1.0])), [0.1, 1.4])
    with pytest.raises(AttributeError):
        config.click_coeff = 2.0


def test_ctr_accessor_config_from_dict_accepts_paddles_sparse_prefixed_names():
    config = CtrAccessorConfig.from_dict({"sparse_show_click_decay_rate": 0.5, "delete_threshold": 0.1})
    assert config.show_click_decay_rate == 0.5 and config.delete_threshold == 0.1
    assert config.replace(sparse_click_coeff=2).click_coeff == 2.0
    assert config.replace(sparse_click_coeff=2).show_click_decay_rate == 0.5


@pytest.mark.parametrize("fields,message", [
    ({"show_click_decay_rate": 0.0}, "CtrAccessorConfig show_click_decay_rate=0.0: must be in (0, 1]"),
    ({"show_click_decay_rate": 1.5}, "show_click_decay_rate=1.5"),
    ({"delete_threshold": -1}, "CtrAccessorConfig delete_threshold=-1: must be a finite number >= 0 (default 0.8)"),
    ({"nonclk_coeff": float("nan")}, "nonclk_coeff=nan"),
    ({"click_coeff": "1"}, "click_coeff='1'"),
    ({"sparse_learning_rate": 0.1}, "CTR accessor field 'sparse_learning_rate' is unknown; valid fields are "
                                    "nonclk_coeff, click_coeff, base_threshold"),
    ({"click_coeff": 1, "sparse_click_coeff": 2}, "'click_coeff' is given twice"),
])
def test_bad_ctr_accessor_fields_name_the_field_value_and_fix(fields, message):
    with pytest.raises(ConfigError) as info:
        CtrAccessorConfig.from_dict(fields)
    assert message in str(info.value)


def test_count_filter_admits_exactly_at_the_count_on_a_stream_without_collisions():
    count = 3
    admission = AdmissionFilter(CountFilterEntry(count), seed=1, width=1 << 20)
    rng = np.random.default_rng(0)
    seen, created = {}, set()
    for _ in range(40):
        batch = rng.integers(0, 2000, 300)
        ids, occurrences = np.unique(batch, return_counts=True)
        candidates = np.array([i for i in ids if i not in created], dtype=np.int64)
        shows = np.array([occurrences[np.searchsorted(ids, i)] for i in candidates], dtype=np.float32)
        mask = admission.admit(candidates, shows)
        for i, s, admitted in zip(candidates, shows, mask):
            seen[i] = seen.get(i, 0) + int(s)
            assert admitted == (seen[i] >= count), (i, seen[i])
            if admitted:
                created.add(int(i))
    assert 0 < len(created) < len(seen)


def test_probability_entry_creates_a_fraction_within_three_sigma_of_p():
    n, p = 200_000, 0.1
    admission = AdmissionFilter(ProbabilityEntry(p), seed=7)
    ids = np.arange(n, dtype=np.int64) * 104729
    created = admission.admit(ids).mean()
    assert abs(created - p) <= 3 * math.sqrt(p * (1 - p) / n), created
    # deterministic: the same seed repeats the same trials
    again = AdmissionFilter(ProbabilityEntry(p), seed=7).admit(ids)
    np.testing.assert_array_equal(again, AdmissionFilter(ProbabilityEntry(p), seed=7).admit(ids))
    assert (again != AdmissionFilter(ProbabilityEntry(p), seed=8).admit(ids)).any()


def test_probability_entry_trials_of_one_id_are_independent_over_lookups():
    p, lookups = 0.2, 30
    admission = AdmissionFilter(ProbabilityEntry(p), seed=3)
    pending = np.arange(20_000, dtype=np.int64)
    alive = []
    for _ in range(lookups):
        mask = admission.admit(pending)
        pending = pending[~mask]
        alive.append(len(pending))
    # the never-created fraction after k lookups is (1 - p) ** k
    for k in (1, 3, 6):
        expected = 20_000 * (1 - p) ** k
        assert abs(alive[k - 1] - expected) <= 4 * math.sqrt(expected), (k, alive[k - 1], expected)


def test_show_click_entry_admits_by_paddles_score_rule():
    admission = AdmissionFilter(ShowClickEntry("show", "click"), seed=2)
    ids = np.arange(30_000, dtype=np.int64)
    # score = (show - click) * 0.1 + click: 0 -> never, 1.2 -> always, 0.5 -> half
    assert not admission.admit(ids[:10_000], np.zeros(10_000), np.zeros(10_000)).any()
    assert admission.admit(ids[10_000:20_000], np.full(10_000, 2.0), np.ones(10_000)).all()
    half = admission.admit(ids[20_000:], np.full(10_000, 5.0), np.zeros(10_000)).mean()
    assert abs(half - 0.5) <= 3 * math.sqrt(0.25 / 10_000)


def test_admission_state_round_trips_and_memory_is_fixed():
    admission = AdmissionFilter(CountFilterEntry(5), seed=4, width=1 << 12, depth=3)
    assert admission.memory_bytes() == 3 << 12
    admission.admit(np.arange(10_000, dtype=np.int64), np.full(10_000, 2.0))
    assert admission.memory_bytes() == 3 << 12
    restored = AdmissionFilter(CountFilterEntry(5), seed=4, width=1 << 12, depth=3)
    restored.load_state_dict(admission.state_dict())
    ids = np.arange(20, dtype=np.int64)
    np.testing.assert_array_equal(restored.estimate(ids), admission.estimate(ids))
    assert (admission.estimate(ids) >= 2).all()
    admission.decay(0.5)
    np.testing.assert_array_equal(admission.estimate(ids), restored.estimate(ids) // 2)
    with pytest.raises(ConfigError, match=r"is uint8\[3, 4096\], expected uint8\[4, 1024\] \(same width and depth\)"):
        AdmissionFilter(CountFilterEntry(5), width=1 << 10).load_state_dict(admission.state_dict())
    with pytest.raises(ConfigError, match="admission sketch width 1000 must be a power of two"):
        AdmissionFilter(CountFilterEntry(5), width=1000)
