"""Isolation per GPU on the real node: each GPU's mode and enforcement in its GPUNode and in `kubectl get
gpunodes`' columns; a pod that requires the node's level is placed; an `isolation: none` pod lands on the GPU
left in time-slicing mode. (A node below a pod's required level: tests/integration/test_agent_extender.py.)

Chart values (tests/realnode/chart.py): agent.mps.exclusiveProcess on, agent.mps.timeSliceGpus [1], the
STAND-IN MPS daemon serving, the node side on, a simulated r615 driver. So GPU 0 is `exclusive` and GPU 1
`shared`, and both give `per-cgroup` memory enforcement (the node side sets each container's limits). The
simulated driver keeps the compute modes.
"""

from __future__ import annotations

import json
from typing import Any

from app.core import names
from app.kube import paths
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for

from .pods import busybox_pod, idle_node, new_namespace, run_to_completion


def isolation_of(kube: Kube, node: str) -> list[dict[str, Any]]:
    status = kube.send(Request("GET", paths.gpunode(node))).get("status") or {}
    return [g.get("isolation") or {} for g in status.get("gpus") or []]


def test_each_gpu_reports_its_mode_and_enforcement(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    cluster, node = real_cluster

    def modes() -> list[str]:
        return [g.get("mpsMode", "") for g in isolation_of(kube, node.name)]

    wait_for(lambda: modes() == ["exclusive", "shared"], 90, "GPU 0 exclusive, GPU 1 shared")
    gpus = isolation_of(kube, node.name)
    assert [g["computeMode"] for g in gpus] == ["ExclusiveProcess", "Default"]
    assert [g["memory"] for g in gpus] == ["per-cgroup", "per-cgroup"]
    assert [g["compute"] for g in gpus] == ["mps-percentage", "time-slice"]
    assert all(g["driverVersion"] for g in gpus)
    # `kubectl get gpunodes`: the apiserver's table from the CRD's printer columns.
    with cluster.api_client() as api:
        resp = api.call_api(
            paths.gpunode(node.name),
            "GET",
            header_params={"Accept": "application/json;as=Table;g=meta.k8s.io;v=v1"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        table = json.loads(resp.data)
    columns = [c["name"] for c in table["columnDefinitions"]]
    row = dict(zip(columns, table["rows"][0]["cells"], strict=True))
    assert row["Mem-Enforced"] == "per-cgroup" and row["Compute-Enforced"] == "time-slice", row
    assert row["GPU-Modes"] == "exclusive,shared", row
    assert row["Driver"] == gpus[0]["driverVersion"]


def test_a_pod_requiring_per_cgroup_memory_runs_with_its_limits(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    _, node = real_cluster
    idle_node(kube, node.name)
    ns = new_namespace(kube)
    annotations = {names.GPU_FRACTION: "0.5", names.MEMORY_ENFORCEMENT: "per-cgroup"}
    done = run_to_completion(kube, ns, busybox_pod("strict", annotations, {"main": ("env",)}, node.name))
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] == node.name
    kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))


def test_an_isolation_none_pod_lands_on_the_gpu_left_for_time_slicing(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    _, node = real_cluster
    idle_node(kube, node.name)
    ns = new_namespace(kube)
    annotations = {names.GPU_FRACTION: "0.5", names.ISOLATION: "none"}
    done = run_to_completion(kube, ns, busybox_pod("plain", annotations, {"main": ("env",)}, node.name))
    assert done["metadata"]["annotations"][names.ALLOC_GPU_INDEXES] == "1"  # GPU 0 is MPS-only
    assert done["status"]["phase"] == "Succeeded", done["status"].get("containerStatuses")
    kube.send(Request("DELETE", f"/api/v1/namespaces/{ns}"))
