"""`LocalRoleMaker`: one worker training alone, with no parameter servers."""
from role_makers.base import Role, RoleMakerBase


class LocalRoleMaker(RoleMakerBase):
    """The role of a process that trains alone: worker 0 of 1, no servers.

    ``fleet.init(LocalRoleMaker())`` runs the same script as distributed training, in
    one process; `is_local()` is True. Reads no environment variables.
    """

    def generate_role(self):
        """Fix the role: worker 0 of 1, no servers, no worker endpoints."""
        self._role, self._current_id, self._worker_num = Role.WORKER, 0, 1
        self._server_endpoints, self._worker_endpoints = [], []
        self._is_local = True
        self._role_is_generated = True
