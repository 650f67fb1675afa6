"""Pods as the gpupack webhook leaves them, for tests that skip the webhook to stay fast.

Annotations, the managed label, the extended resource with request = limit, and the GPU container's
NVIDIA_VISIBLE_DEVICES fieldRef: without that env the extender refuses the pod as one the webhook never saw.
"""

from __future__ import annotations

from typing import Any

from app.core import names

GPU_UUIDS_REF = {"fieldRef": {"fieldPath": f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"}}


def webhook_pod(
    name: str,
    *,
    pool: tuple[str, str],
    milli: int = 0,
    mem: int = 0,
    count: int = 1,
    namespace: str = "",
    scheduler: str = "",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`milli` (gpu-fraction) or `mem` MiB (gpu-memory) on each of `count` GPUs, on nodes labelled `pool`."""
    ann = {names.GPU_FRACTION_NUM_DEVICES: str(count)}
    if milli:
        ann[names.GPU_FRACTION] = f"{milli / 1000:.2f}"
        res = {names.RESOURCE_GPU_MILLI: str(milli * count)}
    else:
        ann[names.GPU_MEMORY] = str(mem)
        res = {names.RESOURCE_GPU_MEMORY_MIB: str(mem * count)}
    ann.update(annotations or {})
    meta: dict[str, Any] = {"name": name, "annotations": ann, "labels": {names.LABEL_MANAGED: "true"}}
    if namespace:
        meta["namespace"] = namespace
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {"requests": res, "limits": res},
        "env": [{"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "valueFrom": GPU_UUIDS_REF}],
    }
    spec: dict[str, Any] = {"nodeSelector": {pool[0]: pool[1]}, "containers": [container]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def deployment(name: str, labels: dict[str, str], template: dict[str, Any], replicas: int) -> dict[str, Any]:
    """A Deployment of `replicas` pods from `template` (metadata + spec), selected by `labels`."""
    meta = dict(template.get("metadata", {}))
    meta["labels"] = {**meta.get("labels", {}), **labels}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": meta, "spec": template["spec"]},
        },
    }
