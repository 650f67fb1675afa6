"""The chart's guards around the MPS daemon, rendered by helm against the real apiserver.

- An upgrade that turns MPS off (agent.mps.enabled=false) removes every node's daemon, and with it the GPU
  work of every MPS pod: while MPS pods run, the chart refuses to render, naming them and the drain command
  (mpsGuards.allowRemovingMpsDaemon=true overrides). `helm template --dry-run=server` renders as an
  upgrade does, reading the cluster (the installed daemon DaemonSet, the running pods).
- exclusiveProcess needs a multi-user daemon (only then is a server started before any client).

The release here is `guard` in the test's own namespace; its "installed" daemon DaemonSet and its pods are
created directly (no node runs them: their phase is set through pods/status, as a kubelet would).
"""

from __future__ import annotations

import subprocess
from typing import Any

from kubernetes import client
from test_deploy import CHART, KUBE_VERSION, helm, run_helm

from app.core import names
from tests.devcluster import Cluster

__all__ = ["helm"]  # the session fixture, shared with test_deploy
RELEASE = "guard"
DAEMON = f"{RELEASE}-gpupack-mps-daemon"


def render(helm: str, cluster: Cluster, namespace: str, *sets: str) -> subprocess.CompletedProcess[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION,
            "--dry-run=server", "--kubeconfig", str(cluster.kubeconfig)]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    return run_helm(helm, *args)


def daemon_set(namespace: str) -> dict[str, Any]:
    labels = {"app": DAEMON}
    return {
        "metadata": {"name": DAEMON, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"gpupack.io/no-such-node": "true"},
                    "containers": [{"name": "mps-control", "image": "busybox"}],
                },
            },
        },
    }


def running_pod(core: Any, namespace: str, name: str, annotations: dict[str, str]) -> None:
    """A gpupack pod placed on a node and running (its status written as the kubelet would)."""
    body = {
        "metadata": {
            "name": name,
            "labels": {names.LABEL_MANAGED: "true"},
            "annotations": {names.ALLOC_NODE: "gpu-node", **annotations},
        },
        "spec": {
            "nodeSelector": {"gpupack.io/no-such-node": "true"},
            "containers": [{"name": "main", "image": "cuda"}],
        },
    }
    core.create_namespaced_pod(namespace, body)
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})


def test_turning_mps_off_while_mps_pods_run_is_refused_with_their_names_and_the_drain(
    helm: str, cluster: Cluster, kube: Any, core: Any, namespace: str
) -> None:
    off = "agent.mps.enabled=false"
    # Nothing installed yet (no daemon DaemonSet): nothing to refuse.
    assert render(helm, cluster, namespace, off).returncode == 0
    client.AppsV1Api(kube).create_namespaced_daemon_set(namespace, daemon_set(namespace))
    running_pod(core, namespace, "plain", {names.GPU_FRACTION: "0.5", names.ISOLATION: "none"})
    running_pod(core, namespace, "mig", {names.MIG_PROFILE: "1g.10gb"})
    assert render(helm, cluster, namespace, off).returncode == 0  # no MPS pod among them
    running_pod(core, namespace, "mps-a", {names.GPU_FRACTION: "0.5"})

    refused = render(helm, cluster, namespace, off)
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    print(said)
    assert f"agent.mps.enabled=false removes the MPS daemon (DaemonSet {namespace}/{DAEMON})" in said
    assert f"{namespace}/mps-a" in said
    assert f"{namespace}/plain" not in said and f"{namespace}/mig" not in said
    assert "kubectl drain <node> --pod-selector=gpupack.io/managed=true" in said
    assert "mpsGuards.allowRemovingMpsDaemon=true" in said
    assert "agent.enabled=false removes" in " ".join(
        render(helm, cluster, namespace, "agent.enabled=false").stderr.split()
    )

    assert render(helm, cluster, namespace, off, "mpsGuards.allowRemovingMpsDaemon=true").returncode == 0
    assert render(helm, cluster, namespace).returncode == 0  # MPS stays on: nothing removed


def test_exclusive_process_without_a_multi_user_daemon_is_refused(helm: str) -> None:
    args = [
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "agent.mps.multiUser=false",
    ]
    done = run_helm(helm, *args)
    assert done.returncode != 0
    assert "agent.mps.exclusiveProcess=true needs agent.mps.multiUser=true" in done.stderr
    assert run_helm(helm, *args, "--set", "agent.mps.exclusiveProcess=false").returncode == 0
