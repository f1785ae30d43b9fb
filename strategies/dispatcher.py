"""Placing variables (parameter blocks) on parameter servers: `RoundRobin` and `HashName`.

``DistributeTranspilerConfig.split_method`` names one of these (or a user subclass of
`PSDispatcher`); the transpiler dispatches every gradient block and then, after `reset()`,
every parameter block in the same order, so block i of a gradient and block i of its
parameter land on the same server.

Dispatchers keep a cursor (`RoundRobin`), so one instance is not thread-safe; the
transpiler uses one per transpile.
"""
import zlib


def _var_name(var):
    """The name of a variable given as a str, an object with ``.name`` or ``.name()``."""
    if isinstance(var, str):
        return var
    name = getattr(var, "name", None)
    if callable(name):
        name = name()
    if not isinstance(name, str):
        raise TypeError(
            f"cannot dispatch {var!r}: pass variable names (str) or objects with a str "
            "'name' attribute"
        )
    return name


class PSDispatcher:
    """Base class: maps each variable of a list to a server endpoint.

    Args:
        pserver_endpoints: non-empty list of "host:port" strings, in server-index order.

    Raises:
        TypeError: ``pserver_endpoints`` is not a non-empty list of str.
    """

    def __init__(self, pserver_endpoints):
        if (
            not isinstance(pserver_endpoints, (list, tuple))
            or len(pserver_endpoints) == 0
            or not all(isinstance(ep, str) for ep in pserver_endpoints)
        ):
            raise TypeError(
                f"pserver_endpoints must be a non-empty list of 'host:port' strings, "
                f"got {pserver_endpoints!r}"
            )
        self._eps = list(pserver_endpoints)
        self._step = 0

    @property
    def eps(self):
        """The server endpoints (list of str)."""
        return self._eps

    def reset(self):
        """Restart from the first server (RoundRobin's cursor back to 0)."""
        self._step = 0

    def dispatch(self, varlist):
        """Choose a server for each variable.

        Args:
            varlist: variables (names or objects with a name), in order.

        Returns:
            list[str]: one endpoint per variable, parallel to ``varlist``.

        Raises:
            NotImplementedError: in the base class, as in Paddle.
        """
        raise NotImplementedError("Interface has not been implemented.")


class RoundRobin(PSDispatcher):
    """Deal variables to servers in turn; the cursor persists across calls until `reset()`."""

    def dispatch(self, varlist):
        """Returns: for each variable, the next endpoint in turn (see `PSDispatcher.dispatch`)."""
        chosen = []
        for _ in varlist:
            chosen.append(self._eps[self._step])
            self._step = (self._step + 1) % len(self._eps)
        return chosen


class HashName(PSDispatcher):
    """Place each variable by a stable hash of its name: ``crc32(name) % len(eps)``.

    Paddle used Python's ``hash()``, which is salted per process (PYTHONHASHSEED), so two
    processes could disagree on where a variable lives; crc32 gives every process, on
    every run, the same placement.
    """

    def dispatch(self, varlist):
        """Returns: for each variable, the endpoint its name hashes to (see `PSDispatcher.dispatch`).

        Raises:
            TypeError: an element has no str name.
        """
        count = len(self._eps)
        return [self._eps[zlib.crc32(_var_name(v).encode("utf-8")) % count] for v in varlist]
