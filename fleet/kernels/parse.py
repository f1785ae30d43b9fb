"""Text parsers for datasets: Paddle's MultiSlot text and raw Criteo lines.

Each kernel reads a uint8 buffer holding many lines and fills preallocated arrays; it
releases the GIL, so several producer threads parse in parallel. A kernel stops at the
end of its input, when its outputs are full (the caller resumes at the returned
position with fresh arrays) or at the first malformed line (the caller turns ``err``
into a ``DataError`` naming file, line and field, or skips the line and resumes at
``err[ERR_NEXT]``).

Common conventions:

- ``buf[start:end]`` is the text; lines end with ``\\n`` (a ``\\r`` before it is
  dropped); the last line may lack its ``\\n``, in which case ``buf[end]`` must exist
  and be ``0`` (a sentinel, so ``strtof`` stops there).
- Empty lines (MultiSlot: only spaces and tabs) are skipped: they count in ``lines``
  but are not examples.
- ``err`` is int64 [ERR_SIZE]; on ``STATUS_ERROR`` it holds the bad line's index among
  the lines this call consumed, the field (slot index, or Criteo column), the error
  code, the line's byte range, the bad token's byte range and one extra number
  (``ERR_VALUE``: the count announced, the values found or the fields found).

Every kernel has a pure-Python ``*_reference`` twin with the same signature and
effects, used by the tests only.
"""
from fractions import Fraction
import re

import numba
import numpy as np
from numba import types

# C's strtof, resolved from the process's libc at link time (the cached code keeps the
# symbol name, not an address, so ``cache=True`` works).
_strtof = types.ExternalFunction("strtof", types.float32(types.uintp, types.uintp))

STATUS_END = 0    # every line up to ``end`` was consumed
STATUS_FULL = 1   # outputs are full; resume at the returned position
STATUS_ERROR = 2  # a malformed line; see ``err``

ERR_LINE, ERR_FIELD, ERR_CODE, ERR_LINE_START, ERR_NEXT, ERR_TOKEN_START, ERR_TOKEN_END, \
    ERR_VALUE = range(8)
ERR_SIZE = 8

E_MISSING_SLOT = 1  # the line ends before this slot's count
E_BAD_COUNT = 2     # the count is not an integer in [1, 2**31) (0 is E_ZERO_COUNT)
E_ZERO_COUNT = 3    # the count is 0 (Paddle's "number of ids can not be zero")
E_WIDTH = 4         # a dense slot's count differs from its width (ERR_VALUE: the count)
E_TOO_FEW = 5       # the line ends inside the slot (ERR_VALUE: values found)
E_BAD_FLOAT = 6     # not a float in strtof syntax
E_BAD_INT = 7       # not a decimal integer
E_INT_RANGE = 8     # an integer that does not fit in 64 bits
E_EXTRA = 9         # text after the last slot
E_FIELD_COUNT = 10  # a Criteo line without 40 fields (ERR_VALUE: fields found)
E_BAD_LABEL = 11    # a Criteo label that is empty or not an integer
E_BAD_HEX = 12      # a Criteo categorical field that is not hexadecimal
E_HEX_RANGE = 13    # a Criteo categorical field above 2**64 - 1

CRITEO_FIELDS = 40
CRITEO_DENSE = 13
CRITEO_SPARSE = 26
# Paddle's CTR-DNN dense normalisation: (x - min) / diff, empty -> 0.0.
CRITEO_CONT_MIN = np.array([0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.float64)
CRITEO_CONT_DIFF = np.array([20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50],
                            dtype=np.float64)
CRITEO_EMPTY = 1 << 32  # the value hashed for an empty categorical field

_NL, _CR, _TAB, _SP, _PLUS, _MINUS = 10, 13, 9, 32, 43, 45
_HEX_VALUE = np.full(256, -1, dtype=np.int64)
_HEX_VALUE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16)
_HEX_VALUE[np.frombuffer(b"ABCDEF", dtype=np.uint8)] = np.arange(10, 16)
_U64_TENTH = 1844674407370955161  # (2**64 - 1) // 10
_I64_TENTH = 922337203685477580   # (2**63 - 1) // 10


# ---------------------------------------------------------------- small helpers

@numba.njit(cache=True, nogil=True, inline="always")
def splitmix64(z):
    """Returns splitmix64 of the uint64 ``z`` (all arithmetic modulo 2**64)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def splitmix64_reference(z):
    """Plain-Python splitmix64 of the int ``z`` (taken modulo 2**64)."""
    mask = (1 << 64) - 1
    z = (z + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def criteo_hash_reference(k, text, hash_dim):
    """The id of categorical field C_k (k = 1..26) holding ``text`` (the Criteo hash of docs/internals.md)."""
    v = int(text, 16) if text else CRITEO_EMPTY
    return splitmix64_reference((k << 33) | v) % hash_dim


@numba.njit(cache=True, nogil=True, inline="always")
def _digits_start(buf, s, e):
    """Start of the digits of an optionally signed decimal in buf[s:e], or -1 if none."""
    i = s
    if i < e and (buf[i] == _PLUS or buf[i] == _MINUS):
        i += 1
    if i == e:
        return -1
    for j in range(i, e):
        if buf[j] < 48 or buf[j] > 57:
            return -1
    return i


@numba.njit(cache=True, nogil=True, inline="always")
def _parse_u64(buf, s, e):
    """Parses buf[s:e] like strtoull (sign allowed, '-' wraps); returns (bits, code)."""
    i = _digits_start(buf, s, e)
    if i < 0:
        return np.int64(0), E_BAD_INT
    acc = np.uint64(0)
    for j in range(i, e):
        d = np.uint64(buf[j] - 48)
        if acc > np.uint64(_U64_TENTH) or (acc == np.uint64(_U64_TENTH) and d > np.uint64(5)):
            return np.int64(0), E_INT_RANGE
        acc = acc * np.uint64(10) + d
    if buf[s] == _MINUS:
        acc = np.uint64(0) - acc
    return np.int64(acc), 0


@numba.njit(cache=True, nogil=True, inline="always")
def _parse_i64(buf, s, e):
    """Parses buf[s:e] as a signed decimal int64; returns (value, code)."""
    i = _digits_start(buf, s, e)
    if i < 0:
        return np.int64(0), E_BAD_INT
    acc = np.int64(0)
    for j in range(i, e):
        d = np.int64(buf[j] - 48)
        if acc > _I64_TENTH or (acc == _I64_TENTH and d > 7):
            return np.int64(0), E_INT_RANGE
        acc = acc * 10 + d
    return (-acc if buf[s] == _MINUS else acc), 0


@numba.njit(cache=True, nogil=True, inline="always")
def _parse_hex(buf, s, e):
    """Parses buf[s:e] as unsigned hexadecimal; returns (uint64 value, code)."""
    if s == e:
        return np.uint64(0), E_BAD_HEX
    # Table-driven and branch-free per digit: hex digits of ids are random, so a
    # digit-or-letter branch would mispredict about every other character.
    bad = np.int64(0)
    high = np.int64(0)  # digits shifted out of the top 64 bits
    acc = np.uint64(0)
    for i in range(s, e):
        d = _HEX_VALUE[buf[i]]
        bad |= d
        high |= np.int64(acc >> np.uint64(60))
        acc = (acc << np.uint64(4)) | np.uint64(d & 15)
    if bad < 0:
        return np.uint64(0), E_BAD_HEX
    if high != 0:
        return np.uint64(0), E_HEX_RANGE
    return acc, 0


@numba.njit(cache=True, nogil=True, inline="always")
def _check_sentinel(buf, start, end):
    if end < start or end > buf.shape[0]:
        raise ValueError("parse kernel: [start, end) is not inside buf")
    if end > start and buf[end - 1] != _NL:
        if end >= buf.shape[0] or buf[end] != 0:
            raise ValueError("parse kernel: text without a final newline needs buf[end] == 0")


# ---------------------------------------------------------------- MultiSlot

@numba.njit(cache=True, nogil=True)
def parse_multislot(buf, start, end, slot_float, slot_width, counts, ivals, fvals, err):
    """Parses MultiSlot lines into line-major values.

    For each line and each slot s (in ``set_use_var`` order) the text is ``n v1 .. vn``.
    Values of float slots (``slot_float[s] == 1``) are parsed with C's strtof and go to
    ``fvals``; others are uint64 ids (strtoull syntax, stored as int64 bits) and go to
    ``ivals``, in line order. ``counts[i, s]`` receives n of example i. A slot with
    ``slot_width[s] > 0`` is dense and must have exactly that many values.

    Args:
        buf: uint8 text; start, end: the byte range to parse (see the module notes).
        slot_float: int64 [S], 1 for float slots. slot_width: int64 [S], -1 for lod slots.
        counts: int64 [max_lines, S] output. ivals: int64 [cap] and fvals: float32 [cap]
            outputs; a line of L bytes needs L // 2 + 2 free entries in each.
        err: int64 [ERR_SIZE] output, written on STATUS_ERROR.

    Returns:
        (pos, lines, examples, n_ivals, n_fvals, status): where to resume, lines consumed
        (blank ones included), examples written, values written, and STATUS_*. On
        STATUS_ERROR ``pos`` is the bad line's start and its values are not counted.

    Thread-safety: pure function of its arguments; releases the GIL.
    """
    _check_sentinel(buf, start, end)
    nslots = slot_float.shape[0]
    max_lines = counts.shape[0]
    endp = np.zeros(1, dtype=np.uintp)
    base = buf.ctypes.data
    pos = start
    lines = 0
    ex = 0
    ni = 0
    nf = 0
    while pos < end:
        le = pos
        while le < end and buf[le] != _NL:
            le += 1
        nxt = le + 1 if le < end else end
        ce = le
        if ce > pos and buf[ce - 1] == _CR:
            ce -= 1
        p = pos
        while p < ce and (buf[p] == _SP or buf[p] == _TAB):
            p += 1
        if p == ce:
            lines += 1
            pos = nxt
            continue
        need = (ce - pos) // 2 + 2
        if ex >= max_lines or ni + need > ivals.shape[0] or nf + need > fvals.shape[0]:
            return pos, lines, ex, ni, nf, STATUS_FULL
        li = ni
        lf = nf
        code = 0
        slot = 0
        ts = p
        te = p
        value = 0
        for slot in range(nslots):
            while p < ce and (buf[p] == _SP or buf[p] == _TAB):
                p += 1
            ts = p
            while p < ce and buf[p] != _SP and buf[p] != _TAB:
                p += 1
            te = p
            if ts == te:
                code = E_MISSING_SLOT
                break
            n, c = _parse_i64(buf, ts, te)
            if c != 0 or n < 0 or n > 2147483647:
                code = E_BAD_COUNT
                break
            if n == 0:
                code = E_ZERO_COUNT
                break
            if slot_width[slot] > 0 and n != slot_width[slot]:
                code = E_WIDTH
                value = n
                break
            isf = slot_float[slot] == 1
            for j in range(n):
                while p < ce and (buf[p] == _SP or buf[p] == _TAB):
                    p += 1
                ts = p
                while p < ce and buf[p] != _SP and buf[p] != _TAB:
                    p += 1
                te = p
                if ts == te:
                    code = E_TOO_FEW
                    value = j
                    break
                if isf:
                    v = _strtof(base + ts, endp.ctypes.data)
                    if endp[0] != base + te:
                        code = E_BAD_FLOAT
                        break
                    fvals[nf] = v
                    nf += 1
                else:
                    iv, c = _parse_u64(buf, ts, te)
                    if c != 0:
                        code = c
                        break
                    ivals[ni] = iv
                    ni += 1
            if code != 0:
                break
            counts[ex, slot] = n
        if code == 0:
            while p < ce and (buf[p] == _SP or buf[p] == _TAB):
                p += 1
            if p < ce:
                ts = p
                while p < ce and buf[p] != _SP and buf[p] != _TAB:
                    p += 1
                te = p
                code = E_EXTRA
                slot = nslots
        if code != 0:
            err[ERR_LINE] = lines
            err[ERR_FIELD] = slot
            err[ERR_CODE] = code
            err[ERR_LINE_START] = pos
            err[ERR_NEXT] = nxt
            err[ERR_TOKEN_START] = ts
            err[ERR_TOKEN_END] = te
            err[ERR_VALUE] = value
            return pos, lines, ex, li, lf, STATUS_ERROR
        lines += 1
        ex += 1
        pos = nxt
    return pos, lines, ex, ni, nf, STATUS_END


@numba.njit(cache=True, nogil=True)
def columnize_multislot(counts, n, slot_float, ivals, fvals, slot_base, out_i, out_f):
    """Moves line-major values of ``n`` examples into slot-major columns.

    Slot s's values (all examples, in order) land at ``out_i[slot_base[s]:]`` (int
    slots) or ``out_f[slot_base[s]:]`` (float slots).

    Thread-safety: pure function of its arguments; releases the GIL.
    """
    nslots = slot_float.shape[0]
    cur = slot_base.copy()
    pi = 0
    pf = 0
    for e in range(n):
        for s in range(nslots):
            c = counts[e, s]
            w = cur[s]
            if slot_float[s] == 1:
                for j in range(c):
                    out_f[w + j] = fvals[pf + j]
                pf += c
            else:
                for j in range(c):
                    out_i[w + j] = ivals[pi + j]
                pi += c
            cur[s] = w + c


# ---------------------------------------------------------------- Criteo

@numba.njit(cache=True, nogil=True)
def parse_criteo(buf, start, end, hash_dim, cont_min, cont_diff, label, dense, ids, err):
    """Parses raw Criteo lines: label, I1..I13, C1..C26, tab-separated, empty allowed.

    Example i gets ``label[i]`` (int64), ``dense[i, j] = (I_j - cont_min[j]) /
    cont_diff[j]`` in float64 rounded to float32 (0.0 when empty) and ``ids[k - 1, i] =
    splitmix64((k << 33) | v) % hash_dim`` with v the hex value of C_k (2**32 when empty).

    Args:
        buf, start, end: the text (see the module notes).
        hash_dim: int, > 0. cont_min, cont_diff: float64 [13].
        label: int64 [cap], dense: float32 [cap, 13], ids: int64 [26, cap] outputs.
        err: int64 [ERR_SIZE] output, written on STATUS_ERROR (field = column 0..39).

    Returns:
        (pos, lines, examples, status) as for ``parse_multislot``.

    Thread-safety: pure function of its arguments; releases the GIL.
    """
    _check_sentinel(buf, start, end)
    cap = label.shape[0]
    hd = np.uint64(hash_dim)
    pos = start
    lines = 0
    ex = 0
    while pos < end:
        le = pos
        tabs = 0
        while le < end and buf[le] != _NL:
            if buf[le] == _TAB:
                tabs += 1
            le += 1
        nxt = le + 1 if le < end else end
        ce = le
        if ce > pos and buf[ce - 1] == _CR:
            ce -= 1
        if ce == pos:
            lines += 1
            pos = nxt
            continue
        if ex >= cap:
            return pos, lines, ex, STATUS_FULL
        code = 0
        f = 0
        s = pos
        e = pos
        if tabs != CRITEO_FIELDS - 1:
            code = E_FIELD_COUNT
            e = ce
        else:
            for f in range(CRITEO_FIELDS):
                e = s
                while e < ce and buf[e] != _TAB:
                    e += 1
                if f == 0:
                    x, c = _parse_i64(buf, s, e)
                    if c != 0:
                        code = E_BAD_LABEL
                        break
                    label[ex] = x
                elif f <= CRITEO_DENSE:
                    if s == e:
                        dense[ex, f - 1] = np.float32(0.0)
                    else:
                        x, c = _parse_i64(buf, s, e)
                        if c != 0:
                            code = c
                            break
                        dense[ex, f - 1] = np.float32(
                            (np.float64(x) - cont_min[f - 1]) / cont_diff[f - 1])
                else:
                    k = f - CRITEO_DENSE
                    if s == e:
                        v = np.uint64(CRITEO_EMPTY)
                    else:
                        v, c = _parse_hex(buf, s, e)
                        if c != 0:
                            code = c
                            break
                    z = (np.uint64(k) << np.uint64(33)) | v
                    ids[k - 1, ex] = np.int64(splitmix64(z) % hd)
                s = e + 1
        if code != 0:
            err[ERR_LINE] = lines
            err[ERR_FIELD] = f
            err[ERR_CODE] = code
            err[ERR_LINE_START] = pos
            err[ERR_NEXT] = nxt
            err[ERR_TOKEN_START] = s if code != E_FIELD_COUNT else pos
            err[ERR_TOKEN_END] = e
            err[ERR_VALUE] = tabs + 1
            return pos, lines, ex, STATUS_ERROR
        lines += 1
        ex += 1
        pos = nxt
    return pos, lines, ex, STATUS_END


# ---------------------------------------------------------------- references (tests only)

_FLOAT_RE = re.compile(
    r"[+-]?(?:(?P<dec>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)"
    r"|(?P<inf>[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
    r"|(?P<nan>[nN][aA][nN](?:\([0-9A-Za-z_]*\))?))\Z")
_U64_RE = re.compile(r"[+-]?[0-9]+\Z")
_HEX_RE = re.compile(r"[0-9a-fA-F]+\Z")


def _float32_nearest(q):
    """Rounds the exact non-negative rational ``q`` to float32, ties to even (as strtof)."""
    if q == 0:
        return 0.0
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    step = max(e, -126) - 23  # exponent of one unit in the last place
    scaled = q / Fraction(2) ** step
    m = scaled.numerator // scaled.denominator
    rest = scaled - m
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and m % 2 == 1):
        m += 1
    if m * Fraction(2) ** step >= Fraction(2) ** 128:
        return float("inf")
    return float(m * Fraction(2) ** step)


def _decimal_value(text):
    """Exact value of an unsigned decimal token, clamped where float32 saturates."""
    mantissa, _, exponent = text.lower().partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    if not digits:
        return Fraction(0)
    exp10 = int(exponent or 0) - len(frac)
    magnitude = len(digits) + exp10  # the value lies in [10**(magnitude-1), 10**magnitude)
    if magnitude - 1 >= 39:
        return Fraction(10) ** 40  # above float32's range: rounds to inf
    if magnitude <= -46:
        return Fraction(0)  # below half the smallest subnormal: rounds to 0
    return Fraction(int(digits)) * Fraction(10) ** exp10


def strtof_reference(token):
    """The float32 C's strtof gives for the whole token, or None if it is not one float."""
    match = _FLOAT_RE.match(token)
    if match is None:
        return None
    if match.group("inf"):
        value = float("inf")
    elif match.group("nan"):
        value = float("nan")
    elif match.group("dec"):
        value = _float32_nearest(_decimal_value(match.group("dec")))
    else:
        text = match.group("hex")[2:].lower()
        mantissa, _, exponent = text.partition("p")
        whole, _, frac = mantissa.partition(".")
        exp2 = int(exponent or 0) - 4 * len(frac)
        digits = int(whole + frac, 16)
        if digits and digits.bit_length() + exp2 > 130:
            value = float("inf")
        elif digits and digits.bit_length() + exp2 < -160:
            value = 0.0
        else:
            value = _float32_nearest(Fraction(digits) * Fraction(2) ** exp2)
    return np.float32(-value if token.startswith("-") else value)


def _u64_reference(token):
    if not _U64_RE.match(token):
        return None, E_BAD_INT
    v = int(token)
    if abs(v) > (1 << 64) - 1:
        return None, E_INT_RANGE
    v &= (1 << 64) - 1
    return (v - (1 << 64) if v >= 1 << 63 else v), 0


def _i64_reference(token):
    if not _U64_RE.match(token):
        return None, E_BAD_INT
    v = int(token)
    if abs(v) > (1 << 63) - 1:
        return None, E_INT_RANGE
    return v, 0


def _split_lines(buf, start, end):
    """Yields (line_start, content_end, next_start) like the kernels."""
    pos = start
    while pos < end:
        le = buf.find(b"\n", pos, end)
        le = end if le < 0 else le
        nxt = le + 1 if le < end else end
        ce = le - 1 if le > pos and buf[le - 1] == _CR else le
        yield pos, ce, nxt
        pos = nxt


def _tokens(buf, s, e):
    """(start, end) of each space/tab separated token of buf[s:e]."""
    out = []
    for m in re.finditer(rb"[^ \t]+", buf[s:e]):
        out.append((s + m.start(), s + m.end()))
    return out


def parse_multislot_reference(buf, start, end, slot_float, slot_width, counts, ivals, fvals, err):
    """Pure-Python twin of ``parse_multislot`` (same arguments, effects and result)."""
    raw = bytes(np.asarray(buf, dtype=np.uint8))
    lines = ex = ni = nf = 0
    nslots = len(slot_float)
    for pos, ce, nxt in _split_lines(raw, start, end):
        toks = _tokens(raw, pos, ce)
        if not toks:
            lines += 1
            continue
        need = (ce - pos) // 2 + 2
        if ex >= counts.shape[0] or ni + need > len(ivals) or nf + need > len(fvals):
            return pos, lines, ex, ni, nf, STATUS_FULL
        li, lf = ni, nf
        k = 0
        failure = None
        for slot in range(nslots):
            if k == len(toks):
                failure = (slot, E_MISSING_SLOT, (ce, ce), 0)
                break
            ts, te = toks[k]
            k += 1
            n, code = _i64_reference(raw[ts:te].decode("latin-1"))
            if code or n < 0 or n > 2147483647:
                failure = (slot, E_BAD_COUNT, (ts, te), 0)
                break
            if n == 0:
                failure = (slot, E_ZERO_COUNT, (ts, te), 0)
                break
            if slot_width[slot] > 0 and n != slot_width[slot]:
                failure = (slot, E_WIDTH, (ts, te), n)
                break
            for j in range(n):
                if k == len(toks):
                    failure = (slot, E_TOO_FEW, (ce, ce), j)
                    break
                ts, te = toks[k]
                k += 1
                text = raw[ts:te].decode("latin-1")
                if slot_float[slot] == 1:
                    v = strtof_reference(text)
                    if v is None:
                        failure = (slot, E_BAD_FLOAT, (ts, te), 0)
                        break
                    fvals[nf] = v
                    nf += 1
                else:
                    v, code = _u64_reference(text)
                    if code:
                        failure = (slot, code, (ts, te), 0)
                        break
                    ivals[ni] = v
                    ni += 1
            if failure:
                break
            counts[ex, slot] = n
        if failure is None and k < len(toks):
            failure = (nslots, E_EXTRA, toks[k], 0)
        if failure:
            slot, code, (ts, te), value = failure
            err[:] = [lines, slot, code, pos, nxt, ts, te, value]
            return pos, lines, ex, li, lf, STATUS_ERROR
        lines += 1
        ex += 1
    return end, lines, ex, ni, nf, STATUS_END


def columnize_multislot_reference(counts, n, slot_float, ivals, fvals, slot_base, out_i, out_f):
    """Pure-numpy twin of ``columnize_multislot``."""
    cur = np.array(slot_base, dtype=np.int64)
    pi = pf = 0
    for e in range(n):
        for s in range(len(slot_float)):
            c = int(counts[e, s])
            if slot_float[s] == 1:
                out_f[cur[s]:cur[s] + c] = fvals[pf:pf + c]
                pf += c
            else:
                out_i[cur[s]:cur[s] + c] = ivals[pi:pi + c]
                pi += c
            cur[s] += c


def parse_criteo_reference(buf, start, end, hash_dim, cont_min, cont_diff, label, dense, ids, err):
    """Pure-Python twin of ``parse_criteo`` (hashes with ``criteo_hash_reference``)."""
    raw = bytes(np.asarray(buf, dtype=np.uint8))
    lines = ex = 0
    for pos, ce, nxt in _split_lines(raw, start, end):
        if ce == pos:
            lines += 1
            continue
        if ex >= len(label):
            return pos, lines, ex, STATUS_FULL
        fields = raw[pos:ce].split(b"\t")
        failure = None
        if len(fields) != CRITEO_FIELDS:
            failure = (0, E_FIELD_COUNT, pos, ce)
        else:
            s = pos
            for f, field in enumerate(fields):
                text = field.decode("latin-1")
                span = (s, s + len(field))
                s += len(field) + 1
                if f == 0:
                    x, code = _i64_reference(text)
                    if code:
                        failure = (f, E_BAD_LABEL) + span
                        break
                    label[ex] = x
                elif f <= CRITEO_DENSE:
                    if not text:
                        dense[ex, f - 1] = 0.0
                        continue
                    x, code = _i64_reference(text)
                    if code:
                        failure = (f, code) + span
                        break
                    dense[ex, f - 1] = np.float32((float(x) - cont_min[f - 1]) / cont_diff[f - 1])
                else:
                    if text and not _HEX_RE.match(text):
                        failure = (f, E_BAD_HEX) + span
                        break
                    if text and int(text, 16) >= 1 << 64:
                        failure = (f, E_HEX_RANGE) + span
                        break
                    ids[f - CRITEO_DENSE - 1, ex] = criteo_hash_reference(f - CRITEO_DENSE, text, hash_dim)
        if failure:
            f, code, ts, te = failure
            err[:] = [lines, f, code, pos, nxt, ts, te, len(fields)]
            return pos, lines, ex, STATUS_ERROR
        lines += 1
        ex += 1
    return end, lines, ex, STATUS_END
