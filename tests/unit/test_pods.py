"""One reading of a pod for the extender's cache and the agent's verification (app.core.pods)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core import names, podview
from app.core.hostres import HostResources
from app.core.model import Allocation, Demand
from app.core.objects import shaped
from app.core.pods import SlimPod, is_gpupack, pod_info

ALLOC = Allocation("n1", (0,), ("GPU-a",), 500, 7554)


def _pod(node: str = "", phase: str = "Running", **ann: str) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": "u1",
            "namespace": "ns",
            "name": "p",
            "annotations": {names.GPU_FRACTION: "0.5", **ALLOC.to_annotations(), **ann},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main"}, {"name": "log"}],
            "initContainers": [{"name": "sidecar"}],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "main", "containerID": "containerd://abc"}],
            "initContainerStatuses": [{"name": "sidecar", "containerID": "containerd://def"}],
        },
    }


@pytest.mark.parametrize(
    ("node", "phase", "counts"),
    [("n1", "Running", True), ("", "Pending", True), ("n2", "Running", False), ("n1", "Succeeded", False)],
    ids=["bound-here", "bind-in-flight", "annotation-names-another-node", "finished"],
)
def test_recorded_allocation_counts_only_while_the_pod_may_hold_its_gpu(
    node: str, phase: str, counts: bool
) -> None:
    info = pod_info(_pod(node, phase))
    assert info.allocation == ALLOC
    assert info.alloc == (ALLOC if counts else None)


def test_containers_demand_and_gpu_container() -> None:
    info = pod_info(_pod("n1", **{names.GPU_FRACTION_CONTAINER_NAME: "sidecar"}))
    assert info.containers == {"abc": "main", "def": "sidecar"}
    assert info.gpu_container == "sidecar"
    assert pod_info(_pod("n1")).gpu_container == "main"
    assert info.demand == Demand(count=1, milli=500)
    assert info.key == "ns/p" and not info.pending


def test_corrupt_allocation_is_reported_not_raised() -> None:
    info = pod_info(_pod("n1", **{names.ALLOC_GPU_MILLI: "lots"}))
    assert info.allocation is None and info.alloc is None
    assert names.ALLOC_GPU_MILLI in info.allocation_error and "'lots'" in info.allocation_error


def _full_pod(gpu: bool, **spec_extra: Any) -> dict[str, Any]:
    """A pod as the apiserver lists it, with the fields gpupack never reads."""
    pod = _pod("n1")
    pod["metadata"].update(
        managedFields=[{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        labels={names.LABEL_MANAGED: "true"} if gpu else {"app": "web"},
        deletionTimestamp="2026-01-01T00:00:00Z",
        ownerReferences=[{"kind": "ReplicaSet", "name": "rs"}],
    )
    if not gpu:
        pod["metadata"]["annotations"] = {"note": "plain"}
    res = {
        "requests": {"cpu": "1500m", "memory": "2Gi"},
        "limits": {names.RESOURCE_GPU_MILLI: "500"} if gpu else {},
    }
    pod["spec"]["containers"][0].update(resources=res, image="x", env=[{"name": "A", "value": "1"}])
    pod["spec"]["initContainers"][0].update(
        restartPolicy="Always", resources={"requests": {"cpu": "250m"}}, command=["sh"]
    )
    pod["spec"].update(overhead={"cpu": "100m"}, volumes=[{"name": "v"}], **spec_extra)
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    pod["status"]["containerStatuses"][0]["image"] = "x"
    return pod


@pytest.mark.parametrize("gpu", [True, False], ids=["gpupack-pod", "other-pod"])
def test_a_slim_pod_reads_exactly_like_the_listed_one(gpu: bool) -> None:
    full = _full_pod(gpu)
    slim = shaped(full, SlimPod)
    assert pod_info(slim) == pod_info(full)
    assert is_gpupack(podview.read(slim)) == is_gpupack(podview.read(full)) == gpu
    assert podview.read(slim).host == podview.read(full).host == HostResources(1850, 2048)
    assert "managedFields" not in slim["metadata"] and "env" not in slim["spec"]["containers"][0]
    assert len(json.dumps(slim)) < len(json.dumps(full))


def test_slim_pod_tolerates_what_the_readers_tolerate() -> None:
    odd: dict[str, Any] = {
        "metadata": "x",
        "spec": {"containers": ["not-a-dict"], "nodeName": 3},
        "status": None,
    }
    assert pod_info(shaped(odd, SlimPod)) == pod_info(odd)
