"""kube-controller-manager in the harness: what a real cluster does for us now happens here too.

Workload controllers create pods (which kwok runs), deleted namespaces go away, ResourceQuota on gpupack's
extended resource is computed and enforced, garbage collection follows owner references, PDB status is
computed (so the Eviction API decides), and the token controller signs with the key the apiserver trusts.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from typing import Any

import podshapes
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from podshapes import webhook_pod

from app.core import names
from tests.devcluster import Cluster, wait_for

APP_LABEL = "gpupack.test/app"


def plain_pod_spec(node: str) -> dict[str, Any]:
    """A pod template spec pinned to one kwok node (kwok runs it; no GPU, so no extender call)."""
    return {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
        "terminationGracePeriodSeconds": 0,
    }


def deployment(name: str, node: str, replicas: int) -> dict[str, Any]:
    return podshapes.deployment(name, {APP_LABEL: name}, {"spec": plain_pod_spec(node)}, replicas)


def fraction_pod(name: str, milli: int) -> dict[str, Any]:
    """A pod as the webhook leaves it for `gpu-fraction` (tests/integration/podshapes.py).

    Its pool selector matches no node, so it stays Pending: the quota counts it all the same.
    """
    return webhook_pod(name, pool=("gpupack.test/pool", "none"), milli=milli)


def running_pods(core: Any, namespace: str, selector: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_deployment_creates_its_pods_on_kwok_nodes(
    kube: Any, core: Any, namespace: str, gpu_nodes: Callable[..., list[str]]
) -> None:
    (node,) = gpu_nodes(1)
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, deployment("web", node, 3))

    wait_for(lambda: len(running_pods(core, namespace, f"{APP_LABEL}=web")) == 3, 60, "3 Running web pods")
    pods = running_pods(core, namespace, f"{APP_LABEL}=web")
    assert {p.spec.node_name for p in pods} == {node}
    owners = {ref.kind for p in pods for ref in p.metadata.owner_references or []}
    assert owners == {"ReplicaSet"}  # deployment controller -> ReplicaSet -> replicaset controller -> pods
    wait_for(
        lambda: (apps.read_namespaced_deployment_status("web", namespace).status.ready_replicas or 0) == 3,
        60,
        "deployment web reports 3 ready replicas",
    )

    # Scaling down is the controllers' job too.
    apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 1}})
    wait_for(
        lambda: len(core.list_namespaced_pod(namespace, label_selector=f"{APP_LABEL}=web").items) == 1,
        60,
        "web scaled down to 1 pod",
    )


def test_deleted_namespace_goes_away_with_its_objects(core: Any, gpu_nodes: Callable[..., list[str]]) -> None:
    (node,) = gpu_nodes(1)
    name = f"t-del-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_config_map(name, {"metadata": {"name": "cfg"}, "data": {"k": "v"}})
    core.create_namespaced_pod(name, {"metadata": {"name": "p"}, "spec": plain_pod_spec(node)})
    wait_for(lambda: core.read_namespaced_pod("p", name).status.phase == "Running", 60, "pod p Running")

    core.delete_namespace(name)
    wait_for(lambda: gone(lambda: core.read_namespace(name)), 90, f"namespace {name} deleted")
    assert not core.list_namespaced_pod(name).items


def test_resource_quota_on_gpu_milli_refuses_the_third_half_gpu_pod(core: Any, namespace: str) -> None:
    quota = f"requests.{names.RESOURCE_GPU_MILLI}"
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "gpu"}, "spec": {"hard": {quota: "1000"}}}
    )
    # Until the quota controller has computed status.hard, admission refuses every counted pod.
    wait_for(
        lambda: (core.read_namespaced_resource_quota("gpu", namespace).status.hard or {}).get(quota) == "1k",
        60,
        "quota status computed",
    )
    core.create_namespaced_pod(namespace, fraction_pod("half-1", 500))
    core.create_namespaced_pod(namespace, fraction_pod("half-2", 500))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, fraction_pod("half-3", 500))
    assert refused.value.status == 403
    assert "exceeded quota: gpu" in refused.value.body
    assert f"requested: {quota}=500, used: {quota}=1k, limited: {quota}=1k" in refused.value.body

    wait_for(
        lambda: core.read_namespaced_resource_quota("gpu", namespace).status.used.get(quota) == "1k",
        60,
        "quota status.used = 1000 milli",
    )
    # Freeing half a GPU lets the third pod in: the controller recomputes usage after the delete. Quota
    # admission reads the quota through its own cache, which may lag the status just read by a moment.
    core.delete_namespaced_pod("half-1", namespace, grace_period_seconds=0)
    wait_for(
        lambda: core.read_namespaced_resource_quota("gpu", namespace).status.used.get(quota) == "500",
        60,
        "quota status.used back to 500 milli",
    )

    def admitted() -> bool:
        try:
            core.create_namespaced_pod(namespace, fraction_pod("half-3", 500))
        except ApiException as exc:
            if exc.status == 403 and "exceeded quota: gpu" in exc.body:
                return False
            raise
        return True

    wait_for(admitted, 30, "the third half-GPU pod admitted once half a GPU is free")


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(core: Any, namespace: str) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for i in range(2):
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": f"dep-{i}", "ownerReferences": [ref]}, "data": {}}
        )
    core.create_namespaced_secret(namespace, {"metadata": {"name": "bystander"}, "data": {}})

    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")
    for i in range(2):
        wait_for(
            lambda i=i: gone(lambda: core.read_namespaced_secret(f"dep-{i}", namespace)),
            60,
            f"dependent secret dep-{i} collected",
        )
    assert core.read_namespaced_secret("bystander", namespace).metadata.name == "bystander"


def test_foreground_deletion_of_a_deployment_removes_replicasets_and_pods(
    kube: Any, core: Any, namespace: str, gpu_nodes: Callable[..., list[str]]
) -> None:
    (node,) = gpu_nodes(1)
    apps = client.AppsV1Api(kube)
    apps.create_namespaced_deployment(namespace, deployment("fg", node, 2))
    wait_for(lambda: len(running_pods(core, namespace, f"{APP_LABEL}=fg")) == 2, 60, "2 Running fg pods")

    apps.delete_namespaced_deployment("fg", namespace, propagation_policy="Foreground")
    wait_for(lambda: gone(lambda: apps.read_namespaced_deployment("fg", namespace)), 90, "deployment fg gone")
    assert not apps.list_namespaced_replica_set(namespace, label_selector=f"{APP_LABEL}=fg").items
    assert not core.list_namespaced_pod(namespace, label_selector=f"{APP_LABEL}=fg").items


def test_pdb_status_is_computed_and_the_eviction_api_honours_it(
    kube: Any, core: Any, namespace: str, gpu_nodes: Callable[..., list[str]]
) -> None:
    (node,) = gpu_nodes(1)
    apps = client.AppsV1Api(kube)
    policy = client.PolicyV1Api(kube)
    apps.create_namespaced_deployment(namespace, deployment("db", node, 2))
    wait_for(lambda: len(running_pods(core, namespace, f"{APP_LABEL}=db")) == 2, 60, "2 Running db pods")
    selector = {"matchLabels": {APP_LABEL: "db"}}
    policy.create_namespaced_pod_disruption_budget(
        namespace, {"metadata": {"name": "db"}, "spec": {"minAvailable": 2, "selector": selector}}
    )

    def status() -> Any:
        return policy.read_namespaced_pod_disruption_budget_status("db", namespace).status

    wait_for(lambda: status().current_healthy == 2 and status().observed_generation == 1, 60, "PDB status")
    st = status()
    assert (st.desired_healthy, st.expected_pods, st.disruptions_allowed) == (2, 2, 0)

    victim = running_pods(core, namespace, f"{APP_LABEL}=db")[0].metadata.name
    eviction = {"metadata": {"name": victim, "namespace": namespace}}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod_eviction(victim, namespace, eviction)
    assert refused.value.status == 429
    assert "disruption budget db" in refused.value.body

    # One pod may go once the budget allows it.
    policy.patch_namespaced_pod_disruption_budget("db", namespace, {"spec": {"minAvailable": 1}})
    wait_for(lambda: status().disruptions_allowed == 1, 60, "PDB allows one disruption")
    core.create_namespaced_pod_eviction(victim, namespace, eviction)
    wait_for(
        lambda: (
            gone(lambda: core.read_namespaced_pod(victim, namespace))
            or core.read_namespaced_pod(victim, namespace).metadata.deletion_timestamp is not None
        ),
        30,
        f"evicted pod {victim} deleted",
    )


def test_service_account_tokens_are_signed_with_the_key_the_apiserver_trusts(
    cluster: Cluster, core: Any, namespace: str
) -> None:
    # Two controllers on their own schedules: serviceaccount makes `default`, root-ca-cert-publisher the CA.
    wait_for(
        lambda: not gone(lambda: core.read_namespaced_service_account("default", namespace)),
        60,
        "ServiceAccount default created",
    )
    wait_for(
        lambda: not gone(lambda: core.read_namespaced_config_map("kube-root-ca.crt", namespace)),
        60,
        "ConfigMap kube-root-ca.crt published",
    )
    root_ca = core.read_namespaced_config_map("kube-root-ca.crt", namespace)
    assert root_ca.data["ca.crt"] == cluster.ca_file.read_text()

    # A legacy token Secret: the token controller fills it, signing with --service-account-private-key-file.
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "tok", "annotations": {"kubernetes.io/service-account.name": "default"}},
            "type": "kubernetes.io/service-account-token",
        },
    )
    wait_for(
        lambda: "token" in (core.read_namespaced_secret("tok", namespace).data or {}), 60, "token filled"
    )
    token = base64.b64decode(core.read_namespaced_secret("tok", namespace).data["token"]).decode()

    cfg = client.Configuration()
    cfg.host = cluster.api_url
    cfg.ssl_ca_cert = str(cluster.ca_file)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review({})
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:default"


def test_kwok_nodes_renew_their_lease_so_the_node_lifecycle_controller_leaves_them_ready(
    cluster: Cluster, gpu_nodes: Callable[..., list[str]]
) -> None:
    # Without a renewed Lease (or status heartbeat) the controller marks a node Unknown and taints it
    # unreachable about 50 s after creation, and long tests then see their pods refused.
    (node,) = gpu_nodes(1, gpus_per_node=1)
    with cluster.api_client() as api:
        coord = client.CoordinationV1Api(api)

        def renew_time() -> Any:
            try:
                return coord.read_namespaced_lease(node, "kube-node-lease").spec.renew_time
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        first = wait_for(renew_time, 30, f"{node}'s Lease in kube-node-lease")
        wait_for(lambda: (renew_time() or first) > first, 30, f"{node}'s Lease renewed")
        taints = client.CoreV1Api(api).read_node(node).spec.taints or []
        assert not [t.key for t in taints if t.key.startswith("node.kubernetes.io/")], taints
