"""KubernetesRoleMaker against a local HTTP server answering the pods-list API.

The PodLists are shaped as the Kubernetes API reference describes (core/v1 Pod:
metadata.deletionTimestamp, status.phase, status.podIP/podIPs, status.conditions,
status.containerStatuses[].restartCount/state), and each is checked to load into the
official client's V1PodList model unchanged, so no field is invented.
"""
import json
import logging
import urllib.parse

import pytest
from kube_sim import FakeApiServer, canonical, pod, pod_list

from fleet.errors import RoleError
from role_makers import KubernetesRoleMaker, Role
from role_makers.kubernetes_role_maker import api_base_url, ip_sort_key, pod_ordinal, pods_url

kubernetes = pytest.importorskip("kubernetes")
SELECTOR = "fleet-job=ctr"


def test_the_pod_lists_of_these_tests_load_into_the_official_model_unchanged():
    client = kubernetes.client.ApiClient()
    body = pod_list(pod("a", "10.0.0.9"), pod("b", phase="Pending", ready=False),
                    pod("c", "10.0.0.3", ready=False, restarts=2), pod("d", "10.0.0.4", terminating=True))
    model = client._ApiClient__deserialize(json.loads(json.dumps(body)), "V1PodList")
    assert client.sanitize_for_serialization(model) == canonical(body)
    assert model.items[3].metadata.deletion_timestamp is not None
    assert model.items[2].status.container_statuses[1].restart_count == 2


@pytest.fixture
def service_account(tmp_path):
    (tmp_path / "token").write_text("token-abc\n")
    (tmp_path / "namespace").write_text("ns1\n")
    return tmp_path


def role_maker(api, sa, **kw):
    kw.setdefault("poll_s", 0.01)
    return KubernetesRoleMaker(mode="pods", api_url=api.url, token_path=str(sa / "token"),
                               namespace_path=str(sa / "namespace"), ca_path=str(sa / "ca.crt"),
                               environ=kw.pop("environ", {}), **kw)


def test_pods_appearing_over_time_are_waited_for_then_ranked_by_ip_numerically(service_account, monkeypatch,
                                                                                 caplog):
    monkeypatch.setenv("FLEET_WAIT_LOG_MS", "1")
    first = pod_list(pod("ctr-a", "10.0.0.10"), pod("ctr-b", "10.0.0.9"),
                     pod("ctr-c", phase="Pending", ready=False))
    second = pod_list(pod("ctr-a", "10.0.0.10"), pod("ctr-b", "10.0.0.9"), pod("ctr-c", "10.0.0.100"),
                      pod("ctr-d", "10.0.0.2", ready=False, restarts=1),
                      pod("ctr-old", "10.0.0.50", terminating=True))
    third = pod_list(pod("ctr-old", "10.0.0.50", terminating=True), pod("ctr-a", "10.0.0.10"),
                     pod("ctr-b", "10.0.0.9"), pod("ctr-c", "10.0.0.100"), pod("ctr-d", "10.0.0.2", restarts=1))
    env = {"TRAINING_ROLE": "TRAINER", "POD_IP": "10.0.0.10", "FLEET_K8S_PODS": "4",
           "FLEET_K8S_SELECTOR": SELECTOR, "FLEET_K8S_SERVER_PORT": "7000", "FLEET_K8S_WORKER_PORT": "7001"}
    caplog.set_level(logging.INFO, logger="fleet")
    with FakeApiServer([(200, first), (200, first), (200, second), (200, second), (200, third)]) as api:
        rm = role_maker(api, service_account, environ=env)
        assert rm.worker_index() == 2
    assert rm.is_worker() and not rm.is_server() and rm.worker_num() == 4 and rm.server_num() == 4
    assert rm.pod_names == ["ctr-d", "ctr-b", "ctr-a", "ctr-c"]
    assert rm.get_pserver_endpoints() == ["10.0.0.2:7000", "10.0.0.9:7000", "10.0.0.10:7000", "10.0.0.100:7000"]
    assert rm.get_trainer_endpoints() == ["10.0.0.2:7001", "10.0.0.9:7001", "10.0.0.10:7001", "10.0.0.100:7001"]
    assert len(api.requests) == 5
    path, headers = api.requests[0]
    assert path == "/api/v1/namespaces/ns1/pods?labelSelector=fleet-job%3Dctr"
    assert headers["Authorization"] == "Bearer token-abc"
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for 4 pods")]
    assert waits and waits[0].startswith(
        "waiting for 4 pods of fleet-job=ctr in namespace ns1 to be Running and Ready (")
    assert any("3 of 4 up; not yet: ctr-d (Running, not Ready, 1 restarts, 10.0.0.2); not counted: ctr-old "
               "(Terminating, 10.0.0.50)" in m for m in waits), waits
    restarted = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert restarted == ["fleet: pod ctr-d restarted 1 times; its server and worker started again and lost what "
                         "they held: restart the job from its last checkpoint"]


def test_a_server_pod_gets_the_same_rank_and_endpoints(service_account):
    body = pod_list(pod("ctr-a", "10.1.2.30"), pod("ctr-b", "10.1.2.4"))
    with FakeApiServer([(200, body)]) as api:
        rm = role_maker(api, service_account, role="PSERVER", pods=2, selector=SELECTOR, pod_ip="10.1.2.30")
        assert rm.is_server() and rm.server_index() == 1
        assert rm.get_pserver_endpoints() == ["10.1.2.4:6170", "10.1.2.30:6170"]
        assert rm.get_trainer_endpoints() == ["10.1.2.4:6171", "10.1.2.30:6171"]


def test_a_timeout_names_the_pods_that_are_missing(service_account):
    body = pod_list(pod("ctr-a", "10.0.0.1"), pod("ctr-b", phase="Pending", ready=False),
                    pod("ctr-x", "10.0.0.7", phase="Failed", ready=False))
    with FakeApiServer([(200, body)]) as api:
        rm = role_maker(api, service_account, role=Role.WORKER, pods=4, selector=SELECTOR, pod_ip="10.0.0.1",
                        timeout_s=0.2)
        with pytest.raises(RoleError) as info:
            rm.generate_role()
    assert str(info.value) == (
        "timed out after 0.2 s waiting for 4 pods of fleet-job=ctr in namespace ns1 to be Running and Ready: "
        "1 of 4 up; not yet: ctr-b (Pending, no IP); 2 not created yet; not counted: ctr-x (Failed, 10.0.0.7); "
        "raise FLEET_K8S_WAIT_TIMEOUT_MS if the pods are slow to start, or see "
        "`kubectl describe pods -l fleet-job=ctr`")


def test_an_unreachable_api_server_is_waited_for_and_named(service_account, free_port):
    rm = KubernetesRoleMaker(mode="pods", role="TRAINER", pods=2, selector=SELECTOR, pod_ip="10.0.0.1",
                             api_url=f"http://127.0.0.1:{free_port()}", namespace="ns1", timeout_s=0.2,
                             poll_s=0.01, token_path=str(service_account / "none"), environ={})
    with pytest.raises(RoleError, match=r"timed out after 0.2 s waiting for 2 pods .*: the API server did not "
                                        r"answer: \[Errno 111\] Connection refused"):
        rm.generate_role()


def test_a_forbidden_listing_fails_at_once_naming_the_missing_permission(service_account):
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": 'pods is forbidden: User "system:serviceaccount:ns1:default" cannot list resource '
                         '"pods" in API group "" in the namespace "ns1"', "reason": "Forbidden",
              "details": {"kind": "pods"}, "code": 403}
    with FakeApiServer([(403, status)]) as api:
        rm = role_maker(api, service_account, role="TRAINER", pods=2, selector=SELECTOR, pod_ip="10.0.0.1")
        with pytest.raises(RoleError) as info:
            rm.generate_role()
        assert len(api.requests) == 1
    assert str(info.value) == (
        f"the API server answered 403 Forbidden to GET {api.url}/api/v1/namespaces/ns1/pods?labelSelector="
        "fleet-job%3Dctr: give the pod's service account a Role allowing 'list' on 'pods' (python -m fleet.k8s "
        "--seed writes one) and set serviceAccountName")


def test_more_running_pods_than_the_job_has_is_an_error(service_account):
    body = pod_list(pod("ctr-a", "10.0.0.1"), pod("ctr-b", "10.0.0.2"), pod("other-c", "10.0.0.3"))
    with FakeApiServer([(200, body)]) as api:
        rm = role_maker(api, service_account, role="TRAINER", pods=2, selector=SELECTOR, pod_ip="10.0.0.1")
        with pytest.raises(RoleError, match=r"^3 pods match fleet-job=ctr in namespace ns1 and are up, but the "
                                            r"job has 2: ctr-a \(Running, 10.0.0.1\), ctr-b \(Running, 10.0.0.2\), "
                                            r"other-c \(Running, 10.0.0.3\); make the label selector"):
            rm.generate_role()


def test_missing_or_bad_variables_name_themselves(service_account):
    with FakeApiServer([(200, pod_list())]) as api:
        with pytest.raises(RoleError, match="^TRAINING_ROLE is not set, but KubernetesRoleMaker needs it"):
            role_maker(api, service_account).generate_role()
        with pytest.raises(RoleError, match='^FLEET_K8S_PODS is not set, but KubernetesRoleMaker\\(mode="pods"\\)'):
            role_maker(api, service_account, environ={"TRAINING_ROLE": "TRAINER"}).generate_role()
        with pytest.raises(RoleError, match="^POD_IP='pod-a' is not an IP address; set it from the downward API"):
            role_maker(api, service_account, role="TRAINER", pods=1, selector=SELECTOR,
                       pod_ip="pod-a").generate_role()
        with pytest.raises(RoleError, match="^the server and worker ports of a pod are both 6170"):
            role_maker(api, service_account, role="TRAINER", pods=1, selector=SELECTOR, pod_ip="10.0.0.1",
                       worker_port=6170).generate_role()
    with pytest.raises(RoleError, match='^KubernetesRoleMaker mode=\'ip\' is not valid; use "pods"'):
        KubernetesRoleMaker(mode="ip")


def test_the_https_url_comes_from_the_variables_kubernetes_sets():
    assert api_base_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) == \
        "https://10.96.0.1:443"
    assert api_base_url({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}) == \
        "https://[fd00:10:96::1]:6443"
    assert pods_url("https://10.96.0.1:443", "team-a", "fleet-job=ctr,fleet-role in (seed)") == \
        "https://10.96.0.1:443/api/v1/namespaces/team-a/pods?labelSelector=" + \
        urllib.parse.quote_plus("fleet-job=ctr,fleet-role in (seed)")
    with pytest.raises(RoleError, match="^KUBERNETES_SERVICE_HOST is not set"):
        api_base_url({"KUBERNETES_SERVICE_PORT": "443"})
    with pytest.raises(RoleError, match="^KUBERNETES_SERVICE_PORT='https' is not an integer in"):
        api_base_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "https"})


def test_the_https_path_uses_the_service_account_ca(service_account):
    # The CA file is handed to ssl: a file that is not a certificate fails the listing, named.
    (service_account / "ca.crt").write_text("not a certificate")
    rm = KubernetesRoleMaker(mode="pods", role="TRAINER", pods=1, selector=SELECTOR, pod_ip="10.0.0.1",
                             ca_path=str(service_account / "ca.crt"), namespace="ns1", timeout_s=5,
                             environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"})
    with pytest.raises(RoleError, match=f"^cannot load the API server's CA certificate {service_account}/ca.crt: "
                                        r".*; mount the service account's ca.crt or pass ca_path$"):
        rm.generate_role()


def test_ips_sort_as_numbers_and_ordinals_come_from_pod_names():
    ips = ["10.0.0.10", "10.0.0.9", "10.0.1.1", "9.255.255.255", "10.0.0.100"]
    assert sorted(ips, key=ip_sort_key) == ["9.255.255.255", "10.0.0.9", "10.0.0.10", "10.0.0.100", "10.0.1.1"]
    assert [pod_ordinal(n) for n in ("ctr-server-3", "ctr-server-12", "ctr", "")] == [3, 12, None, None]


def index_env(**extra):
    env = {"PADDLE_PSERVERS_IP_PORT_LIST": "ctr-server-0.ctr-svc:6170,ctr-server-1.ctr-svc:6170",
           "PADDLE_TRAINERS_NUM": "3",
           "PADDLE_TRAINER_ENDPOINTS": ",".join(f"ctr-worker-{i}.ctr-svc:6171" for i in range(3))}
    env.update(extra)
    return env


def test_index_mode_takes_the_completion_index_or_the_statefulset_ordinal():
    rm = KubernetesRoleMaker(mode="index", environ=index_env(TRAINING_ROLE="TRAINER", FLEET_K8S_INDEX="2"))
    assert rm.is_worker() and rm.worker_index() == 2 and rm.worker_num() == 3
    assert rm.get_trainer_endpoints()[2] == "ctr-worker-2.ctr-svc:6171"
    rm = KubernetesRoleMaker(mode="index", environ=index_env(TRAINING_ROLE="PSERVER", JOB_COMPLETION_INDEX="1"))
    assert rm.is_server() and rm.server_index() == 1
    rm = KubernetesRoleMaker(mode="index", environ=index_env(TRAINING_ROLE="PSERVER", POD_NAME="ctr-server-1"))
    assert rm.server_index() == 1 and rm.get_pserver_endpoints() == ["ctr-server-0.ctr-svc:6170",
                                                                      "ctr-server-1.ctr-svc:6170"]
    with pytest.raises(RoleError, match=r"^POD_NAME='ctr-server-2' has ordinal 2, but there are only 2 servers"):
        KubernetesRoleMaker(mode="index", environ=index_env(TRAINING_ROLE="PSERVER",
                                                            POD_NAME="ctr-server-2")).generate_role()
    with pytest.raises(RoleError, match=r"^FLEET_K8S_INDEX='3' is not an integer in \[0, 3\)"):
        KubernetesRoleMaker(mode="index", environ=index_env(TRAINING_ROLE="TRAINER",
                                                            FLEET_K8S_INDEX="3")).generate_role()
    with pytest.raises(RoleError, match=r"found no index for this worker: set FLEET_K8S_INDEX"):
        KubernetesRoleMaker(mode="index", environ=index_env(TRAINING_ROLE="TRAINER",
                                                            HOSTNAME="ctr")).generate_role()
