"""fleetrun: start parameter servers and workers and watch them.

The flow is command line -> frozen :class:`LaunchConfig` -> :func:`launch`, so a
program can start a job without going through argv::

    from fleet.launch import LaunchConfig, launch
    code = launch(LaunchConfig("train.py", server_endpoints=("127.0.0.1:6170",),
                               worker_endpoints=("127.0.0.1:6171",)))

Each process runs ``python -u <script> <args>`` with Paddle's role variables set (see
:func:`process_environment`), its stdout and stderr in ``log_dir/serverlog.N`` or
``log_dir/workerlog.N``, in its own process group so it and whatever it starts can be
stopped together. ``fleetrun --help`` is the manual.

The package's parts:

- `fleet.launch.cli`: the command line (``build_parser``, ``config_from_args``, ``main``);
- `fleet.launch.from_args`: this host's ``LaunchConfig`` and the job's keys from the arguments;
- `fleet.launch.hosts`: ``--hosts``: a job on several hosts over ssh, from one command;
- `fleet.launch.etcd_launch`: ``--elastic_server``: hosts that meet in etcd (rounds, slots);
- `fleet.launch.config`: ``LaunchConfig`` and ``process_environment``;
- `fleet.launch.local`: the processes of this host (``launch``);
- `fleet.launch.restart`: ``--max_restarts``: restarting the whole job after a failure;
- `fleet.launch.elastic`: elastic jobs (``--np MIN:MAX``): lost workers, replacements,
  ``admit_worker`` and ``--add_workers``;
- `fleet.launch.report`: fleetrun's messages, log tails, the error a log ends with.
"""
from fleet.launch.cli import build_parser, config_from_args, main
from fleet.launch.config import (BLAS_THREAD_VARIABLES, DEFAULT_FAILURE_GRACE, EXIT_OK,
                                 EXIT_PROCESS_FAILED, EXIT_TIMEOUT, EXIT_USAGE, ROLE_VARIABLES,
                                 STALE_VARIABLES, LaunchConfig, process_environment)
from fleet.launch.local import launch

__all__ = [
    "BLAS_THREAD_VARIABLES", "DEFAULT_FAILURE_GRACE", "EXIT_OK", "EXIT_PROCESS_FAILED",
    "EXIT_TIMEOUT", "EXIT_USAGE", "LaunchConfig", "ROLE_VARIABLES", "STALE_VARIABLES",
    "build_parser", "config_from_args", "launch", "main", "process_environment",
]
