"""The container-start env check: a process's GPU env against its pod's allocation, and the agent's Event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import metrics as agent_metrics
from agent.enforce import envcheck
from agent.enforce.cgroup import PodRef
from agent.loop import Agent, AgentConfig
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.report.reporter import ReporterConfig
from agent.simgpu.simulated import SimulatedNvml
from app.core import names
from app.core.model import Allocation
from app.core.pods import pod_info
from app.kube.calls import Request

UID = "0b6c3c9e-6f1a-4a8e-9d55-1a2b3c4d5e6f"
MAIN, SIDE, SANDBOX = "a" * 64, "b" * 64, "c" * 64
ALLOC = Allocation("n1", (0,), ("GPU-aaaa",), 500, 8000)


def pod() -> dict[str, Any]:
    return {
        "metadata": {
            "uid": UID, "namespace": "ml", "name": "train",
            "labels": {names.LABEL_MANAGED: "true"}, "annotations": ALLOC.to_annotations(),
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}, {"name": "side"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{MAIN}"},
                {"name": "side", "containerID": f"containerd://{SIDE}"},
            ],
        },
    }  # fmt: skip


def kubelet_env() -> dict[str, str]:
    """What the kubelet resolves for the GPU container from the webhook's fieldRefs."""
    a = ALLOC.to_annotations()
    return {
        "PATH": "/bin",
        names.ENV_NVIDIA_VISIBLE_DEVICES: a[names.ALLOC_GPU_UUIDS],
        names.ENV_CUDA_VISIBLE_DEVICES: a[names.ALLOC_GPU_UUIDS],
        names.ENV_MPS_THREAD_PERCENTAGE: a[names.ALLOC_THREAD_PERCENTAGE],
        names.ENV_MPS_MEMORY_LIMIT: a[names.ALLOC_MPS_MEMORY_LIMIT],
        names.ENV_MEMORY_LIMIT_MIB: a[names.ALLOC_MEMORY_LIMIT_MIB],
    }


def test_the_env_the_kubelet_gives_passes() -> None:
    info = pod_info(pod())
    assert envcheck.mismatches(info, "main", kubelet_env()) == ()
    assert envcheck.mismatches(info, "side", {names.ENV_NVIDIA_VISIBLE_DEVICES: "void"}) == ()


def test_isolation_none_has_no_mps_variables_to_compare() -> None:
    env = {k: v for k, v in kubelet_env().items() if not k.startswith("CUDA_MPS_")}
    assert envcheck.mismatches(pod_info(pod()), "main", env) == ()


def test_a_burstable_pod_is_checked_against_its_hard_limit_too() -> None:
    burstable = Allocation("n1", (0,), ("GPU-aaaa",), 500, 8000, hard_limit_mib=12000)
    body = pod()
    body["metadata"]["annotations"] = burstable.to_annotations()
    info = pod_info(body)
    env = kubelet_env() | {
        names.ENV_MPS_MEMORY_LIMIT: "0=12000M",
        names.ENV_MEMORY_HARD_LIMIT_MIB: "12000",
    }
    assert envcheck.mismatches(info, "main", env) == ()
    assert envcheck.mismatches(info, "main", env | {names.ENV_MEMORY_HARD_LIMIT_MIB: "99999"}) == (
        "GPUPACK_MEMORY_HARD_LIMIT_MIB='99999' (allocation: '12000')",
    )


@pytest.mark.parametrize(
    ("container", "change", "want"),
    [
        (
            "main",
            {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"},
            ("CUDA_VISIBLE_DEVICES='GPU-bbbb' (allocation: 'GPU-aaaa')",),
        ),
        ("main", {"NVIDIA_VISIBLE_DEVICES": None}, ("NVIDIA_VISIBLE_DEVICES='' (allocation: 'GPU-aaaa')",)),
        (
            "main",
            {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"},
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='100' (allocation: '50')",),
        ),
        ("side", {"NVIDIA_VISIBLE_DEVICES": "all"}, ("NVIDIA_VISIBLE_DEVICES='all' (allocation: 'void')",)),
    ],
    ids=["other-gpu", "unset", "more-threads", "side-container-all"],
)
def test_each_changed_variable_is_named(
    container: str, change: dict[str, str | None], want: tuple[str, ...]
) -> None:
    env = kubelet_env() if container == "main" else {names.ENV_NVIDIA_VISIBLE_DEVICES: "void"}
    for k, v in change.items():
        if v is None:
            env.pop(k)
        else:
            env[k] = v
    assert envcheck.mismatches(pod_info(pod()), container, env) == want


def test_environ_parsing_last_entry_wins() -> None:
    raw = b"A=1\0B=x=y\0A=2\0junk\0\0"
    assert envcheck.parse_environ(raw) == {"A": "2", "B": "x=y"}


# ---- in the agent cycle ----


class Procs:
    def __init__(self, table: dict[int, tuple[PodRef | None, dict[str, str]]]) -> None:
        self.table = table

    def pids(self) -> list[int]:
        return list(self.table)

    def pod_of(self, pid: int) -> PodRef | None:
        return self.table[pid][0]

    def environ(self, pid: int) -> bytes | None:
        return b"\0".join(f"{k}={v}".encode() for k, v in self.table[pid][1].items())


class Kube:
    def __init__(self) -> None:
        self.requests: list[Request] = []

    def send(self, req: Request) -> dict[str, Any]:
        self.requests.append(req)
        if req.method == "GET" and req.path == "/api/v1/pods":
            return {"items": [pod()]}
        if req.path.startswith("/api/v1/nodes/"):
            return {"metadata": {"uid": "node-uid", "labels": {}}}
        return {}

    def events(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.method == "POST" and r.path.endswith("/events")]


def agent(tmp_path: Path, procs: Procs, kube: Kube) -> Agent:
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump({"gpus": [{"model": "T4"}]}))
    sim = SimulatedNvml(tmp_path / "sim.yaml", "n1")
    mps = MpsSupervisor(MpsConfig(binary=str(tmp_path / "none"), pipe_dir=tmp_path / "p"))
    config = AgentConfig("n1", ReporterConfig(heartbeat_s=30, min_interval_s=5, memory_threshold_mib=256))
    return Agent(config, nvml=sim, resolver=sim, mps=mps, send=kube.send, clock=lambda: 1.0e9, procs=procs)


def checks(result: str) -> float:
    return (
        agent_metrics.registry().get_sample_value("gpupack_agent_env_checks_total", {"result": result}) or 0.0
    )


def test_agent_flags_a_tampered_process_once_and_passes_the_others(tmp_path: Path) -> None:
    tampered = {**kubelet_env(), names.ENV_CUDA_VISIBLE_DEVICES: "GPU-bbbb"}
    procs = Procs(
        {
            1: (None, {}),  # a host process
            10: (PodRef(UID, SANDBOX), {}),  # the pod's sandbox: in no container the pod status names
            11: (PodRef(UID, MAIN), kubelet_env()),
            12: (PodRef(UID, SIDE), {names.ENV_NVIDIA_VISIBLE_DEVICES: "void"}),
            13: (PodRef(UID, MAIN), tampered),  # e.g. a child the entrypoint started after an export
        }
    )
    kube = Kube()
    ok_before, bad_before = checks("ok"), checks("mismatch")
    a = agent(tmp_path, procs, kube)
    a.step()
    a.step()  # checked once per process: no second Event, no second count
    (event,) = kube.events()
    assert event["reason"] == "GpupackEnvMismatch" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == UID
    assert event["message"].startswith(
        "container main (pid 13) runs with CUDA_VISIBLE_DEVICES='GPU-bbbb' (allocation: 'GPU-aaaa')"
    )
    assert (checks("ok") - ok_before, checks("mismatch") - bad_before) == (2, 1)
