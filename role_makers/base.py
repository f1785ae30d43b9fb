"""Who this process is: the `Role` enum and the `RoleMakerBase` every role maker extends.

A role maker answers three questions for the fleet layer: is this process a worker or a
parameter server, what is its index among its kind, and where are the servers (and,
when known, the workers). Subclasses only implement `generate_role()`, which fills the
fields below; every getter generates the role lazily on first use.

Role makers hold plain settings: after `generate_role()` returns they never change, so
reading them from several threads is safe. `generate_role()` itself is not meant to be
called concurrently (call it, or any getter, once from the main thread first).
"""
import enum


class Role(enum.IntEnum):
    """The role of a process: WORKER (1, trains) or SERVER (2, holds parameters).

    An ``IntEnum`` so that ``Role.WORKER == 1`` as in Paddle, where the roles were
    plain integers.
    """

    WORKER = 1
    SERVER = 2


class RoleMakerBase:
    """Base class of role makers; `fleet.init` accepts any instance of it.

    Subclasses implement `generate_role()`, which must set ``_role``, ``_current_id``,
    ``_worker_num``, ``_server_endpoints``, ``_worker_endpoints`` (and ``_is_local`` when
    the process trains alone) and then ``_role_is_generated = True``.

    Thread-safety: getters only read fields once the role is generated; see the module
    docstring.
    """

    def __init__(self):
        self._worker_endpoints = []
        self._server_endpoints = []
        self._role_is_generated = False
        self._role = None
        self._current_id = -1
        self._worker_num = 0
        self._is_local = False

    def generate_role(self):
        """Determine the role of this process; calling it again does nothing.

        Raises:
            NotImplementedError: in the base class (as Paddle); subclasses implement it.
        """
        raise NotImplementedError("Please implement this method in child class")

    def _generated(self):
        if not self._role_is_generated:
            self.generate_role()
        return self

    def is_worker(self):
        """Returns: True if this process trains (Role.WORKER)."""
        return self._generated()._role == Role.WORKER

    def is_server(self):
        """Returns: True if this process is a parameter server (Role.SERVER)."""
        return self._generated()._role == Role.SERVER

    def is_first_worker(self):
        """Returns: True for worker 0, the one that saves models and logs."""
        return self.is_worker() and self._current_id == 0

    def is_local(self):
        """Returns: True if this process trains alone, with no parameter servers."""
        return self._generated()._is_local

    def worker_num(self):
        """Returns: the number of workers (int >= 1)."""
        return self._generated()._worker_num

    def worker_index(self):
        """Index of this process among its kind.

        Returns:
            int: the worker index on a worker. As in Paddle, a server gets its server
            index here too (``worker_index`` and ``server_index`` both return the
            process's id).
        """
        return self._generated()._current_id

    def server_index(self):
        """Returns: the server index on a server (the process's id on a worker, as Paddle)."""
        return self._generated()._current_id

    def server_num(self):
        """Returns: the number of parameter servers (0 in local training)."""
        return len(self._generated()._server_endpoints)

    def role_id(self):
        """Returns: worker_index() on a worker, server_index() on a server."""
        return self.worker_index() if self.is_worker() else self.server_index()

    def get_trainer_endpoints(self):
        """Returns: a new list of the workers' "host:port" strings (empty when unknown)."""
        return list(self._generated()._worker_endpoints)

    def get_pserver_endpoints(self):
        """Returns: a new list of the servers' "host:port" strings, in server-index order."""
        return list(self._generated()._server_endpoints)

    def to_string(self):
        """Returns: a one-line description (Paddle's format) of the generated role."""
        self._generated()
        return "role: {}, current_id: {}, worker_endpoints: {}, server_endpoints: {}".format(
            self._role, self._current_id, self._worker_endpoints, self._server_endpoints
        )

    def __repr__(self):
        # Never generates the role: a repr must not raise on a bad environment.
        if not self._role_is_generated:
            return f"<{type(self).__name__} (role not generated yet)>"
        return f"<{type(self).__name__} {self.to_string()}>"
