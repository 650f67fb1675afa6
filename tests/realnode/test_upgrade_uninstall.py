"""`helm upgrade` rolls the components and keeps placing; `helm uninstall` leaves none of the chart's objects.

Runs last in the tier (file order): it replaces the components the other tests used, then removes them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import names
from app.devcluster import Cluster, kubeletnode, wait_for
from app.devcluster.identities import GPUPACK_NAMESPACE
from app.kube.calls import Request
from app.kube.client import Kube

from . import chart
from .pods import busybox_pod, env_of, new_namespace, run_to_completion

ROLLOUT_TIMEOUT_S = 180


@pytest.fixture
def kube(real_cluster: tuple[Cluster, kubeletnode.RealNode]) -> Iterator[Kube]:
    k = Kube.connect(str(real_cluster[0].kubeconfig))
    yield k
    k.close()


def _names(kube: Kube) -> set[str]:
    return {p["metadata"]["name"] for c in ("webhook", "extender", "agent") for p in chart.pods(kube, c)}


def test_upgrade_rolls_every_component_and_pods_still_get_their_gpu(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str
) -> None:
    cluster, node = real_cluster
    # A pod as gpupack admitted MPS shares before the node side: the whole pipe dir as a hostPath volume,
    # no RuntimeClass. It must keep running, reaching the daemon, through the rollout (docs/node-side.md).
    legacy_ns = new_namespace(kube, {"pod-security.kubernetes.io/enforce": "privileged"})
    probe = "while true; do test -S /tmp/nvidia-mps/control && echo reach-$(date +%s); sleep 1; done"
    legacy = busybox_pod("legacy", {names.GPU_FRACTION: "0.5"}, {"main": ("sh", "-c", probe)}, node.name)
    legacy["spec"]["volumes"] = [
        {
            "name": "gpupack-mps-pipe",
            "hostPath": {"path": str(chart.mps_pipe_dir(cluster)), "type": "DirectoryOrCreate"},
        }
    ]
    legacy["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "gpupack-mps-pipe", "mountPath": "/tmp/nvidia-mps"}
    ]
    kube.send(Request("POST", f"/api/v1/namespaces/{legacy_ns}/pods", legacy))
    legacy_path = f"/api/v1/namespaces/{legacy_ns}/pods/legacy"
    wait_for(
        lambda: kube.send(Request("GET", legacy_path))["status"].get("phase") == "Running", 90, "legacy pod"
    )
    stored = kube.send(Request("GET", legacy_path))
    assert "runtimeClassName" not in stored["spec"]  # its own pipe mount is kept: no node side for it
    before = _names(kube)
    debug = [arg for c in ("webhook", "extender", "agent") for arg in ("--set", f"{c}.logLevel=debug")]
    chart.helm(helm_bin, cluster, "upgrade", chart.RELEASE, str(chart.CHART), "--reuse-values", *debug)
    wait_for(
        lambda: chart.installed(kube) and not (_names(kube) & before),
        ROLLOUT_TIMEOUT_S,
        "every component replaced and Ready",
        interval=1,
    )
    ns = new_namespace(kube)
    done = run_to_completion(
        kube, ns, busybox_pod("after", {names.GPU_FRACTION: "0.5"}, {"main": ("env",)}, node.name)
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    env = env_of(kube, ns, "after", "main")
    assert env[names.ENV_CUDA_VISIBLE_DEVICES] == done["metadata"]["annotations"][names.ALLOC_GPU_UUIDS]
    assert done["spec"]["runtimeClassName"] == "gpupack"
    # The legacy pod ran through the rollout and still reaches the daemon through its hostPath mount.
    status = kube.send(Request("GET", legacy_path))["status"]
    assert status["phase"] == "Running" and status["containerStatuses"][0]["restartCount"] == 0, status
    seen_before = len(kube.text(f"{legacy_path}/log", {"container": "main"}).split())
    wait_for(
        lambda: len(kube.text(f"{legacy_path}/log", {"container": "main"}).split()) > seen_before,
        10,
        "the legacy pod reaching the daemon after the upgrade",
    )


def test_uninstall_removes_every_object_of_the_chart(
    real_cluster: tuple[Cluster, kubeletnode.RealNode], kube: Kube, helm_bin: str
) -> None:
    cluster, node = real_cluster
    handler = node.paths.handler_dir
    assert sorted(p.name for p in handler.iterdir()) == ["gpupack-runc", "gpupack-runc.json"]
    # Drain what runs under the handler first (docs/node-side.md, "Uninstall"): it needs the binary to stop.
    under = [
        p["metadata"]
        for p in kube.send(Request("GET", "/api/v1/pods"))["items"]
        if p["spec"].get("runtimeClassName") == "gpupack"
    ]
    for meta in under:
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        kube.send(Request("DELETE", path, {"gracePeriodSeconds": 0}))
    wait_for(
        lambda: (
            not any(
                p["spec"].get("runtimeClassName") for p in kube.send(Request("GET", "/api/v1/pods"))["items"]
            )
        ),
        120,
        "every pod under the runtime handler gone",
    )
    chart.helm(helm_bin, cluster, "uninstall", chart.RELEASE, "--wait", "--timeout", "120s")
    selector = {"labelSelector": f"app.kubernetes.io/instance={chart.RELEASE}"}
    paths = (
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/pods",
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/services",
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/configmaps",
        f"/api/v1/namespaces/{GPUPACK_NAMESPACE}/serviceaccounts",
        f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/deployments",
        f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/daemonsets",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/node.k8s.io/v1/runtimeclasses",
    )

    def left() -> list[str]:
        return [
            f"{p}/{o['metadata']['name']}"
            for p in paths
            for o in kube.send(Request("GET", p, query=selector))["items"]
        ]

    wait_for(lambda: not left(), 60, "no object of the release left")
    # The node side's installer removed the handler from the node (no container runs under it any more);
    # containerd's declaration of the handler is node preparation, not the chart's (docs/node-side.md).
    wait_for(
        lambda: not handler.exists() or not any(handler.iterdir()), 60, "the handler removed from the node"
    )
    # Helm keeps CRDs (crds/) on uninstall by design: the GPUNode CRD stays, as the local-cluster docs say.
