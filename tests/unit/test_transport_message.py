"""The wire format without sockets: encode, decode, and every check on both sides."""
import msgpack
import numpy as np
import pytest

from fleet.errors import ConfigError, TransportError
from fleet.transport import message, settings
from fleet.transport.message import PROTOCOL_VERSION, decode, encode, salvage

ALL_DTYPES = ["float32", "int64", "uint8", "float64", "int32"]


def sample_arrays():
    rng = np.random.default_rng(0)
    arrays = {}
    for dtype in ALL_DTYPES:
        arrays[f"{dtype}_2d"] = (rng.random((3, 5)) * 100).astype(dtype)
        arrays[f"{dtype}_empty"] = np.zeros((0, 4), dtype=dtype)
        arrays[f"{dtype}_scalar"] = np.array(7, dtype=dtype)
    arrays["int64_extremes"] = np.array([-(2**63), 2**63 - 1, 0], dtype=np.int64)
    arrays["float32_3d"] = rng.random((2, 3, 4)).astype(np.float32)
    return arrays


def as_bytes(frames):
    return [bytes(memoryview(f)) for f in frames]


def header_of(frames):
    return msgpack.unpackb(frames[0], raw=False)


def test_every_dtype_round_trips_including_empty_and_zero_dimensional_arrays():
    arrays = sample_arrays()
    frames = encode("push", 5, 2, list(arrays), list(arrays.values()), meta={"lr": 0.5, "tags": ["a"]})
    msg = decode(as_bytes(frames))
    assert (msg.op, msg.seq, msg.worker) == ("push", 5, 2)
    assert msg.meta == {"lr": 0.5, "tags": ["a"]}
    for name, arr in arrays.items():
        got = msg[name]
        assert got.dtype == arr.dtype and got.shape == arr.shape, name
        np.testing.assert_array_equal(got, arr)
        assert got.flags.writeable and got.flags.aligned


def test_the_header_carries_version_names_dtypes_and_shapes():
    header = header_of(encode("pull", 1, 0, ["w"], [np.zeros((2, 3), np.float32)]))
    assert header == {"v": PROTOCOL_VERSION, "op": "pull", "seq": 1, "worker": 0, "names": ["w"],
                      "dtypes": ["float32"], "shapes": [[2, 3]]}


def test_arrays_are_sent_as_views_without_a_copy():
    arr = np.arange(1000, dtype=np.float32)
    frames = encode("push", 1, 0, ["a"], [arr])
    assert np.shares_memory(frames[1], arr)


def test_reply_fields_round_trip_and_are_required_when_decoding_a_reply():
    ok = decode(as_bytes(encode("pull", 3, 1, ok=True)), reply=True)
    assert ok.header["ok"] is True
    err = decode(as_bytes(encode("pull", 3, 1, ok=False, error="no such table")), reply=True)
    assert err.header["error"] == "no such table"
    with pytest.raises(TransportError, match="header field 'ok' must be a bool"):
        decode(as_bytes(encode("pull", 3, 1)), reply=True)


@pytest.mark.parametrize(
    "names,arrays,meta,pattern",
    [
        (["a"], [np.zeros((4, 4), np.float32)[:, ::2]], None,
         "array 'a' is not C-contiguous; send np.ascontiguousarray"),
        (["a"], [np.zeros(3, np.float16)], None, "array 'a' has dtype <f2; send one of"),
        (["a"], [np.zeros(3, ">f4")], None, "array 'a' has dtype >f4; send one of .* native byte order"),
        (["a"], [np.array([object()])], None, "has dtype |O"),
        (["a", "b"], [np.zeros(1, np.float32)], None, "2 names for 1 arrays"),
        (["a", "a"], [np.zeros(1, np.float32)] * 2, None, "array name 'a' is used twice"),
        (["a"], [[1, 2]], None, "'a' is a list, not a numpy array"),
        ([], [], {"seq": 3}, "meta keys must be strings other than the reserved"),
        ([], [], {"x": object()}, "meta values must be msgpack types"),
    ],
)
def test_encode_refuses_what_cannot_be_sent_and_says_how_to_fix_it(names, arrays, meta, pattern):
    with pytest.raises(TransportError, match=pattern):
        encode("push", 1, 0, names, arrays, meta)


def test_encode_refuses_a_message_over_the_limit_naming_the_variable():
    with pytest.raises(TransportError, match="over the limit of 100; .* FLEET_MAX_MESSAGE_BYTES"):
        encode("push", 1, 0, ["a"], [np.zeros(100, np.float32)], max_bytes=100)


def test_encode_refuses_an_empty_op():
    with pytest.raises(TransportError, match="op '' must be a non-empty string"):
        encode("", 1, 0)


def good_frames():
    return as_bytes(encode("push", 9, 1, ["a", "b"], [np.zeros((2, 2), np.float32), np.arange(3)]))


def with_header(frames, **changes):
    header = header_of(frames)
    for key, value in changes.items():
        if value is KeyError:
            del header[key]
        else:
            header[key] = value
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        (lambda f: [b"\xc1garbage", *f[1:]], "header is not a valid msgpack map"),
        (lambda f: [msgpack.packb([1, 2]), *f[1:]], "header is a msgpack list, not a map"),
        (lambda f: [f[0][:-3], *f[1:]], "header is not a valid msgpack map"),
        (lambda f: [f[0] + b"\x00", *f[1:]], "header is not a valid msgpack map"),
        (lambda f: with_header(f, v=PROTOCOL_VERSION + 1),
         f"protocol version {PROTOCOL_VERSION + 1} is not {PROTOCOL_VERSION}"),
        (lambda f: with_header(f, v=KeyError), "protocol version None is not"),
        (lambda f: with_header(f, op=7), "header field 'op' must be a non-empty string"),
        (lambda f: with_header(f, seq="1"), "header field 'seq' must be an int64"),
        (lambda f: with_header(f, worker=True), "header field 'worker' must be an int64"),
        (lambda f: with_header(f, names=KeyError), "names, dtypes and shapes must be lists of equal length"),
        (lambda f: with_header(f, dtypes=["float32"]), "names, dtypes and shapes must be lists of equal length"),
        (lambda f: with_header(f, names=["a", "a"]), "array names must be unique strings"),
        (lambda f: with_header(f, dtypes=["float32", "object"]), "array 'b' has dtype 'object'"),
        (lambda f: with_header(f, shapes=[[2, 2], [-3]]), "array 'b' has shape \\[-3\\]"),
        (lambda f: with_header(f, shapes=[[2, 2], [1] * 40]), "expected a list of at most 32"),
        (lambda f: with_header(f, shapes=[[2, 2], [2**40, 2**40]]), "array 'b' has 24 bytes but int64"),
        (lambda f: f[:2], "header names 2 arrays but 1 buffer frames followed"),
        (lambda f: f + [b"extra"], "header names 2 arrays but 3 buffer frames followed"),
        (lambda f: [f[0], f[1][:-1], f[2]], "array 'a' has 15 bytes but float32\\[2, 2\\] needs 16"),
        (lambda f: [], "empty message"),
    ],
)
def test_decode_refuses_malformed_messages_with_a_message_saying_what_is_wrong(mutate, pattern):
    with pytest.raises(TransportError, match=pattern):
        decode(mutate(good_frames()))


def test_decode_refuses_a_message_over_the_limit():
    with pytest.raises(TransportError, match="over the limit of 20"):
        decode(good_frames(), max_bytes=20)


def test_salvage_recovers_op_and_seq_of_a_malformed_header_when_it_can():
    assert salvage(with_header(good_frames(), v=99)[0]) == ("push", 9, 1)
    assert salvage(b"\xc1") == ("?", -1, -1)
    assert salvage(msgpack.packb({"op": 5, "seq": "x"})) == ("?", -1, -1)


def test_messages_expose_names_and_arrays_by_name():
    msg = decode(good_frames())
    assert msg.names == ["a", "b"] and "a" in msg and "c" not in msg
    assert list(msg.as_dict()) == ["a", "b"]
    with pytest.raises(KeyError, match="message 'push' has no array 'c'"):
        msg["c"]


@pytest.mark.parametrize("name,getter", [("FLEET_RPC_TIMEOUT_MS", settings.rpc_timeout_ms),
                                         ("FLEET_CONNECT_TIMEOUT_MS", settings.connect_timeout_ms),
                                         ("FLEET_MAX_MESSAGE_BYTES", settings.max_message_bytes)])
def test_settings_come_from_the_environment_and_bad_values_name_the_variable(monkeypatch, name, getter):
    monkeypatch.delenv(name, raising=False)
    default = getter()
    assert default > 0
    monkeypatch.setenv(name, "1234")
    assert getter() == 1234
    monkeypatch.setenv(name, "-5")
    with pytest.raises(ConfigError) as info:
        getter()
    assert str(info.value).startswith(f"{name}='-5' is not an integer >= 1; set {name} to the ")
    assert str(info.value).endswith(f", or unset it to use the default {default}")


def test_only_the_transport_imports_zmq_and_msgpack_and_tables_do_not_import_it():
    import pathlib

    root = pathlib.Path(message.__file__).parents[1]
    offenders = []
    for path in root.rglob("*.py"):
        if path.parent.name == "transport":
            continue
        text = path.read_text()
        if any(line.strip().startswith(("import zmq", "from zmq", "import msgpack", "from msgpack"))
               for line in text.splitlines()):
            offenders.append(str(path.relative_to(root)))
        if path.parent.name == "tables" and "fleet.transport" in text:
            offenders.append(str(path.relative_to(root)))
    assert offenders == []
