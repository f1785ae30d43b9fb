"""The pods of python -m fleet.k8s's manifests, run as processes on this machine.

No cluster here: each pod's container runs its manifest's command with the environment
Kubernetes would give it (fieldRefs, $(VAR) references; tests/kube_sim.py), each pod
standing at a loopback address of its own (127.0.0.2, ...) in place of its IP and DNS
name, and its CURVE Secret mounted as the files of its volume's items, mode 0400. The
script is a small sync job (tests/integration/scripts/dist_model.py).
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from kube_sim import FakeApiServer, container_environment, pod, pod_list

from fleet.k8s import build_manifests, JobSpec
from fleet.k8s.manifests import COMPLETION_INDEX, CURVE_MOUNT
from fleet.transport import generate_keys

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "dist_model.py")
STEPS, BATCH = 4, 16
ROLE_VARIABLES = ("TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
                  "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT", "FLEET_CURVE_KEYS_DIR", "FLEET_BIND_HOST")


def mount_secret(pod_spec, container, keys, where):
    """The files Kubernetes would put in the container's Secret volume, with its mode."""
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == CURVE_MOUNT)
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])["secret"]
    os.makedirs(where)
    for item in volume["items"]:
        shutil.copyfile(keys / item["key"], os.path.join(where, item["path"]))
        os.chmod(os.path.join(where, item["path"]), volume["defaultMode"])
    return where


def start_container(procs, tmp_path, pod_name, pod_spec, container, fields, hosts, keys):
    """Starts one container as a process; returns (Popen, log path)."""
    env = container_environment(container, fields)
    for name, value in env.items():
        for host, address in hosts.items():
            value = value.replace(host, address)
        env[name] = value
    env["FLEET_CURVE_KEYS_DIR"] = mount_secret(pod_spec, container, keys,
                                               str(tmp_path / pod_name / container["name"] / "curve"))
    base = {k: v for k, v in os.environ.items() if k not in ROLE_VARIABLES and not k.startswith("FLEET_K8S_")}
    log = tmp_path / f"{pod_name}.{container['name']}.log"
    with open(log, "w") as out:
        proc = procs.start(container["command"], env={**base, **env}, stdout=out, stderr=subprocess.STDOUT,
                           cwd=tmp_path)
    return proc, log


def finish(procs, started):
    for proc, log in started:
        code = procs.wait(proc, timeout=120)
        assert code == 0, f"{log.name} exited with {code}:\n{log.read_text()[-3000:]}"


def check_trained(out):
    first, second = (np.load(out / f"worker{i}.npz") for i in range(2))
    for name in first.files:  # sync: both workers end with the servers' parameters
        np.testing.assert_allclose(first[name], second[name], rtol=1e-6, atol=1e-7)
    assert np.isfinite(first["fc_0_w_0"]).all()


@pytest.mark.slow
def test_one_server_and_two_workers_from_the_indexed_jobs(procs, tmp_path, free_ports):
    port, worker_port = free_ports(2)
    out = tmp_path / "out"
    out.mkdir()
    generate_keys(str(tmp_path / "keys"))
    spec = JobSpec(name="ctr", image="img:1", servers=1, workers=2, port=port, worker_port=worker_port,
                   secret="ctr-curve", command=(sys.executable, SCRIPT, "sync", str(out), str(STEPS), str(BATCH)))
    service, servers, workers = build_manifests(spec)
    hosts = {"ctr-server-0.ctr-svc": "127.0.0.2", "ctr-worker-0.ctr-svc": "127.0.0.3",
             "ctr-worker-1.ctr-svc": "127.0.0.4"}
    started = []
    pod_spec = servers["spec"]["template"]["spec"]
    started.append(start_container(procs, tmp_path, "ctr-server-0-abcde", pod_spec, pod_spec["containers"][0],
                                   {COMPLETION_INDEX: "0", "status.podIP": "10.9.9.9"}, hosts,
                                   tmp_path / "keys"))
    pod_spec = workers["spec"]["template"]["spec"]
    for index in range(2):
        started.append(start_container(procs, tmp_path, f"ctr-worker-{index}-fghij", pod_spec,
                                       pod_spec["containers"][0],
                                       {COMPLETION_INDEX: str(index), "status.podIP": f"127.0.0.{3 + index}"},
                                       hosts, tmp_path / "keys"))
    finish(procs, started)
    check_trained(out)
    # The server bound 0.0.0.0 (FLEET_BIND_HOST) and was known by its name's address.
    assert f"listening on 127.0.0.2:{port}" in started[0][1].read_text()


@pytest.mark.slow
def test_seed_pods_rank_themselves_through_the_api_server_then_train(procs, tmp_path, free_ports):
    port, worker_port = free_ports(2)
    out = tmp_path / "out"
    out.mkdir()
    generate_keys(str(tmp_path / "keys"))
    spec = JobSpec(name="ctr", image="img:1", seed=True, servers=2, workers=2, port=port, worker_port=worker_port,
                   secret="ctr-curve", python=sys.executable,
                   command=(sys.executable, SCRIPT, "sync", str(out), str(STEPS), str(BATCH)))
    job = build_manifests(spec)[-1]
    pod_spec = job["spec"]["template"]["spec"]
    # IPs out of order, one pod still Pending at the first listing.
    first = pod_list(pod("ctr-b", "127.0.0.3"), pod("ctr-a", phase="Pending", ready=False))
    later = pod_list(pod("ctr-b", "127.0.0.3"), pod("ctr-a", "127.0.0.2"))
    with FakeApiServer([(200, first), (200, later)]) as api:
        started = []
        for name, ip in (("ctr-b", "127.0.0.3"), ("ctr-a", "127.0.0.2")):
            for container in pod_spec["containers"]:
                container = {**container, "env": [*container["env"], {"name": "FLEET_K8S_API_URL", "value": api.url}]}
                started.append(start_container(procs, tmp_path, name, pod_spec, container,
                                               {"status.podIP": ip, "metadata.namespace": "ns1"}, {},
                                               tmp_path / "keys"))
        finish(procs, started)
    check_trained(out)
    logs = {log.name: log.read_text() for _, log in started}
    assert "this pod is worker 1 of 2 (pods in IP order: ctr-a, ctr-b)" in logs["ctr-b.worker.log"]
    assert "this pod is server 0 of 2 (pods in IP order: ctr-a, ctr-b)" in logs["ctr-a.server.log"]
    assert f"listening on 127.0.0.3:{port}" in logs["ctr-b.server.log"]
    assert all(path.startswith("/api/v1/namespaces/ns1/pods?labelSelector=fleet-job%3Dctr")
               for path, _ in api.requests)
