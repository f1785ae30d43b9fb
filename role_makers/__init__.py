"""Role makers: who this process is (worker or server, its index, where the servers are).

Plain, validated settings objects (layer 2): they read only ``os.environ``.

- `PaddleCloudRoleMaker`: from Paddle's environment variables (what ``fleetrun`` and
  cluster manifests set); with ``TRAINING_ROLE`` unset, one local worker.
- `UserDefinedRoleMaker`, `UserDefinedCollectiveRoleMaker`: a role given in code.
- `LocalRoleMaker`: one worker, no servers.
- `KubernetesRoleMaker`: a pod of a Kubernetes job, ranked among the job's pods by IP
  (through the API server) or by its completion index / StatefulSet ordinal.
- `MPISymetricRoleMaker` (base `MPIRoleMaker`): under ``mpirun -np 2N``, even ranks
  servers and odd ranks workers, endpoints exchanged through MPI (mpi4py, optional:
  ``pip install fleet[mpi]``, imported only when the role is generated).
"""
from role_makers.base import Role, RoleMakerBase
from role_makers.kubernetes_role_maker import KubernetesRoleMaker
from role_makers.local_role_maker import LocalRoleMaker
from role_makers.mpi_role_maker import MPIRoleMaker, MPISymetricRoleMaker
from role_makers.paddle_cloud_role_maker import PaddleCloudRoleMaker
from role_makers.user_defined_role_maker import (
    UserDefinedCollectiveRoleMaker,
    UserDefinedRoleMaker,
)

__all__ = [
    "KubernetesRoleMaker",
    "LocalRoleMaker",
    "MPIRoleMaker",
    "MPISymetricRoleMaker",
    "PaddleCloudRoleMaker",
    "Role",
    "RoleMakerBase",
    "UserDefinedCollectiveRoleMaker",
    "UserDefinedRoleMaker",
]
