"""Per-namespace GPU quota on the real control plane: the webhook charges, the apiserver enforces.

Pods are created as a user writes them (annotations only) through the real apiserver, our webhook (over
TLS), kube-scheduler and our extender; kube-controller-manager computes the quotas' status. A namespace
ResourceQuota on `requests.gpupack.io/quota-gpu-milli` (GPU share) or `...quota-gpu-memory-mib` (GPU memory)
caps every request kind: the apiserver refuses the pod that would pass it, at creation, with its own message.
A quota on the placement resources (`gpupack.io/gpu-milli`, `gpupack.io/gpu-memory-mib`) would count one
request kind only; the chart's quota-resources admission policy refuses it, naming the quota resources.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from test_extender import POOL, create_gpunodes, setup, start_extender  # noqa: F401 (setup: fixture)
from test_webhook import Webhook, webhook  # noqa: F401 (webhook: fixture)

from app.core import names
from app.kube.client import Kube
from tests.devcluster import Cluster, wait_for
from tests.devcluster.addons import MANIFEST_RELPATH, install_policies, policy_objects, scoped_binding

MILLI = f"requests.{names.RESOURCE_QUOTA_GPU_MILLI}"
MEMORY = f"requests.{names.RESOURCE_QUOTA_GPU_MEMORY_MIB}"
A100 = "A100-40GB"  # 40960 MiB: half of it is 20480 MiB


@pytest.fixture(scope="module")
def scheduling(cluster: Cluster, setup: Kube, webhook: Webhook) -> Iterator[Kube]:  # noqa: F811
    """Webhook and extender running: pods go from annotations to a bound, Running pod."""
    start_extender(cluster)
    try:
        yield setup
    finally:
        cluster.stop_process("gpupack-extender")


@pytest.fixture
def pool(scheduling: Kube, kube: Any, gpu_nodes: Callable[..., list[str]]) -> Iterator[str]:
    """One kwok node of 4 A100-40GB (a GPUNode as its agent would report it), in a pool of its own."""
    name = uuid.uuid4().hex[:8]
    nodes = gpu_nodes(1, gpus_per_node=4, model=A100, labels={POOL: name})
    create_gpunodes(scheduling, nodes, 4)
    yield name
    for node in nodes:  # the Node goes with gpu_nodes; its GPUNode would outlive it
        client.CustomObjectsApi(kube).delete_cluster_custom_object(
            names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL, node
        )


def user_pod(name: str, pool: str, annotations: dict[str, str], **container: Any) -> dict[str, Any]:
    """A pod as a user writes it: the annotations and nothing of gpupack's (the webhook adds the rest)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {POOL: pool},
            "containers": [{"name": "main", "image": "cuda", **container}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def create_quota(core: Any, namespace: str, hard: dict[str, str]) -> None:
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "gpu"}, "spec": {"hard": hard}})

    # Until the quota controller has computed status.hard, admission refuses every pod the quota counts.
    def computed() -> bool:
        status = core.read_namespaced_resource_quota("gpu", namespace).status
        return {k: parse_quantity(v) for k, v in (status.hard or {}).items()} == {
            k: parse_quantity(v) for k, v in hard.items()
        }

    wait_for(computed, 60, "quota status computed")


def running(core: Any, namespace: str, *pods: str) -> None:
    def all_running() -> bool:
        return all(core.read_namespaced_pod(p, namespace).status.phase == "Running" for p in pods)

    wait_for(all_running, 60, f"{', '.join(pods)} Running")


def refused(call: Callable[[], object]) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, (err.value.status, err.value.body)
    return str(json.loads(err.value.body)["message"])


def used(core: Any, namespace: str, key: str) -> int:
    status = core.read_namespaced_resource_quota("gpu", namespace).status
    return int(parse_quantity((status.used or {}).get(key, "0")))


# quota key, its hard limit (one A100-40GB, as the apiserver prints it), a half-GPU pod, its charge
HALF_GPU = [
    pytest.param(MILLI, "1k", {names.GPU_FRACTION: "0.5"}, "500", id="share-quota-fraction"),
    pytest.param(
        MILLI, "1k", {names.GPU_MEMORY: "20Gi", names.GPU_MODEL: A100}, "500", id="share-quota-memory"
    ),
    pytest.param(
        MEMORY,
        "40960",
        {names.GPU_FRACTION: "0.5", names.GPU_MODEL: A100},
        "20480",
        id="memory-quota-fraction",
    ),
    pytest.param(MEMORY, "40960", {names.GPU_MEMORY: "20480"}, "20480", id="memory-quota-memory"),
]


@pytest.mark.parametrize(("key", "hard", "annotations", "charge"), HALF_GPU)
def test_one_gpu_of_quota_runs_two_halves_and_refuses_the_third(  # noqa: PLR0917 (fixtures + params)
    core: Any, namespace: str, pool: str, key: str, hard: str, annotations: dict[str, str], charge: str
) -> None:
    create_quota(core, namespace, {key: hard})
    for name in ("half-1", "half-2"):
        core.create_namespaced_pod(namespace, user_pod(name, pool, annotations))
    # Both halves land on the node's GPUs: the charge binds the namespace, never the node.
    running(core, namespace, "half-1", "half-2")

    message = refused(lambda: core.create_namespaced_pod(namespace, user_pod("half-3", pool, annotations)))
    assert message == (
        f'pods "half-3" is forbidden: exceeded quota: gpu, requested: {key}={charge}, '
        f"used: {key}={hard}, limited: {key}={hard}"
    )
    wait_for(lambda: used(core, namespace, key) == parse_quantity(hard), 60, "quota status.used = one GPU")


def test_both_request_kinds_draw_on_one_share_quota(
    cluster: Cluster, core: Any, namespace: str, pool: str, run_gpupack: Callable[..., Any]
) -> None:
    create_quota(core, namespace, {MILLI: "1000", MEMORY: "40960"})
    core.create_namespaced_pod(
        namespace, user_pod("frac", pool, {names.GPU_FRACTION: "0.5", names.GPU_MODEL: A100})
    )
    core.create_namespaced_pod(
        namespace, user_pod("mem", pool, {names.GPU_MEMORY: "20Gi", names.GPU_MODEL: A100})
    )
    running(core, namespace, "frac", "mem")
    message = refused(
        lambda: core.create_namespaced_pod(namespace, user_pod("more", pool, {names.GPU_FRACTION: "0.1"}))
    )
    # A fraction with no model is charged its share of the largest GPU the catalogue knows (A100-80GB).
    assert message == (
        'pods "more" is forbidden: exceeded quota: gpu, '
        f"requested: {MEMORY}=8192,{MILLI}=100, used: {MEMORY}=40960,{MILLI}=1k, "
        f"limited: {MEMORY}=40960,{MILLI}=1k"
    )

    # `gpupack top --namespace` shows the namespace against its quota, once the controller has counted.
    wait_for(lambda: used(core, namespace, MILLI) == 1000, 60, "quota status.used = one GPU")
    kubeconfig = str(cluster.kubeconfig)
    out = run_gpupack(
        "top", "--kubeconfig", kubeconfig, "--namespace", namespace, env=dict(os.environ), timeout=60
    )
    assert out.returncode == 0, out.stderr
    # the namespace's own share: its two halves (the fraction and 20Gi of an A100-40GB)
    assert f"\n{namespace}: 1.00 GPUs allocated, on " in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:1] == [namespace]]
    assert rows == [
        [namespace, "gpu", MEMORY, "[####################]", "40960/40960", "MiB", "100%"],
        [namespace, "gpu", MILLI, "[####################]", "1.00/1.00", "GPUs", "100%"],
    ]


def test_whole_and_multi_gpu_pods_are_charged_per_gpu(core: Any, namespace: str, pool: str) -> None:
    create_quota(core, namespace, {MILLI: "2000"})
    core.create_namespaced_pod(namespace, user_pod("whole", pool, {names.GPU_FRACTION: "1"}))
    running(core, namespace, "whole")
    two = {names.GPU_FRACTION: "1", names.GPU_FRACTION_NUM_DEVICES: "2"}
    message = refused(lambda: core.create_namespaced_pod(namespace, user_pod("two", pool, two)))
    assert message == (
        f'pods "two" is forbidden: exceeded quota: gpu, requested: {MILLI}=2k, used: {MILLI}=1k, '
        f"limited: {MILLI}=2k"
    )
    # A 2-GPU pod at half a GPU each is one GPU of quota: it fits beside the whole one.
    halves = {names.GPU_FRACTION: "0.5", names.GPU_FRACTION_NUM_DEVICES: "2"}
    core.create_namespaced_pod(namespace, user_pod("halves", pool, halves))
    running(core, namespace, "halves")
    wait_for(lambda: used(core, namespace, MILLI) == 2000, 60, "quota status.used = two GPUs")


def test_a_tenant_cannot_write_a_smaller_charge_or_skip_the_annotations(
    core: Any, namespace: str, pool: str
) -> None:
    create_quota(core, namespace, {MILLI: "1000"})
    dodge = {names.RESOURCE_QUOTA_GPU_MILLI: "1"}
    written = {"resources": {"requests": dict(dodge), "limits": dict(dodge)}}
    for name in ("cheap-1", "cheap-2"):
        core.create_namespaced_pod(namespace, user_pod(name, pool, {names.GPU_FRACTION: "0.5"}, **written))
    stored = core.read_namespaced_pod("cheap-1", namespace).spec.containers[0].resources
    for part in (stored.requests, stored.limits):
        assert parse_quantity(part[names.RESOURCE_QUOTA_GPU_MILLI]) == 500  # the webhook's value, not theirs
    running(core, namespace, "cheap-1", "cheap-2")
    message = refused(
        lambda: core.create_namespaced_pod(
            namespace, user_pod("cheap-3", pool, {names.GPU_FRACTION: "0.5"}, **written)
        )
    )
    assert f"exceeded quota: gpu, requested: {MILLI}=500, used: {MILLI}=1k" in message

    # Without the annotations the webhook refuses the pod outright (it would be a share nobody tracks).
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, user_pod("bare", pool, {}, **written))
    body = json.loads(err.value.body)["message"]
    assert (
        f"{names.RESOURCE_QUOTA_GPU_MILLI}='1': requested by container 'main' without a GPU-share annotation"
        in body
    )


PLACEMENT_KEYS = [f"requests.{names.RESOURCE_GPU_MILLI}", f"requests.{names.RESOURCE_GPU_MEMORY_MIB}"]


@pytest.fixture
def quota_policy(kube: Any, namespace: str) -> Iterator[Callable[[], None]]:
    """Binds the chart's quota-resources policy to `namespace` when called (from the rendered manifest)."""
    docs = yaml.safe_load_all((Path(__file__).resolve().parents[2] / MANIFEST_RELPATH).read_text())
    objects = [
        o
        for o in policy_objects([d for d in docs if d])
        if o["metadata"]["name"].endswith("-quota-resources")
    ]
    policy, binding = objects
    scoped = scoped_binding(binding, namespace=namespace)
    yield lambda: install_policies(kube, [policy, scoped])
    client.AdmissionregistrationV1Api(kube).delete_validating_admission_policy_binding(
        scoped["metadata"]["name"]
    )


@pytest.mark.parametrize("key", PLACEMENT_KEYS)
def test_a_quota_on_a_placement_resource_is_refused_naming_the_quota_resources(
    core: Any, namespace: str, quota_policy: Callable[[], None], key: str
) -> None:
    def quota(name: str, hard: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"hard": hard}}

    # A quota written before the policy was installed (as by an older gpupack) stays editable.
    core.create_namespaced_resource_quota(namespace, quota("older", {key: "1000"}))
    quota_policy()

    def in_effect() -> bool:  # the apiserver loads policies asynchronously
        try:
            core.create_namespaced_resource_quota(namespace, quota("probe", {key: "1"}), dry_run="All")
        except ApiException as e:
            return e.status == 422
        return False

    wait_for(in_effect, 30, "the quota-resources admission policy in effect")
    with pytest.raises(ApiException) as err:
        core.create_namespaced_resource_quota(namespace, quota("gpu", {key: "1000", "pods": "10"}))
    assert err.value.status == 422, err.value.body
    message = json.loads(err.value.body)["message"]
    assert f"spec.hard: {key} counts only the pods that ask in that one kind" in message
    assert f"limit {MILLI} (GPU share, 1000 = one GPU) and/or {MEMORY} (GPU memory in MiB) instead" in message

    # Adding the key to a quota is refused the same way; editing a quota that had it already is not.
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_resource_quota("older", namespace, {"spec": {"hard": {other(key): "1"}}})
    assert err.value.status == 422 and other(key) in json.loads(err.value.body)["message"]
    core.patch_namespaced_resource_quota("older", namespace, {"spec": {"hard": {key: "2000"}}})
    # The quota resources themselves are admitted.
    core.create_namespaced_resource_quota(namespace, quota("gpu", {MILLI: "1000", MEMORY: "40960"}))


def other(key: str) -> str:
    """The other placement resource's quota key."""
    return next(k for k in PLACEMENT_KEYS if k != key)
