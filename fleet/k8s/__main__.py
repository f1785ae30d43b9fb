"""``python -m fleet.k8s``: write the Kubernetes manifests of a fleet job (``--help``)."""
import argparse
import json
import os
import sys

from fleet.errors import ConfigError
from fleet.k8s.manifests import JobSpec, build_manifests, secret_from_keys_dir

_DESCRIPTION = """\
Write the Kubernetes objects of a fleet job as JSON (which kubectl reads as it reads YAML):
by default a headless Service, the servers as an Indexed Job (or a StatefulSet) and the
workers as an Indexed Job, every process with Paddle's role variables set; with --seed one
Job whose pods each run a server and a worker, ranked by IP through the API server.
Apply them with `kubectl apply -f FILE`; docs/kubernetes.md has the whole procedure."""

_EPILOG = """\
example:
  python -m fleet.k8s --name ctr --image registry.example.com/ctr:1 --servers 2 --workers 4 \\
      --volume-claim ctr-data --secret ctr-curve --out ctr.json -- python train.py --epochs 2

environment of the containers (besides --env):
  TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS,
  PADDLE_TRAINER_ID (workers), POD_IP, PADDLE_PORT     Paddle's role variables
  FLEET_BIND_HOST=0.0.0.0        servers bind every interface, advertised by DNS name
  FLEET_DATA_DIR, FLEET_OUTPUT_DIR  with a shared volume
  FLEET_CURVE_KEYS_DIR           with --secret (files mode 0400)
  FLEET_K8S_*                    --seed pods: what fleet.k8s.rank needs to rank the pod"""


def build_parser():
    """The argument parser of ``python -m fleet.k8s``."""
    p = argparse.ArgumentParser(prog="python -m fleet.k8s", description=_DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="job name (a DNS label); objects and pods are named after it")
    p.add_argument("--image", required=True, help="container image holding fleet and the script")
    p.add_argument("--servers", type=int, default=1, help="number of parameter servers (default 1)")
    p.add_argument("--workers", type=int, default=1, help="number of workers (default 1)")
    p.add_argument("--seed", action="store_true",
                   help="one Job whose pods each run one server and one worker, ranked by pod IP "
                        "(--servers and --workers equal)")
    p.add_argument("--server-kind", choices=("job", "statefulset"), default="job",
                   help="servers as an Indexed Job (default: the job completes) or a StatefulSet")
    p.add_argument("--port", type=int, default=6170, help="servers' port (default 6170)")
    p.add_argument("--worker-port", type=int, default=6171, help="workers' port (default 6171)")
    p.add_argument("--cpu", help="CPU request per container, e.g. 2 or 500m")
    p.add_argument("--memory", help="memory request per container, e.g. 4Gi")
    p.add_argument("--cpu-limit", help="CPU limit per container")
    p.add_argument("--memory-limit", help="memory limit per container (default: the --memory request)")
    volume = p.add_mutually_exclusive_group()
    volume.add_argument("--volume-claim", metavar="PVC", help="PersistentVolumeClaim shared by every pod "
                        "(ReadWriteMany) for data and output")
    volume.add_argument("--host-path", metavar="DIR", help="a node directory instead (single-node clusters)")
    p.add_argument("--mount-path", default="/fleet", help="where the shared volume is mounted (default /fleet)")
    p.add_argument("--data-dir", help="FLEET_DATA_DIR of the script (default MOUNT_PATH/data)")
    p.add_argument("--output-dir", help="FLEET_OUTPUT_DIR of the script (default MOUNT_PATH/output)")
    curve = p.add_mutually_exclusive_group()
    curve.add_argument("--secret", metavar="NAME", help="Secret holding the CURVE key files (required "
                       "unless --insecure)")
    curve.add_argument("--insecure", action="store_true", help="no CURVE: parameters travel unauthenticated "
                       "and in clear text")
    p.add_argument("--keys-dir", metavar="DIR", help="also write the Secret from this key directory "
                   "(fleet.transport.generate_keys); its name is --secret, default NAME-curve")
    p.add_argument("--namespace", default="default", help="namespace of every object (default default)")
    p.add_argument("--restart-policy", choices=("Never", "OnFailure"), default="Never",
                   help="restartPolicy of the Jobs' pods (default Never: fleet has no elastic training)")
    p.add_argument("--backoff-limit", type=int, default=0,
                   help="pod failures a Job tolerates before it fails (default 0)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment variable of every container (repeatable)")
    p.add_argument("--python", default="python", help="interpreter of the seed pods' fleet.k8s.rank "
                   "(default python)")
    p.add_argument("--connect-timeout-s", type=float, default=600.0,
                   help="FLEET_CONNECT_TIMEOUT_MS of the workers in seconds (default 600: pods start "
                        "minutes apart while images are pulled)")
    p.add_argument("--wait-timeout-s", type=float, default=600.0,
                   help="--seed: how long a pod waits for the others (FLEET_K8S_WAIT_TIMEOUT_MS; default 600)")
    p.add_argument("--out", metavar="PATH", help="write to this file (one List), or to this directory (one "
                   "file per object) when it exists or ends with /; default stdout")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS]: what each container runs")
    return p


def spec_from_args(args):
    """A JobSpec from parsed arguments.

    Raises:
        ConfigError: a bad value (names the option and the fix).
    """
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    env = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env {item!r} is not NAME=VALUE")
        env.append((name, value))
    secret = args.secret
    if args.keys_dir and not secret:
        if args.insecure:
            raise ConfigError("--keys-dir writes a CURVE Secret, but --insecure turns CURVE off; drop one")
        secret = f"{args.name}-curve"
    for what, value in (("--connect-timeout-s", args.connect_timeout_s), ("--wait-timeout-s", args.wait_timeout_s)):
        if not value > 0:
            raise ConfigError(f"{what} {value!r} is not a positive number of seconds")
    return JobSpec(
        name=args.name, image=args.image, command=tuple(command), servers=args.servers, workers=args.workers,
        seed=args.seed, port=args.port, worker_port=args.worker_port, server_kind=args.server_kind,
        cpu=args.cpu, memory=args.memory, cpu_limit=args.cpu_limit,
        memory_limit=args.memory_limit or args.memory, volume_claim=args.volume_claim,
        host_path=args.host_path, mount_path=args.mount_path, data_dir=args.data_dir,
        output_dir=args.output_dir, secret=secret, insecure=args.insecure, namespace=args.namespace,
        restart_policy=args.restart_policy, backoff_limit=args.backoff_limit, env=tuple(env),
        python=args.python, connect_timeout_ms=int(args.connect_timeout_s * 1000),
        wait_timeout_ms=int(args.wait_timeout_s * 1000))


def objects_from_args(args):
    """Every object the arguments describe: the Secret first (with --keys-dir), then the job's."""
    spec = spec_from_args(args)
    objects = build_manifests(spec)
    if args.keys_dir:
        objects.insert(0, secret_from_keys_dir(spec, args.keys_dir))
    return objects


def write(objects, out, stdout):
    """Writes ``objects`` to stdout (a v1 List), a file (a List) or a directory (a file each).

    Returns:
        list[str]: the files written (empty for stdout).
    """
    if out is None:
        stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n")
        return []
    if out.endswith("/") or os.path.isdir(out):
        os.makedirs(out, exist_ok=True)
        paths = []
        for number, obj in enumerate(objects):
            path = os.path.join(out, f"{number:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.json")
            _write_file(path, obj)
            paths.append(path)
        return paths
    _write_file(out, {"apiVersion": "v1", "kind": "List", "items": objects})
    return [out]


def _write_file(path, obj):
    # A Secret's file holds private keys: owner-only from the start.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed with a wider mode
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(obj, indent=2) + "\n")


def main(argv=None, stdout=None):
    """Entry point; returns the exit code (0, or 2 for a bad option)."""
    stdout = sys.stdout if stdout is None else stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        paths = write(objects_from_args(args), args.out, stdout)
    except ConfigError as e:
        parser.print_usage(sys.stderr)
        print(f"python -m fleet.k8s: error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
