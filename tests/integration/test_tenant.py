"""A tenant against gpupack's trust boundary through the real apiserver: admission policies, narrow RBAC.

The tenant identity (tests/devcluster/identities.py) has no rights of its own; each test grants it what a
namespace user typically has (pods: create/get/list/watch/update/patch/delete in its namespace). The
chart's ValidatingAdmissionPolicies come from the rendered deploy/manifests/gpupack.yaml, bound only to
this test's namespace or nodes (addons.scoped_binding), so other modules sharing the apiserver keep
their own fixtures. `make dev` binds them cluster-wide (addons.Definitions).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_extender import POOL, PROC, create_gpunodes, gpu_pod, outcome, start_extender

from app.core import managed, names
from app.core.model import Allocation
from app.kube.client import Kube
from tests.devcluster import GPUPACK_NAMESPACE, Cluster, wait_for
from tests.devcluster.addons import (
    MANIFEST_RELPATH,
    agent_node_token,
    install_policies,
    install_rbac,
    policy_objects,
    rbac_objects,
    scoped_binding,
    wait_for_pod_policy,
)
from tests.devcluster.identities import kubeconfig

REPO = Path(__file__).resolve().parents[2]
EXTENDER_USER = f"system:serviceaccount:{GPUPACK_NAMESPACE}:gpupack-extender"
AGENT_USER = f"system:serviceaccount:{GPUPACK_NAMESPACE}:gpupack-agent"
TENANT_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"],
    }
]


def manifest() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / MANIFEST_RELPATH).read_text()) if d]


def by_name(objs: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"]["name"].endswith(suffix)]


@pytest.fixture(scope="module")
def components_rbac(kube: Any, gpunode_crd: None) -> None:
    """The chart's RBAC for the extender and the agent, as a real install creates it."""
    install_rbac(kube, rbac_objects(manifest(), ("extender", "agent")))


@pytest.fixture
def tenant(cluster: Cluster, kube: Any, namespace: str, components_rbac: None) -> Iterator[Any]:
    """CoreV1Api as the tenant, who may do anything to pods in `namespace`; the pod policy bound there."""
    rbac = client.RbacAuthorizationV1Api(kube)
    role = {"metadata": {"name": "pods", "namespace": namespace}, "rules": TENANT_RULES}
    rbac.create_namespaced_role(namespace, role)
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tenant-pods", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "tenant"}],
        },
    )
    policies = by_name(policy_objects(manifest()), "-pod-allocation")
    policy, binding = policies
    scoped = scoped_binding(binding, namespace=namespace)
    install_policies(kube, [policy, scoped])
    wait_for_pod_policy(kube, namespace)
    try:
        with cluster.api_client("tenant") as api:
            yield client.CoreV1Api(api)
    finally:
        client.AdmissionregistrationV1Api(kube).delete_validating_admission_policy_binding(
            scoped["metadata"]["name"]
        )


@pytest.fixture
def extender_api(cluster: Cluster) -> Iterator[Any]:
    with cluster.api_client("gpupack-extender") as api:
        yield client.CoreV1Api(api)


def refused(call: Callable[[], object]) -> str:
    """The apiserver's message for a request that must be refused (403 Forbidden or 422 Invalid)."""
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status in (403, 422), (err.value.status, err.value.body)
    return str(json.loads(err.value.body)["message"])


def webhook_made_pod(name: str, fraction: str = "0.6", **spec: Any) -> dict[str, Any]:
    """A pod as the webhook leaves it (its label, request annotation, resource and env)."""
    milli = {names.RESOURCE_GPU_MILLI: str(round(float(fraction) * 1000))}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {names.GPU_FRACTION: fraction},
            "labels": {names.LABEL_MANAGED: "true"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"requests": milli, "limits": milli},
                    "env": [
                        {
                            "name": names.ENV_NVIDIA_VISIBLE_DEVICES,
                            "valueFrom": {"fieldRef": {"fieldPath": managed.GPU_UUIDS_FIELD}},
                        }
                    ],
                }
            ],
            **spec,
        },
    }


ALLOCATION = Allocation("gpu-node", (0,), ("GPU-0",), 600, 24000)


def annotate(api: Any, namespace: str, name: str, annotations: dict[str, str | None]) -> Any:
    return api.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})


# ---- pod metadata: only the extender writes the allocation; the managed label is the webhook's ----


def test_tenant_cannot_create_a_pod_with_an_allocation(tenant: Any, namespace: str) -> None:
    """The squatter: fake allocation annotations and a nodeSelector nothing matches."""
    for key, value in ALLOCATION.to_annotations().items():
        body = webhook_made_pod(f"squat-{len(key)}", nodeSelector={"nowhere": "true"})
        body["metadata"]["annotations"][key] = value
        message = refused(functools.partial(tenant.create_namespaced_pod, namespace, body))
        assert f"annotation {key} is the GPU allocation: only the gpupack extender" in message
        assert "not tenant" in message
    assert tenant.list_namespaced_pod(namespace).items == []


def test_managed_label_needs_a_gpu_request_at_creation(tenant: Any, namespace: str) -> None:
    plain = {"metadata": {"name": "fake", "labels": {names.LABEL_MANAGED: "true"}}, "spec": {
        "containers": [{"name": "main", "image": "busybox"}]
    }}  # fmt: skip
    message = refused(lambda: tenant.create_namespaced_pod(namespace, plain))
    assert "label gpupack.io/managed=true is set by the gpupack webhook" in message
    odd = webhook_made_pod("odd")
    odd["metadata"]["labels"][names.LABEL_MANAGED] = "yes"
    assert "gpupack.io/managed=yes" in refused(lambda: tenant.create_namespaced_pod(namespace, odd))
    # consistent with a request (what the webhook itself produces): admitted
    tenant.create_namespaced_pod(namespace, webhook_made_pod("ok"))


def test_kai_and_burstable_request_annotations_count_as_a_request_and_are_frozen(
    tenant: Any, namespace: str
) -> None:
    """The managed label is allowed beside KAI's NvFractions memory names alone; like gpupack's own request
    annotations (gpupack.io/gpu-memory-limit among them), they cannot change after creation."""
    req, limit = "nvidia.com/container.main.gpu-memory.request", "nvidia.com/container.main.gpu-memory.limit"
    kai = webhook_made_pod("kai")
    kai["metadata"]["annotations"] = {req: "4Gi", limit: "8Gi"}
    tenant.create_namespaced_pod(namespace, kai)
    for key, value in (
        (limit, "16Gi"),
        (req, None),
        ("kai.scheduler/gpu-compute-sharing-mode", "sm-sharing"),
    ):
        message = refused(lambda k=key, v=value: annotate(tenant, namespace, "kai", {k: v}))
        assert f"annotation {key} of a gpupack pod cannot change after creation" in message
    burst = webhook_made_pod("burst")
    burst["metadata"]["annotations"][names.GPU_MEMORY_LIMIT] = "16Gi"
    tenant.create_namespaced_pod(namespace, burst)
    message = refused(lambda: annotate(tenant, namespace, "burst", {names.GPU_MEMORY_LIMIT: "32Gi"}))
    assert f"annotation {names.GPU_MEMORY_LIMIT} of a gpupack pod cannot change after creation" in message
    mode_only = webhook_made_pod("mode-only")
    mode_only["metadata"]["annotations"] = {"kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}
    message = refused(lambda: tenant.create_namespaced_pod(namespace, mode_only))
    assert "label gpupack.io/managed=true is set by the gpupack webhook" in message


def test_every_tenant_edit_of_the_allocation_is_denied_and_the_extender_still_writes(
    tenant: Any, extender_api: Any, namespace: str
) -> None:
    tenant.create_namespaced_pod(namespace, webhook_made_pod("p"))
    # The extender writes the allocation (as bind does) and may remove it again (as a failed bind does).
    annotate(extender_api, namespace, "p", dict(ALLOCATION.to_annotations()))
    annotate(extender_api, namespace, "p", dict.fromkeys(ALLOCATION.to_annotations()))
    annotate(extender_api, namespace, "p", dict(ALLOCATION.to_annotations()))
    before = tenant.read_namespaced_pod("p", namespace).metadata

    alloc_edits: dict[str, dict[str, str | None]] = {
        "shrink gpu-milli": {names.ALLOC_GPU_MILLI: "100"},
        "shrink memory": {names.ALLOC_MEMORY_LIMIT_MIB: "1"},
        "move node": {names.ALLOC_NODE: "other"},
        "other GPUs": {names.ALLOC_GPU_UUIDS: "GPU-1,GPU-2"},
        "drop allocation": dict.fromkeys(names.ALLOCATION_ANNOTATIONS),
    }
    edits: list[tuple[str, Any, str]] = [
        (what, {"metadata": {"annotations": body}}, next(iter(body))) for what, body in alloc_edits.items()
    ]
    edits += [
        (
            "change request",
            {"metadata": {"annotations": {names.GPU_FRACTION: "0.1"}}},
            f"annotation {names.GPU_FRACTION} of a gpupack pod cannot change",
        ),
        (
            "remove label",
            {"metadata": {"labels": {names.LABEL_MANAGED: None}}},
            'label gpupack.io/managed cannot be added, changed or removed after creation (was "true", now "")',  # noqa: E501
        ),
        (
            "relabel",
            {"metadata": {"labels": {names.LABEL_MANAGED: "false"}}},
            "label gpupack.io/managed cannot be added",
        ),
        (
            "json patch wiping annotations",
            [{"op": "remove", "path": "/metadata/annotations"}],
            names.ALLOC_NODE,
        ),
    ]
    wrong = []
    for what, body, expected in edits:
        message = refused(functools.partial(tenant.patch_namespaced_pod, "p", namespace, body))
        if expected not in message:
            wrong.append(f"{what}: {message}")
    assert not wrong, "\n".join(wrong)
    after = tenant.read_namespaced_pod("p", namespace).metadata
    assert (after.annotations, after.labels) == (before.annotations, before.labels)
    # What a tenant may still do to its pod: its own labels and annotations.
    tenant.patch_namespaced_pod(
        "p", namespace, {"metadata": {"labels": {"team": "a"}, "annotations": {"n": "1"}}}
    )


def test_a_label_added_later_is_denied(tenant: Any, namespace: str) -> None:
    """A plain pod made a 'gpupack pod' after creation would enter the extender's informer unaccounted."""
    tenant.create_namespaced_pod(
        namespace,
        {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    message = refused(
        lambda: tenant.patch_namespaced_pod(
            "plain", namespace, {"metadata": {"labels": {names.LABEL_MANAGED: "true"}}}
        )
    )
    assert (
        'label gpupack.io/managed cannot be added, changed or removed after creation (was "", now "true")'
        in message
    )


def test_the_extender_may_change_only_allocation_annotations(
    tenant: Any, extender_api: Any, namespace: str
) -> None:
    tenant.create_namespaced_pod(namespace, webhook_made_pod("p"))
    only = "the gpupack extender may change only the allocation annotations of a pod"
    patches = {
        "image": {"spec": {"containers": [{"name": "main", "image": "evil"}]}},
        "deadline": {"spec": {"activeDeadlineSeconds": 5}},
        "label": {"metadata": {"labels": {"x": "y"}}},
        "other annotation": {"metadata": {"annotations": {"note": "x"}}},
        "request annotation": {"metadata": {"annotations": {names.GPU_FRACTION: "0.1"}}},
    }
    for what, body in patches.items():
        message = refused(functools.partial(extender_api.patch_namespaced_pod, "p", namespace, body))
        assert only in message or names.GPU_FRACTION in message, (what, message)
    pod = tenant.read_namespaced_pod("p", namespace)
    assert pod.spec.containers[0].image == "cuda" and pod.spec.active_deadline_seconds is None


# ---- RBAC: what each identity may do at all (SubjectAccessReview), plus real denied requests ----


def allowed(kube: Any, user: str, groups: list[str], verb: str, resource: str, *, namespace: str) -> bool:
    resource, _, sub = resource.partition("/")
    resource, _, group = resource.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [*groups, "system:authenticated"],
            "resourceAttributes": {
                "namespace": namespace, "verb": verb, "group": group,
                "resource": resource, "subresource": sub,
            },
        },
    }  # fmt: skip
    return bool(client.AuthorizationV1Api(kube).create_subject_access_review(review).status.allowed)


def test_narrowed_rights_by_subject_access_review(kube: Any, tenant: Any, namespace: str) -> None:
    sa = ["system:serviceaccounts", f"system:serviceaccounts:{GPUPACK_NAMESPACE}"]
    cases = [
        (EXTENDER_USER, sa, "patch", "pods", namespace, True),
        (EXTENDER_USER, sa, "update", "pods", namespace, False),  # no full-object writes
        (EXTENDER_USER, sa, "create", "pods", namespace, False),
        (EXTENDER_USER, sa, "delete", "pods", namespace, False),
        (EXTENDER_USER, sa, "patch", "pods/status", namespace, False),
        (EXTENDER_USER, sa, "patch", "nodes", "", False),
        (EXTENDER_USER, sa, "patch", "gpunodes.gpupack.io", "", False),
        (AGENT_USER, sa, "patch", "nodes", "", True),  # any node by RBAC: the policy narrows it to its own
        (AGENT_USER, sa, "delete", "nodes", "", False),
        (AGENT_USER, sa, "patch", "pods", namespace, False),
        (AGENT_USER, sa, "delete", "gpunodes.gpupack.io", "", False),
        ("tenant", ["tenants"], "patch", "pods", namespace, True),
        ("tenant", ["tenants"], "patch", "pods", "default", False),
        ("tenant", ["tenants"], "create", "pods/binding", namespace, False),
        ("tenant", ["tenants"], "patch", "nodes", "", False),
    ]
    wrong = [
        f"{user} {verb} {res} in {ns!r}: allowed={not want}"
        for user, groups, verb, res, ns, want in cases
        if allowed(kube, user, groups, verb, res, namespace=ns) != want
    ]
    assert not wrong, "\n".join(wrong)


def test_denied_for_real(tenant: Any, extender_api: Any, namespace: str) -> None:
    tenant.create_namespaced_pod(namespace, webhook_made_pod("p"))
    # RBAC: the extender has no update, the tenant no binding
    body = extender_api.read_namespaced_pod("p", namespace)
    with pytest.raises(ApiException) as err:
        extender_api.replace_namespaced_pod("p", namespace, body)
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        tenant.create_namespaced_pod_binding(
            "p", namespace, {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n"}}
        )
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        tenant.list_namespaced_pod("default")
    assert err.value.status == 403


# ---- agents: each writes only its own Node and GPUNode ----


@pytest.fixture
def agent_policy(kube: Any, components_rbac: None) -> Iterator[Callable[[list[str]], None]]:
    """bind(nodes): the agent-own-node policy, bound to those Nodes and GPUNodes only."""
    admission = client.AdmissionregistrationV1Api(kube)
    made: list[str] = []

    def bind(nodes: list[str]) -> None:
        policy, binding = by_name(policy_objects(manifest()), "-agent-own-node")
        scoped = scoped_binding(binding, object_names=nodes)
        install_policies(kube, [policy, scoped])
        made.append(scoped["metadata"]["name"])

    yield bind
    for name in made:
        admission.delete_validating_admission_policy_binding(name)


def as_agent(cluster: Cluster, kube: Any, node: str | None, tmp_path: Path) -> Any:
    """An ApiClient as the agent: with a token bound to a pod on `node`, or (None) the static dev token."""
    if node is None:
        return cluster.api_client("gpupack-agent")
    path = tmp_path / f"{node}.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(cluster.api_url, str(cluster.ca_file), AGENT_USER,
                                              agent_node_token(kube, node))))  # fmt: skip
    from kubernetes import config

    return config.new_client_from_config(config_file=str(path))


def test_each_agent_writes_only_its_own_node_and_gpunode(
    cluster: Cluster, kube: Any, gpu_nodes: Any, agent_policy: Any, tmp_path: Path
) -> None:
    mine, other = gpu_nodes(2, gpus_per_node=1)
    create_gpunodes(Kube.connect(str(cluster.kubeconfig)), [mine, other], gpus=1)
    agent_policy([mine, other])
    crd = (names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL)
    touched = {"metadata": {"labels": {"gpupack.test/touched": "yes"}}}

    def node(api: Any, name: str, **kw: Any) -> None:
        client.CoreV1Api(api).patch_node(name, touched, **kw)

    def node_status(api: Any, name: str) -> None:
        client.CoreV1Api(api).patch_node_status(
            name, {"status": {"capacity": {names.RESOURCE_GPU_MILLI: "9k"}}}
        )

    def gpunode(api: Any, name: str) -> None:
        client.CustomObjectsApi(api).patch_cluster_custom_object(*crd, name, touched)

    with as_agent(cluster, kube, mine, tmp_path) as api:

        def in_effect() -> bool:  # the policy reaches the admission chain asynchronously
            try:
                node(api, other, dry_run="All")
            except ApiException as exc:
                return exc.status in (403, 422)
            return False

        wait_for(in_effect, 30, "agent-own-node policy in effect")
        for write in (node, node_status, gpunode):
            write(api, mine)  # its own node: allowed
            message = refused(functools.partial(write, api, other))
            assert "the gpupack agent may write only its own node's Node and GPUNode" in message
            assert f"{other} is not its node ({mine})" in message
    with as_agent(cluster, kube, None, tmp_path) as api:
        message = refused(lambda: node(api, mine))
        assert "its token names no node: use a pod-bound ServiceAccount token" in message
    core = client.CoreV1Api(kube)
    assert (core.read_node(other).metadata.labels or {}).get("gpupack.test/touched") is None
    assert (core.read_node(mine).metadata.labels or {}).get("gpupack.test/touched") == "yes"
    got = client.CustomObjectsApi(kube).get_cluster_custom_object(*crd, other)
    assert "gpupack.test/touched" not in (got["metadata"].get("labels") or {})
    core.delete_namespaced_pod(f"gpupack-agent-{mine}", GPUPACK_NAMESPACE, grace_period_seconds=0)


# ---- end to end: real kube-scheduler + extender; no tenant sequence over-commits a GPU ----


@pytest.fixture
def extender(cluster: Cluster, components_rbac: None) -> Iterator[None]:
    start_extender(cluster, "binpack")
    yield
    if any(p.name == PROC for p in cluster.processes):
        cluster.stop_process(PROC)


def allocation_of(core: Any, namespace: str, name: str) -> Allocation | None:
    ann = core.read_namespaced_pod(name, namespace).metadata.annotations or {}
    return Allocation.from_annotations(ann) if names.ALLOC_NODE in ann else None


def test_no_tenant_sequence_overcommits_a_gpu(  # noqa: PLR0917 (fixtures)
    cluster: Cluster, kube: Any, core: Any, tenant: Any, namespace: str, gpu_nodes: Any, extender: None
) -> None:
    (node,) = gpu_nodes(1, gpus_per_node=2, labels={POOL: namespace})
    create_gpunodes(Kube.connect(str(cluster.kubeconfig)), [node], gpus=2)

    # 1. A pod skipping the webhook (our resource, no annotation, no label, no env) is not placed.
    direct = {"metadata": {"name": "direct"}, "spec": {"nodeSelector": {POOL: namespace}, "containers": [
        {"name": "main", "image": "cuda", "resources": {"limits": {names.RESOURCE_GPU_MILLI: "600"}}}
    ]}}  # fmt: skip
    tenant.create_namespaced_pod(namespace, direct)

    def direct_refused() -> str | None:
        pod = core.read_namespaced_pod("direct", namespace)
        for c in pod.status.conditions or []:
            if (
                c.type == "PodScheduled"
                and c.status == "False"
                and "not admitted by the gpupack webhook" in (c.message or "")
            ):
                return str(c.message)
        return None

    wait_for(direct_refused, 60, "the extender refusing the pod that skipped the webhook")
    assert core.read_namespaced_pod("direct", namespace).spec.node_name is None

    # 2. A webhook-made 0.6 is placed; every tenant edit that would shrink or drop its share is denied.
    tenant.create_namespaced_pod(namespace, gpu_pod("a", namespace, namespace, milli=600))
    wait_for(lambda: outcome(core, namespace, "a") == node, 60, "pod a bound")
    for edit in (
        {"metadata": {"annotations": {names.ALLOC_GPU_MILLI: "100"}}},
        {"metadata": {"annotations": {names.ALLOC_MEMORY_LIMIT_MIB: "1"}}},
        {"metadata": {"annotations": {names.ALLOC_NODE: "elsewhere"}}},
        {"metadata": {"labels": {names.LABEL_MANAGED: None}}},
    ):
        refused(functools.partial(tenant.patch_namespaced_pod, "a", namespace, edit))

    # 3. A second 0.6 goes to the other GPU; a third finds no room (the node still has 800 milli unused).
    tenant.create_namespaced_pod(namespace, gpu_pod("b", namespace, namespace, milli=600))
    wait_for(lambda: outcome(core, namespace, "b") == node, 60, "pod b bound")
    tenant.create_namespaced_pod(namespace, gpu_pod("c", namespace, namespace, milli=600))
    wait_for(lambda: outcome(core, namespace, "c") == "unschedulable", 60, "pod c refused")
    allocs = {name: allocation_of(core, namespace, name) for name in ("a", "b", "c")}
    assert allocs["c"] is None
    per_gpu: dict[int, int] = {}
    for alloc in (allocs["a"], allocs["b"]):
        assert alloc is not None and alloc.milli == 600
        for i in alloc.gpu_indexes:
            per_gpu[i] = per_gpu.get(i, 0) + alloc.milli
    assert per_gpu == {0: 600, 1: 600}
