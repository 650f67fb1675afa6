"""GPUNode types and pure request builders: exact bodies, round trips, staleness, the placement view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.kube import gpunode
from app.kube.calls import MERGE_PATCH
from app.kube.gpunode import (
    GPUNode,
    GPUNodeSpec,
    GPUNodeStatus,
    GpuSpec,
    GpuStatus,
    MigDeviceSpec,
    MpsStatus,
    ProcessStatus,
    Summary,
)

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z

SPEC = GPUNodeSpec(
    node_name="gpu-1",
    driver_version="550.54.15",
    gpus=(
        GpuSpec("GPU-a", 0, "A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, mps_capable=True),
        GpuSpec("GPU-b", 1, "A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, mps_capable=True),
        GpuSpec(
            "GPU-c",
            2,
            "A100-40GB",
            "NVIDIA A100-SXM4-40GB",
            40960,
            mig_enabled=True,
            mig_devices=(MigDeviceSpec("MIG-x", 0, 19968, "3g.20gb"),),
        ),
    ),
)
STATUS = GPUNodeStatus(
    heartbeat_time=T0,
    gpus=(
        GpuStatus(
            "GPU-a",
            0,
            memory_used_mib=1024,
            memory_free_mib=39936,
            utilization_percent=12,
            processes=(ProcessStatus(41, "uid-1", 1000), ProcessStatus(42, "", None)),
        ),
        GpuStatus("GPU-b", 1, healthy=False, reason="NVML_ERROR_GPU_IS_LOST: GPU is lost"),
        GpuStatus(
            "GPU-c",
            2,
            memory_used_mib=0,
            memory_free_mib=40960,
            processes=(ProcessStatus(43, "uid-2", 10, "MIG-x"),),
        ),
    ),
    mps=MpsStatus("running", "mps"),
    summary=Summary(3, 2, "A100-40GB", 122880, 4096, 1024),
)


def test_create_body() -> None:
    req = gpunode.create("gpu-1", SPEC, node_uid="node-uid-1")
    assert (req.method, req.path) == ("POST", "/apis/gpupack.io/v1alpha1/gpunodes")
    assert req.body == {
        "apiVersion": "gpupack.io/v1alpha1",
        "kind": "GPUNode",
        "metadata": {
            "name": "gpu-1",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "node-uid-1"}],
        },
        "spec": {
            "nodeName": "gpu-1",
            "driverVersion": "550.54.15",
            "gpus": [
                {
                    "uuid": "GPU-a",
                    "index": 0,
                    "model": "A100-40GB",
                    "productName": "NVIDIA A100-SXM4-40GB",
                    "memoryMiB": 40960,
                    "migEnabled": False,
                    "migDevices": [],
                    "mpsCapable": True,
                    "shared": True,
                },
                {
                    "uuid": "GPU-b",
                    "index": 1,
                    "model": "A100-40GB",
                    "productName": "NVIDIA A100-SXM4-40GB",
                    "memoryMiB": 40960,
                    "migEnabled": False,
                    "migDevices": [],
                    "mpsCapable": True,
                    "shared": True,
                },
                {
                    "uuid": "GPU-c",
                    "index": 2,
                    "model": "A100-40GB",
                    "productName": "NVIDIA A100-SXM4-40GB",
                    "memoryMiB": 40960,
                    "migEnabled": True,
                    "migDevices": [{"uuid": "MIG-x", "index": 0, "memoryMiB": 19968, "profile": "3g.20gb"}],
                    "mpsCapable": False,
                    "shared": False,
                },
            ],
        },
    }


def test_create_without_node_uid_has_no_owner() -> None:
    assert "ownerReferences" not in gpunode.create("gpu-1", SPEC).body["metadata"]


def test_patch_status_body() -> None:
    req = gpunode.patch_status("gpu-1", STATUS)
    assert (req.method, req.path, req.content_type) == (
        "PATCH",
        "/apis/gpupack.io/v1alpha1/gpunodes/gpu-1/status",
        MERGE_PATCH,
    )
    assert req.body == {
        "status": {
            "heartbeatTime": "2023-11-14T22:13:20Z",
            "heartbeatIntervalSeconds": 30,
            "staleAfterSeconds": 90,
            "gpus": [
                {
                    "uuid": "GPU-a",
                    "index": 0,
                    "healthy": True,
                    "memoryUsedMiB": 1024,
                    "memoryFreeMiB": 39936,
                    "utilizationPercent": 12,
                    "processes": [{"pid": 41, "podUID": "uid-1", "usedMiB": 1000}, {"pid": 42, "podUID": ""}],
                },
                {
                    "uuid": "GPU-b",
                    "index": 1,
                    "healthy": False,
                    "reason": "NVML_ERROR_GPU_IS_LOST: GPU is lost",
                    "processes": [],
                },
                {
                    "uuid": "GPU-c",
                    "index": 2,
                    "healthy": True,
                    "memoryUsedMiB": 0,
                    "memoryFreeMiB": 40960,
                    "processes": [{"pid": 43, "podUID": "uid-2", "usedMiB": 10, "migUUID": "MIG-x"}],
                },
            ],
            "mps": {"state": "running", "isolation": "mps", "message": "", "restarts": 0},
            "summary": {
                "gpus": 3,
                "healthyGpus": 2,
                "model": "A100-40GB",
                "memoryTotalMiB": 122880,
                "memoryAllocatedMiB": 4096,
                "memoryUsedMiB": 1024,
            },
            "envDeviceSelection": "unknown",
            "nvmlError": "",
        }
    }


def test_patch_spec_node_labels_and_resources() -> None:
    spec = gpunode.patch_spec("gpu-1", SPEC)
    assert (spec.method, spec.path, spec.content_type) == (
        "PATCH",
        "/apis/gpupack.io/v1alpha1/gpunodes/gpu-1",
        MERGE_PATCH,
    )
    assert spec.body == {"spec": SPEC.to_dict()}
    labels = gpunode.patch_node_labels("gpu-1", gpunode.node_labels(SPEC))
    assert (labels.method, labels.path, labels.content_type) == ("PATCH", "/api/v1/nodes/gpu-1", MERGE_PATCH)
    assert labels.body == {
        "metadata": {
            "labels": {
                "gpupack.io/enabled": "true",
                "gpupack.io/gpu-model": "A100-40GB",
                "gpupack.io/gpu-memory-max-mib": "40960",
            }
        }
    }
    res = gpunode.patch_node_resources(
        "gpu-1", gpunode.extended_resources(SPEC, frozenset({"GPU-a", "GPU-c"}))
    )
    assert (res.method, res.path, res.content_type) == ("PATCH", "/api/v1/nodes/gpu-1/status", MERGE_PATCH)
    # GPU-b is unhealthy; GPU-c is in MIG mode: its one MIG device (19968 MiB) is advertised, not GPU-c.
    want = {"gpupack.io/gpu-milli": "2000", "gpupack.io/gpu-memory-mib": str(40960 + 19968)}
    assert res.body == {"status": {"capacity": want, "allocatable": want}}


@pytest.mark.parametrize(
    ("mig_devices", "enabled", "model", "mib"),
    [
        pytest.param(SPEC.gpus[2].mig_devices, "true", "A100-40GB", 19968, id="mig-devices-offered"),
        pytest.param((), "false", "", 0, id="mig-mode-without-devices-is-not-enabled"),
    ],
)
def test_a_node_of_mig_gpus_offers_their_mig_devices(
    mig_devices: tuple[MigDeviceSpec, ...], enabled: str, model: str, mib: int
) -> None:
    spec = GPUNodeSpec("n", gpus=(replace(SPEC.gpus[2], mig_devices=mig_devices),))
    assert gpunode.node_labels(spec) == {
        "gpupack.io/enabled": enabled,
        "gpupack.io/gpu-model": model,
        "gpupack.io/gpu-memory-max-mib": str(mib),
    }
    assert gpunode.extended_resources(spec, frozenset({"GPU-c"})) == {
        "gpupack.io/gpu-milli": str(1000 * len(mig_devices)),
        "gpupack.io/gpu-memory-mib": str(mib),
    }


def test_mixed_node_labels_the_most_common_model_and_largest_memory() -> None:
    spec = GPUNodeSpec(
        "n",
        gpus=(
            GpuSpec("a", 0, "T4", "Tesla T4", 15109),
            GpuSpec("b", 1, "L4", "NVIDIA L4", 22491),
            GpuSpec("c", 2, "L4", "NVIDIA L4", 22491),
        ),
    )
    labels = gpunode.node_labels(spec)
    assert labels["gpupack.io/gpu-model"] == "L4"
    assert labels["gpupack.io/gpu-memory-max-mib"] == "22491"


def test_label_value_sanitises_product_names() -> None:
    assert gpunode.label_value("NVIDIA GeForce RTX 4090 (rev a1)") == "NVIDIA-GeForce-RTX-4090-rev-a1"
    assert len(gpunode.label_value("x" * 80)) == 63


def test_round_trip() -> None:
    obj = {
        "metadata": {"name": "gpu-1", "resourceVersion": "7"},
        "spec": SPEC.to_dict(),
        "status": STATUS.to_dict(),
    }
    node = GPUNode.from_dict(obj)
    assert node == GPUNode("gpu-1", SPEC, STATUS, "7")


def test_from_dict_tolerates_missing_and_wrong_fields() -> None:
    node = GPUNode.from_dict(
        {"metadata": {"name": "x"}, "spec": {"gpus": [{"uuid": 5, "index": "1"}, "junk"]}}
    )
    assert node.spec.gpus == (GpuSpec("", 0, "", "", 0),)
    assert node.status is None and not node.to_model_node(T0).schedulable


def test_staleness_uses_the_objects_own_threshold() -> None:
    assert GPUNode("gpu-1", SPEC, STATUS).to_model_node(T0 + 90).schedulable
    assert not GPUNode("gpu-1", SPEC, STATUS).to_model_node(T0 + 91).schedulable
    fast = GPUNodeStatus(heartbeat_time=T0, heartbeat_interval_seconds=2, stale_after_seconds=6)
    assert not GPUNode("gpu-1", SPEC, fast).to_model_node(T0 + 7).schedulable


def test_to_model_node_for_the_extender() -> None:
    node = GPUNode("gpu-1", SPEC, STATUS)
    fresh = node.to_model_node(T0 + 10)
    assert fresh.schedulable and fresh.unschedulable_reason == ""
    assert [(g.index, g.uuid, g.live_free_mib, g.healthy) for g in fresh.gpus] == [
        (0, "GPU-a", 39936, True),
        (1, "GPU-b", None, False),
        (300, "MIG-x", None, True),
    ]  # the MIG GPU is not offered; its MIG device is, with its own index and UUID
    stale = node.to_model_node(T0 + 100)
    assert not stale.schedulable
    assert stale.unschedulable_reason == "gpupack agent heartbeat is 100s old (limit 90s)"
    assert not GPUNode("gpu-1", SPEC).to_model_node(T0).schedulable


@pytest.mark.parametrize(
    ("heartbeat", "now", "reason"),
    [
        pytest.param(None, 1000.0, "gpupack agent has not reported a heartbeat", id="never"),
        pytest.param(1000.0, 1090.0, "", id="at-the-limit"),
        pytest.param(1000.0, 1090.4, "gpupack agent heartbeat is 91s old (limit 90s)", id="rounded-up"),
    ],
)
def test_stale_reason(heartbeat: float | None, now: float, reason: str) -> None:
    assert gpunode.stale_reason(heartbeat, 90, now) == reason


def test_foreign_memory_round_trips_and_reaches_placement() -> None:
    from dataclasses import replace

    gpu_a = replace(STATUS.gpus[0], foreign_memory_mib=7987)
    status = replace(STATUS, gpus=(gpu_a, *STATUS.gpus[1:]))
    assert status.to_dict()["gpus"][0]["foreignMemoryMiB"] == 7987
    assert GPUNodeStatus.from_dict(status.to_dict()) == status
    node = GPUNode("gpu-1", SPEC, status).to_model_node(T0)
    assert [(g.foreign_mib, g.utilization_percent) for g in node.gpus] == [(7987, 12), (0, None), (0, None)]
    assert node.gpus[0].memory_free_mib == 40960 - 7987


@pytest.mark.parametrize(
    ("mps", "env", "schedulable", "has_mps"),
    [
        pytest.param(MpsStatus("running", "mps"), "allowed", True, True, id="mps-running"),
        pytest.param(MpsStatus("disabled", "none"), "unknown", True, False, id="mps-disabled"),
        pytest.param(MpsStatus("running", "mps"), "disabled", False, True, id="env-selection-disabled"),
    ],
)
def test_model_node_knows_mps_and_env_device_selection(
    mps: MpsStatus, env: str, schedulable: bool, has_mps: bool
) -> None:
    from dataclasses import replace

    node = GPUNode("gpu-1", SPEC, replace(STATUS, mps=mps, env_device_selection=env)).to_model_node(T0)
    assert (node.schedulable, node.mps) == (schedulable, has_mps)
    if not has_mps:
        assert node.mps_reason == "MPS is disabled on this node"
    if not schedulable:
        assert "NVIDIA_VISIBLE_DEVICES" in node.unschedulable_reason


@pytest.mark.parametrize("live_memory", [True, False], ids=["nvml-read", "nvml-unread"])
def test_idle_gpunode_reads_back_as_idle_gpus(live_memory: bool) -> None:
    spec, status = gpunode.idle("n1", "T4", 2, 1000.0, mps=True, live_memory=live_memory)
    obj = {"metadata": {"name": "n1"}, "spec": spec.to_dict(), "status": status.to_dict()}
    node = gpunode.GPUNode.from_dict(obj).to_model_node(1000.0)
    assert [(g.index, g.uuid, g.model, g.memory_mib, g.milli_used) for g in node.gpus] == [
        (0, "GPU-n1-0", "T4", 15109, 0),
        (1, "GPU-n1-1", "T4", 15109, 0),
    ]
    assert all(g.healthy for g in node.gpus) and node.schedulable
    assert [g.live_free_mib for g in node.gpus] == ([15109, 15109] if live_memory else [None, None])
