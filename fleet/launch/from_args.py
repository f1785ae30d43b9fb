"""What each way of starting a job (one host, endpoints naming several hosts, an etcd
rendezvous) makes from fleetrun's parsed arguments: the LaunchConfig of this host's share
(:func:`make_config`), the job's CURVE key directory (:func:`keys_dir`) and new keys
(:func:`make_keys`, ``fleetrun --make_keys``)."""
from __future__ import annotations

import os

from fleet.errors import ConfigError, FleetError
from fleet.launch.config import LaunchConfig
from fleet.transport.curve import CurveConfig, generate_keys


def make_config(args, servers, workers, **more):
    """The LaunchConfig of this host's share of a job: the endpoints and ``more`` as given,
    every other field from fleetrun's arguments."""
    return LaunchConfig(training_script=args.training_script,
                        script_args=tuple(args.training_script_args),
                        server_endpoints=servers, worker_endpoints=workers,
                        log_dir=args.log_dir, server_exit_timeout=args.server_exit_timeout,
                        kill_timeout=args.kill_timeout, timeout=args.timeout,
                        failure_grace=args.failure_grace,
                        stop_on_stdin_eof=args.stop_on_stdin_eof, result_json=args.result_json,
                        metrics_port=args.metrics_port, live_summary=args.live_summary,
                        collective=args.collective, max_restarts=args.max_restarts,
                        restart_from_scratch=args.restart_from_scratch, **more)


def keys_dir(args, multi_host):
    """The --keys_dir to give every process, after checking the job's encryption choice."""
    if args.insecure and args.keys_dir:
        raise ConfigError("--insecure and --keys_dir contradict each other: give --keys_dir to "
                          "encrypt the job, or --insecure (and no keys) not to")
    if args.keys_dir:
        try:
            CurveConfig.from_dir(args.keys_dir)
        except (ConfigError, FleetError) as e:
            raise ConfigError(f"--keys_dir {args.keys_dir!r}: {e}") from e
        return args.keys_dir
    if multi_host and not args.insecure and CurveConfig.from_env() is None:
        raise ConfigError(
            "this job spans several hosts, and fleetrun encrypts such a job (CURVE) so that "
            "nobody else on the network can read or push updates: make keys once with "
            "`fleetrun --make_keys DIR`, copy DIR to every host (owner-only), and give "
            "--keys_dir DIR (or set FLEET_CURVE_KEYS_DIR=DIR); or pass --insecure on a network "
            "you trust")
    return None


def make_keys(directory):
    """Write a new CURVE key directory for a job: private directory, owner-only files.

    Raises:
        ConfigError: the directory exists and is not empty, or cannot be written.
    """
    if os.path.exists(directory) and os.listdir(directory):
        raise ConfigError(f"--make_keys {directory!r} exists and is not empty; give a new "
                          "directory (keys are never overwritten)")
    try:
        generate_keys(directory)
        for root, _, files in os.walk(directory):
            os.chmod(root, 0o700)
            for name in files:
                os.chmod(os.path.join(root, name), 0o600)
    except OSError as e:
        raise ConfigError(f"cannot write keys to {directory!r} ({e.strerror}); give a "
                          "writable directory") from e
