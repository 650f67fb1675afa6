"""Pod Security and MPS shares on a real kubelet: the levels README states, proven at admission and at start.

An MPS share needs its pipe dir as a hostPath volume, so it runs at `privileged` only; in a namespace that
enforces `baseline` or `restricted` our webhook refuses it with its own message. A share with isolation
`none` adds nothing Pod Security checks and runs at `restricted` (the pod complying otherwise).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app import names
from app.errors import KubeError
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode

from .pods import busybox_pod, env_of, new_namespace, run_to_completion

ENFORCE = "pod-security.kubernetes.io/enforce"
RESTRICTED_POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture
def kube(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> Iterator[Kube]:
    k = Kube.connect(str(real_cluster[0].kubeconfig))
    yield k
    k.close()


def restricted(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["securityContext"] = dict(RESTRICTED_POD_SECURITY)
    for c in pod["spec"]["containers"]:
        c["securityContext"] = dict(RESTRICTED_CONTAINER_SECURITY)
    return pod


def test_mps_share_runs_in_a_privileged_namespace(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    ns = new_namespace(kube, {ENFORCE: "privileged"})
    pod = busybox_pod("mps", {names.GPU_FRACTION: "0.5"}, {"main": ("env",)}, real_cluster[1].name)
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert any("hostPath" in v for v in done["spec"]["volumes"])  # the pipe dir
    assert env_of(kube, ns, "mps", "main")[names.ENV_MPS_THREAD_PERCENTAGE] == "50"


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_mps_share_refused_with_our_message_where_hostpath_is_forbidden(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, level: str
) -> None:
    ns = new_namespace(kube, {ENFORCE: level})
    pod = busybox_pod("mps", {names.GPU_FRACTION: "0.5"}, {"main": ("env",)}, real_cluster[1].name)
    if level == "restricted":
        pod = restricted(pod)  # compliant in every other way: the share alone is what is refused
    with pytest.raises(KubeError) as refused:
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
    assert refused.value.code == 422, refused.value
    message = str(refused.value)
    assert f"{names.ISOLATION}='': an MPS share" in message
    assert f"Pod Security level '{level}' enforced in namespace '{ns}' refuses" in message
    assert "violates PodSecurity" not in message  # ours, not Pod Security's own refusal


def test_share_without_mps_runs_at_restricted(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    ns = new_namespace(kube, {ENFORCE: "restricted"})
    annotations = {names.GPU_FRACTION: "0.5", names.ISOLATION: "none"}
    pod = restricted(busybox_pod("plain", annotations, {"main": ("env",)}, real_cluster[1].name))
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    env = env_of(kube, ns, "plain", "main")
    assert env[names.ENV_NVIDIA_VISIBLE_DEVICES] == done["metadata"]["annotations"][names.ALLOC_GPU_UUIDS]
    assert not any(k.startswith("CUDA_MPS_") for k in env)
    assert not any("hostPath" in v for v in done["spec"].get("volumes", []))
