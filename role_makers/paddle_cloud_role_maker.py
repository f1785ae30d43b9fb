"""`PaddleCloudRoleMaker`: the role of this process, read from Paddle's environment variables.

Parameter-server mode reads exactly Paddle 1.7's variables:

=============================  ==========  ==================================================
variable                       read by     meaning
=============================  ==========  ==================================================
TRAINING_ROLE                  all         TRAINER or PSERVER; unset means local training
PADDLE_PSERVERS_IP_PORT_LIST   all         comma list of every server's host:port
PADDLE_TRAINERS_NUM            all         number of workers (>= 1)
PADDLE_TRAINER_ENDPOINTS       all         optional comma list of the workers' host:port
PADDLE_TRAINER_ID              TRAINER     this worker's index in [0, PADDLE_TRAINERS_NUM)
POD_IP, PADDLE_PORT            PSERVER     this server's host and port; POD_IP:PADDLE_PORT
                                           must be an entry of PADDLE_PSERVERS_IP_PORT_LIST
=============================  ==========  ==================================================

Collective mode (``is_collective=True``) reads PADDLE_TRAINER_ENDPOINTS (required),
PADDLE_TRAINER_ID (default 0) and PADDLE_TRAINING_ROLE (default TRAINER, the only value
allowed); it has workers only, no servers.
"""
import logging
import os
import threading

from fleet.endpoints import join_endpoint
from fleet.errors import RoleError
from role_makers._env import parse_endpoint_list, parse_int, require
from role_makers.base import Role, RoleMakerBase

_logger = logging.getLogger("fleet")
_local_notice_lock = threading.Lock()
_local_notice_given = False

_SERVERS_MEANING = (
    "the comma list of every parameter server's host:port, e.g. '127.0.0.1:6170,127.0.0.1:6171'"
)


def _give_local_notice():
    """Log, once per process, that an unset TRAINING_ROLE means local training."""
    global _local_notice_given
    with _local_notice_lock:
        if _local_notice_given:
            return
        _local_notice_given = True
    _logger.warning(
        "TRAINING_ROLE is not set: PaddleCloudRoleMaker runs this process as one local "
        "worker with no parameter servers. To train distributed, set TRAINING_ROLE=TRAINER "
        "or PSERVER and the PADDLE_* variables (or start the script with fleetrun)."
    )


class PaddleCloudRoleMaker(RoleMakerBase):
    """Role maker that reads the role from environment variables, as Paddle's does.

    With ``TRAINING_ROLE`` unset, the process is one local worker with no servers
    (``is_local()`` is True; a warning on the "fleet" logger says so once per process).
    With it set, every variable the role needs must be present and well formed.

    Args:
        is_collective: False (default) for parameter-server training; True reads the
            collective variables (workers only, no servers).

    Raises:
        TypeError: ``is_collective`` is not a bool.

    The environment is read on the first call to `generate_role()` or any getter, not in
    the constructor. Not thread-safe until the role is generated.
    """

    def __init__(self, is_collective=False):
        super().__init__()
        if not isinstance(is_collective, bool):
            raise TypeError(f"is_collective must be a bool, got {is_collective!r}")
        self._is_collective = is_collective

    def generate_role(self):
        """Read the environment and fix this process's role; later calls do nothing.

        Raises:
            RoleError: (a ValueError) a variable the role needs is missing or malformed;
                the message names the variable, the value seen and what was expected.
        """
        if self._role_is_generated:
            return
        if self._is_collective:
            self._generate_collective(os.environ)
        else:
            self._generate_parameter_server(os.environ)
        self._role_is_generated = True

    def _generate_parameter_server(self, env):
        role_text = env.get("TRAINING_ROLE")
        if role_text is None and env.get("PADDLE_CURRENT_ENDPOINT") and \
                len(env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")) > 1:
            raise RoleError(
                f"PADDLE_CURRENT_ENDPOINT={env['PADDLE_CURRENT_ENDPOINT']!r} and PADDLE_TRAINER_ENDPOINTS list "
                "several workers without TRAINING_ROLE: this is a collective job (fleetrun --collective); "
                "create the role maker with PaddleCloudRoleMaker(is_collective=True), or this process "
                "would train alone")
        if role_text is None:
            self._role, self._current_id, self._worker_num = Role.WORKER, 0, 1
            self._server_endpoints, self._worker_endpoints = [], []
            self._is_local = True
            _give_local_notice()
            return
        if role_text not in ("TRAINER", "PSERVER"):
            raise RoleError(
                f"TRAINING_ROLE={role_text!r} is not valid: TRAINING_ROLE must be PSERVER "
                "or TRAINER (or unset it to train locally)"
            )
        needed_by = f"TRAINING_ROLE={role_text}"
        servers = parse_endpoint_list(
            "PADDLE_PSERVERS_IP_PORT_LIST",
            require(env, "PADDLE_PSERVERS_IP_PORT_LIST", needed_by, _SERVERS_MEANING),
        )
        worker_num = parse_int(
            "PADDLE_TRAINERS_NUM",
            require(env, "PADDLE_TRAINERS_NUM", needed_by, "the number of workers (>= 1)"),
            1, None, "the number of workers",
        )
        workers = self._read_trainer_endpoints(env, worker_num)
        if role_text == "TRAINER":
            role = Role.WORKER
            meaning = f"this worker's index in [0, PADDLE_TRAINERS_NUM={worker_num})"
            current_id = parse_int(
                "PADDLE_TRAINER_ID", require(env, "PADDLE_TRAINER_ID", needed_by, meaning),
                0, worker_num, meaning,
            )
        else:
            role = Role.SERVER
            current_id = self._find_server_index(env, servers, needed_by)
        self._role, self._current_id, self._worker_num = role, current_id, worker_num
        self._server_endpoints, self._worker_endpoints = servers, workers
        self._is_local = False

    @staticmethod
    def _read_trainer_endpoints(env, worker_num):
        text = env.get("PADDLE_TRAINER_ENDPOINTS", "")
        if not text.strip():
            return []
        workers = parse_endpoint_list("PADDLE_TRAINER_ENDPOINTS", text)
        if len(workers) != worker_num:
            raise RoleError(
                f"PADDLE_TRAINER_ENDPOINTS={text!r} lists {len(workers)} endpoints but "
                f"PADDLE_TRAINERS_NUM={worker_num}; list one host:port per worker, or unset "
                "PADDLE_TRAINER_ENDPOINTS"
            )
        return workers

    @staticmethod
    def _find_server_index(env, servers, needed_by):
        host = require(
            env, "POD_IP", needed_by,
            "this server's IP address as it appears in PADDLE_PSERVERS_IP_PORT_LIST",
        )
        port = parse_int(
            "PADDLE_PORT",
            require(env, "PADDLE_PORT", needed_by, "the port this server listens on (1..65535)"),
            1, 65536, "the port this server listens on",
        )
        endpoint = join_endpoint(host.strip().strip("[]"), port)
        if endpoint not in servers:
            raise RoleError(
                f"POD_IP:PADDLE_PORT={endpoint!r} is not in PADDLE_PSERVERS_IP_PORT_LIST, "
                f"which holds {servers}; set POD_IP and PADDLE_PORT to this server's entry "
                "of that list"
            )
        return servers.index(endpoint)

    def _generate_collective(self, env):
        meaning = "the comma list of every worker's host:port"
        workers = parse_endpoint_list(
            "PADDLE_TRAINER_ENDPOINTS",
            require(env, "PADDLE_TRAINER_ENDPOINTS", "PaddleCloudRoleMaker(is_collective=True)", meaning),
        )
        role_text = env.get("PADDLE_TRAINING_ROLE", "TRAINER")
        if role_text != "TRAINER":
            raise RoleError(
                f"PADDLE_TRAINING_ROLE={role_text!r} is not valid in collective mode: every "
                "process is a TRAINER; set PADDLE_TRAINING_ROLE=TRAINER or unset it"
            )
        id_meaning = f"this worker's index in [0, {len(workers)}) (one per PADDLE_TRAINER_ENDPOINTS entry)"
        current_id = parse_int(
            "PADDLE_TRAINER_ID", env.get("PADDLE_TRAINER_ID", "0"), 0, len(workers), id_meaning
        )
        self._role, self._current_id, self._worker_num = Role.WORKER, current_id, len(workers)
        self._server_endpoints, self._worker_endpoints = [], workers
        self._is_local = False
