"""Pod Security and MPS shares on a real kubelet: the levels docs/node-side.md states, proven at admission
and at start.

With gpupack's RuntimeClass an MPS share carries no hostPath (the node adds the pod's own MPS directory), so
it runs at every level, `restricted` included when the rest of the pod complies. A pod that brings the host's
pipe dir as its own hostPath is refused where the level forbids it, with our message saying what to remove.
A share with isolation `none` adds nothing Pod Security checks and runs at `restricted` too.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.core import names
from app.core.errors import KubeError
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode

from . import chart
from .pods import busybox_pod, env_of, new_namespace, run_to_completion

ENFORCE = "pod-security.kubernetes.io/enforce"
RESTRICTED_POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["securityContext"] = dict(RESTRICTED_POD_SECURITY)
    for c in pod["spec"]["containers"]:
        c["securityContext"] = dict(RESTRICTED_CONTAINER_SECURITY)
    return pod


@pytest.mark.parametrize("level", ["privileged", "baseline", "restricted"])
def test_mps_share_runs_at_every_level(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, level: str
) -> None:
    ns = new_namespace(kube, {ENFORCE: level})
    pod = busybox_pod("mps", {names.GPU_FRACTION: "0.5"}, {"main": ("env",)}, real_cluster[1].name)
    if level == "restricted":
        pod = restricted(pod)  # what `restricted` asks of every pod; the share adds nothing it forbids
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["runtimeClassName"] == "gpupack"
    assert not any("hostPath" in v for v in done["spec"].get("volumes", []))  # the node adds the MPS dir
    env = env_of(kube, ns, "mps", "main")
    assert env[names.ENV_MPS_THREAD_PERCENTAGE] == "50"
    assert env[names.ENV_MPS_PIPE_DIRECTORY] == names.MPS_PIPE_DIRECTORY


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_pod_mounting_the_pipe_dir_itself_is_refused_with_our_message(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, level: str
) -> None:
    """A KAI-style pod brings the host's pipe dir as its own hostPath: we say what to remove."""
    ns = new_namespace(kube, {ENFORCE: level})
    pod = busybox_pod("mps", {names.GPU_FRACTION: "0.5"}, {"main": ("env",)}, real_cluster[1].name)
    pod["spec"]["volumes"] = [{"name": "mps", "hostPath": {"path": str(chart.mps_pipe_dir(real_cluster[0]))}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mps", "mountPath": "/mps"}]
    if level == "restricted":
        pod = restricted(pod)
    with pytest.raises(KubeError) as refused:
        kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))
    assert refused.value.code == 422, refused.value
    message = str(refused.value)
    assert "the pod mounts the node's MPS pipe directory itself (a hostPath volume, at /mps)" in message
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
