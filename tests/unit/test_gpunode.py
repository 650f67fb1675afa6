"""GPUNode types and pure request builders: exact bodies, round trips, staleness, the placement view."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.core.errors import FieldError
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
    ObjectMeta,
    ProcessStatus,
    Summary,
)
from app.kube.stores import gpunode_to_node

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z

A100 = {"model": "A100-40GB", "product_name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}
SPEC = GPUNodeSpec(
    node_name="gpu-1",
    driver_version="550.54.15",
    gpus=(
        GpuSpec(uuid="GPU-a", index=0, **A100, mps_capable=True),
        GpuSpec(uuid="GPU-b", index=1, **A100, mps_capable=True),
        GpuSpec(
            uuid="GPU-c",
            index=2,
            **A100,
            mig_enabled=True,
            mig_devices=(MigDeviceSpec(uuid="MIG-x", index=0, memory_mib=19968, profile="3g.20gb"),),
        ),
    ),
)
STATUS = GPUNodeStatus(
    heartbeat_time=T0,
    gpus=(
        GpuStatus(
            uuid="GPU-a",
            index=0,
            healthy=True,
            memory_used_mib=1024,
            memory_free_mib=39936,
            utilization_percent=12,
            processes=(
                ProcessStatus(pid=41, pod_uid="uid-1", used_mib=1000),
                ProcessStatus(pid=42, pod_uid="", used_mib=None),
            ),
        ),
        GpuStatus(uuid="GPU-b", index=1, healthy=False, reason="NVML_ERROR_GPU_IS_LOST: GPU is lost"),
        GpuStatus(
            uuid="GPU-c",
            index=2,
            healthy=True,
            memory_used_mib=0,
            memory_free_mib=40960,
            processes=(ProcessStatus(pid=43, pod_uid="uid-2", used_mib=10, mig_uuid="MIG-x"),),
        ),
    ),
    mps=MpsStatus(state="running", isolation="mps"),
    summary=Summary(
        gpus=3,
        healthy_gpus=2,
        model="A100-40GB",
        memory_total_mib=122880,
        memory_allocated_mib=4096,
        memory_used_mib=1024,
    ),
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
    assert spec.body == {"spec": SPEC.wire()}
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
    spec = GPUNodeSpec(node_name="n", gpus=(SPEC.gpus[2].model_copy(update={"mig_devices": mig_devices}),))
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
        node_name="n",
        gpus=(
            GpuSpec(uuid="a", index=0, model="T4", product_name="Tesla T4", memory_mib=15109),
            GpuSpec(uuid="b", index=1, model="L4", product_name="NVIDIA L4", memory_mib=22491),
            GpuSpec(uuid="c", index=2, model="L4", product_name="NVIDIA L4", memory_mib=22491),
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
        "spec": SPEC.wire(),
        "status": STATUS.wire(),
    }
    node = gpunode.read(obj)
    assert node == GPUNode(metadata=ObjectMeta(name="gpu-1", resource_version="7"), spec=SPEC, status=STATUS)
    assert (node.name, node.resource_version) == ("gpu-1", "7")


def test_fields_the_crd_does_not_require_read_as_their_defaults() -> None:
    node = gpunode.read(
        {
            "metadata": {"name": "x"},
            "spec": {
                "nodeName": "x",
                "gpus": [{"uuid": "GPU-1", "index": 0, "model": "T4", "memoryMiB": 15109}],
            },
            "status": {},  # before the agent's first status write
        }
    )
    assert node.spec.gpus == (GpuSpec(uuid="GPU-1", index=0, model="T4", memory_mib=15109),)
    assert (
        node.status is None
        and node.heartbeat.stale_reason(T0) == "gpupack agent has not reported a heartbeat"
    )


@pytest.mark.parametrize(
    ("obj", "field", "value", "rule"),
    [
        pytest.param(
            {"spec": {"nodeName": "x", "gpus": [{"uuid": 5, "index": 0, "model": "T4", "memoryMiB": 1}]}},
            "spec.gpus.0.uuid",
            5,
            "Input should be a valid string",
            id="number-for-string",
        ),
        pytest.param(
            {"spec": {"nodeName": "x", "gpus": [{"uuid": "u", "index": "1", "model": "T4", "memoryMiB": 1}]}},
            "spec.gpus.0.index",
            "1",
            "Input should be a valid integer",
            id="string-for-integer",
        ),
        pytest.param(
            {"spec": {"nodeName": "x", "gpus": ["junk"]}},
            "spec.gpus.0",
            "junk",
            "Input should be a valid dictionary or instance of GpuSpec",
            id="string-for-gpu",
        ),
        pytest.param({"spec": {"nodeName": "x"}}, "spec.gpus", None, "is required", id="missing-required"),
        pytest.param(
            {"spec": {"nodeName": "x", "gpus": []}, "status": {"heartbeatTime": "yesterday"}},
            "status.heartbeatTime",
            "yesterday",
            "Value error, must be an RFC 3339 time such as 2023-11-14T22:13:20Z",
            id="bad-time",
        ),
    ],
)
def test_an_object_that_breaks_the_crd_types_is_an_error_naming_field_value_and_rule(
    obj: dict[str, Any], field: str, value: object, rule: str
) -> None:
    with pytest.raises(gpunode.GPUNodeError) as info:
        gpunode.read({"metadata": {"name": "gpu-9"}, **obj})
    assert info.value.error == FieldError(field, value, rule)
    assert str(info.value) == f"GPUNode gpu-9 does not fit its schema: {field}={value!r}: {rule}"


def test_the_cache_offers_nothing_on_a_malformed_gpunode_and_says_why() -> None:
    obj = {"metadata": {"name": "gpu-9"}, "spec": {"nodeName": "gpu-9", "gpus": "all"}}
    node, heartbeat = gpunode_to_node(obj, None)
    assert (node.name, node.gpus, node.schedulable) == ("gpu-9", (), False)
    assert node.unschedulable_reason.startswith("GPUNode gpu-9 does not fit its schema: spec.gpus='all'")
    assert heartbeat.at is None


def test_staleness_uses_the_objects_own_threshold_unless_the_reader_sets_one() -> None:
    assert gpunode.Heartbeat.of(STATUS).stale_reason(T0 + 90) == ""
    assert gpunode.Heartbeat.of(STATUS).stale_reason(T0 + 91) != ""
    fast = GPUNodeStatus(heartbeat_time=T0, heartbeat_interval_seconds=2, stale_after_seconds=6)
    assert gpunode.Heartbeat.of(fast).stale_reason(T0 + 7) == "gpupack agent heartbeat is 7s old (limit 6s)"
    # The extender's --heartbeat-timeout wins over the agent's own limit.
    assert gpunode.Heartbeat.of(fast, timeout_s=30).stale_reason(T0 + 7) == ""
    assert gpunode.Heartbeat.of(fast, timeout_s=30).fresh_until == T0 + 30
    assert gpunode.Heartbeat.of(None).fresh_until == -math.inf


def test_to_model_node_for_the_extender() -> None:
    node = GPUNode.of("gpu-1", SPEC, STATUS)
    view = node.to_model_node()
    assert view.schedulable and view.unschedulable_reason == ""
    assert [(g.index, g.uuid, g.live_free_mib, g.healthy) for g in view.gpus] == [
        (0, "GPU-a", 39936, True),
        (1, "GPU-b", None, False),
        (300, "MIG-x", None, True),
    ]  # the MIG GPU is not offered; its MIG device is, with its own index and UUID
    assert node.heartbeat.stale_reason(T0 + 100) == "gpupack agent heartbeat is 100s old (limit 90s)"


@pytest.mark.parametrize(
    ("heartbeat", "now", "reason"),
    [
        pytest.param(None, 1000.0, "gpupack agent has not reported a heartbeat", id="never"),
        pytest.param(1000.0, 1090.0, "", id="at-the-limit"),
        pytest.param(1000.0, 1090.4, "gpupack agent heartbeat is 91s old (limit 90s)", id="rounded-up"),
    ],
)
def test_stale_reason(heartbeat: float | None, now: float, reason: str) -> None:
    assert gpunode.Heartbeat(heartbeat, 90).stale_reason(now) == reason


def test_foreign_memory_round_trips_and_reaches_placement() -> None:
    gpu_a = STATUS.gpus[0].model_copy(update={"foreign_memory_mib": 7987})
    status = STATUS.model_copy(update={"gpus": (gpu_a, *STATUS.gpus[1:])})
    assert status.wire()["gpus"][0]["foreignMemoryMiB"] == 7987
    assert GPUNodeStatus.model_validate(status.wire()) == status
    node = GPUNode.of("gpu-1", SPEC, status).to_model_node()
    assert [(g.foreign_mib, g.utilization_percent) for g in node.gpus] == [(7987, 12), (0, None), (0, None)]
    assert node.gpus[0].memory_free_mib == 40960 - 7987


@pytest.mark.parametrize(
    ("mps", "env", "schedulable", "has_mps"),
    [
        pytest.param(MpsStatus(state="running", isolation="mps"), "allowed", True, True, id="mps-running"),
        pytest.param(
            MpsStatus(state="disabled", isolation="none"), "unknown", True, False, id="mps-disabled"
        ),
        pytest.param(
            MpsStatus(state="running", isolation="mps"), "disabled", False, True, id="env-selection-disabled"
        ),
    ],
)
def test_model_node_knows_mps_and_env_device_selection(
    mps: MpsStatus, env: str, schedulable: bool, has_mps: bool
) -> None:
    status = STATUS.model_copy(update={"mps": mps, "env_device_selection": env})
    node = GPUNode.of("gpu-1", SPEC, status).to_model_node()
    assert (node.schedulable, node.mps) == (schedulable, has_mps)
    if not has_mps:
        assert node.mps_reason == "MPS is disabled on this node"
    if not schedulable:
        assert "NVIDIA_VISIBLE_DEVICES" in node.unschedulable_reason


@pytest.mark.parametrize("live_memory", [True, False], ids=["nvml-read", "nvml-unread"])
def test_idle_gpunode_reads_back_as_idle_gpus(live_memory: bool) -> None:
    spec, status = gpunode.idle("n1", "T4", 2, 1000.0, mps=True, live_memory=live_memory)
    node = gpunode.read(GPUNode.of("n1", spec, status).wire()).to_model_node()
    assert [(g.index, g.uuid, g.model, g.memory_mib, g.milli_used) for g in node.gpus] == [
        (0, "GPU-n1-0", "T4", 15109, 0),
        (1, "GPU-n1-1", "T4", 15109, 0),
    ]
    assert all(g.healthy for g in node.gpus) and node.schedulable
    assert [g.live_free_mib for g in node.gpus] == ([15109, 15109] if live_memory else [None, None])
