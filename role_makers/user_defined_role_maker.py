"""Role makers whose role is given in code: `UserDefinedRoleMaker` and
`UserDefinedCollectiveRoleMaker`.

Arguments are validated in the constructor, in Paddle's order and with Paddle's messages
(each followed by the value seen). Type errors are the builtin ``TypeError`` as in Paddle;
value errors are `RoleError`, a ``ValueError``.
"""
import numbers

from fleet.errors import RoleError
from role_makers._env import endpoint_problem
from role_makers.base import Role, RoleMakerBase


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_endpoint_list(arg_name, endpoints):
    """Validate a list of "host:port" strings given as an argument.

    Returns:
        list[str]: a copy of the list.

    Raises:
        TypeError: not a list, or an element is not a str.
        RoleError: the list is empty, has duplicates, or an element is not host:port.
    """
    if not isinstance(endpoints, list):
        raise TypeError(f"{arg_name} must be as string list: got {endpoints!r}")
    if len(endpoints) == 0:
        raise RoleError(
            f"the length of {arg_name} list must be greater than 0: got [], "
            'pass one "host:port" string per process'
        )
    hashable = [e for e in endpoints if isinstance(e, (str, numbers.Number))]
    duplicates = sorted({repr(e) for e in hashable if hashable.count(e) > 1})
    if duplicates:
        raise RoleError(
            f"{arg_name} can't have duplicate elements: {', '.join(duplicates)} "
            f"appear more than once in {endpoints!r}"
        )
    for index, endpoint in enumerate(endpoints):
        if not isinstance(endpoint, str):
            raise TypeError(
                f"every element in {arg_name} list must be as string: "
                f"{arg_name}[{index}] is {endpoint!r}"
            )
        problem = endpoint_problem(endpoint)
        if problem is not None:
            raise RoleError(
                f"{arg_name}[{index}]={endpoint!r} is not host:port ({problem}); "
                "write it like '127.0.0.1:6170'"
            )
    return list(endpoints)


def _check_current_id(current_id):
    if not _is_int(current_id):
        raise TypeError(f"current_id must be as int: got {current_id!r}")
    if current_id < 0:
        raise RoleError(f"current_id must be greater than or equal to 0: got {current_id}")
    return int(current_id)


class UserDefinedRoleMaker(RoleMakerBase):
    """A parameter-server role given explicitly (tests, custom launchers).

    Args:
        current_id: this process's index among its kind (worker or server index).
        role: ``Role.WORKER`` or ``Role.SERVER``.
        worker_num: the number of workers (> 0).
        server_endpoints: list of every server's "host:port", in server-index order.

    Raises:
        TypeError: an argument has the wrong type (Paddle's messages: "server_endpoints
            must be as string list", "every element in server_endpoints list must be as
            string", "role must be as Role", "current_id must be as int", "worker_num must
            be as int").
        RoleError: an argument has a bad value (Paddle's messages: "the length of
            server_endpoints list must be greater than 0", "server_endpoints can't have
            duplicate elements", "current_id must be greater than or equal to 0", "if role
            is Role.SERVER, current_id must be less than or equal to len(server_endpoints)
            - 1", "worker_num must be greater than 0"); fleet also rejects an endpoint that
            is not host:port and a worker whose current_id is not below worker_num.
    """

    def __init__(self, current_id=0, role=Role.WORKER, worker_num=0, server_endpoints=None):
        super().__init__()
        servers = _check_endpoint_list("server_endpoints", server_endpoints)
        if not _is_int(role) or role not in (Role.WORKER, Role.SERVER):
            raise TypeError(f"role must be as Role (Role.WORKER or Role.SERVER): got {role!r}")
        role = Role(role)
        current_id = _check_current_id(current_id)
        if role == Role.SERVER and current_id >= len(servers):
            raise RoleError(
                "if role is Role.SERVER, current_id must be less than or equal to "
                f"len(server_endpoints) - 1: got current_id={current_id} with "
                f"{len(servers)} server_endpoints"
            )
        if not _is_int(worker_num):
            raise TypeError(f"worker_num must be as int: got {worker_num!r}")
        if worker_num <= 0:
            raise RoleError(f"worker_num must be greater than 0: got {worker_num}")
        if role == Role.WORKER and current_id >= worker_num:
            raise RoleError(
                "if role is Role.WORKER, current_id must be less than or equal to "
                f"worker_num - 1: got current_id={current_id} with worker_num={worker_num}"
            )
        self._current_id = current_id
        self._role = role
        self._worker_num = int(worker_num)
        self._server_endpoints = servers

    def generate_role(self):
        """Mark the role generated (it was fixed by the constructor)."""
        self._role_is_generated = True


class UserDefinedCollectiveRoleMaker(RoleMakerBase):
    """A collective (workers only, no servers) role given explicitly.

    Args:
        current_id: this worker's index in ``worker_endpoints``.
        worker_endpoints: list of every worker's "host:port", in worker-index order.

    Raises:
        TypeError: "worker_endpoints must be as string list", "every element in
            worker_endpoints list must be as string", "current_id must be as int".
        RoleError: "the length of worker_endpoints list must be greater than 0",
            "worker_endpoints can't have duplicate elements", "current_id must be greater
            than or equal to 0", "current_id must be less than or equal to
            len(worker_endpoints) - 1", or an endpoint that is not host:port.
    """

    def __init__(self, current_id=0, worker_endpoints=None):
        super().__init__()
        workers = _check_endpoint_list("worker_endpoints", worker_endpoints)
        current_id = _check_current_id(current_id)
        if current_id >= len(workers):
            raise RoleError(
                "current_id must be less than or equal to len(worker_endpoints) - 1: got "
                f"current_id={current_id} with {len(workers)} worker_endpoints"
            )
        self._current_id = current_id
        self._role = Role.WORKER
        self._worker_num = len(workers)
        self._worker_endpoints = workers

    def generate_role(self):
        """Mark the role generated (it was fixed by the constructor)."""
        self._role_is_generated = True
