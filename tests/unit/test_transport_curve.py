"""CURVE: authenticated clients are served, others are refused; off means unchanged."""
import contextlib
import os

import numpy as np
import pytest
import zmq

from fleet.errors import ConfigError, FleetTimeoutError, TransportError
from fleet.transport import Client, CurveConfig, ServerSocket, generate_keys, serving as serve_with, wait_for_servers
from fleet.transport import curve as curve_module

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")


def echo(request):
    request.reply(request.names, request.arrays)


@contextlib.contextmanager
def serving(curve):
    server = ServerSocket("127.0.0.1:0", curve=curve)
    with serve_with(server, echo, poll_ms=20):
        yield server


@pytest.fixture
def keys(tmp_path):
    return generate_keys(str(tmp_path / "keys"))


def test_generate_keys_writes_a_private_directory_that_loads_back(tmp_path, keys):
    directory = tmp_path / "keys"
    assert sorted(os.listdir(directory)) == ["authorized_clients", "client.key", "client.key_secret",
                                              "server.key", "server.key_secret"]
    assert (directory.stat().st_mode & 0o777) == 0o700
    assert (os.stat(directory / "server.key_secret").st_mode & 0o777) == 0o600
    again = CurveConfig.from_dir(str(directory))
    assert again.server_public == keys.server_public and again.client_secret == keys.client_secret
    assert keys.authorized_clients == {keys.client_public}


def test_an_authenticated_client_pushes_and_pulls(keys):
    with serving(keys) as server, Client(server.endpoint, 0, curve=keys, timeout_ms=5000) as client:
        reply = client.request("echo", ["w"], [np.arange(6, dtype=np.float32)])
        np.testing.assert_array_equal(reply["w"], np.arange(6, dtype=np.float32))
        wait_for_servers([server.endpoint], timeout_ms=5000, curve=keys)


def test_a_client_without_keys_gets_no_answer_and_a_hint_at_curve(keys):
    with serving(keys) as server, Client(server.endpoint, 0, timeout_ms=300) as client:
        with pytest.raises(FleetTimeoutError, match="If the servers use CURVE authentication"):
            client.request("echo", ["w"], [np.ones(3)])
        assert server.stats()["received"] == 0


def test_waiting_for_a_curve_server_without_keys_ends_naming_curve_whatever_the_pings_meet(keys, monkeypatch):
    # A keyless ping may find no connection to queue on (ZeroMQ drops a connection whose
    # CURVE handshake failed and connects again): the wait goes on to its deadline and
    # then names the server and CURVE, never "its queue is full" (seen once in CI).
    calls = []
    real_send = Client.send_request

    def send_request(self, op, *args, **kwargs):
        calls.append(op)
        if len(calls) % 2 == 0:  # every other ping meets no connection
            raise FleetTimeoutError(f"could not send {op!r} to server {self.endpoint} within 1 ms: its queue is full")
        return real_send(self, op, *args, **kwargs)
    monkeypatch.setattr(Client, "send_request", send_request)
    with serving(keys) as server:
        with pytest.raises(FleetTimeoutError, match=r"did not answer within 800 ms.*needs the keys too") as err:
            wait_for_servers([server.endpoint], timeout_ms=800, retry_ms=100)
        assert server.endpoint in str(err.value) and "queue is full" not in str(err.value)
        assert len(calls) >= 4 and server.stats()["received"] == 0


def test_a_client_with_a_key_the_server_does_not_know_is_refused(tmp_path, keys):
    stranger = generate_keys(str(tmp_path / "other"))
    impostor = CurveConfig(keys.server_public, client_public=stranger.client_public,
                           client_secret=stranger.client_secret)
    with serving(keys) as server, Client(server.endpoint, 0, curve=impostor, timeout_ms=300) as client:
        with pytest.raises(FleetTimeoutError, match="check that the server authorizes this client's public key"):
            client.request("echo", ["w"], [np.ones(3)])
        assert server.stats()["received"] == 0
        with Client(server.endpoint, 1, curve=keys, timeout_ms=5000) as friend:
            assert friend.request("echo", ["w"], [np.ones(2)])["w"].tolist() == [1.0, 1.0]


def test_keys_from_environment_variables_configure_both_sides(monkeypatch):
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    extra_public, _ = zmq.curve_keypair()
    monkeypatch.delenv("FLEET_CURVE_KEYS_DIR", raising=False)
    monkeypatch.setenv("FLEET_CURVE_SERVER_PUBLIC", server_public.decode())
    monkeypatch.setenv("FLEET_CURVE_SERVER_SECRET", server_secret.decode())
    monkeypatch.setenv("FLEET_CURVE_CLIENT_PUBLIC", client_public.decode())
    monkeypatch.setenv("FLEET_CURVE_CLIENT_SECRET", client_secret.decode())
    monkeypatch.setenv("FLEET_CURVE_AUTHORIZED_CLIENTS", extra_public.decode())
    config = CurveConfig.from_env()
    assert config.authorized_clients == {client_public, extra_public}
    with serving(config) as server, Client(server.endpoint, 0, curve=config, timeout_ms=5000) as client:
        assert client.request("echo", ["a"], [np.array([4])])["a"].tolist() == [4]


def test_keys_dir_variable_takes_precedence(monkeypatch, tmp_path, keys):
    monkeypatch.setenv("FLEET_CURVE_KEYS_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("FLEET_CURVE_SERVER_PUBLIC", "not even a key")
    assert CurveConfig.from_env().server_public == keys.server_public


def test_curve_is_off_without_any_variable():
    environ = {"PATH": "/bin"}
    assert CurveConfig.from_env(environ) is None


def test_a_malformed_key_variable_is_named_without_showing_its_value():
    environ = {"FLEET_CURVE_SERVER_PUBLIC": zmq.curve_keypair()[0].decode(),
               "FLEET_CURVE_CLIENT_SECRET": "secret-value"}
    pattern = "the FLEET_CURVE_CLIENT_SECRET from the environment is not a CURVE key"
    with pytest.raises(ConfigError, match=pattern) as info:
        CurveConfig.from_env(environ)
    assert "secret-value" not in str(info.value)


def test_a_missing_server_public_key_is_named():
    with pytest.raises(ConfigError, match="FLEET_CURVE_SERVER_PUBLIC is not"):
        CurveConfig.from_env({"FLEET_CURVE_CLIENT_PUBLIC": zmq.curve_keypair()[0].decode()})


def test_a_worker_config_cannot_start_a_server_and_says_what_is_missing(keys):
    worker_only = CurveConfig(keys.server_public, client_public=keys.client_public, client_secret=keys.client_secret)
    with pytest.raises(ConfigError, match="the server secret key is missing; a server process needs "
                                          "FLEET_CURVE_SERVER_SECRET"):
        ServerSocket("127.0.0.1:0", curve=worker_only)
    server_only = CurveConfig(keys.server_public, keys.server_secret, authorized_clients=[keys.client_public])
    with pytest.raises(ConfigError, match="the client key pair is missing"):
        Client("127.0.0.1:1", 0, curve=server_only)


def test_a_missing_key_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory; create one with"):
        CurveConfig.from_dir(str(tmp_path / "nope"))


def test_a_libzmq_without_curve_is_reported_clearly(monkeypatch):
    monkeypatch.setattr(curve_module.zmq, "has", lambda capability: False)
    with pytest.raises(TransportError, match="was built without it \\(zmq.has\\('curve'\\) is False\\)"):
        curve_module.check_curve_available()


def test_servers_with_and_without_curve_coexist_in_one_process(keys):
    with serving(keys) as secure, serving(None) as plain:
        with Client(plain.endpoint, 0, timeout_ms=5000) as client:
            assert client.request("echo", ["a"], [np.array([1])])["a"].tolist() == [1]
        with Client(secure.endpoint, 0, curve=keys, timeout_ms=5000) as client:
            assert client.request("echo", ["a"], [np.array([2])])["a"].tolist() == [2]
    assert curve_module.zap_registry._auth is None  # the ZAP thread stops with the last CURVE server
