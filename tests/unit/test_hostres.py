"""Host CPU and memory a pod requests and a node offers, as kube-scheduler counts them."""

from __future__ import annotations

from typing import Any

import pytest

from app.core import podview
from app.core.hostres import HostResources, node_allocatable


def c(
    cpu: str | None = None, mem: str | None = None, *, limits: bool = False, **extra: Any
) -> dict[str, Any]:
    res = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    return {"name": "x", "resources": {"limits" if limits else "requests": res}, **extra}


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        pytest.param(
            {"containers": [c("500m", "1Gi"), c("1", "512Mi")]}, HostResources(1500, 1536), id="sum"
        ),
        pytest.param(
            {"containers": [c("2", "4Gi", limits=True)]}, HostResources(2000, 4096), id="limit-only"
        ),
        pytest.param(
            {"containers": [c("1", "1Gi")], "initContainers": [c("4", "100Mi")]},
            HostResources(4000, 1024),
            id="init-peak",
        ),
        pytest.param(
            {
                "containers": [c("1", "1Gi")],
                "initContainers": [c("500m", "256Mi", restartPolicy="Always"), c("1", "2Gi")],
            },
            HostResources(1500, 2304),
            id="sidecar-runs-with-later-init-and-main",
        ),
        pytest.param(
            {"containers": [c("1", "1Gi")], "overhead": {"cpu": "250m", "memory": "64Mi"}},
            HostResources(1250, 1088),
            id="overhead",
        ),
        pytest.param({"containers": [c("0.1", "1500k")]}, HostResources(100, 2), id="round-up"),
        pytest.param({"containers": [{"name": "x"}, "junk", {"resources": []}]}, HostResources(), id="junk"),
        pytest.param(None, HostResources(), id="no-spec"),
    ],
)
def test_pod_requests(spec: Any, want: HostResources) -> None:
    assert podview.read({"spec": spec}).host == want


def test_node_allocatable_rounds_down_and_none_without_status() -> None:
    node = {"status": {"allocatable": {"cpu": "31500m", "memory": "65535Ki", "pods": "110"}}}
    assert node_allocatable(node) == HostResources(31500, 63)
    assert node_allocatable({"status": {}}) is None
    assert node_allocatable({}) is None
