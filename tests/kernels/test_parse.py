"""The text-parsing kernels against their pure-Python references."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fleet.kernels import parse as K

SETTINGS = settings(max_examples=50, deadline=None)


def _buffer(text):
    """uint8 array of ``text`` plus the 0 sentinel the kernels need after unterminated text."""
    return np.frombuffer(text + b"\0", dtype=np.uint8)


def _run_multislot(fn, text, slot_float, slot_width, max_lines=64, cap=4096):
    buf = _buffer(text)
    counts = np.zeros((max_lines, len(slot_float)), dtype=np.int64)
    ivals = np.zeros(cap, dtype=np.int64)
    fvals = np.zeros(cap, dtype=np.float32)
    err = np.zeros(K.ERR_SIZE, dtype=np.int64)
    result = fn(buf, 0, len(text), np.array(slot_float, dtype=np.int64),
                np.array(slot_width, dtype=np.int64), counts, ivals, fvals, err)
    pos, lines, ex, ni, nf, status = result
    return (tuple(int(x) for x in result), counts[:ex].tolist(), ivals[:ni].tolist(),
            fvals[:nf].view(np.uint32).tolist(), err.tolist() if status == K.STATUS_ERROR else None)


def _run_criteo(fn, text, hash_dim=1000001, cap=64):
    buf = _buffer(text)
    label = np.zeros(cap, dtype=np.int64)
    dense = np.zeros((cap, 13), dtype=np.float32)
    ids = np.zeros((26, cap), dtype=np.int64)
    err = np.zeros(K.ERR_SIZE, dtype=np.int64)
    result = fn(buf, 0, len(text), hash_dim, K.CRITEO_CONT_MIN, K.CRITEO_CONT_DIFF, label, dense,
                ids, err)
    ex = result[2]
    return (tuple(int(x) for x in result), label[:ex].tolist(), dense[:ex].view(np.uint32).tolist(),
            ids[:, :ex].tolist(), err.tolist() if result[3] == K.STATUS_ERROR else None)


# ---------------------------------------------------------------- strtof syntax

decimal_tokens = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from(["", "-", "+"]),
    st.text("0123456789", min_size=0, max_size=12),
    st.sampled_from(["", "."]).flatmap(
        lambda dot: st.text("0123456789", max_size=12).map(lambda d: dot + d if dot else "")),
    st.one_of(st.just(""), st.builds(lambda e, s, d: e + s + str(d), st.sampled_from("eE"),
                                     st.sampled_from(["", "-", "+"]), st.integers(0, 60))),
).filter(lambda t: any(c.isdigit() for c in t.split("e")[0].split("E")[0]))

float_tokens = st.one_of(
    decimal_tokens,
    st.floats(allow_nan=False, width=32).map(repr),
    st.floats(allow_nan=False).map(lambda x: "%.9e" % x),
    st.sampled_from(["inf", "-inf", "INF", "Infinity", "nan", "NaN", "0x1p3", "0x1.8p-2",
                     "-0x.8", "1e-45", "1e-46", "7e-46", "3.40282356e38", "3.40282357e38",
                     "3.5e38", "1.17549435e-38", "16777217", "0.1", "-0"]),
)


@SETTINGS
@given(float_tokens)
def test_strtof_kernel_matches_exact_rounding_reference(token):
    _, _, _, fvals, err = _run_multislot(K.parse_multislot, f"1 {token}\n".encode(), [1], [-1])
    expected = K.strtof_reference(token)
    assert err is None and expected is not None
    got = np.array(fvals, dtype=np.uint32).view(np.float32)[0]
    if np.isnan(expected):
        assert np.isnan(got)
    else:
        assert np.float32(got).view(np.uint32) == np.float32(expected).view(np.uint32)


def test_strtof_reference_rounds_halfway_cases_to_even():
    # 16777217 = 2**24 + 1 lies halfway between two float32 values: ties go to the even one
    assert K.strtof_reference("16777217") == np.float32(16777216)
    assert K.strtof_reference("16777219") == np.float32(16777220)
    # FLT_MAX + half an ulp is 3.4028235678e38: below it rounds to FLT_MAX, above to inf
    assert K.strtof_reference("3.40282356e38") == np.finfo(np.float32).max
    assert np.isinf(K.strtof_reference("3.40282357e38"))
    assert np.isinf(K.strtof_reference("3.5e38"))
    assert K.strtof_reference("1e-46") == 0.0
    assert K.strtof_reference("1.5e") is None
    assert K.strtof_reference("0x") is None


# ---------------------------------------------------------------- MultiSlot

@st.composite
def multislot_inputs(draw):
    nslots = draw(st.integers(1, 4))
    slot_float = [draw(st.integers(0, 1)) for _ in range(nslots)]
    slot_width = [draw(st.sampled_from([-1, -1, 1, 3])) for _ in range(nslots)]
    int_token = st.one_of(st.integers(0, 2**64 - 1), st.integers(-2**63, 0)).map(str)
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from(["", "  ", "\t", "\r"])))
            continue
        tokens = []
        for s in range(nslots):
            n = slot_width[s] if slot_width[s] > 0 else draw(st.integers(1, 4))
            tokens.append(str(n))
            tokens += [draw(float_tokens if slot_float[s] else int_token) for _ in range(n)]
        corruption = draw(st.integers(0, 12))
        if corruption == 1:
            tokens[draw(st.integers(0, len(tokens) - 1))] = draw(
                st.sampled_from(["x", "1.5.5", "--1", "1e", "", "0x", "nan(", "18446744073709551616"]))
        elif corruption == 2:
            tokens.pop(draw(st.integers(0, len(tokens) - 1)))
        elif corruption == 3:
            tokens.append(draw(st.sampled_from(["7", "1.0", "junk"])))
        elif corruption == 4:
            tokens[0] = draw(st.sampled_from(["0", "-1", "2147483648", "+2", "a"]))
        seps = [draw(st.sampled_from([" ", " ", "  ", "\t", " \t"])) for _ in tokens]
        line = "".join(t + sep for t, sep in zip(tokens, seps)).rstrip(" \t")
        lines.append(draw(st.sampled_from(["", " ", "\t"])) + line + draw(st.sampled_from(["", "\r"])))
    text = "\n".join(lines) + draw(st.sampled_from(["\n", ""]))
    return text.encode(), slot_float, slot_width


@SETTINGS
@given(multislot_inputs(), st.integers(1, 8), st.sampled_from([8, 64, 4096]))
def test_multislot_kernel_matches_reference(case, max_lines, cap):
    text, slot_float, slot_width = case
    got = _run_multislot(K.parse_multislot, text, slot_float, slot_width, max_lines, cap)
    want = _run_multislot(K.parse_multislot_reference, text, slot_float, slot_width, max_lines, cap)
    assert got == want


def test_multislot_parses_dense_and_lod_slots_in_order():
    text = b"3 0.5 -1e-3 2E2 2 7 18446744073709551615 1 1\n\n3 1 2 3 1 -5 1 0\r\n"
    (pos, lines, ex, ni, nf, status), counts, ivals, fvals, err = _run_multislot(
        K.parse_multislot, text, [1, 0, 0], [3, -1, 1])
    assert (pos, lines, ex, status) == (len(text), 3, 2, K.STATUS_END)
    assert counts == [[3, 2, 1], [3, 1, 1]]
    assert ivals == [7, -1, 1, -5, 0]  # uint64 ids keep their bits in int64
    assert np.array(fvals, np.uint32).view(np.float32).tolist() == [0.5, np.float32(-1e-3), 200.0,
                                                                   1.0, 2.0, 3.0]


@pytest.mark.parametrize("line, code, field, value", [
    (b"0 1 1", K.E_ZERO_COUNT, 0, 0),
    (b"2 1.0 2.0 1 5", K.E_WIDTH, 0, 2),
    (b"1 1.0 3 5 6", K.E_TOO_FEW, 1, 2),
    (b"1 1.0", K.E_MISSING_SLOT, 1, 0),
    (b"1 1.0 1 5 9", K.E_EXTRA, 2, 0),
    (b"1 abc 1 5", K.E_BAD_FLOAT, 0, 0),
    (b"1 1.0 1 5x", K.E_BAD_INT, 1, 0),
    (b"1 1.0 1 99999999999999999999", K.E_INT_RANGE, 1, 0),
    (b"-1 1.0 1 5", K.E_BAD_COUNT, 0, 0),
])
def test_multislot_reports_line_field_and_code_of_a_bad_line(line, code, field, value):
    text = b"1 2.5 1 3\n" + line + b"\n1 2.5 1 3\n"
    (pos, lines, ex, _, _, status), _, _, _, err = _run_multislot(
        K.parse_multislot, text, [1, 0], [1, -1])
    assert status == K.STATUS_ERROR and (lines, ex, pos) == (1, 1, 10)
    assert err[K.ERR_LINE] == 1 and err[K.ERR_CODE] == code and err[K.ERR_FIELD] == field
    assert err[K.ERR_VALUE] == value and err[K.ERR_NEXT] == 10 + len(line) + 1


def test_multislot_resumes_where_full_stopped():
    text = b"".join(b"2 %d %d\n" % (i, i + 1) for i in range(10))
    buf = _buffer(text)
    counts = np.zeros((3, 1), dtype=np.int64)
    ivals = np.zeros(64, dtype=np.int64)
    fvals = np.zeros(64, dtype=np.float32)
    err = np.zeros(K.ERR_SIZE, dtype=np.int64)
    pos, seen = 0, []
    while pos < len(text):
        pos, lines, ex, ni, _, status = K.parse_multislot(
            buf, pos, len(text), np.zeros(1, np.int64), np.full(1, -1, np.int64), counts, ivals,
            fvals, err)
        assert status in (K.STATUS_FULL, K.STATUS_END) and ex <= 3
        seen += ivals[:ni].tolist()
    assert seen == [v for i in range(10) for v in (i, i + 1)]


def test_columnize_moves_line_major_values_into_slot_columns():
    counts = np.array([[2, 1, 1], [1, 3, 1]], dtype=np.int64)
    slot_float = np.array([0, 1, 0], dtype=np.int64)
    ivals = np.array([1, 2, 10, 3, 11], dtype=np.int64)      # line 0: 1 2 | 10 ; line 1: 3 | 11
    fvals = np.array([0.5, 1.5, 2.5, 3.5], dtype=np.float32)  # line 0: 0.5 ; line 1: 1.5 2.5 3.5
    base = np.array([0, 0, 3], dtype=np.int64)
    outs = []
    for fn in (K.columnize_multislot, K.columnize_multislot_reference):
        out_i = np.zeros(5, dtype=np.int64)
        out_f = np.zeros(4, dtype=np.float32)
        fn(counts, 2, slot_float, ivals, fvals, base, out_i, out_f)
        outs.append((out_i.tolist(), out_f.tolist()))
    assert outs[0] == outs[1] == ([1, 2, 3, 10, 11], [0.5, 1.5, 2.5, 3.5])


def test_kernel_rejects_unterminated_text_without_sentinel():
    buf = np.frombuffer(b"1 5", dtype=np.uint8)
    with pytest.raises(ValueError, match="sentinel|buf\\[end\\] == 0"):
        K.parse_multislot(buf, 0, 3, np.zeros(1, np.int64), np.full(1, -1, np.int64),
                          np.zeros((4, 1), np.int64), np.zeros(8, np.int64),
                          np.zeros(8, np.float32), np.zeros(K.ERR_SIZE, np.int64))


# ---------------------------------------------------------------- Criteo

@SETTINGS
@given(st.integers(0, 2**64 - 1))
def test_splitmix64_kernel_equals_plain_python(z):
    assert int(K.splitmix64(np.uint64(z))) == K.splitmix64_reference(z)


def test_splitmix64_known_values():
    # first outputs of the reference splitmix64 generator seeded with 0
    assert K.splitmix64_reference(0) == 0xE220A8397B1DCDAF
    assert K.splitmix64_reference(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


@st.composite
def criteo_inputs(draw):
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 9)) == 0:
            lines.append("")
            continue
        fields = [str(draw(st.integers(0, 1)))]
        fields += [draw(st.one_of(st.just(""), st.integers(-3, 10**6).map(str))) for _ in range(13)]
        fields += [draw(st.one_of(st.just(""), st.integers(0, 2**32 - 1).map(lambda v: "%08x" % v),
                                  st.integers(0, 2**64 - 1).map(lambda v: "%X" % v)))
                   for _ in range(26)]
        corruption = draw(st.integers(0, 10))
        if corruption == 1:
            fields[draw(st.integers(0, 39))] = draw(
                st.sampled_from(["zz", "1.5", "-", " 1", "1" * 20, "f" * 17]))
        elif corruption == 2:
            fields.pop(draw(st.integers(0, 39)))
        elif corruption == 3:
            fields.append("")
        elif corruption == 4:
            fields[0] = ""
        lines.append("\t".join(fields) + draw(st.sampled_from(["", "\r"])))
    return ("\n".join(lines) + draw(st.sampled_from(["\n", ""]))).encode()


@SETTINGS
@given(criteo_inputs(), st.sampled_from([1000001, 7, 2**62 + 1]), st.integers(1, 6))
def test_criteo_kernel_matches_reference(text, hash_dim, cap):
    got = _run_criteo(K.parse_criteo, text, hash_dim, cap)
    want = _run_criteo(K.parse_criteo_reference, text, hash_dim, cap)
    assert got == want


def test_criteo_line_gets_paddle_normalisation_and_stable_hash():
    fields = ["1", "", "-3", "50"] + ["7"] * 10 + ["68fd1e64", ""] + ["0"] * 24
    text = ("\t".join(fields) + "\n").encode()
    (pos, lines, ex, status), label, dense, ids, err = _run_criteo(K.parse_criteo, text)
    assert (ex, status) == (1, K.STATUS_END) and label == [1]
    dense = np.array(dense, np.uint32).view(np.float32)[0]
    assert dense[0] == 0.0                       # empty -> 0.0
    assert dense[1] == np.float32(0.0)           # (-3 - -3) / 603
    assert dense[2] == np.float32(50 / 100)      # (50 - 0) / 100
    assert dense[4] == np.float32(7 / 64000)
    mask = (1 << 64) - 1
    assert ids[0][0] == K.splitmix64_reference(((1 << 33) | 0x68FD1E64) & mask) % 1000001
    assert ids[1][0] == K.splitmix64_reference((2 << 33) | (1 << 32)) % 1000001  # empty C2
    assert ids[2][0] == K.criteo_hash_reference(3, "0", 1000001)


@pytest.mark.parametrize("edit, code, field", [
    (lambda f: f[:39], K.E_FIELD_COUNT, 0),
    (lambda f: ["", *f[1:]], K.E_BAD_LABEL, 0),
    (lambda f: f[:3] + ["1.5"] + f[4:], K.E_BAD_INT, 3),
    (lambda f: f[:20] + ["xyz"] + f[21:], K.E_BAD_HEX, 20),
    (lambda f: f[:20] + ["1" * 17] + f[21:], K.E_HEX_RANGE, 20),
])
def test_criteo_reports_the_bad_field(edit, code, field):
    good = "\t".join(["0"] + ["1"] * 13 + ["a"] * 26)
    text = (good + "\n" + "\t".join(edit(good.split("\t"))) + "\n").encode()
    (pos, lines, ex, status), _, _, _, err = _run_criteo(K.parse_criteo, text)
    assert status == K.STATUS_ERROR and (lines, ex) == (1, 1)
    assert (err[K.ERR_CODE], err[K.ERR_FIELD]) == (code, field)
