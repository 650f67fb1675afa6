"""What docs/node-side.md and docs/upgrades.md say about restarts and readiness is what the code says: each
refusal a GPU container can meet at creation is produced here from the code, and the docs must quote it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.mpsdaemon import mpsprep
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.mpsdaemon.pipedirs import PipeDirs
from agent.runtime.nodeserver import NodeServer
from app.core import names
from app.core.model import Allocation

REPO = Path(__file__).resolve().parents[2]
NODE_SIDE = " ".join((REPO / "docs/node-side.md").read_text().split())  # line breaks as spaces
UPGRADES = " ".join((REPO / "docs/upgrades.md").read_text().split())
UID = "5d0c2d4e-aaaa-bbbb-cccc-0123456789ab"


def pod() -> dict[str, object]:
    alloc = Allocation(node="n1", gpu_indexes=(0,), gpu_uuids=("GPU-a",), milli=500, memory_mib=20480)
    return {
        "metadata": {"uid": UID, "namespace": "team-a", "name": "half",
                     "labels": {names.LABEL_MANAGED: "true"},
                     "annotations": {names.GPU_FRACTION: "0.5", **alloc.to_annotations()}},
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
    }  # fmt: skip


def create(server: NodeServer) -> str:
    ask = {"pod_uid": UID, "namespace": "team-a", "name": "half", "container": "main", "container_id": "c1"}
    answer = server.reply(json.dumps(ask).encode())
    assert not answer.allowed
    return answer.reason


def stable(reason: str) -> str:
    """The part of a reason the docs quote: up to the first value that varies (a path, a quote, a paren)."""
    return re.split(r"[(`'\"/]| at ", reason.split(": ", 1)[-1])[0].strip()


@pytest.fixture
def pipe(tmp_path: Path) -> Path:
    return tmp_path / "pipe"


def test_each_refusal_at_create_is_quoted_in_the_fail_closed_table(pipe: Path) -> None:
    pipe.mkdir()
    reasons = []
    # no daemon behind the socket
    reasons.append(create(NodeServer(pipe / "a.sock", "n1", PipeDirs(pipe), lambda r: {"items": [pod()]})))
    # the daemon not configured (a supervisor that has not seen it run)
    sup = MpsSupervisor(MpsConfig(binary="/nonexistent", pipe_dir=pipe))
    reasons.append(create(NodeServer(pipe / "b.sock", "n1", PipeDirs(pipe), lambda r: {"items": [pod()]},
                                     daemon_not_ready=sup.not_ready)))  # fmt: skip
    # the daemon pod has not prepared the node on this boot
    ready = mpsprep.readiness(pipe, "this-boot")
    reasons.append(create(NodeServer(pipe / "c.sock", "n1", PipeDirs(pipe), lambda r: {"items": [pod()]},
                                     mps_not_ready=ready)))  # fmt: skip
    table = NODE_SIDE[NODE_SIDE.index("### Fail closed") : NODE_SIDE.index("### When the MPS daemon refuses")]
    for reason in reasons:
        assert stable(reason) in table, f"docs/node-side.md's fail-closed table does not quote: {reason}"


def test_what_the_handler_says_while_the_agent_is_down_is_what_the_docs_say() -> None:
    said = "the gpupack agent on this node did not answer"
    assert said in (REPO / "handler/create.go").read_text()
    assert said in NODE_SIDE and said in UPGRADES
    assert "New GPU containers **start correctly without the agent**" not in UPGRADES
