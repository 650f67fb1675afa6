"""The guard on a real kubelet + containerd 1.6: gpupack-runc is the node's default runtime (node
preparation: kubeletnode), and a container whose pod gpupack allocated no GPU runs with
NVIDIA_VISIBLE_DEVICES=void whatever its spec said; an exempt namespace's pod keeps what it asked for;
gpupack's pods keep their allocation, under gpupack's RuntimeClass (MPS) and through the guard
(`isolation: none`, whose allocation reaches the guard through containerd's pod_annotations).

Each container reports the env its first process got from the runtime (/proc/1/environ), not the pod
spec's, and the guard's record mounted in it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core import names
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for

from . import chart
from .pods import busybox_pod, env_of, idle_node, new_namespace, run_to_completion

RECORD = "/run/gpupack/injection.json"
# The first process prints the env the runtime gave it, then the guard's record (empty when none).
REPORT = ("sh", "-c", f'tr "\\0" "\\n" < /proc/1/environ; echo "RECORD=$(cat {RECORD} 2>/dev/null)"')
ASKS = [
    {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "value": "all"},  # what a CUDA base image sets
    {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "80G"},
]


def asking_for_every_gpu(name: str, node: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = busybox_pod(name, annotations or {}, {"main": REPORT}, node)
    pod["spec"]["containers"][0]["env"] = list(ASKS)
    return pod


def test_a_pod_without_gpu_keys_gets_no_gpu_whatever_its_env_says(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    node = real_cluster[1]
    ns = new_namespace(kube)
    done = run_to_completion(kube, ns, asking_for_every_gpu("plain", node.name))
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert "runtimeClassName" not in done["spec"]  # the node's default runtime created it
    env = env_of(kube, ns, "plain", "main")
    assert env[names.ENV_NVIDIA_VISIBLE_DEVICES] == "void"
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in env
    record = json.loads(env["RECORD"])
    assert (record["namespace"], record["pod"], record["container"], record["guard"]) == (
        ns,
        "plain",
        "main",
        "no-gpu",
    )
    assert record["env"] == {names.ENV_NVIDIA_VISIBLE_DEVICES: "void"}
    # The pod as stored is what the user wrote: the node gave the container its env.
    stored = {e["name"]: e["value"] for e in done["spec"]["containers"][0]["env"]}
    assert stored[names.ENV_NVIDIA_VISIBLE_DEVICES] == "all"


def test_a_pod_in_an_exempt_namespace_keeps_what_it_asked_for(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    node = real_cluster[1]
    ns = chart.GUARD_EXEMPT_NAMESPACE
    kube.send(Request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}))
    try:
        done = run_to_completion(kube, ns, asking_for_every_gpu("monitor", node.name))
        assert done["status"]["phase"] == "Succeeded", done["status"]
        env = env_of(kube, ns, "monitor", "main")
        assert env[names.ENV_NVIDIA_VISIBLE_DEVICES] == "all"
        assert env["NVIDIA_GPU_MEMORY_LIMIT"] == "80G"
        assert env["RECORD"] == ""  # untouched: no record mounted
    finally:
        kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))

        def gone() -> bool:
            items = kube.send(Request("GET", "/api/v1/namespaces"))["items"]
            return ns not in {n["metadata"]["name"] for n in items}

        wait_for(gone, 120, f"namespace {ns} gone", interval=1)


@pytest.mark.parametrize(
    ("annotations", "runtime_class"),
    [
        ({names.GPU_FRACTION: "0.5"}, "gpupack"),  # MPS: gpupack's RuntimeClass, the agent answers
        ({names.GPU_FRACTION: "0.5", names.ISOLATION: "none"}, None),  # the guard, by the allocation
    ],
    ids=["mps-runtimeclass", "isolation-none-guard"],
)
def test_a_gpupack_pod_still_gets_its_allocation(
    real_cluster: tuple[Cluster, kubeletnode.RealNode],
    kube: Kube,
    annotations: dict[str, str],
    runtime_class: str | None,
) -> None:
    node = real_cluster[1]
    idle_node(kube, node.name)
    ns = new_namespace(kube)
    pod = busybox_pod("share", annotations, {"main": REPORT, "side": REPORT}, node.name)
    done = run_to_completion(kube, ns, pod)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"].get("runtimeClassName") == runtime_class
    uuids = done["metadata"]["annotations"][names.ALLOC_GPU_UUIDS]
    main = env_of(kube, ns, "share", "main")
    assert main[names.ENV_NVIDIA_VISIBLE_DEVICES] == uuids
    assert main[names.ENV_CUDA_VISIBLE_DEVICES] == uuids
    side = env_of(kube, ns, "share", "side")
    assert side[names.ENV_NVIDIA_VISIBLE_DEVICES] == "void"  # the webhook's, for the pod's other container
    if runtime_class is None:
        assert main["RECORD"] == "" and side["RECORD"] == ""  # the guard left both as the kubelet made them
