"""python -m fleet.k8s: every manifest loads into the official kubernetes client's models
unchanged, the objects fit together (selectors, service names, accounts), and the
environment each pod gets makes the role makers find the right role."""
import base64
import io
import json
import os
import stat

import pytest
from kube_sim import container_environment

from fleet.errors import ConfigError
from fleet.k8s import JobSpec, build_manifests, secret_from_keys_dir
from fleet.k8s.__main__ import main
from fleet.k8s.manifests import COMPLETION_INDEX
from fleet.k8s.rank import role_environment
from role_makers import KubernetesRoleMaker, PaddleCloudRoleMaker, UserDefinedRoleMaker

kubernetes = pytest.importorskip("kubernetes")

MODELS = {"Service": "V1Service", "Job": "V1Job", "StatefulSet": "V1StatefulSet",
          "ServiceAccount": "V1ServiceAccount", "Role": "V1Role", "RoleBinding": "V1RoleBinding",
          "Secret": "V1Secret"}
ROLE_VARIABLES = ("TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
                  "PADDLE_TRAINER_ID", "POD_IP", "PADDLE_PORT")
COMMAND = ("python", "train.py", "--epochs", "2")


def spec(**kw):
    base = dict(name="ctr", image="registry.example.com/ctr:1", command=COMMAND, servers=2, workers=3,
                secret="ctr-curve", namespace="team-a")
    base.update(kw)
    return JobSpec(**base)


def load(obj):
    """The object as the official client's model; fails on a missing required field, and
    (by the round trip) on any field the model does not have or a value of the wrong type."""
    client = kubernetes.client.ApiClient()
    model = client._ApiClient__deserialize(json.loads(json.dumps(obj)), MODELS[obj["kind"]])
    assert client.sanitize_for_serialization(model) == obj
    return model


OPTIONS = {
    "jobs": {},
    "statefulset": {"server_kind": "statefulset"},
    "seed": {"seed": True, "servers": 3, "workers": 3},
    "resources+pvc": {"cpu": "2", "memory": "4Gi", "cpu_limit": "4", "memory_limit": "4Gi", "volume_claim": "ctr-data",
                      "data_dir": "/fleet/criteo", "output_dir": "/fleet/out"},
    "host-path+insecure": {"host_path": "/srv/ctr", "secret": None, "insecure": True,
                           "restart_policy": "OnFailure", "backoff_limit": 2, "env": (("CPU_NUM", "4"),)},
    "seed+pvc+insecure": {"seed": True, "servers": 2, "workers": 2, "volume_claim": "ctr-data", "secret": None,
                          "insecure": True, "port": 7000, "worker_port": 7001},
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_manifest_loads_into_the_official_models_and_the_objects_fit_together(option):
    objects = build_manifests(spec(**OPTIONS[option]))
    models = [load(obj) for obj in objects]
    assert {m.metadata.namespace for m in models} == {"team-a"}
    by_kind = {}
    for model in models:
        by_kind.setdefault(model.kind, []).append(model)
    workloads = by_kind.get("Job", []) + by_kind.get("StatefulSet", [])
    for workload in workloads:
        template = workload.spec.template
        assert template.metadata.labels["fleet-job"] == "ctr"
        if workload.kind == "StatefulSet":
            assert workload.spec.selector.match_labels == template.metadata.labels
            assert template.spec.restart_policy == "Always"
        else:
            assert workload.spec.completions == workload.spec.parallelism
            assert template.spec.restart_policy == OPTIONS[option].get("restart_policy", "Never")
            assert workload.spec.backoff_limit == OPTIONS[option].get("backoff_limit", 0)
        for container in template.spec.containers:
            assert container.image == "registry.example.com/ctr:1"
            mounts = {m.name: m for m in container.volume_mounts or ()}
            volumes = {v.name: v for v in template.spec.volumes or ()}
            assert set(mounts) <= set(volumes)
            env = {e.name: e for e in container.env}
            if OPTIONS[option].get("insecure"):
                assert "FLEET_CURVE_KEYS_DIR" not in env and not any(n.startswith("curve") for n in volumes)
            else:
                assert env["FLEET_CURVE_KEYS_DIR"].value == "/etc/fleet/curve"
                secret = volumes[f"curve-{container.name}"].secret
                assert secret.secret_name == "ctr-curve" and secret.default_mode == 0o400
                assert mounts[f"curve-{container.name}"].read_only is True
    if "seed" in option:
        assert [m.kind for m in models] == ["ServiceAccount", "Role", "RoleBinding", "Job"]
        account, role, binding, job = models
        assert role.rules[0].resources == ["pods"] and role.rules[0].verbs == ["list"]
        assert (binding.role_ref.kind, binding.role_ref.name) == ("Role", role.metadata.name)
        assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == \
            [("ServiceAccount", account.metadata.name, "team-a")]
        pod = job.spec.template.spec
        assert pod.service_account_name == account.metadata.name and pod.automount_service_account_token
        assert job.spec.completion_mode is None  # NonIndexed: ranks come from the IPs
        assert [c.name for c in pod.containers] == ["server", "worker"]
        for container in pod.containers:
            assert container.command == ["python", "-m", "fleet.k8s.rank", "--", *COMMAND]
    else:
        service = by_kind["Service"][0]
        assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
        for workload in workloads:
            pod = workload.spec.template.spec
            assert pod.automount_service_account_token is False
            assert pod.subdomain == service.metadata.name
            assert set(service.spec.selector.items()) <= set(workload.spec.template.metadata.labels.items())
            for container in pod.containers:
                assert container.command == list(COMMAND)
        if option == "statefulset":
            assert by_kind["StatefulSet"][0].spec.service_name == service.metadata.name
            assert by_kind["StatefulSet"][0].spec.pod_management_policy == "Parallel"
        else:
            assert [j.spec.completion_mode for j in by_kind["Job"]] == ["Indexed", "Indexed"]


def test_resources_volume_and_extra_env_land_in_every_container():
    objects = build_manifests(spec(**OPTIONS["resources+pvc"], env=(("CPU_NUM", "4"), ("FLEET_WAIT_LOG_MS", "0"))))
    for job in objects[1:]:
        pod = job["spec"]["template"]["spec"]
        assert pod["volumes"][0] == {"name": "shared", "persistentVolumeClaim": {"claimName": "ctr-data"}}
        container = pod["containers"][0]
        assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"},
                                          "limits": {"cpu": "4", "memory": "4Gi"}}
        assert {"name": "shared", "mountPath": "/fleet"} in container["volumeMounts"]
        env = container_environment(container, {"status.podIP": "10.0.0.1", COMPLETION_INDEX: "0"})
        assert (env["FLEET_DATA_DIR"], env["FLEET_OUTPUT_DIR"]) == ("/fleet/criteo", "/fleet/out")
        assert (env["CPU_NUM"], env["FLEET_WAIT_LOG_MS"]) == ("4", "0")


def test_each_role_mounts_only_the_key_files_it_needs():
    objects = build_manifests(spec(seed=True, servers=2, workers=2))
    volumes = {v["name"]: v["secret"] for v in objects[-1]["spec"]["template"]["spec"]["volumes"]}
    assert volumes == {
        "curve-server": {"secretName": "ctr-curve", "defaultMode": 0o400,
                         "items": [{"key": k, "path": k} for k in ("server.key", "server.key_secret", "client.key")]},
        "curve-worker": {"secretName": "ctr-curve", "defaultMode": 0o400,
                         "items": [{"key": k, "path": k} for k in ("server.key", "client.key", "client.key_secret")]},
    }


def pod_env(job, fields):
    return container_environment(job["spec"]["template"]["spec"]["containers"][0], fields)


def use_env(monkeypatch, env):
    for name in ROLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("server_kind", ["job", "statefulset"])
def test_each_pod_gets_paddles_role_variables_and_the_role_makers_agree(monkeypatch, server_kind):
    _, servers, workers = build_manifests(spec(server_kind=server_kind))
    server_list = "ctr-server-0.ctr-svc:6170,ctr-server-1.ctr-svc:6170"
    worker_list = "ctr-worker-0.ctr-svc:6171,ctr-worker-1.ctr-svc:6171,ctr-worker-2.ctr-svc:6171"
    for index in range(2):
        # An Indexed Job's pod is named ctr-server-<index>-<random>; its host name is ctr-server-<index>.
        name = f"ctr-server-{index}" if server_kind == "statefulset" else f"ctr-server-{index}-x7k2q"
        env = pod_env(servers, {"metadata.name": name, COMPLETION_INDEX: str(index), "status.podIP": "10.0.0.9"})
        expected = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": server_list,
                    "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ENDPOINTS": worker_list,
                    "POD_IP": f"ctr-server-{index}.ctr-svc", "PADDLE_PORT": "6170", "FLEET_BIND_HOST": "0.0.0.0",
                    "FLEET_CURVE_KEYS_DIR": "/etc/fleet/curve"}
        assert {k: env[k] for k in expected} == expected
        use_env(monkeypatch, env)
        rm = PaddleCloudRoleMaker()
        assert rm.is_server() and rm.server_index() == index and rm.worker_num() == 3
        rm = KubernetesRoleMaker(mode="index", environ=env)
        assert rm.is_server() and rm.server_index() == index
    for index in range(3):
        env = pod_env(workers, {"metadata.name": f"ctr-worker-{index}-abcde", COMPLETION_INDEX: str(index),
                                "status.podIP": f"10.0.1.{index}"})
        expected = {"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(index), "POD_IP": f"10.0.1.{index}",
                    "PADDLE_PORT": "6171", "FLEET_CONNECT_TIMEOUT_MS": "600000"}
        assert {k: env[k] for k in expected} == expected and "FLEET_BIND_HOST" not in env
        use_env(monkeypatch, env)
        rm = PaddleCloudRoleMaker()
        assert rm.is_worker() and rm.worker_index() == index
        assert rm.get_pserver_endpoints() == server_list.split(",")
        assert rm.get_trainer_endpoints() == worker_list.split(",")


def test_a_seed_pod_gets_what_the_rank_command_needs_and_the_script_gets_paddles_variables(monkeypatch):
    job = build_manifests(spec(seed=True, servers=2, workers=2, port=7000, worker_port=7001))[-1]
    server, worker = job["spec"]["template"]["spec"]["containers"]
    env = container_environment(worker, {"status.podIP": "10.0.0.10", "metadata.namespace": "team-a"})
    assert env == {"TRAINING_ROLE": "TRAINER", "POD_IP": "10.0.0.10", "FLEET_K8S_NAMESPACE": "team-a",
                   "FLEET_K8S_PODS": "2",
                   "FLEET_K8S_SELECTOR": "fleet-job=ctr", "FLEET_K8S_SERVER_PORT": "7000",
                   "FLEET_K8S_WORKER_PORT": "7001", "FLEET_K8S_WAIT_TIMEOUT_MS": "600000",
                   "FLEET_CONNECT_TIMEOUT_MS": "600000", "FLEET_CURVE_KEYS_DIR": "/etc/fleet/curve"}
    assert container_environment(server, {"status.podIP": "10.0.0.10", "metadata.namespace": "team-a"})[
        "TRAINING_ROLE"] == "PSERVER"
    # What fleet.k8s.rank hands the script once the pod is ranked 1 of 2 (by IP: .9 before .10).
    servers, workers = ["10.0.0.9:7000", "10.0.0.10:7000"], ["10.0.0.9:7001", "10.0.0.10:7001"]
    for role, port in ((1, "7001"), (2, "7000")):
        ranked = UserDefinedRoleMaker(current_id=1, role=role, worker_num=2, server_endpoints=servers)
        ranked._worker_endpoints = workers
        script_env = role_environment(ranked, env)
        use_env(monkeypatch, script_env)
        rm = PaddleCloudRoleMaker()
        assert rm.role_id() == 1 and rm.is_worker() == (role == 1)
        assert rm.get_pserver_endpoints() == servers and rm.get_trainer_endpoints() == workers
        assert (script_env["POD_IP"], script_env["PADDLE_PORT"]) == ("10.0.0.10", port)


def test_the_secret_from_a_key_directory_holds_its_files(tmp_path):
    from fleet.transport import generate_keys
    generate_keys(str(tmp_path / "keys"))
    secret = secret_from_keys_dir(spec(), str(tmp_path / "keys"))
    load(secret)
    assert secret["metadata"] == {"name": "ctr-curve", "namespace": "team-a", "labels": {"fleet-job": "ctr"}}
    assert sorted(secret["data"]) == ["client.key", "client.key_secret", "server.key", "server.key_secret"]
    for name, value in secret["data"].items():
        assert base64.b64decode(value) == (tmp_path / "keys" / name).read_bytes()
    os.remove(tmp_path / "keys" / "client.key_secret")
    with pytest.raises(ConfigError, match=f"^--keys-dir '{tmp_path}/keys' has no client.key_secret; write a key "
                                          "directory with python -c"):
        secret_from_keys_dir(spec(), str(tmp_path / "keys"))


def test_the_command_line_writes_a_list_a_file_or_a_directory(tmp_path, capsys):
    from fleet.transport import generate_keys
    generate_keys(str(tmp_path / "keys"))
    args = ["--name", "ctr", "--image", "img:1", "--servers", "1", "--workers", "2", "--keys-dir",
            str(tmp_path / "keys"), "--memory", "1Gi", "--", "python", "train.py", "-v"]
    out = io.StringIO()
    assert main(args, stdout=out) == 0
    listing = json.loads(out.getvalue())
    assert listing["kind"] == "List" and [o["kind"] for o in listing["items"]] == ["Secret", "Service", "Job", "Job"]
    for obj in listing["items"]:
        load(obj)
    worker = listing["items"][3]["spec"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["python", "train.py", "-v"]
    assert worker["resources"] == {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    assert main([*args[:-4], "--out", str(tmp_path / "job.json"), *args[-4:]]) == 0
    assert json.loads((tmp_path / "job.json").read_text()) == listing
    assert main([*args[:-4], "--out", str(tmp_path / "objects") + "/", *args[-4:]]) == 0
    files = sorted(os.listdir(tmp_path / "objects"))
    assert files == ["00-secret-ctr-curve.json", "01-service-ctr-svc.json", "02-job-ctr-server.json",
                     "03-job-ctr-worker.json"]
    assert stat.S_IMODE(os.stat(tmp_path / "objects" / files[0]).st_mode) == 0o600
    capsys.readouterr()


@pytest.mark.parametrize("kw, message", [
    ({"secret": None}, "a job on several machines uses CURVE: give --secret NAME (the Secret holding the key files; "
                       "--keys-dir DIR also writes it) or --insecure to send parameters unauthenticated and in clear "
                       "text"),
    ({"seed": True}, "--seed runs one server and one worker in each pod, so --servers and --workers must be equal; "
                     "got 2 and 3"),
    ({"name": "CTR_job"}, "job name (--name) 'CTR_job' is not a valid Kubernetes name: lower-case letters, digits "
                          "and '-', starting and ending with a letter or digit, at most 63 characters"),
    ({"name": "c" * 55, "workers": 10}, f"job name {'c' * 55!r} is too long: pod host names such as "
                                        f"{'c' * 55}-worker-9 must have at most 63 characters; shorten --name"),
    ({"memory": "4GB"}, "--memory '4GB' is not a Kubernetes quantity; write e.g. 2, 500m, 4Gi"),
    ({"data_dir": "/fleet/data"}, "--data-dir '/fleet/data' needs a shared volume: give --volume-claim PVC or "
                                  "--host-path"),
    ({"volume_claim": "d", "output_dir": "/out"}, "--output-dir '/out' is not under the shared volume's "
                                                  "--mount-path '/fleet'"),
    ({"command": ()}, "no command to run: give the script's command line after --, e.g. -- python train.py"),
    ({"port": 6171}, "--port and --worker-port are both 6171; give them different values"),
    ({"restart_policy": "Always"}, "--restart-policy 'Always' is not valid for a Job's pods; use Never or OnFailure"),
    ({"env": (("POD_IP", "1.2.3.4"),)}, "--env POD_IP is set by the manifests themselves; leave it out"),
])
def test_bad_options_are_config_errors_naming_the_fix(kw, message):
    with pytest.raises(ConfigError) as info:
        spec(**kw)
    assert str(info.value) == message


def test_the_command_line_reports_a_bad_option_with_exit_code_2(capsys):
    assert main(["--name", "ctr", "--image", "img:1", "--", "python", "train.py"], stdout=io.StringIO()) == 2
    assert capsys.readouterr().err.endswith(
        "python -m fleet.k8s: error: a job on several machines uses CURVE: give --secret NAME (the Secret holding "
        "the key files; --keys-dir DIR also writes it) or --insecure to send parameters unauthenticated and in "
        "clear text\n")
