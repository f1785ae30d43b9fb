"""Writes a deterministic stream of Criteo-format data for online (day/pass) training.

The lines have the format of ``generate_data.py`` (``label \\t I1..I13 \\t C1..C26``, read by
``train.py`` and ``online.py`` with ``set_data_format("criteo")``), laid out as Paddle's
online training expects: one directory per day (``YYYYMMDD``), one per pass inside it
(``HHMM``, the pass's start time: passes split the day evenly), the pass's files
``part-00000`` .. and, once they are complete, an empty done file (``to.hadoop.done``,
PaddleRec's default name). Held-out lines of each pass (same distribution, other examples)
go to ``test/YYYYMMDD/HHMM/part-00000``::

    out/20260101/0000/part-00000 .. part-00003, out/20260101/0000/to.hadoop.done
    out/20260101/0600/...
    out/test/20260101/0000/part-00000

What makes it a production-like stream:

- Long tail: each categorical value is drawn by a Zipf law over ranks (exponent
  ``--zipf``), so a few values are frequent and most are rare: with the defaults about
  half of the distinct values of a day occur once in it (``--stats`` prints the figure).
- Drift: a value lives ``--lifetime`` passes: the identity behind each rank is renewed
  every ``lifetime`` passes, each rank at its own phase, so in every pass about
  1/lifetime of the values of every popularity stop and as many new ones appear (the
  vocabulary is renewed once every ``lifetime`` passes; a table that never deletes a row
  grows by about that much per ``lifetime`` passes, for ever).
- Signal: the label follows a logistic model of five categorical fields (a fixed weight per
  value, from a hash of the value, so a value keeps its weight while it lives) and two
  integer fields, so test AUC is meaningful (0.77-0.89 after a few passes, depending on
  the lines per pass: the README and docs/tables.md show runs).

The same seed gives the same files, whichever passes are written and in which order.

Usage:
    python generate_online_data.py --out_dir online_data --days 2 --passes_per_day 4 \\
        --lines_per_pass 20000
    python generate_online_data.py --out_dir online_data --days 1 --passes_per_day 4 \\
        --only_pass 3          # one pass (day 1, pass 3): e.g. to simulate arrivals
"""
import argparse
import datetime
import os
import time

import numpy as np

SIGNAL_FIELDS = (0, 3, 7, 12, 20)  # the fields whose values move the label, as generate_data.py
DONE_FILE = "to.hadoop.done"
START_DAY = "20260101"
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(z):
    """splitmix64 of a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return z ^ (z >> np.uint64(31))


def _key_hash(seed, field, keys):
    """A uint64 hash of (seed, field, value identity) per element of ``keys`` (int64)."""
    salt = np.uint64((seed * 1_000_003 + field * 7919 + 1) & 0xFFFFFFFFFFFFFFFF)
    return _splitmix64(keys.astype(np.int64).view(np.uint64) ^ _splitmix64(np.array([salt]))[0])


def _weights(seed, field, keys):
    """The planted weight of each value of a signal field: Normal(0, 1.2) from its hash."""
    h1 = _key_hash(seed + 101, field, keys)
    h2 = _key_hash(seed + 202, field, keys)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = ((h2 >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    return 1.2 * np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)


def pass_dirname(day_index, pass_index, passes_per_day, start_day=START_DAY):
    """``YYYYMMDD/HHMM`` of a pass (both 0-based): the day's date and the pass's start time."""
    day = datetime.datetime.strptime(start_day, "%Y%m%d") + datetime.timedelta(days=day_index)
    minutes = pass_index * (24 * 60 // passes_per_day)
    return f"{day:%Y%m%d}/{minutes // 60:02d}{minutes % 60:02d}"


def generate_pass(lines, seed, global_pass, zipf=1.8, lifetime=8, max_rank=1 << 24, part=0):
    """Lines of one pass of the stream.

    Args:
        lines: how many examples.
        seed: the stream's seed.
        global_pass: the pass counted from the start of the stream (day * passes_per_day + pass).
        zipf: the Zipf exponent of a value's rank (smaller: longer tail).
        lifetime: passes a value lives (its rank then stands for a new value).
        max_rank: ranks above this are clipped (bounds the vocabulary of one pass).
        part: 0 for training lines; another number for other lines of the same pass (held-out).

    Returns:
        (labels int64 [lines], ints int64 [lines, 13] with -1 for empty,
        keys int64 [lines, 26]: each value's identity, with -1 for an empty field).
    """
    rng = np.random.default_rng([seed, global_pass, part])
    ranks = np.minimum(rng.zipf(zipf, size=(lines, 26)), max_rank).astype(np.int64)
    # the identity behind a rank changes every `lifetime` passes, each rank at its own phase
    phase = (_key_hash(seed + 303, 0, ranks) % np.uint64(lifetime)).astype(np.int64)
    keys = (ranks << 20) | ((global_pass + phase) // lifetime)  # < 2**44: fits field_text's hash input
    empty = rng.random((lines, 26)) < 0.04
    keys[empty] = -1
    ints = np.minimum(rng.geometric(0.05, size=(lines, 13)) - 1, 5000)
    ints[rng.random((lines, 13)) < 0.1] = -1
    logit = np.full(lines, -1.2)
    for f in SIGNAL_FIELDS:
        present = keys[:, f] >= 0
        logit[present] += _weights(seed, f, keys[present, f])
    logit += 0.04 * np.clip(ints[:, 0], 0, 40) - 0.02 * np.clip(ints[:, 5], 0, 60)
    labels = (rng.random(lines) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return labels, ints, keys


def field_text(seed, keys):
    """The 8-digit hex text of every value (empty string for -1), as Criteo writes them."""
    out = np.empty(keys.shape, dtype=object)
    for f in range(keys.shape[1]):
        col = keys[:, f]
        h = (_key_hash(seed, f, np.maximum(col, 0)) & np.uint64(0xFFFFFFFF)).astype(np.int64)
        out[:, f] = [f"{v:08x}" if k >= 0 else "" for v, k in zip(h.tolist(), col.tolist())]
    return out


def write_lines(path, seed, labels, ints, keys):
    """Writes Criteo lines to ``path`` atomically (a temporary name, then a rename)."""
    int_text = np.where(ints >= 0, ints.astype(str), "")
    cat_text = field_text(seed, keys)
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        for i in range(len(labels)):
            out.write(f"{labels[i]}\t" + "\t".join(int_text[i]) + "\t" + "\t".join(cat_text[i]) + "\n")
    os.replace(tmp, path)


def write_pass(out_dir, day_index, pass_index, args):
    """Writes one pass: its part files, its held-out file, then its done file (last).

    Returns:
        The pass directory.
    """
    name = pass_dirname(day_index, pass_index, args.passes_per_day, args.start_day)
    pass_dir = os.path.join(out_dir, name)
    test_dir = os.path.join(out_dir, "test", name)
    os.makedirs(pass_dir, exist_ok=True)
    os.makedirs(test_dir, exist_ok=True)
    g = day_index * args.passes_per_day + pass_index
    per_file = -(-args.lines_per_pass // args.files_per_pass)
    labels, ints, keys = generate_pass(args.lines_per_pass, args.seed, g, args.zipf, args.lifetime)
    for k in range(args.files_per_pass):
        sl = slice(k * per_file, min((k + 1) * per_file, args.lines_per_pass))
        write_lines(os.path.join(pass_dir, f"part-{k:05d}"), args.seed, labels[sl], ints[sl], keys[sl])
    if args.test_lines:
        write_lines(os.path.join(test_dir, "part-00000"), args.seed,
                    *generate_pass(args.test_lines, args.seed, g, args.zipf, args.lifetime, part=1))
    open(os.path.join(pass_dir, args.done_file), "w").close()
    return pass_dir


def day_statistics(args, day_index):
    """{"distinct", "once", "once_fraction", "occurrences"} of the categorical values of one
    day's training lines (every pass), for checking the long tail."""
    values = []
    for p in range(args.passes_per_day):
        _, _, k = generate_pass(args.lines_per_pass, args.seed, day_index * args.passes_per_day + p,
                                args.zipf, args.lifetime)
        field = np.broadcast_to(np.arange(26, dtype=np.int64) << 50, k.shape)
        values.append((k + field)[k >= 0])  # a value of field f is (f, identity)
    keys = np.concatenate(values)
    _, counts = np.unique(keys, return_counts=True)
    once = int((counts == 1).sum())
    return {"distinct": int(len(counts)), "once": once, "once_fraction": round(once / len(counts), 4),
            "occurrences": int(len(keys))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="online_data")
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--passes_per_day", type=int, default=4, help="passes split each day evenly (divides 1440)")
    p.add_argument("--lines_per_pass", type=int, default=20_000)
    p.add_argument("--files_per_pass", type=int, default=4)
    p.add_argument("--test_lines", type=int, default=5_000, help="held-out lines per pass (0: none)")
    p.add_argument("--zipf", type=float, default=1.8, help="Zipf exponent of the values' ranks (smaller: longer tail)")
    p.add_argument("--lifetime", type=int, default=8, help="passes a value lives before its rank stands for a new one")
    p.add_argument("--start_day", default=START_DAY, help="the first day's date, YYYYMMDD")
    p.add_argument("--done_file", default=DONE_FILE, help="the empty file that marks a pass complete")
    p.add_argument("--only_day", type=int, help="write only this day (1-based)")
    p.add_argument("--only_pass", type=int, help="write only this pass of each day written (1-based)")
    p.add_argument("--stats", action="store_true", help="print the long-tail figures of each day written")
    p.add_argument("--seed", type=int, default=2026)
    args = p.parse_args(argv)
    if args.passes_per_day < 1 or 1440 % args.passes_per_day:
        p.error(f"--passes_per_day {args.passes_per_day} must divide 1440 (the minutes of a day)")
    if args.lines_per_pass < args.files_per_pass:
        p.error(f"--lines_per_pass {args.lines_per_pass} is smaller than --files_per_pass {args.files_per_pass}")
    return args


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    days = [args.only_day - 1] if args.only_day else range(args.days)
    passes = [args.only_pass - 1] if args.only_pass else range(args.passes_per_day)
    written = 0
    for d in days:
        for p in passes:
            write_pass(args.out_dir, d, p, args)
            written += 1
        if args.stats:
            print(f"day {d + 1}: " + ", ".join(f"{k} {v}" for k, v in day_statistics(args, d).items()))
    print(f"wrote {written} passes of {args.lines_per_pass} lines to {args.out_dir}/ in {time.time() - start:.1f} s",
          flush=True)


if __name__ == "__main__":
    main()
