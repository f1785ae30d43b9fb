"""Optional ZeroMQ CURVE: authenticated, encrypted sockets.

With CURVE on, a server's ROUTER is a CURVE server that accepts only the client public
keys it authorizes (checked by a ZAP handler thread), and every worker's DEALER encrypts
to the server's public key with its own key pair. A client without the keys, or with a
key the server does not know, never completes the handshake: its requests time out and
nothing it sends reaches a handler.

Keys come from the environment (see docs/env.md), either a directory::

    FLEET_CURVE_KEYS_DIR=/path    # server.key, server.key_secret, client.key,
                                  # client.key_secret, authorized_clients/*.key

(``generate_keys(path)`` writes one), or Z85 key text (40 characters each)::

    FLEET_CURVE_SERVER_PUBLIC, FLEET_CURVE_SERVER_SECRET   (server processes)
    FLEET_CURVE_CLIENT_PUBLIC, FLEET_CURVE_CLIENT_SECRET   (worker processes)
    FLEET_CURVE_AUTHORIZED_CLIENTS                         (optional: more client public keys, comma list)

With none of them set, CURVE is off and sockets behave as without this module.
"""
import itertools
import logging
import os
import shutil
import threading

import zmq
import zmq.auth
from zmq.auth.base import Authenticator
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from fleet.errors import ConfigError, TransportError

KEYS_DIR_ENV = "FLEET_CURVE_KEYS_DIR"
SERVER_PUBLIC_ENV = "FLEET_CURVE_SERVER_PUBLIC"
SERVER_SECRET_ENV = "FLEET_CURVE_SERVER_SECRET"
CLIENT_PUBLIC_ENV = "FLEET_CURVE_CLIENT_PUBLIC"
CLIENT_SECRET_ENV = "FLEET_CURVE_CLIENT_SECRET"
AUTHORIZED_CLIENTS_ENV = "FLEET_CURVE_AUTHORIZED_CLIENTS"
_KEY_ENVS = (SERVER_PUBLIC_ENV, SERVER_SECRET_ENV, CLIENT_PUBLIC_ENV, CLIENT_SECRET_ENV, AUTHORIZED_CLIENTS_ENV)


def check_curve_available():
    """Raises TransportError if this libzmq was built without CURVE."""
    if not zmq.has("curve"):
        raise TransportError(
            f"CURVE was requested but libzmq {zmq.zmq_version()} was built without it (zmq.has('curve') is "
            f"False); install a pyzmq wheel (they bundle libsodium) or unset {KEYS_DIR_ENV} and FLEET_CURVE_*"
        )


class CurveConfig:
    """The CURVE keys of a job. Immutable; safe to share between threads.

    Args:
        server_public: the servers' public key (Z85 bytes or str); every process needs it.
        server_secret: the servers' secret key (server processes).
        client_public, client_secret: the workers' key pair (worker processes).
        authorized_clients: client public keys servers accept besides ``client_public``.
        source: where the keys came from (named in error messages).

    Raises:
        ConfigError: a key is not 40 characters of Z85 (the message names it, never its value).
    """

    def __init__(self, server_public, server_secret=None, client_public=None, client_secret=None,
                 authorized_clients=(), source="arguments"):
        self.source = source
        self.server_public = _key(server_public, "server public key", source)
        self.server_secret = _key(server_secret, "server secret key", source)
        self.client_public = _key(client_public, "client public key", source)
        self.client_secret = _key(client_secret, "client secret key", source)
        authorized = [_key(k, "authorized client key", source) for k in authorized_clients]
        if self.client_public is not None:
            authorized.append(self.client_public)
        self.authorized_clients = frozenset(authorized)

    @classmethod
    def from_env(cls, environ=None):
        """Returns the CurveConfig the environment describes, or None when CURVE is off.

        Raises:
            ConfigError: a variable is malformed or the key directory is incomplete.
        """
        environ = os.environ if environ is None else environ
        directory = environ.get(KEYS_DIR_ENV, "").strip()
        if directory:
            return cls.from_dir(directory)
        if not any(environ.get(name, "").strip() for name in _KEY_ENVS):
            return None
        if not environ.get(SERVER_PUBLIC_ENV, "").strip():
            raise ConfigError(f"CURVE variables are set but {SERVER_PUBLIC_ENV} is not; every process needs "
                              f"the servers' public key (or set {KEYS_DIR_ENV})")
        get = lambda name: environ.get(name, "").strip() or None  # noqa: E731
        for name in _KEY_ENVS[:4]:
            _key(get(name), name, "the environment")
        extra = [k.strip() for k in environ.get(AUTHORIZED_CLIENTS_ENV, "").split(",") if k.strip()]
        for key in extra:
            _key(key, f"a key in {AUTHORIZED_CLIENTS_ENV}", "the environment")
        return cls(get(SERVER_PUBLIC_ENV), get(SERVER_SECRET_ENV), get(CLIENT_PUBLIC_ENV),
                   get(CLIENT_SECRET_ENV), extra, source="FLEET_CURVE_* environment variables")

    @classmethod
    def from_dir(cls, directory):
        """Loads keys written by ``generate_keys`` (files that are absent are left None).

        Raises:
            ConfigError: the directory or its server.key is missing, or a file is not a key file.
        """
        if not os.path.isdir(directory):
            raise ConfigError(f"{KEYS_DIR_ENV}={directory!r} is not a directory; create one with "
                              f"fleet.transport.curve.generate_keys(dir)")

        def load(name):
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                return None, None
            try:
                return zmq.auth.load_certificate(path)
            except (OSError, ValueError) as e:
                raise ConfigError(f"CURVE key file {path!r} cannot be read as a ZeroMQ certificate: {e}") from e

        server_public, server_secret = load("server.key_secret")
        if server_public is None:
            server_public, _ = load("server.key")
        if server_public is None:
            raise ConfigError(f"CURVE key directory {directory!r} has no server.key; every process needs the "
                              f"servers' public key (write a directory with generate_keys(dir))")
        client_public, client_secret = load("client.key_secret")
        if client_public is None:
            client_public, _ = load("client.key")
        authorized = []
        auth_dir = os.path.join(directory, "authorized_clients")
        if os.path.isdir(auth_dir):
            authorized = list(zmq.auth.load_certificates(auth_dir))
        return cls(server_public, server_secret, client_public, client_secret, authorized,
                   source=f"{KEYS_DIR_ENV}={directory}")

    def apply_server(self, sock, zap_domain):
        """Makes ``sock`` a CURVE server with the server key pair and ZAP domain ``zap_domain``."""
        check_curve_available()
        if self.server_secret is None:
            raise ConfigError(f"CURVE is on ({self.source}) but the server secret key is missing; a server "
                              f"process needs {SERVER_SECRET_ENV} or server.key_secret in {KEYS_DIR_ENV}")
        if not self.authorized_clients:
            raise ConfigError(f"CURVE is on ({self.source}) but no client public key is authorized; set "
                              f"{CLIENT_PUBLIC_ENV} or put client.key in {KEYS_DIR_ENV}")
        sock.curve_server = True
        sock.curve_publickey = self.server_public
        sock.curve_secretkey = self.server_secret
        sock.zap_domain = zap_domain.encode()

    def apply_client(self, sock):
        """Makes ``sock`` a CURVE client of the servers with the client key pair."""
        check_curve_available()
        if self.client_public is None or self.client_secret is None:
            raise ConfigError(f"CURVE is on ({self.source}) but the client key pair is missing; a worker "
                              f"process needs {CLIENT_PUBLIC_ENV} and {CLIENT_SECRET_ENV} or client.key_secret "
                              f"in {KEYS_DIR_ENV}")
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.client_public
        sock.curve_secretkey = self.client_secret

    def __repr__(self):
        return f"CurveConfig(source={self.source!r}, authorized_clients={len(self.authorized_clients)})"


def generate_keys(directory):
    """Writes a new server and client key pair to ``directory`` and returns its CurveConfig.

    Files: server.key, server.key_secret, client.key, client.key_secret and
    authorized_clients/client.key. The directory is made private (0700) and secret files 0600.
    Copy it to every machine of the job and set FLEET_CURVE_KEYS_DIR to it.

    Raises:
        TransportError: libzmq lacks CURVE.
    """
    check_curve_available()
    auth_dir = os.path.join(directory, "authorized_clients")
    os.makedirs(auth_dir, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    for name in ("server", "client"):
        _, secret_file = zmq.auth.create_certificates(directory, name)
        os.chmod(secret_file, 0o600)
    shutil.copyfile(os.path.join(directory, "client.key"), os.path.join(auth_dir, "client.key"))
    return CurveConfig.from_dir(directory)


def _key(value, what, source):
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("ascii", "replace")
    try:
        ok = len(value) == 40 and len(z85.decode(value)) == 32
    except Exception:  # z85 raises several types on bad text
        ok = False
    if not ok:
        raise ConfigError(f"the {what} from {source} is not a CURVE key (40 characters of Z85, as "
                          f"zmq.curve_keypair() makes); regenerate it with generate_keys(dir)")
    return bytes(value)


class _Credentials:
    def __init__(self, keys):
        self.keys = keys

    def callback(self, domain, key):
        return key in self.keys

# How long closing a CURVE socket's owner waits for its ZAP authenticator thread, and for
# its ZeroMQ context to terminate, before it leaves them behind with a warning.
STOP_TIMEOUT_S = 5.0

_log = logging.getLogger("fleet.transport")


def stop_authenticator(auth, who, timeout_s=STOP_TIMEOUT_S):
    """Stops a ``ThreadAuthenticator`` waiting at most ``timeout_s`` for its thread (its
    own ``stop()`` waits without bound). Returns whether it stopped; if not, logs a
    warning naming ``who`` and leaves the thread (a daemon) and its sockets open."""
    pipe, thread = auth.pipe, auth.thread
    if pipe is None:
        return True
    if thread is not None and thread.is_alive():
        try:
            pipe.send(b"TERMINATE", zmq.NOBLOCK)
        except zmq.ZMQError:  # the thread's end is gone: it is ending by itself
            pass
        thread.join(timeout_s)
        if thread.is_alive():
            _log.warning("fleet: %s: the CURVE authenticator thread did not stop within %g s; leaving it and "
                         "its ZeroMQ context open (they end with the process)", who, timeout_s)
            return False
    auth.thread = None
    pipe.close(linger=0)
    auth.pipe = None
    Authenticator.stop(auth)  # closes the ZAP socket
    return True


def terminate_context(ctx, who, timeout_s=STOP_TIMEOUT_S):
    """``ctx.term()`` (every socket of ``ctx`` must be closed), waiting at most
    ``timeout_s``; past that, logs a warning naming ``who`` and returns False (the
    termination goes on in a daemon thread)."""
    done = threading.Thread(target=ctx.term, name="fleet-zmq-term", daemon=True)
    done.start()
    done.join(timeout_s)
    if done.is_alive():
        _log.warning("fleet: %s: its ZeroMQ context did not terminate within %g s (a socket of it is still "
                     "open); leaving it to end with the process", who, timeout_s)
        return False
    return True


class _ZapRegistry:
    """One ZAP authenticator per process (ZeroMQ allows one per context), shared by servers.

    Each CURVE server socket gets its own ZAP domain with its own set of allowed keys;
    the authenticator thread runs while at least one is registered.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._auth = None
        self._pid = None
        self._domains = set()
        self._counter = itertools.count()

    def register(self, keys):
        """Returns a new ZAP domain that accepts exactly the client public ``keys``."""
        with self._lock:
            if self._auth is None or self._pid != os.getpid():
                self._auth = ThreadAuthenticator(zmq.Context.instance())
                self._auth.start()
                self._pid = os.getpid()
                self._domains = set()
            domain = f"fleet-{os.getpid()}-{next(self._counter)}"
            self._auth.configure_curve_callback(domain, _Credentials(frozenset(keys)))
            self._domains.add(domain)
            return domain

    def unregister(self, domain):
        """Forgets ``domain``; stops the authenticator when no domain is left."""
        with self._lock:
            if self._auth is None or domain not in self._domains:
                return
            self._domains.discard(domain)
            self._auth.credentials_providers.pop(domain, None)
            if not self._domains:
                stop_authenticator(self._auth, f"process {os.getpid()}'s servers")
                self._auth = None


zap_registry = _ZapRegistry()
