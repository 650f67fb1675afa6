"""Dev cluster: the fake GPU Node body."""

from __future__ import annotations

from typing import Any

import pytest

from app.core import catalog, names
from tests.devcluster import node_body
from tests.devcluster.nodes import is_ready


def test_node_advertises_gpus_as_design_says() -> None:
    body = node_body("gpu-node-3", 8, "A100-40GB")
    meta, status = body["metadata"], body["status"]
    assert meta["name"] == "gpu-node-3"
    assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert meta["labels"][names.NODE_LABEL_ENABLED] == "true"
    assert meta["labels"][names.NODE_LABEL_GPU_MODEL] == "A100-40GB"
    assert meta["labels"][names.NODE_LABEL_GPU_MEMORY_MAX_MIB] == "40960"
    assert meta["labels"]["kubernetes.io/hostname"] == "gpu-node-3"
    assert status["capacity"][names.RESOURCE_GPU_MILLI] == "8000"
    assert status["capacity"][names.RESOURCE_GPU_MEMORY_MIB] == str(8 * 40960)
    assert status["allocatable"] == status["capacity"]
    assert status["allocatable"] is not status["capacity"]
    assert "spec" in body and "taints" not in body["spec"]


def test_alias_is_labelled_with_the_catalogue_name() -> None:
    body = node_body("n", 1, "Tesla T4")
    assert body["metadata"]["labels"][names.NODE_LABEL_GPU_MODEL] == "T4"
    assert body["status"]["capacity"][names.RESOURCE_GPU_MEMORY_MIB] == str(catalog.lookup("T4").memory_mib)


def test_extra_labels_are_added() -> None:
    body = node_body("n", 2, "V100M32", labels={"pool": "a"})
    assert body["metadata"]["labels"]["pool"] == "a"
    assert body["metadata"]["labels"][names.NODE_LABEL_ENABLED] == "true"


def test_unknown_model_lists_known_models() -> None:
    with pytest.raises(KeyError, match=r"unknown GPU model 'X9000'; known: .*A100-40GB"):
        node_body("n", 1, "X9000")


@pytest.mark.parametrize("gpus", [0, -1])
def test_needs_at_least_one_gpu(gpus: int) -> None:
    with pytest.raises(ValueError, match=f"gpus={gpus}: must be >= 1"):
        node_body("n", gpus, "T4")


@pytest.mark.parametrize(
    ("node", "ready"),
    [
        ({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True),
        ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False),
        ({"status": {"conditions": [{"type": "MemoryPressure", "status": "True"}]}}, False),
        ({"status": {}}, False),
        ({}, False),
    ],
    ids=["ready", "not-ready", "other-condition", "no-conditions", "no-status"],
)
def test_is_ready_reads_the_ready_condition_of_a_node_object(node: dict[str, Any], ready: bool) -> None:
    assert is_ready(node) is ready
