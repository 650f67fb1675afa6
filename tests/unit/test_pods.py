"""One reading of a pod for the extender's cache and the agent's verification (app.pods)."""

from __future__ import annotations

from typing import Any

import pytest

from app import names
from app.model import Allocation, Demand
from app.pods import pod_info

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
