"""``python -m fleet.k8s.rank -- python train.py ARGS``: rank a seed pod, then run the script.

The container command of seed-style pods (``python -m fleet.k8s --seed``). It finds this
pod's index with ``KubernetesRoleMaker(mode="pods")`` (list the job's pods through the API
server, wait until all are Running and Ready, sort their IPs), then replaces itself with
the script, its environment holding Paddle's role variables for that index, so a script
written for ``PaddleCloudRoleMaker`` runs unchanged:

=============================  ============================================================
TRAINING_ROLE                  as given to the container (PSERVER or TRAINER)
PADDLE_PSERVERS_IP_PORT_LIST   ``IP:FLEET_K8S_SERVER_PORT`` of every pod, in IP order
PADDLE_TRAINER_ENDPOINTS       ``IP:FLEET_K8S_WORKER_PORT`` of every pod, in IP order
PADDLE_TRAINERS_NUM            the number of pods
PADDLE_TRAINER_ID              this pod's rank (workers only)
POD_IP, PADDLE_PORT            this pod's IP and its container's port
=============================  ============================================================
"""
import logging
import os
import sys

from fleet.endpoints import split_endpoint
from fleet.errors import FleetError
from fleet.logs import install_default_handler
from role_makers import KubernetesRoleMaker

log = logging.getLogger("fleet")


def role_environment(role_maker, environ):
    """The environment of the script: ``environ`` with the role variables of ``role_maker``.

    Args:
        role_maker: a generated role maker (any RoleMakerBase).
        environ: the environment to start from (not modified).

    Returns:
        dict: the new environment.
    """
    env = dict(environ)
    servers, workers = role_maker.get_pserver_endpoints(), role_maker.get_trainer_endpoints()
    env["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(servers)
    env["PADDLE_TRAINER_ENDPOINTS"] = ",".join(workers)
    env["PADDLE_TRAINERS_NUM"] = str(role_maker.worker_num())
    index = role_maker.role_id()
    if role_maker.is_server():
        env["TRAINING_ROLE"] = "PSERVER"
        env.pop("PADDLE_TRAINER_ID", None)
        env["POD_IP"], env["PADDLE_PORT"] = split_endpoint(servers[index])
    else:
        env["TRAINING_ROLE"] = "TRAINER"
        env["PADDLE_TRAINER_ID"] = str(index)
        env["POD_IP"], env["PADDLE_PORT"] = split_endpoint(workers[index])
    return env


def main(argv=None):
    """Rank this pod and exec the command after ``--``; returns an exit code on failure.

    Exit codes: 2 for a missing command, 1 when the role cannot be found (the message says
    why: a missing variable, a refused listing, or pods that did not come up in time).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m fleet.k8s.rank -- COMMAND [ARGS]: rank this seed pod among the job's "
              "pods by IP, then run COMMAND with Paddle's role variables", file=sys.stderr)
        return 2
    install_default_handler()
    role_maker = KubernetesRoleMaker(mode="pods")
    try:
        role_maker.generate_role()
    except FleetError as e:
        print(f"fleet.k8s.rank: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    kind = "server" if role_maker.is_server() else "worker"
    log.info("fleet: this pod is %s %d of %d (pods in IP order: %s)", kind, role_maker.role_id(),
             role_maker.worker_num(), ", ".join(role_maker.pod_names))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, role_environment(role_maker, os.environ))
    except OSError as e:
        print(f"fleet.k8s.rank: cannot run {argv[0]!r}: {e.strerror}; check the command after --", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
