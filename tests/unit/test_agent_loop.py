"""The agent cycle end to end over the simulator and a fake API: status, verification events, metrics."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from agent import metrics as agent_metrics
from agent.command import duration, register, settings_from
from agent.loop import Agent, AgentConfig
from agent.main import create_app, reporter_config
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.report.reporter import ReporterConfig
from agent.settings import Settings
from agent.simgpu.simulated import SimulatedNvml
from app.core.model import Allocation
from app.kube.calls import Request

DEFAULT_CADENCE = reporter_config(Settings(node="n1"))  # the agent's settings' defaults

T0 = 1_700_000_000.0
POD_UID = "5a3e8d5c-8f0e-4d7e-9a52-3c1f1d2b7a10"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class FakeKube:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.requests: list[Request] = []

    def send(self, req: Request) -> dict[str, Any]:
        self.requests.append(req)
        if req.method == "GET" and req.path == "/api/v1/pods":
            return {"items": self.pods}
        if req.path.startswith("/api/v1/nodes/"):
            return {"metadata": {"uid": "node-uid", "labels": {}}}
        return {}

    def status_bodies(self) -> list[dict[str, Any]]:
        return [r.body["status"] for r in self.requests if r.path.endswith("/gpunodes/n1/status")]


def write(path: Path, doc: object) -> None:
    path.write_text(yaml.safe_dump(doc))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def managed_pod(sim: SimulatedNvml, gpu: int) -> dict[str, Any]:
    alloc = Allocation("n1", (gpu,), (sim.uuid(gpu),), 250, 2000)
    return {
        "metadata": {
            "uid": POD_UID,
            "namespace": "ml",
            "name": "train",
            "annotations": alloc.to_annotations(),
        },
        "spec": {"containers": [{"name": "main"}]},
    }


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Agent, FakeKube, Clock, Path]:
    path = tmp_path / "sim.yaml"
    write(
        path,
        {
            "gpus": [
                {
                    "model": "T4",
                    "processes": [{"pid": 4101, "used_mib": 3000, "pod_uid": POD_UID, "container": "main"}],
                },
                {"model": "T4"},
            ]
        },
    )
    sim = SimulatedNvml(path, "n1")
    probe = SimulatedNvml(path, "n1")
    probe.init()
    kube = FakeKube([managed_pod(probe, gpu=1)])  # allocated GPU 1, but runs on GPU 0
    clock = Clock()
    mps = MpsSupervisor(MpsConfig(binary=str(tmp_path / "none"), pipe_dir=tmp_path / "p"))
    agent = Agent(
        AgentConfig("n1", ReporterConfig(heartbeat_s=30, min_interval_s=5, memory_threshold_mib=256)),
        nvml=sim,
        resolver=sim,
        mps=mps,
        send=kube.send,
        clock=clock,
    )
    return agent, kube, clock, path


METRICS = agent_metrics.registry()  # the same series the agent's app serves


def metric(name: str, **labels: str) -> float | None:
    return METRICS.get_sample_value(name, labels)


def test_cycle_reports_attributes_and_verifies(setup: tuple[Agent, FakeKube, Clock, Path]) -> None:
    agent, kube, clock, path = setup
    events_before = metric("gpupack_agent_violations_total", kind="wrong_gpu") or 0.0
    status = agent.step()
    assert [p.pod_uid for p in status.gpus[0].processes] == [POD_UID]
    assert status.mps.isolation == "none" and status.mps.state == "unavailable"
    assert status.summary.memory_allocated_mib == 2000
    events = [r for r in kube.requests if r.path == "/api/v1/namespaces/ml/events"]
    assert len(events) == 1 and events[0].body["reason"] == "GpupackWrongGPU"
    assert metric("gpupack_agent_violations_total", kind="wrong_gpu") == events_before + 1
    uuid0 = status.gpus[0].uuid
    assert metric("gpupack_agent_gpu_memory_used_mib", gpu="0", uuid=uuid0) == 3000
    assert metric("gpupack_agent_pod_memory_used_mib", namespace="ml", pod="train", gpu="0") == 3000

    # The same violation is not reported twice.
    clock.now += 5
    agent.step()
    assert len([r for r in kube.requests if r.path.endswith("/events")]) == 1

    # A foreign process appears on GPU 1: the next write shows it (a process change is significant).
    write(
        path,
        {
            "gpus": [
                {
                    "model": "T4",
                    "processes": [{"pid": 4101, "used_mib": 3000, "pod_uid": POD_UID, "container": "main"}],
                },
                {"model": "T4", "processes": [{"pid": 999, "used_mib": 5000}]},
            ]
        },
    )
    clock.now += 5
    agent.step()
    last = kube.status_bodies()[-1]
    assert last["gpus"][1]["memoryUsedMiB"] == 5000
    assert last["gpus"][1]["processes"] == [{"pid": 999, "podUID": "", "usedMiB": 5000}]
    assert metric("gpupack_agent_gpu_processes", gpu="1", uuid=last["gpus"][1]["uuid"], owner="foreign") == 1

    # The pod's processes go: its per-pod series is removed, not left at its last value.
    write(path, {"gpus": [{"model": "T4"}, {"model": "T4"}]})
    clock.now += 5
    agent.step()
    assert metric("gpupack_agent_pod_memory_used_mib", namespace="ml", pod="train", gpu="0") is None


def test_a_burstable_pod_borrowing_above_its_request_is_no_violation_and_is_shown_per_gpu(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sim.yaml"
    proc = {"pid": 4101, "used_mib": 3000, "pod_uid": POD_UID, "container": "main"}
    write(path, {"gpus": [{"model": "T4", "processes": [proc]}, {"model": "T4"}]})
    sim, probe = SimulatedNvml(path, "n1"), SimulatedNvml(path, "n1")
    probe.init()
    pod = managed_pod(probe, gpu=0)
    # request 2000 MiB, hard limit 4000 MiB (gpupack.io/gpu-memory-limit), as the extender records it
    pod["metadata"]["annotations"] = Allocation(
        "n1", (0,), (probe.uuid(0),), 250, 2000, 4000
    ).to_annotations()
    kube = FakeKube([pod])
    mps = MpsSupervisor(MpsConfig(binary=str(tmp_path / "none"), pipe_dir=tmp_path / "p"))
    config = AgentConfig("n1", ReporterConfig(heartbeat_s=30, min_interval_s=5, memory_threshold_mib=256))
    agent = Agent(config, nvml=sim, resolver=sim, mps=mps, send=kube.send, clock=Clock())
    status = agent.step()
    assert [r for r in kube.requests if r.path.endswith("/events")] == []  # 3000 MiB is within its 4000 cap
    assert metric("gpupack_agent_gpu_memory_borrowed_mib", gpu="0", uuid=status.gpus[0].uuid) == 1000
    assert metric("gpupack_agent_gpu_memory_borrowed_mib", gpu="1", uuid=status.gpus[1].uuid) == 0
    assert metric("gpupack_agent_pod_memory_limit_mib", namespace="ml", pod="train", gpu="0") == 2000


def test_nvml_failure_is_reported_and_init_retried(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    write(path, {"init_error": "NVML_ERROR_DRIVER_NOT_LOADED", "gpus": [{"model": "T4"}]})
    sim = SimulatedNvml(path, "n1")
    kube, clock = FakeKube([]), Clock()
    mps = MpsSupervisor(MpsConfig(enabled=False))
    agent = Agent(
        AgentConfig("n1", DEFAULT_CADENCE), nvml=sim, resolver=sim, mps=mps, send=kube.send, clock=clock
    )
    status = agent.step()
    assert "DRIVER_NOT_LOADED" in status.nvml_error and status.gpus == ()
    write(path, {"gpus": [{"model": "T4"}]})
    clock.now += 10
    assert agent.step().nvml_error != ""  # init retried only once per heartbeat
    clock.now += 30
    status = agent.step()
    assert status.nvml_error == "" and len(status.gpus) == 1


def test_metrics_and_healthz_endpoints(setup: tuple[Agent, FakeKube, Clock, Path]) -> None:
    agent, _, clock, _ = setup
    with TestClient(create_app(Settings(node="n1"), agent)) as client:
        health = client.get("/healthz")
        assert health.status_code == 503  # no cycle has run yet
        agent.step()
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["ok"] is True
        text = client.get("/metrics").text
        assert "gpupack_agent_gpu_memory_used_mib{" in text
        assert 'gpupack_agent_nvml_errors_total{code="NVML_ERROR_GPU_IS_LOST"}' in text
        clock.now += Settings(node="n1").max_step_age_s + 1  # no cycle for longer than allowed
        assert client.get("/healthz").status_code == 503


@pytest.mark.parametrize(
    ("raw", "seconds"), [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), ("7", 7.0)]
)
def test_duration(raw: str, seconds: float) -> None:
    assert duration(raw) == seconds


@pytest.mark.parametrize("raw", ["", "0s", "-1s", "5d", "1e3", "s"])
def test_bad_duration(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(raw)


def test_the_drain_timeout_takes_0_for_off_as_the_chart_writes_it() -> None:
    """agent.mps.drainTimeoutSeconds: 0 renders `--mps-drain-timeout=0s` (no drain): the agent must start."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for raw, seconds in (("0s", 0.0), ("0", 0.0), ("5s", 5.0)):
        args = parser.parse_args(["agent", "run", "--node", "n1", f"--mps-drain-timeout={raw}"])
        assert settings_from(args).mps_drain_timeout_s == seconds
    with pytest.raises(SystemExit):
        parser.parse_args(["agent", "run", "--node", "n1", "--mps-drain-timeout=-1s"])


def test_a_gpu_that_turns_unhealthy_tells_the_pod_allocated_on_it_once(
    setup: tuple[Agent, FakeKube, Clock, Path],
) -> None:
    agent, kube, clock, path = setup
    agent.step()
    write(path, {"gpus": [{"model": "T4"}, {"model": "T4", "lost": True}]})
    for _ in range(2):
        clock.now += 5
        status = agent.step()
    assert not status.gpus[1].healthy
    told = [r.body for r in kube.requests if r.path.endswith("/events")]
    unhealthy = [e for e in told if e["reason"] == "GpupackGPUUnhealthy"]
    assert len(unhealthy) == 1 and unhealthy[0]["involvedObject"]["name"] == "train"
    assert f"GPU 1 ({status.gpus[1].uuid})" in unhealthy[0]["message"]


def test_the_daemons_death_is_told_to_the_pods_on_its_gpus(
    setup: tuple[Agent, FakeKube, Clock, Path], tmp_path: Path
) -> None:
    """docs/node-side.md, "MPS as measured": the daemon's death ends every MPS client on the node. The cycle
    that finds it gone puts an Event naming that cause on each pod placed on the node's shared GPUs, a pod
    placed since the agent last listed the node's pods included."""
    agent, kube, clock, _ = setup
    standin = Path(__file__).resolve().parents[1] / "standin" / "mps_control.py"
    pipe = Path(tempfile.mkdtemp(prefix="loop-mps-", dir="/tmp")) / "pipe"
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(pipe.parent))
    agent.mps = MpsSupervisor(MpsConfig(binary=str(standin), pipe_dir=pipe, command_timeout_s=20))
    subprocess.run([sys.executable, str(standin), "-d", "-M"], env=env, check=True, timeout=20)
    try:
        assert agent.step().mps.state == "running"
        clock.now += 5
        agent.step()  # the pod list is read
        lost = [
            r for r in kube.requests if r.path.endswith("/events") and r.body["reason"] == "GPUMPSDaemonLost"
        ]
        assert lost == []
        late = managed_pod(agent.nvml, gpu=0)  # bound after that listing; the next is due in 30 s
        late["metadata"] |= {"uid": "late-uid", "name": "late"}
        kube.pods.append(late)
        subprocess.run(
            [sys.executable, str(standin)], input="quit\n", env=env, text=True, timeout=20, check=True
        )
        wait = time.monotonic() + 5
        while (pipe / "control").exists() and time.monotonic() < wait:
            time.sleep(0.05)
        clock.now += 5
        assert agent.step().mps.state == "starting"
        lost = [
            r for r in kube.requests if r.path.endswith("/events") and r.body["reason"] == "GPUMPSDaemonLost"
        ]
        assert sorted(e.body["involvedObject"]["name"] for e in lost) == ["late", "train"]
        assert {e.path for e in lost} == {"/api/v1/namespaces/ml/events"}
        assert all("CUDA_ERROR_MPS_RPC_FAILURE" in e.body["message"] for e in lost)
    finally:
        subprocess.run(
            [sys.executable, str(standin)], input="quit\n", env=env, text=True, timeout=20, check=False
        )
        shutil.rmtree(pipe.parent, ignore_errors=True)
