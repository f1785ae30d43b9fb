"""What Kubernetes would give a container of fleet.k8s's manifests, without a cluster.

``container_environment`` resolves a container's ``env`` as the kubelet does: downward-API
``fieldRef`` values from a dict standing for the pod, and ``$(NAME)`` references to
variables defined earlier in the list (``$$`` escapes a ``$``).

``FakeApiServer`` answers the pods-list API from a local ``http.server`` with PodLists
built by ``pod`` / ``pod_list``, shaped as the Kubernetes API reference describes
(core/v1 Pod: metadata.deletionTimestamp, status.phase, status.podIP/podIPs,
status.conditions, status.containerStatuses[].restartCount/state).
"""
import http.server
import json
import re
import threading

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def container_environment(container, fields):
    """The variables of ``container`` (a manifest dict) in a pod described by ``fields``.

    Args:
        container: one entry of a pod template's ``containers``.
        fields: {fieldPath: value} for the pod, e.g. {"status.podIP": "10.0.0.4",
            "metadata.name": "ctr-server-0"}.

    Returns:
        dict: name -> value, in definition order.

    Raises:
        KeyError: a fieldRef the pod does not have (a typo in the manifest).
    """
    env = {}
    for item in container.get("env", ()):
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            def expand(match):
                if match.group(0) == "$$":
                    return "$"
                return env.get(match.group(1), match.group(0))
            env[item["name"]] = _REFERENCE.sub(expand, item.get("value", ""))
    return env


T0 = "2026-11-25T10:00:00Z"
SELECTOR = "fleet-job=ctr"


def pod(name, ip=None, phase="Running", ready=True, restarts=0, terminating=False):
    """One Pod as the API server lists it (two containers: a seed pod's server and worker)."""
    waiting = phase == "Pending" or (phase == "Running" and not ready)
    if phase == "Pending":
        state = {"waiting": {"reason": "ContainerCreating"}}
    elif waiting:
        state = {"waiting": {"reason": "CrashLoopBackOff",
                             "message": "back-off 10s restarting failed container=worker"}}
    else:
        state = {"running": {"startedAt": T0}}
    statuses = []
    for container in ("server", "worker"):
        status = {"name": container, "image": "registry.example.com/ctr:1",
                  "imageID": "registry.example.com/ctr@sha256:" + "ab" * 32,
                  "ready": ready and phase == "Running", "restartCount": restarts if container == "worker" else 0,
                  "started": phase == "Running", "state": state}
        if phase != "Pending":
            status["containerID"] = "containerd://" + "cd" * 32
        if restarts and container == "worker":
            status["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": T0,
                                                  "finishedAt": T0, "containerID": "containerd://" + "ef" * 32}}
        statuses.append(status)
    conditions = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": T0}]
    if phase != "Pending":
        flag = "True" if ready else "False"
        conditions += [
            {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": T0},
            {"type": "ContainersReady", "status": flag, "lastProbeTime": None, "lastTransitionTime": T0},
            {"type": "Ready", "status": flag, "lastProbeTime": None, "lastTransitionTime": T0},
        ]
        if not ready:
            for c in conditions[-2:]:
                c["reason"] = "ContainersNotReady"
                c["message"] = "containers with unready status: [worker]"
    metadata = {"name": name, "generateName": "ctr-", "namespace": "ns1", "uid": f"uid-{name}",
                "resourceVersion": "4711", "creationTimestamp": T0,
                "labels": {"fleet-job": "ctr", "fleet-role": "seed", "job-name": "ctr",
                           "batch.kubernetes.io/job-name": "ctr", "controller-uid": "uid-job"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "ctr", "uid": "uid-job",
                                     "controller": True, "blockOwnerDeletion": True}]}
    if terminating:
        metadata["deletionTimestamp"] = T0
        metadata["deletionGracePeriodSeconds"] = 30
    status = {"phase": phase, "conditions": conditions, "hostIP": "192.168.1.5",
              "hostIPs": [{"ip": "192.168.1.5"}], "qosClass": "BestEffort", "containerStatuses": statuses}
    if phase != "Pending":
        status["startTime"] = T0
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    spec = {"containers": [{"name": c, "image": "registry.example.com/ctr:1"} for c in ("server", "worker")],
            "restartPolicy": "Never", "serviceAccountName": "ctr-pod-lister", "nodeName": "node-1"}
    return {"metadata": metadata, "spec": spec, "status": status}


def pod_list(*pods):
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "4712"}, "items": list(pods)}


def canonical(value):
    """``value`` as the client writes it back: null fields dropped, times as +00:00."""
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value.replace("T10:00:00Z", "T10:00:00+00:00") if value == T0 else value


class FakeApiServer:
    """A local http.server answering GET /api/v1/namespaces/NS/pods with a scripted PodList.

    ``answers`` is a list of (status, body); request k gets answers[min(k, len - 1)], so
    the pods can change over the first polls and then stay.
    """

    def __init__(self, answers):
        self.answers = answers
        self.requests = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                fake.requests.append((self.path, dict(self.headers)))
                status, body = fake.answers[min(len(fake.requests) - 1, len(fake.answers) - 1)]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
