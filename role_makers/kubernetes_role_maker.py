"""`KubernetesRoleMaker`: the role of a process running in a Kubernetes pod.

Two ways to find this pod's index (``mode``):

- ``"pods"`` (seed-style pods, the way Paddle's Kubernetes documents run a job): every pod
  of the job runs one server and one worker. The role maker lists the job's pods through
  the API server with the pod's service account, waits until ``pods`` of them are
  Running and Ready with an IP, sorts their IPs numerically (``10.0.0.9`` before
  ``10.0.0.10``) and takes this pod's position (``POD_IP``) as the index of both its
  server and its worker. Server ``i`` is ``IP_i:server_port``, worker ``i`` is
  ``IP_i:worker_port``.
- ``"index"`` (servers and workers in pods of their own, as ``python -m fleet.k8s``
  writes them): endpoints come from Paddle's variables (``PADDLE_PSERVERS_IP_PORT_LIST``,
  ``PADDLE_TRAINER_ENDPOINTS``, ``PADDLE_TRAINERS_NUM``); the index is the Indexed Job's
  completion index (``FLEET_K8S_INDEX``, else ``JOB_COMPLETION_INDEX``) or the
  StatefulSet ordinal at the end of the pod's name (``POD_NAME``, else ``HOSTNAME``).

Variables (arguments of the constructor take precedence; docs/env.md lists them all):

=========================== ====== =========================================================
variable                    mode   meaning
=========================== ====== =========================================================
TRAINING_ROLE               both   TRAINER or PSERVER
POD_IP                      pods   this pod's IP (downward API ``status.podIP``)
FLEET_K8S_PODS              pods   how many pods the job has (each one server + one worker)
FLEET_K8S_SELECTOR          pods   label selector of the job's pods, e.g. ``fleet-job=ctr``
FLEET_K8S_SERVER_PORT       pods   port of every server (default 6170)
FLEET_K8S_WORKER_PORT       pods   port of every worker (default 6171)
FLEET_K8S_WAIT_TIMEOUT_MS   pods   how long to wait for the pods (default 600000)
FLEET_K8S_NAMESPACE         pods   the job's namespace (default: the service account's)
KUBERNETES_SERVICE_HOST/    pods   the API server (Kubernetes sets both in every pod)
KUBERNETES_SERVICE_PORT
FLEET_K8S_API_URL           pods   another API server URL, e.g. ``http://127.0.0.1:8001``
                                   of ``kubectl proxy`` (no token is needed there)
=========================== ====== =========================================================

Which pods count (mode "pods"), and why:

- Running with an IP and the Ready condition True: counted.
- Pending, or Running but not Ready (a container still starting, or restarting after a
  crash): waited for.
- Terminating (``metadata.deletionTimestamp`` set), Succeeded or Failed: never counted;
  the Job controller replaces a failed pod with a new pod, with a new name and a new IP,
  which is waited for instead.
- Running and Ready with ``restartCount`` > 0 (a container restarted in place): counted,
  since its IP, and so every pod's rank, is unchanged; a warning names it, because its
  server or worker started again and lost what it held (fleet has no elastic training:
  such a job should be restarted from its last checkpoint).
- More than ``pods`` counted pods: a `RoleError` naming them (the selector matches pods
  of another job, or the Job's parallelism differs from ``pods``).

Every pod ranks the same set of IPs only if the set does not change while the pods
start; a pod replaced during the start-up gets a new IP and the job's ranks disagree,
so a replaced pod means restarting the whole job.

The API server is read with the standard library only (``urllib`` + ``ssl``): the token
and CA certificate of the service account are read from
``/var/run/secrets/kubernetes.io/serviceaccount/`` (``token``, ``ca.crt``, ``namespace``).
"""
import ipaddress
import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from fleet.endpoints import join_endpoint
from fleet.errors import RoleError
from fleet.logs import WaitLog
from role_makers._env import parse_endpoint_list, parse_int, require
from role_makers.base import Role, RoleMakerBase

_logger = logging.getLogger("fleet")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_SERVER_PORT = 6170
DEFAULT_WORKER_PORT = 6171
DEFAULT_WAIT_TIMEOUT_MS = 600_000
DEFAULT_POLL_S = 2.0
_REQUEST_TIMEOUT_S = 10.0
_ROLES = {"TRAINER": Role.WORKER, "PSERVER": Role.SERVER}
_ORDINAL = re.compile(r"-(\d+)$")


def api_base_url(environ=None):
    """The in-cluster API server's URL, from the variables Kubernetes sets in every pod.

    Args:
        environ: the environment mapping (default ``os.environ``).

    Returns:
        str: ``https://HOST:PORT`` (an IPv6 host in brackets).

    Raises:
        RoleError: KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is missing or bad.
    """
    environ = os.environ if environ is None else environ
    needed_by = 'KubernetesRoleMaker(mode="pods")'
    host = require(environ, "KUBERNETES_SERVICE_HOST", needed_by,
                   "the API server's address (Kubernetes sets it in every pod; outside a pod pass api_url)")
    port_text = require(environ, "KUBERNETES_SERVICE_PORT", needed_by,
                        "the API server's port (Kubernetes sets it in every pod; outside a pod pass api_url)")
    port = parse_int("KUBERNETES_SERVICE_PORT", port_text, 1, 65536, "the API server's port")
    host = host.strip()
    if not host:
        raise RoleError("KUBERNETES_SERVICE_HOST is empty; set it to the API server's address or pass api_url")
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{port}"


def pods_url(base_url, namespace, selector):
    """The URL listing the pods of ``namespace`` that match the label ``selector``."""
    query = urllib.parse.urlencode({"labelSelector": selector})
    return f"{base_url.rstrip('/')}/api/v1/namespaces/{urllib.parse.quote(namespace, safe='')}/pods?{query}"


def ip_sort_key(ip):
    """Sorts IP addresses numerically: ``10.0.0.9`` before ``10.0.0.10``; IPv4 before IPv6."""
    address = ipaddress.ip_address(ip)
    return address.version, int(address)


def pod_ordinal(name):
    """The index at the end of a pod name (``ctr-server-3`` -> 3), or None."""
    match = _ORDINAL.search(name or "")
    return int(match.group(1)) if match else None


class PodState:
    """What the role maker needs of one pod of the PodList.

    Attributes:
        name: metadata.name.
        ip: status.podIP ("" when none yet).
        phase: status.phase (Pending, Running, Succeeded, Failed, Unknown).
        ready: the Ready condition is True.
        restarts: the sum of the containers' restartCount.
        terminating: metadata.deletionTimestamp is set.
    """

    def __init__(self, item):
        metadata = item.get("metadata") or {}
        status = item.get("status") or {}
        self.name = metadata.get("name", "?")
        self.ip = status.get("podIP") or ""
        self.phase = status.get("phase") or "Unknown"
        self.ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                         for c in status.get("conditions") or ())
        self.restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ())
        self.terminating = bool(metadata.get("deletionTimestamp"))

    @property
    def counts(self):
        """True if this pod takes part in the ranking (see the module docstring)."""
        return self.phase == "Running" and self.ready and bool(self.ip) and not self.terminating

    @property
    def gone(self):
        """True if this pod will never count (terminating or finished)."""
        return self.terminating or self.phase in ("Succeeded", "Failed")

    def describe(self):
        """e.g. ``ctr-x7 (Pending, no IP)``."""
        if self.terminating:
            state = "Terminating"
        elif self.phase == "Running" and not self.ready:
            state = "Running, not Ready"
        else:
            state = self.phase
        if self.restarts:
            state += f", {self.restarts} restarts"
        return f"{self.name} ({state}, {self.ip or 'no IP'})"


class KubernetesRoleMaker(RoleMakerBase):
    """Role maker for pods of a Kubernetes job (see the module docstring for both modes).

    Args:
        mode: "pods" (rank by IP among the job's pods) or "index" (completion index or
            StatefulSet ordinal).
        role: "TRAINER" / "PSERVER" or a `Role`; default TRAINING_ROLE.
        pods: mode "pods": the number of pods; default FLEET_K8S_PODS.
        selector: mode "pods": label selector of the job's pods; default FLEET_K8S_SELECTOR.
        server_port, worker_port: mode "pods": ports of each pod's server and worker;
            default FLEET_K8S_SERVER_PORT (6170), FLEET_K8S_WORKER_PORT (6171).
        pod_ip: mode "pods": this pod's IP; default POD_IP.
        api_url: the API server's base URL; default FLEET_K8S_API_URL, else
            ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``. An ``http://`` URL is read without TLS (tests,
            ``kubectl proxy``).
        token_path, ca_path, namespace_path: the service account's files (default under
            /var/run/secrets/kubernetes.io/serviceaccount/). A missing token file sends no
            Authorization header (``kubectl proxy``).
        namespace: the job's namespace; default FLEET_K8S_NAMESPACE, else the service
            account's namespace file.
        timeout_s: how long to wait for the pods; default FLEET_K8S_WAIT_TIMEOUT_MS (600 s).
        poll_s: seconds between two listings while waiting.
        environ: the environment mapping (default ``os.environ``), read on
            `generate_role()`.

    Raises:
        RoleError: ``mode`` is neither "pods" nor "index".
    """

    def __init__(self, mode="pods", role=None, pods=None, selector=None, server_port=None,
                 worker_port=None, pod_ip=None, api_url=None, token_path=None, ca_path=None,
                 namespace=None, namespace_path=None, timeout_s=None, poll_s=DEFAULT_POLL_S,
                 environ=None):
        super().__init__()
        if mode not in ("pods", "index"):
            raise RoleError(f'KubernetesRoleMaker mode={mode!r} is not valid; use "pods" (rank by IP among '
                            'the job\'s pods) or "index" (completion index or StatefulSet ordinal)')
        self._mode = mode
        self._role_arg = role
        self._pods_arg = pods
        self._selector_arg = selector
        self._server_port_arg = server_port
        self._worker_port_arg = worker_port
        self._pod_ip_arg = pod_ip
        self._api_url = api_url
        self._token_path = token_path or os.path.join(SERVICE_ACCOUNT_DIR, "token")
        self._ca_path = ca_path or os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
        self._namespace_arg = namespace
        self._namespace_path = namespace_path or os.path.join(SERVICE_ACCOUNT_DIR, "namespace")
        self._timeout_arg = timeout_s
        self._poll_s = float(poll_s)
        self._environ = environ
        self.pod_names = []  # mode "pods": the ranked pods' names, in rank order

    def generate_role(self):
        """Find this pod's role and index; later calls do nothing.

        Raises:
            RoleError: a variable is missing or malformed; the API server refused the
                listing (the message says which permission is missing); the pods were not
                all up within the timeout (names how many are up and which are missing).
        """
        if self._role_is_generated:
            return
        env = os.environ if self._environ is None else self._environ
        role = self._read_role(env)
        if self._mode == "pods":
            self._generate_from_pods(env, role)
        else:
            self._generate_from_index(env, role)
        self._role = role
        self._is_local = False
        self._role_is_generated = True

    def _read_role(self, env):
        value = self._role_arg
        if value is None:
            value = require(env, "TRAINING_ROLE", "KubernetesRoleMaker", "TRAINER or PSERVER")
        if isinstance(value, Role):
            return value
        if value not in _ROLES:
            raise RoleError(f"TRAINING_ROLE={value!r} is not valid: KubernetesRoleMaker needs TRAINER or PSERVER")
        return _ROLES[value]

    # mode "index" ---------------------------------------------------------------------

    def _generate_from_index(self, env, role):
        needed_by = 'KubernetesRoleMaker(mode="index")'
        servers = parse_endpoint_list("PADDLE_PSERVERS_IP_PORT_LIST", require(
            env, "PADDLE_PSERVERS_IP_PORT_LIST", needed_by, "the comma list of every server's host:port"))
        worker_num = parse_int("PADDLE_TRAINERS_NUM", require(
            env, "PADDLE_TRAINERS_NUM", needed_by, "the number of workers (>= 1)"), 1, None, "the number of workers")
        workers_text = env.get("PADDLE_TRAINER_ENDPOINTS", "")
        workers = parse_endpoint_list("PADDLE_TRAINER_ENDPOINTS", workers_text) if workers_text.strip() else []
        if workers and len(workers) != worker_num:
            raise RoleError(f"PADDLE_TRAINER_ENDPOINTS={workers_text!r} lists {len(workers)} endpoints but "
                            f"PADDLE_TRAINERS_NUM={worker_num}; list one host:port per worker")
        count = worker_num if role == Role.WORKER else len(servers)
        kind = "worker" if role == Role.WORKER else "server"
        meaning = f"this {kind}'s index in [0, {count})"
        index = None
        for name in ("FLEET_K8S_INDEX", "JOB_COMPLETION_INDEX"):
            if env.get(name, "").strip():
                index = parse_int(name, env[name], 0, count, meaning)
                break
        if index is None:
            for name in ("POD_NAME", "HOSTNAME"):
                ordinal = pod_ordinal(env.get(name, "").strip())
                if ordinal is not None:
                    if ordinal >= count:
                        raise RoleError(f"{name}={env[name]!r} has ordinal {ordinal}, but there are only "
                                        f"{count} {kind}s; the StatefulSet's replicas must match the "
                                        f"{kind} count")
                    index = ordinal
                    break
        if index is None:
            raise RoleError(f"{needed_by} found no index for this {kind}: set FLEET_K8S_INDEX or "
                            "JOB_COMPLETION_INDEX (an Indexed Job's completion index) or POD_NAME ending in "
                            f"-N (a StatefulSet pod); HOSTNAME={env.get('HOSTNAME', '')!r} has no ordinal")
        self._current_id, self._worker_num = index, worker_num
        self._server_endpoints, self._worker_endpoints = servers, workers

    # mode "pods" ----------------------------------------------------------------------

    def _generate_from_pods(self, env, role):
        needed_by = 'KubernetesRoleMaker(mode="pods")'
        pods = self._pods_arg
        if pods is None:
            pods = parse_int("FLEET_K8S_PODS", require(env, "FLEET_K8S_PODS", needed_by,
                                                       "the number of pods of the job"), 1, None,
                             "the number of pods of the job")
        selector = self._selector_arg or require(env, "FLEET_K8S_SELECTOR", needed_by,
                                                 "the label selector of the job's pods, e.g. fleet-job=ctr")
        server_port = self._port(env, self._server_port_arg, "FLEET_K8S_SERVER_PORT", DEFAULT_SERVER_PORT)
        worker_port = self._port(env, self._worker_port_arg, "FLEET_K8S_WORKER_PORT", DEFAULT_WORKER_PORT)
        if server_port == worker_port:
            raise RoleError(f"the server and worker ports of a pod are both {server_port}; give "
                            "FLEET_K8S_SERVER_PORT and FLEET_K8S_WORKER_PORT different values")
        pod_ip = self._pod_ip_arg or require(env, "POD_IP", needed_by,
                                             "this pod's IP (the downward API's status.podIP)")
        try:
            ip_sort_key(pod_ip.strip())
        except ValueError:
            raise RoleError(f"POD_IP={pod_ip!r} is not an IP address; set it from the downward API "
                            "(fieldRef status.podIP)") from None
        pod_ip = pod_ip.strip()
        timeout_s = self._timeout_arg
        if timeout_s is None:
            timeout_s = parse_int("FLEET_K8S_WAIT_TIMEOUT_MS", env.get("FLEET_K8S_WAIT_TIMEOUT_MS",
                                                                       str(DEFAULT_WAIT_TIMEOUT_MS)),
                                  1, None, "milliseconds to wait for the job's pods") / 1000.0
        namespace = self._namespace_arg or env.get("FLEET_K8S_NAMESPACE", "").strip() or self._read_namespace()
        base_url = self._api_url or env.get("FLEET_K8S_API_URL", "").strip() or api_base_url(env)
        if not base_url.startswith(("https://", "http://")):
            raise RoleError(f"the API server URL {base_url!r} (api_url or FLEET_K8S_API_URL) does not start with "
                            "https:// or http://")
        url = pods_url(base_url, namespace, selector)
        ranked = self._wait_for_pods(url, namespace, selector, pods, pod_ip, timeout_s)
        self.pod_names = [p.name for p in ranked]
        ips = [p.ip for p in ranked]
        for pod in ranked:
            if pod.restarts:
                _logger.warning("fleet: pod %s restarted %d times; its server and worker started again and lost "
                                "what they held: restart the job from its last checkpoint", pod.name, pod.restarts)
        self._current_id = ips.index(pod_ip)
        self._worker_num = pods
        self._server_endpoints = [join_endpoint(ip, server_port) for ip in ips]
        self._worker_endpoints = [join_endpoint(ip, worker_port) for ip in ips]

    @staticmethod
    def _port(env, value, name, default):
        if value is not None:
            return parse_int(name, str(value), 1, 65536, f"a port (1..65535; default {default})")
        return parse_int(name, env.get(name, str(default)), 1, 65536, f"a port (1..65535; default {default})")

    def _read_namespace(self):
        try:
            with open(self._namespace_path) as f:
                namespace = f.read().strip()
        except OSError as e:
            raise RoleError(f"cannot read the pod's namespace from {self._namespace_path} ({e.strerror}); mount "
                            "the service account token (automountServiceAccountToken) or pass namespace=") from None
        if not namespace:
            raise RoleError(f"{self._namespace_path} is empty; pass namespace=")
        return namespace

    def _ssl_context(self):
        """TLS trusting the service account's CA (the system's CAs when the file is absent)."""
        if not os.path.exists(self._ca_path):
            return ssl.create_default_context()
        try:
            return ssl.create_default_context(cafile=self._ca_path)
        except (ssl.SSLError, OSError) as e:
            raise RoleError(f"cannot load the API server's CA certificate {self._ca_path}: {e}; mount the "
                            "service account's ca.crt or pass ca_path") from None

    def _list_pods(self, url):
        """One listing: a list of PodState. Raises RoleError for answers that will not
        change by waiting (401, 403, 404, not a PodList); OSError for transient failures."""
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if os.path.exists(self._token_path):
            with open(self._token_path) as f:  # re-read: Kubernetes rotates bound tokens
                request.add_header("Authorization", f"Bearer {f.read().strip()}")
        context = self._ssl_context() if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_S, context=context) as answer:
                body = answer.read()
        except urllib.error.HTTPError as e:
            if e.code in (401, 403, 404):
                fix = {401: "the service account token was refused; mount the pod's token "
                            "(automountServiceAccountToken: true)",
                       403: "give the pod's service account a Role allowing 'list' on 'pods' (python -m fleet.k8s "
                            "--seed writes one) and set serviceAccountName",
                       404: "check the namespace"}[e.code]
                raise RoleError(f"the API server answered {e.code} {e.reason} to GET {url}: {fix}") from None
            raise
        try:
            items = json.loads(body)["items"]
            return [PodState(item) for item in items]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RoleError(f"GET {url} did not answer a PodList (JSON with 'items'): {body[:200]!r}") from None

    def _wait_for_pods(self, url, namespace, selector, pods, pod_ip, timeout_s):
        what = f"{pods} pods of {selector} in namespace {namespace} to be Running and Ready"
        limit = f"giving up after {timeout_s:g} s (FLEET_K8S_WAIT_TIMEOUT_MS)"
        wait = WaitLog(what, limit)
        deadline = time.monotonic() + timeout_s
        progress = "the API server has not answered yet"
        while True:
            try:
                states = self._list_pods(url)
            except (OSError, urllib.error.URLError) as e:
                progress = f"the API server did not answer: {getattr(e, 'reason', e)}"
            else:
                up = sorted((p for p in states if p.counts), key=lambda p: ip_sort_key(p.ip))
                if len(up) > pods:
                    raise RoleError(f"{len(up)} pods match {selector} in namespace {namespace} and are up, but "
                                    f"the job has {pods}: {', '.join(p.describe() for p in up)}; make the label "
                                    "selector match only this job's pods and FLEET_K8S_PODS the Job's parallelism")
                if len(up) == pods and pod_ip in {p.ip for p in up}:
                    return up
                progress = self._progress(states, up, pods, pod_ip)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RoleError(f"timed out after {timeout_s:g} s waiting for {what}: {progress}; raise "
                                "FLEET_K8S_WAIT_TIMEOUT_MS if the pods are slow to start, or see "
                                "`kubectl describe pods -l " + selector + "`")
            wait.tick(progress)
            time.sleep(min(self._poll_s, remaining))

    @staticmethod
    def _progress(states, up, pods, pod_ip):
        waiting = [p for p in states if not p.counts and not p.gone]
        gone = [p for p in states if p.gone]
        text = f"{len(up)} of {pods} up"
        if waiting:
            text += "; not yet: " + ", ".join(p.describe() for p in waiting)
        missing = pods - len(up) - len(waiting)
        if missing > 0:
            text += f"; {missing} not created yet"
        if gone:
            text += "; not counted: " + ", ".join(p.describe() for p in gone)
        if len(up) == pods:
            text += f"; this pod's IP {pod_ip} is not among them"
        return text
