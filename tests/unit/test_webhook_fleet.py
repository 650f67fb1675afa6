"""webhook.fleet: the GPUNode view the quota charge reads, and the charge the webhook writes from it."""

from __future__ import annotations

import base64
import json
from typing import Any

from fastapi.testclient import TestClient

from app.core import names
from app.kube.gpunode import GPUNode, GPUNodeSpec, GpuSpec
from webhook.fleet import FleetView
from webhook.main import create_app
from webhook.settings import Settings


def gpunode(name: str, *gpus: tuple[str, int]) -> dict[str, Any]:
    spec = GPUNodeSpec(
        node_name=name,
        gpus=tuple(
            GpuSpec(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=mib)
            for i, (model, mib) in enumerate(gpus)
        ),
    )
    return GPUNode.of(name, spec).wire()


def test_the_fleet_is_each_model_with_its_largest_gpu_across_nodes() -> None:
    view = FleetView()
    view.replace([gpunode("a", ("A100-40GB", 40960), ("T4", 15109)), gpunode("b", ("A100-40GB", 40536))])
    assert dict(view.fleet.models) == {"A100-40GB": 40960, "T4": 15109}
    view.upsert(gpunode("c", ("H100-80GB", 81559)))
    assert dict(view.fleet.models) == {"A100-40GB": 40960, "T4": 15109, "H100-80GB": 81559}
    view.delete(gpunode("a"))
    assert dict(view.fleet.models) == {"A100-40GB": 40536, "H100-80GB": 81559}
    view.replace([])
    assert dict(view.fleet.models) == {}


def test_a_gpunode_that_breaks_its_schema_counts_no_gpu() -> None:
    view = FleetView(fallback_memory_mib=24576)
    broken = gpunode("bad", ("A100-40GB", 40960))
    broken["spec"]["gpus"][0]["memoryMiB"] = "forty"
    view.replace([broken, gpunode("ok", ("T4", 15109))])
    assert dict(view.fleet.models) == {"T4": 15109}
    assert view.fleet.fallback_memory_mib == 24576


def quota_charge(client: TestClient, annotations: dict[str, str]) -> dict[str, str]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "team-a",
            "object": {
                "metadata": {"name": "p", "annotations": annotations},
                "spec": {"containers": [{"name": "main", "image": "x"}]},
            },
        },
    }
    answer = client.post("/mutate", json=review).json()["response"]
    ops = json.loads(base64.b64decode(answer["patch"]))
    resources = next(op["value"] for op in ops if op["path"] == "/spec/containers/0/resources")
    quota_keys = (names.RESOURCE_QUOTA_GPU_MILLI, names.RESOURCE_QUOTA_GPU_MEMORY_MIB)
    return {k: v for k, v in resources["requests"].items() if k in quota_keys}


def test_a_fraction_is_charged_from_the_gpus_the_webhook_sees() -> None:
    view = FleetView()
    client = TestClient(create_app(Settings(), fleet=lambda: view.fleet))
    half = {names.GPU_FRACTION: "0.5"}
    # none known yet: half of the largest catalogue GPU (A100-80GB)
    assert quota_charge(client, half)[names.RESOURCE_QUOTA_GPU_MEMORY_MIB] == "40960"
    view.replace([gpunode("a", ("A100-40GB", 40960)), gpunode("b", ("A100-40GB", 40960))])
    assert quota_charge(client, half) == {
        names.RESOURCE_QUOTA_GPU_MILLI: "500",
        names.RESOURCE_QUOTA_GPU_MEMORY_MIB: "20480",
    }


def test_the_chart_fallback_is_charged_when_no_gpu_is_known() -> None:
    client = TestClient(create_app(Settings(quota_gpu_memory_mib=24576)))
    charged = quota_charge(client, {names.GPU_FRACTION: "0.5"})
    assert charged[names.RESOURCE_QUOTA_GPU_MEMORY_MIB] == "12288"


def test_a_bad_fallback_names_the_flag_and_the_rule() -> None:
    errors = Settings(quota_gpu_memory_mib=0).validate()
    assert [e.as_flag() for e in errors] == [
        "--quota-gpu-memory-mib=0: must be a whole number of MiB from 1 to 16777216"
    ]
