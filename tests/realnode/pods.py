"""Pods on the real node: run one to completion, read its containers' output through the apiserver."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from app.core import names
from app.kube.calls import Request
from app.kube.client import Kube
from tests.devcluster import kubeletnode, wait_for

RUN_TIMEOUT_S = 90


def busybox_pod(
    name: str, annotations: Mapping[str, str], commands: Mapping[str, Sequence[str]], node: str
) -> dict[str, Any]:
    """A pod of the node's busybox image, one container per `commands` entry, pinned to the real node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations)},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": kubeletnode.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": c,
                    "image": kubeletnode.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": list(cmd),
                }
                for c, cmd in commands.items()
            ],
        },
    }


def new_namespace(kube: Kube, labels: Mapping[str, str] | None = None) -> str:
    name = f"rn-{uuid.uuid4().hex[:8]}"
    kube.send(
        Request("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": dict(labels or {})}})
    )
    return name


def run_to_completion(kube: Kube, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    """Create `pod` and wait until every container has exited; returns the pod as last read."""
    created = kube.send(Request("POST", f"/api/v1/namespaces/{namespace}/pods", pod))
    return wait_done(kube, namespace, created["metadata"]["name"])


def wait_done(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """Wait until every container of the pod has exited; returns the pod as last read."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    last: dict[str, Any] = {}

    def done() -> bool:
        last.clear()
        last.update(kube.send(Request("GET", path)))
        return last.get("status", {}).get("phase") in ("Succeeded", "Failed")

    wait_for(done, RUN_TIMEOUT_S, f"pod {path} done", interval=0.5)
    return last


def env_of(kube: Kube, namespace: str, pod: str, container: str) -> dict[str, str]:
    """The container's log (through the apiserver, from the kubelet) read as `env` output: NAME=value."""
    text = kube.text(f"/api/v1/namespaces/{namespace}/pods/{pod}/log", {"container": container})
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def idle_node(kube: Kube, node: str) -> None:
    """Remove the earlier tests' namespaces; wait until no gpupack pod is left on `node`: every GPU free."""
    for item in kube.send(Request("GET", "/api/v1/namespaces"))["items"]:
        name = item["metadata"]["name"]
        if name.startswith("rn-") and not item["metadata"].get("deletionTimestamp"):
            kube.send(Request("DELETE", f"/api/v1/namespaces/{name}"))
    selector = {"labelSelector": f"{names.LABEL_MANAGED}=true", "fieldSelector": f"spec.nodeName={node}"}

    def idle() -> bool:
        return not kube.send(Request("GET", "/api/v1/pods", query=selector))["items"]

    wait_for(idle, 90, "no gpupack pod left on the node", interval=1)
