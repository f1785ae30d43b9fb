"""The Kubernetes objects of a fleet job, as plain dicts (``kubectl apply`` takes their JSON).

Two layouts (docs/kubernetes.md explains the choices):

- servers and workers in pods of their own (default): a headless Service; the servers
  as an Indexed Job (or, with ``server_kind="statefulset"``, a StatefulSet) and the
  workers as an Indexed Job. Every pod has a stable DNS name,
  ``JOB-server-I.JOB-svc`` / ``JOB-worker-I.JOB-svc``, so the endpoints are known when the
  manifests are written and every pod gets Paddle's role variables directly.
- seed-style (``seed=True``): one Job of N pods, each running a server container and a
  worker container; a ServiceAccount, Role and RoleBinding let the pods list the job's
  pods, and ``python -m fleet.k8s.rank`` ranks each pod by IP before starting the
  script with Paddle's role variables.

CURVE keys come from a Secret mounted read-only with mode 0400; each container gets only
the key files its role needs.
"""
import base64
import dataclasses
import os
import re

from fleet.errors import ConfigError

SERVER_ROLE_VARIABLES = ("TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM",
                         "PADDLE_TRAINER_ENDPOINTS", "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT",
                         "FLEET_K8S_INDEX", "FLEET_BIND_HOST", "FLEET_CURVE_KEYS_DIR")
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
CURVE_MOUNT = "/etc/fleet/curve"
SHARED_VOLUME = "shared"
SECRET_MODE = 0o400
JOB_LABEL = "fleet-job"
ROLE_LABEL = "fleet-role"
# Files of a key directory (fleet.transport.generate_keys) each role reads.
CURVE_FILES = {
    "server": ("server.key", "server.key_secret", "client.key"),
    "worker": ("server.key", "client.key", "client.key_secret"),
}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What ``python -m fleet.k8s`` writes manifests for (its options, one field each).

    Attributes:
        name: the job's name (a DNS label); objects and pods are named after it.
        image: the container image holding fleet and the script.
        command: the script's command line, e.g. ``("python", "train.py", "--epochs", "2")``.
        servers, workers: how many; with ``seed`` both are the number of pods.
        seed: one Job whose pods each run one server and one worker.
        port: every server's port; worker_port: every worker's (seed pods need both).
        server_kind: "job" (an Indexed Job) or "statefulset"; not used with ``seed``.
        cpu, memory, cpu_limit, memory_limit: resource requests and limits per container
            (Kubernetes quantities, e.g. "2", "500m", "4Gi"); None leaves one out.
        volume_claim: a PersistentVolumeClaim to mount at ``mount_path`` (shared data and
            output); host_path: a node directory instead (single-node clusters).
        data_dir, output_dir: given to the script as FLEET_DATA_DIR and FLEET_OUTPUT_DIR;
            default ``mount_path``/data and /output.
        secret: the Secret holding the CURVE keys; insecure: no CURVE (one must be given).
        namespace: where the objects go.
        restart_policy: "Never" or "OnFailure" for the Jobs' pods.
        backoff_limit: pod failures a Job tolerates before it fails.
        env: extra (name, value) pairs for every container.
        python: the interpreter that runs ``-m fleet.k8s.rank`` in seed pods.
        connect_timeout_ms: FLEET_CONNECT_TIMEOUT_MS of the workers (pods start minutes
            apart while images are pulled); wait_timeout_ms: FLEET_K8S_WAIT_TIMEOUT_MS of
            the seed pods.

    Raises:
        ConfigError: any value Kubernetes or fleet would refuse, naming it and the fix.
    """

    name: str
    image: str
    command: tuple
    servers: int = 1
    workers: int = 1
    seed: bool = False
    port: int = 6170
    worker_port: int = 6171
    server_kind: str = "job"
    cpu: str = None
    memory: str = None
    cpu_limit: str = None
    memory_limit: str = None
    volume_claim: str = None
    host_path: str = None
    mount_path: str = "/fleet"
    data_dir: str = None
    output_dir: str = None
    secret: str = None
    insecure: bool = False
    namespace: str = "default"
    restart_policy: str = "Never"
    backoff_limit: int = 0
    env: tuple = ()
    python: str = "python"
    connect_timeout_ms: int = 600_000
    wait_timeout_ms: int = 600_000

    def __post_init__(self):
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", tuple(tuple(pair) for pair in self.env))
        _check_label("job name (--name)", self.name)
        _check_label("namespace (--namespace)", self.namespace)
        if not self.image or self.image != self.image.strip():
            raise ConfigError(f"image (--image) {self.image!r} is empty or blank-padded; give the image that "
                              "holds fleet and the script, e.g. registry.example.com/ctr:1")
        if not all(isinstance(part, str) for part in self.command):
            raise ConfigError(f"the command {self.command!r} must be strings")
        if not self.command:
            raise ConfigError("no command to run: give the script's command line after --, "
                              "e.g. -- python train.py")
        for what, value in (("--servers", self.servers), ("--workers", self.workers)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{what} {value!r} is not an integer >= 1")
        if self.seed and self.servers != self.workers:
            raise ConfigError(f"--seed runs one server and one worker in each pod, so --servers and --workers "
                              f"must be equal; got {self.servers} and {self.workers}")
        for what, value in (("--port", self.port), ("--worker-port", self.worker_port)):
            if not isinstance(value, int) or not 1 <= value <= 65535:
                raise ConfigError(f"{what} {value!r} is not a port in 1..65535")
        if self.port == self.worker_port:
            raise ConfigError(f"--port and --worker-port are both {self.port}; give them different values")
        if self.server_kind not in ("job", "statefulset"):
            raise ConfigError(f"--server-kind {self.server_kind!r} is not valid; use job or statefulset")
        if self.seed and self.server_kind != "job":
            raise ConfigError("--server-kind statefulset does not apply to --seed (its pods run both roles "
                              "in one Job); leave it out")
        longest = max(len(f"{self.name}-server-{self.servers - 1}"), len(f"{self.name}-worker-{self.workers - 1}"))
        if not self.seed and longest > 63:
            raise ConfigError(f"job name {self.name!r} is too long: pod host names such as "
                              f"{self.name}-worker-{self.workers - 1} must have at most 63 characters; "
                              "shorten --name")
        if self.server_kind == "statefulset" and len(self.name) + len("-server") > 52:
            raise ConfigError(f"job name {self.name!r} is too long for a StatefulSet named {self.name}-server "
                              "(at most 52 characters); shorten --name")
        for what, value in (("--cpu", self.cpu), ("--memory", self.memory), ("--cpu-limit", self.cpu_limit),
                            ("--memory-limit", self.memory_limit)):
            if value is not None and not _QUANTITY.match(value):
                raise ConfigError(f"{what} {value!r} is not a Kubernetes quantity; write e.g. 2, 500m, 4Gi")
        if self.volume_claim and self.host_path:
            raise ConfigError("give either --volume-claim or --host-path, not both")
        if self.volume_claim is not None:
            _check_label("--volume-claim", self.volume_claim, subdomain=True)
        for what, value in (("--host-path", self.host_path), ("--mount-path", self.mount_path)):
            if value is not None and not value.startswith("/"):
                raise ConfigError(f"{what} {value!r} is not an absolute path")
        has_volume = bool(self.volume_claim or self.host_path)
        for what, value in (("--data-dir", self.data_dir), ("--output-dir", self.output_dir)):
            if value is None:
                continue
            if not has_volume:
                raise ConfigError(f"{what} {value!r} needs a shared volume: give --volume-claim PVC or --host-path")
            if not (value + "/").startswith(self.mount_path.rstrip("/") + "/"):
                raise ConfigError(f"{what} {value!r} is not under the shared volume's --mount-path "
                                  f"{self.mount_path!r}")
        if self.secret and self.insecure:
            raise ConfigError("give either --secret (CURVE keys) or --insecure, not both")
        if not self.secret and not self.insecure:
            raise ConfigError("a job on several machines uses CURVE: give --secret NAME (the Secret holding the "
                              "key files; --keys-dir DIR also writes it) or --insecure to send parameters "
                              "unauthenticated and in clear text")
        if self.secret:
            _check_label("--secret", self.secret, subdomain=True)
        if self.restart_policy not in ("Never", "OnFailure"):
            raise ConfigError(f"--restart-policy {self.restart_policy!r} is not valid for a Job's pods; use Never "
                              "or OnFailure")
        if not isinstance(self.backoff_limit, int) or self.backoff_limit < 0:
            raise ConfigError(f"--backoff-limit {self.backoff_limit!r} is not an integer >= 0")
        for pair in self.env:
            if len(pair) != 2 or not _ENV_NAME.match(pair[0]):
                raise ConfigError(f"--env {'='.join(map(str, pair))!r} is not NAME=VALUE with a valid name")
            if pair[0] in SERVER_ROLE_VARIABLES or pair[0].startswith("FLEET_K8S_"):
                raise ConfigError(f"--env {pair[0]} is set by the manifests themselves; leave it out")

    @property
    def service(self):
        """The headless Service's name (the pods' DNS subdomain)."""
        return f"{self.name}-svc"

    def server_host(self, index):
        """The DNS name of server ``index`` (resolved from the pods' own namespace)."""
        return f"{self.name}-server-{index}.{self.service}"

    def worker_host(self, index):
        """The DNS name of worker ``index``."""
        return f"{self.name}-worker-{index}.{self.service}"


def _check_label(what, value, subdomain=False):
    ok = isinstance(value, str) and 0 < len(value) <= (253 if subdomain else 63)
    parts = value.split(".") if ok and subdomain else [value]
    if not ok or not all(isinstance(p, str) and _DNS_LABEL.match(p) for p in parts):
        raise ConfigError(f"{what} {value!r} is not a valid Kubernetes name: lower-case letters, digits and '-', "
                          "starting and ending with a letter or digit, at most 63 characters")


def secret_from_keys_dir(spec, directory):
    """The Secret holding a key directory's files (written by fleet.transport.generate_keys).

    Args:
        spec: the JobSpec (its ``secret`` names the Secret, its ``namespace`` holds it).
        directory: the key directory.

    Returns:
        dict: a v1 Secret with the four key files base64-encoded under their file names.

    Raises:
        ConfigError: a file is missing (names it and how to write the directory).
    """
    data = {}
    for name in sorted(set(CURVE_FILES["server"]) | set(CURVE_FILES["worker"])):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ConfigError(f"--keys-dir {directory!r} has no {name}; write a key directory with "
                              "python -c \"from fleet.transport import generate_keys; generate_keys('keys')\"")
        with open(path, "rb") as f:
            data[name] = base64.b64encode(f.read()).decode("ascii")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": spec.secret, "namespace": spec.namespace, "labels": {JOB_LABEL: spec.name}},
            "data": data}


def build_manifests(spec):
    """Every object of the job, in the order ``kubectl apply`` should create them.

    Args:
        spec: a JobSpec.

    Returns:
        list[dict]: Service + server Job/StatefulSet + worker Job, or (``seed``)
        ServiceAccount + Role + RoleBinding + Job.
    """
    if spec.seed:
        return _seed_manifests(spec)
    servers = [f"{spec.server_host(i)}:{spec.port}" for i in range(spec.servers)]
    workers = [f"{spec.worker_host(i)}:{spec.worker_port}" for i in range(spec.workers)]
    common = [_env("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(servers)),
              _env("PADDLE_TRAINERS_NUM", spec.workers),
              _env("PADDLE_TRAINER_ENDPOINTS", ",".join(workers))]
    if spec.server_kind == "statefulset":
        server_index = [_field("POD_NAME", "metadata.name"),
                        _env("POD_IP", f"$(POD_NAME).{spec.service}")]
    else:
        server_index = [_field("FLEET_K8S_INDEX", COMPLETION_INDEX),
                        _env("POD_IP", f"{spec.name}-server-$(FLEET_K8S_INDEX).{spec.service}")]
    server_env = [_env("TRAINING_ROLE", "PSERVER"), *common, *server_index,
                  _env("PADDLE_PORT", spec.port), _env("FLEET_BIND_HOST", "0.0.0.0")]
    worker_env = [_env("TRAINING_ROLE", "TRAINER"), *common,
                  _field("FLEET_K8S_INDEX", COMPLETION_INDEX), _field("PADDLE_TRAINER_ID", COMPLETION_INDEX),
                  _field("POD_IP", "status.podIP"), _env("PADDLE_PORT", spec.worker_port),
                  _env("FLEET_CONNECT_TIMEOUT_MS", spec.connect_timeout_ms)]
    server_container = _container(spec, "server", spec.command, server_env, spec.port)
    worker_container = _container(spec, "worker", spec.command, worker_env, spec.worker_port)
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(spec, spec.service, None),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {JOB_LABEL: spec.name},
                 "ports": [{"name": "server", "port": spec.port, "targetPort": spec.port, "protocol": "TCP"}]},
    }
    if spec.server_kind == "statefulset":
        labels = _labels(spec, "server")
        server_pod = _pod_spec(spec, [server_container], "Always")
        server_pod["subdomain"] = spec.service
        server_set = {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _metadata(spec, f"{spec.name}-server", "server"),
            "spec": {"serviceName": spec.service, "replicas": spec.servers, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": server_pod}},
        }
    else:
        server_set = _indexed_job(spec, "server", spec.servers, server_container)
    return [service, server_set, _indexed_job(spec, "worker", spec.workers, worker_container)]


def _seed_manifests(spec):
    account = f"{spec.name}-pod-lister"
    pods = spec.servers
    common = [_field("POD_IP", "status.podIP"), _field("FLEET_K8S_NAMESPACE", "metadata.namespace"),
              _env("FLEET_K8S_PODS", pods),
              _env("FLEET_K8S_SELECTOR", f"{JOB_LABEL}={spec.name}"),
              _env("FLEET_K8S_SERVER_PORT", spec.port), _env("FLEET_K8S_WORKER_PORT", spec.worker_port),
              _env("FLEET_K8S_WAIT_TIMEOUT_MS", spec.wait_timeout_ms)]
    command = (spec.python, "-m", "fleet.k8s.rank", "--", *spec.command)
    server = _container(spec, "server", command, [_env("TRAINING_ROLE", "PSERVER"), *common], spec.port)
    worker = _container(spec, "worker", command, [_env("TRAINING_ROLE", "TRAINER"), *common,
                                                  _env("FLEET_CONNECT_TIMEOUT_MS", spec.connect_timeout_ms)],
                        spec.worker_port)
    pod = _pod_spec(spec, [server, worker], spec.restart_policy)
    pod["serviceAccountName"] = account
    pod["automountServiceAccountToken"] = True
    labels = _labels(spec, "seed")
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _metadata(spec, spec.name, "seed"),
        "spec": {"completions": pods, "parallelism": pods, "backoffLimit": spec.backoff_limit,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(spec, account, None)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _metadata(spec, account, None),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _metadata(spec, account, None),
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": spec.namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account}},
        job,
    ]


def _indexed_job(spec, role, count, container):
    labels = _labels(spec, role)
    pod = _pod_spec(spec, [container], spec.restart_policy)
    pod["subdomain"] = spec.service
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _metadata(spec, f"{spec.name}-{role}", role),
        "spec": {"completions": count, "parallelism": count, "completionMode": "Indexed",
                 "backoffLimit": spec.backoff_limit,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def _labels(spec, role):
    return {JOB_LABEL: spec.name, ROLE_LABEL: role}


def _metadata(spec, name, role):
    labels = _labels(spec, role) if role else {JOB_LABEL: spec.name}
    return {"name": name, "namespace": spec.namespace, "labels": labels}


def _env(name, value):
    return {"name": name, "value": str(value)}


def _field(name, path):
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _pod_spec(spec, containers, restart_policy):
    pod = {"restartPolicy": restart_policy, "automountServiceAccountToken": False, "containers": containers}
    volumes = []
    if spec.volume_claim:
        volumes.append({"name": SHARED_VOLUME, "persistentVolumeClaim": {"claimName": spec.volume_claim}})
    elif spec.host_path:
        volumes.append({"name": SHARED_VOLUME, "hostPath": {"path": spec.host_path, "type": "DirectoryOrCreate"}})
    if spec.secret:
        for container in containers:
            role = container["name"]
            volumes.append({"name": f"curve-{role}", "secret": {
                "secretName": spec.secret, "defaultMode": SECRET_MODE,
                "items": [{"key": name, "path": name} for name in CURVE_FILES[role]]}})
    if volumes:
        pod["volumes"] = volumes
    return pod


def _container(spec, role, command, env, port):
    env = list(env)
    mounts = []
    if spec.volume_claim or spec.host_path:
        mounts.append({"name": SHARED_VOLUME, "mountPath": spec.mount_path})
        env += [_env("FLEET_DATA_DIR", spec.data_dir or spec.mount_path.rstrip("/") + "/data"),
                _env("FLEET_OUTPUT_DIR", spec.output_dir or spec.mount_path.rstrip("/") + "/output")]
    if spec.secret:
        mounts.append({"name": f"curve-{role}", "mountPath": CURVE_MOUNT, "readOnly": True})
        env.append(_env("FLEET_CURVE_KEYS_DIR", CURVE_MOUNT))
    names = {e["name"]: i for i, e in enumerate(env)}
    for name, value in spec.env:
        if name in names:
            env[names[name]] = _env(name, value)
        else:
            env.append(_env(name, value))
    container = {"name": role, "image": spec.image, "command": list(command), "env": env,
                 "ports": [{"name": role, "containerPort": port, "protocol": "TCP"}]}
    requests = {k: v for k, v in (("cpu", spec.cpu), ("memory", spec.memory)) if v}
    limits = {k: v for k, v in (("cpu", spec.cpu_limit), ("memory", spec.memory_limit)) if v}
    if requests or limits:
        container["resources"] = {key: value for key, value in (("requests", requests), ("limits", limits))
                                  if value}
    if mounts:
        container["volumeMounts"] = mounts
    return container
