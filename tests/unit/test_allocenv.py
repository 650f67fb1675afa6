"""One allocation → env table (app.core.allocenv) read three ways: the webhook's fieldRefs, the node side's
values at create, and the agent's check of a running process all name the same variables and values."""

from __future__ import annotations

from typing import Any

import pytest

from agent.enforce import envcheck
from agent.runtime import nodeside
from app.core import names, podview, request
from app.core.model import Allocation
from app.core.pods import info_of
from app.core.request import GpuRequest
from webhook import mutate

NODE = "gpu-1"
UID = "0b7e6a3c-1111-2222-3333-444455556666"


def a_pod(asks: dict[str, str], hard_mib: int | None) -> dict[str, Any]:
    allocation = Allocation(NODE, (1,), ("GPU-b",), milli=500, memory_mib=8192, hard_limit_mib=hard_mib)
    return {
        "metadata": {"uid": UID, "namespace": "team-a", "name": "p", "labels": {names.LABEL_MANAGED: "true"},
                     "annotations": {**asks, **allocation.to_annotations()}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
    }  # fmt: skip


def resolved(field_ref_env: list[dict[str, Any]], annotations: dict[str, str]) -> dict[str, str]:
    """The webhook's env as the kubelet resolves it: each fieldRef to its annotation ("" when absent)."""
    out = {}
    for e in field_ref_env:
        if "value" in e:
            out[e["name"]] = e["value"]
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            out[e["name"]] = annotations.get(path.split("['", 1)[1].rstrip("']"), "")
    return out


@pytest.mark.parametrize(
    ("asks", "hard_mib"),
    [
        ({names.GPU_MEMORY: "8Gi", names.ISOLATION: "mps"}, None),
        ({names.GPU_MEMORY: "8Gi", names.ISOLATION: "none"}, None),
        ({names.GPU_MEMORY: "8Gi", names.GPU_MEMORY_LIMIT: "16Gi", names.ISOLATION: "mps"}, 16384),
        ({names.GPU_MEMORY: "8Gi", names.GPU_MEMORY_LIMIT: "16Gi", names.ISOLATION: "none"}, 16384),
    ],
)
def test_the_webhook_the_node_side_and_the_check_agree_on_every_variable(
    asks: dict[str, str], hard_mib: int | None
) -> None:
    pod = a_pod(asks, hard_mib)
    view = podview.read(pod)
    req = request.parse(view)
    assert isinstance(req, GpuRequest)
    from_webhook = resolved(mutate.gpu_env(req), pod["metadata"]["annotations"])
    grant = nodeside.decide(nodeside.Ask(UID, "team-a", "p", "main", "c0"), view, NODE)
    assert isinstance(grant, nodeside.Grant)
    assert dict(grant.env) == from_webhook
    assert (names.ENV_MEMORY_HARD_LIMIT_MIB in from_webhook) == (hard_mib is not None)
    assert (names.ENV_MPS_THREAD_PERCENTAGE in from_webhook) == (req.isolation.value == "mps")
    info = info_of(view)
    assert envcheck.mismatches(info, "main", grant.env) == ()
    for var in grant.env:
        if var == names.ENV_MPS_PIPE_DIRECTORY:
            continue  # a path, not read from the allocation: the mount decides what it reaches
        changed = {**grant.env, var: "tampered"}
        assert [m.split("=", 1)[0] for m in envcheck.mismatches(info, "main", changed)] == [var]
