"""The generated Criteo-format data the model examples train on, in memory.

Lines come from ``examples/ctr_dnn/generate_data.py`` (same generator, same seeds: the label
is drawn from a logistic model of five categorical fields and two integer fields) and are
turned into model inputs exactly as ``dataset.set_data_format("criteo", hash_dim)`` reads
them: the 13 integers normalised as Paddle's CTR example does (empty: 0.0) and categorical
field k with hex text t hashed to ``splitmix64((k << 33) | int(t, 16)) % hash_dim``
(``1 << 32`` for an empty field).

The multi-task models need a second label. ``conversion`` is derived deterministically from
a line's features: a line converts when it was clicked and its C4 field is present with a
value whose index in the generator's vocabulary is divisible by 3 (about 45% of lines
carry such a C4 value, so about a third of clicks convert). It is learnable from the click's
signal and C4's embedding; for ESMM it is the click-and-conversion (CTCVR) label.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ctr_dnn"))
from generate_data import SIGNAL_FIELDS, VOCAB, _vocab, generate  # noqa: E402

CONT_MIN = np.array([0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], np.float32)
CONT_DIFF = np.array([20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50], np.float32)
CONVERSION_FIELD = 3  # C4


def _splitmix64(z):
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def make(train_lines, test_lines, hash_dim=100003, seed=2026):
    """Returns (train, test): dicts of arrays ``dense_input`` [n, 13] float32, ``ids``
    [n, 26] int64, ``label`` and ``conversion`` [n, 1] int64. Deterministic in ``seed``
    (the generator's ``--seed``: the same lines as ``generate_data.py --seed``)."""
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng)
    weights = {f: rng.normal(0, 1.2, VOCAB) for f in SIGNAL_FIELDS}
    values = np.array([[int(t, 16) for t in field] for field in vocab], dtype=np.uint64)  # [26, VOCAB]
    sets = []
    for lines, part_seed in ((train_lines, seed + 1), (test_lines, seed + 1000)):
        labels, ints, cats = generate(lines, part_seed, vocab, weights)
        dense = np.where(ints >= 0, (ints - CONT_MIN) / CONT_DIFF, 0.0).astype(np.float32)
        raw = np.where(cats >= 0, values[np.arange(26), np.maximum(cats, 0)], np.uint64(1 << 32))
        with np.errstate(over="ignore"):
            keys = (np.arange(1, 27, dtype=np.uint64) << np.uint64(33)) | raw
            ids = (_splitmix64(keys) % np.uint64(hash_dim)).astype(np.int64)
        c4 = cats[:, CONVERSION_FIELD]
        conversion = labels.astype(bool) & (c4 >= 0) & (c4 % 3 == 0)
        sets.append({"dense_input": dense, "ids": ids, "label": labels.reshape(-1, 1),
                     "conversion": conversion.astype(np.int64).reshape(-1, 1)})
    return sets[0], sets[1]


def feed(data, rows, names):
    """The feed dict of ``rows`` (a slice or index array) for the input ``names``."""
    out = {}
    for name in names:
        if name.startswith("C") and name[1:].isdigit():
            ids = data["ids"][rows, int(name[1:]) - 1]
            out[name] = (ids, np.ones(len(ids), np.int64))
        else:
            out[name] = data[name][rows]
    return out


def auc(labels, scores):
    """Area under the ROC curve (ties counted half), from the ranks of ``scores``."""
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2.0
    pos = labels.sum()
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        raise ValueError("auc needs both positive and negative labels")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
