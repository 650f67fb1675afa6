"""The GPUNode wire format, pinned by golden files: what the agent writes for a simulated node, read back.

Each tests/golden/gpunode/<node>.json is the whole object as the apiserver returns it (metadata with
uid, resourceVersion and managedFields; the agent's spec and status). The agent's cycle over the
simulated GPU set of the same name must write exactly that spec and status, and reading the object
and writing it again must give the same bytes. `pytest --update-golden` rewrites the files (review the
diff: a change here is a change of the CRD's wire format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.loop import Agent, AgentConfig
from agent.main import reporter_config
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.settings import Settings
from agent.simgpu.simulated import SimulatedNvml
from app.kube import gpunode
from app.kube.calls import Request

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests/golden/gpunode"
SIM = REPO / "agent/data/sim"
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
SHAPES = ["a100x4", "faults", "t4x2"]  # agent/data/sim/<shape>.yaml, one node each


def agent_writes(shape: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec the agent creates its GPUNode with and the status it then patches, for one cycle."""
    written: list[Request] = []

    def send(req: Request) -> dict[str, Any]:
        written.append(req)
        if req.method == "GET" and req.path == "/api/v1/pods":
            return {"items": []}
        if req.path.startswith("/api/v1/nodes/"):
            return {"metadata": {"uid": "0f6c3c55-6f5e-4a4e-9d36-0d8c3e0a1b2c", "labels": {}}}
        return {}

    sim = SimulatedNvml(SIM / f"{shape}.yaml", shape)
    # A node without the MPS daemon (its message names the binary, hence a fixed path).
    absent = Path("/nonexistent/nvidia-cuda-mps-control")
    mps = MpsSupervisor(MpsConfig(binary=str(absent), pipe_dir=tmp_path / "p"))
    config = AgentConfig(shape, reporter_config(Settings(node=shape)))
    Agent(config, nvml=sim, resolver=sim, mps=mps, send=send, clock=lambda: T0).step()
    [create] = [r for r in written if r.method == "POST" and r.path.endswith("/gpunodes")]
    [status] = [r for r in written if r.path.endswith(f"/gpunodes/{shape}/status")]
    return create.body["spec"], status.body["status"]


def as_served(shape: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The object as `kubectl get gpunode -o json` shows it: the apiserver's metadata around our fields."""
    return {
        "apiVersion": gpunode.API_VERSION,
        "kind": "GPUNode",
        "metadata": {
            "creationTimestamp": "2023-11-14T22:13:20Z",
            "generation": 1,
            "managedFields": [
                {
                    "apiVersion": gpunode.API_VERSION,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {".": {}, "f:gpus": {}, "f:nodeName": {}}},
                    "manager": "gpupack",
                    "operation": "Update",
                    "time": "2023-11-14T22:13:20Z",
                }
            ],
            "name": shape,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": shape,
                    "uid": "0f6c3c55-6f5e-4a4e-9d36-0d8c3e0a1b2c",
                }
            ],
            "resourceVersion": "48213",
            "uid": "5d1b9a0e-3c7f-4f21-8a64-2b9e7c1d0f43",
        },
        "spec": spec,
        "status": status,
    }


@pytest.mark.parametrize("shape", SHAPES)
def test_the_agent_writes_the_golden_gpunode(shape: str, tmp_path: Path, update_golden: bool) -> None:
    doc = as_served(shape, *agent_writes(shape, tmp_path))
    path = GOLDEN / f"{shape}.json"
    if update_golden:
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    assert doc == json.loads(path.read_text())


@pytest.mark.parametrize("shape", SHAPES)
def test_a_served_gpunode_reads_and_writes_back_unchanged(shape: str) -> None:
    doc = json.loads((GOLDEN / f"{shape}.json").read_text())
    node = gpunode.read(doc)
    assert (node.name, node.resource_version) == (shape, "48213")
    assert node.status is not None
    assert gpunode.patch_spec(shape, node.spec).body == {"spec": doc["spec"]}
    assert gpunode.patch_status(shape, node.status).body == {"status": doc["status"]}
