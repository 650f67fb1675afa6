"""Isolation per GPU on the real node: each GPU's mode and enforcement in its GPUNode and in `kubectl get
gpunodes`' columns; a pod that requires more memory enforcement than the node gives stays Pending, with a
reason naming both levels in its FailedScheduling event and in `gpupack explain`; an `isolation: none` pod
lands on the GPU left in time-slicing mode.

Chart values (tests/realnode/chart.py): agent.mps.exclusiveProcess on, agent.mps.timeSliceGpus [1], the
STAND-IN MPS daemon serving, no daemon memory cap. So GPU 0 is `exclusive` and GPU 1 `shared`, and both give
`client-env` memory enforcement. The simulated driver keeps the compute modes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from app import names
from app.kube import paths
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import Cluster, kubeletnode, wait_for

from .pods import RUN_TIMEOUT_S, busybox_pod, idle_node, new_namespace, run_to_completion

REQUIRED = "daemon-default"  # above what this node gives (client-env: no daemon memory cap)
REASON = (
    f"pod requires GPU memory enforcement '{REQUIRED}' ({names.MEMORY_ENFORCEMENT}), but this node's GPUs "
    "give at most 'client-env'"
)


@pytest.fixture
def kube(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> Iterator[Kube]:
    k = Kube.connect(str(real_cluster[0].kubeconfig))
    yield k
    k.close()


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
    assert [g["memory"] for g in gpus] == ["client-env", "client-env"]
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
    assert row["Mem-Enforced"] == "client-env" and row["Compute-Enforced"] == "time-slice", row
    assert row["GPU-Modes"] == "exclusive,shared", row
    assert row["Driver"] == gpus[0]["driverVersion"]


def test_a_pod_requiring_more_than_the_node_enforces_stays_pending_naming_both(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube
) -> None:
    cluster, node = real_cluster
    idle_node(kube, node.name)  # every GPU free: only the level can refuse the pod
    ns = new_namespace(kube)
    annotations = {names.GPU_FRACTION: "0.5", names.MEMORY_ENFORCEMENT: REQUIRED}
    pod = busybox_pod("strict", annotations, {"main": ("env",)}, node.name)
    kube.send(Request("POST", f"/api/v1/namespaces/{ns}/pods", pod))

    def failed_scheduling() -> list[str]:
        events = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/events"))["items"]
        return [e["message"] for e in events if e.get("reason") == "FailedScheduling"]

    (message, *_) = wait_for(failed_scheduling, RUN_TIMEOUT_S, "a FailedScheduling event", interval=0.5)
    assert REASON in message, message
    now = kube.send(Request("GET", f"/api/v1/namespaces/{ns}/pods/strict"))
    assert now["status"]["phase"] == "Pending" and not now["spec"].get("nodeName"), now["status"]
    (scheduled,) = [c for c in now["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["status"] == "False" and REASON in scheduled["message"], scheduled

    explained = subprocess.run(
        [sys.executable, "-m", "app.cli", "explain", f"{ns}/strict", "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert explained.returncode == 0, explained.stderr
    out = explained.stdout
    assert f"memory enforcement >= {REQUIRED}" in out and "nowhere: no node fits" in out, out
    assert REASON in out, out
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
