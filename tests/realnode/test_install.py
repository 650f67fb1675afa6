"""`helm install` on the real node: every component Ready, leader election live, the agent reporting."""

from __future__ import annotations

from app.core import names
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode
from tests.devcluster.identities import GPUPACK_NAMESPACE

from . import chart


def test_components_run_on_the_real_node_from_the_local_image(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    node = real_cluster[1].name
    for component, count in (("webhook", 2), ("extender", 2), ("agent", 1)):
        running = chart.pods(kube, component)
        assert len(running) == count, component
        for pod in running:
            assert pod["spec"]["nodeName"] == node
            (status,) = pod["status"]["containerStatuses"]
            assert status["image"].startswith("localhost/gpupack:"), status["image"]
            assert status["state"].get("running"), status


def test_one_extender_leads_and_it_is_the_ready_one(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    lease = kube.send(
        Request(
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{GPUPACK_NAMESPACE}/leases/{chart.RELEASE}-extender",
        )
    )
    ready = [p["metadata"]["name"] for p in chart.pods(kube, "extender") if chart.ready(p)]
    assert ready == [lease["spec"]["holderIdentity"]]


def test_agent_daemonset_publishes_the_real_node(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    node_name = real_cluster[1].name
    gpunode = kube.send(
        Request(
            "GET", f"/apis/{names.GPUNODE_GROUP}/{names.GPUNODE_VERSION}/{names.GPUNODE_PLURAL}/{node_name}"
        )
    )
    assert len(gpunode["spec"]["gpus"]) == 2
    node = kube.send(Request("GET", f"/api/v1/nodes/{node_name}"))
    assert node["metadata"]["labels"][names.NODE_LABEL_ENABLED] == "true"
    assert node["status"]["allocatable"][names.RESOURCE_GPU_MILLI] in ("2000", "2k")
