"""A GPU share on an init container or a sidecar: node-level numbers (what kube-scheduler's NodeResourcesFit
counts of our extended resource) and the extender's demand (app.core.request.pod_demand) agree with the
request."""

from __future__ import annotations

from typing import Any

import pytest
from test_webhook_mutate import apply_patch, decoded, review_of

from app.core import managed, names, podview, request, units
from app.core.model import Demand
from webhook import mutate
from webhook.settings import Settings


def effective_request(spec: dict[str, Any], resource: str) -> int:
    """kube-scheduler's effective pod request of one resource: max(regular + sidecars, each plain init
    container + the sidecars started before it)."""

    def amount(c: dict[str, Any]) -> int:
        res = c.get("resources") or {}
        raw = (res.get("requests") or {}).get(resource) or (res.get("limits") or {}).get(resource) or "0"
        value = units.quantity_value(str(raw))
        assert value is not None
        return int(value)

    sidecars = peak = 0
    for c in spec.get("initContainers") or ():
        if c.get("restartPolicy") == "Always":
            sidecars += amount(c)
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + amount(c))
    return max(sum(amount(c) for c in spec["containers"]) + sidecars, peak)


@pytest.mark.parametrize("sidecar", [False, True], ids=["init-container", "sidecar"])
@pytest.mark.parametrize(
    ("annotations", "resource", "amount"),
    [
        ({names.GPU_FRACTION: "0.3", names.GPU_FRACTION_NUM_DEVICES: "2"}, names.RESOURCE_GPU_MILLI, 600),
        ({names.GPU_MEMORY: "4096"}, names.RESOURCE_GPU_MEMORY_MIB, 4096),
    ],
)
def test_init_container_share_counts_once_at_node_level_and_in_the_extender(
    sidecar: bool, annotations: dict[str, str], resource: str, amount: int
) -> None:
    gpu: dict[str, Any] = {"name": "gpu-init", "image": "cuda"}
    if sidecar:
        gpu["restartPolicy"] = "Always"
    obj = {
        "metadata": {
            "name": "p",
            "annotations": {**annotations, names.GPU_FRACTION_CONTAINER_NAME: "gpu-init"},
        },
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}, gpu],
            "containers": [{"name": "main-app", "image": "app"}, {"name": "log", "image": "app"}],
        },
    }
    out = apply_patch(obj, decoded(mutate.review(review_of(obj), Settings())))
    assert effective_request(out["spec"], resource) == amount
    demand = request.pod_demand(podview.read(out))
    assert isinstance(demand, Demand), demand
    per_device = demand.milli if resource == names.RESOURCE_GPU_MILLI else demand.memory_mib
    assert (per_device or 0) * demand.count == amount
    assert managed.unmanaged_errors(podview.read(out)) == ()
