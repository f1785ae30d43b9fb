"""What fleet says while it runs: the ``fleet`` logger's default output and wait messages.

fleet logs on the ``fleet`` logger and its children (``fleet.server``, ``fleet.transport``,
``fleet.dataset``). ``install_default_handler()`` (called by ``fleet.init``) makes that
output visible without any logging setup, as Paddle's own modules do: INFO and above go
to stderr, as ``HH:MM:SS message``, unless the application configured logging itself
(the root logger has a handler), in which case records go only to the application's
handlers. Quiet it with ``logging.getLogger("fleet").setLevel(logging.WARNING)``.

``WaitLog`` is how every blocking wait that can last seconds says what it waits for:
once it has lasted FLEET_WAIT_LOG_MS (5 s), then each time its length has doubled (at
most every 30 s), so a silent process is never a mystery and a long wait does not flood
the log.

Thread-safety: ``WaitLog`` is for one waiting thread; ``install_default_handler`` may be
called from any thread.
"""
import logging
import sys
import threading
import time

from fleet.envvars import env_int

WAIT_LOG_MS_ENV = "FLEET_WAIT_LOG_MS"
DEFAULT_WAIT_LOG_MS = 5000
MAX_WAIT_LOG_GAP_S = 30.0

_install_lock = threading.Lock()


class _DefaultHandler(logging.StreamHandler):
    """Writes to the current sys.stderr while the application has not configured logging."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the current stderr is used
        pass

    def emit(self, record):
        if logging.getLogger().handlers:  # the application's handlers get it by propagation
            return
        super().emit(record)


def install_default_handler():
    """Makes the ``fleet`` logger write INFO and above to stderr (see the module
    docstring). Idempotent; leaves a level or handler the application set alone."""
    logger = logging.getLogger("fleet")
    with _install_lock:
        if any(isinstance(h, _DefaultHandler) for h in logger.handlers):
            return
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        logger.addHandler(_DefaultHandler())


def wait_log_ms():
    """FLEET_WAIT_LOG_MS: how long a wait lasts before it says what it waits for (5000;
    0 turns these messages off).

    Raises:
        ConfigError: not an integer >= 0.
    """
    return env_int(WAIT_LOG_MS_ENV, DEFAULT_WAIT_LOG_MS, 0,
                   "the milliseconds a wait lasts before it is logged (0: never)")


class WaitLog:
    """Logs a blocking wait: once it has lasted ``first_s``, then whenever its length has
    doubled since the last message (at most MAX_WAIT_LOG_GAP_S apart).

    Each message is ``waiting for <what> (<progress>) for <n> s; <limit>``: the caller's
    ``what`` names whom it waits for, ``progress`` (given to ``tick``) says how far it
    got, e.g. ``1 of 2 answered; not yet 127.0.0.1:6171``.

    Args:
        what: e.g. "servers 127.0.0.1:6170, 127.0.0.1:6171".
        limit: how the wait ends if it never does, e.g. "giving up after 60 s
            (FLEET_CONNECT_TIMEOUT_MS)"; None for nothing.
        logger: where to log (default the ``fleet`` logger), at INFO.
        first_s: seconds before the first message (default FLEET_WAIT_LOG_MS); 0 or less:
            never log.
        clock: time source (tests).
        started: when the wait began, on ``clock`` (default: now).

    Raises:
        ConfigError: FLEET_WAIT_LOG_MS is malformed.
    """

    def __init__(self, what, limit=None, logger=None, first_s=None, clock=time.monotonic, started=None):
        self.what = what
        self.limit = limit
        self.logger = logger or logging.getLogger("fleet")
        self.first_s = wait_log_ms() / 1000.0 if first_s is None else float(first_s)
        self.clock = clock
        self.started = clock() if started is None else started
        self.messages = 0
        self._due = self.started + self.first_s if self.first_s > 0 else None

    def next_due_s(self):
        """Seconds until the next message is due (None: never); a waiter that blocks in
        one call can wake up then to ``tick``."""
        return None if self._due is None else max(0.0, self._due - self.clock())

    def tick(self, progress=None):
        """Logs if a message is due. Never blocks.

        Args:
            progress: how far the wait got (a short clause), or None.

        Returns:
            The message logged, or None.
        """
        if self._due is None:
            return None
        now = self.clock()
        if now < self._due:
            return None
        waited = now - self.started
        text = f"waiting for {self.what}"
        if progress:
            text += f" ({progress})"
        text += f" for {waited:.1f} s" if waited < 10 else f" for {waited:.0f} s"
        if self.limit:
            text += f"; {self.limit}"
        self.logger.info("%s", text)
        self.messages += 1
        self._due = now + min(max(waited, self.first_s), MAX_WAIT_LOG_GAP_S)
        return text
