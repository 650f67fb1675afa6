"""The watchdog in the real agent (agent.main.build, its Runner) over simulated GPUs, against real processes.

A real process holds memory on a simulated GPU through the agent's simulated allocator
(agent/simgpu/simalloc.py, the stand-in CUDA process tests/standin/gpu_alloc.py --hold), so the simulated NVML
lists it as NVML lists a process with a context. It runs outside any pod: a host process on a GPU gpupack
shares. With the watchdog on it is ended by SIGKILL; each ending's runtime (from the process's start to its
end, as the agent's cycle of `--interval 5s` finds it) is printed. With the watchdog off it keeps running. No
control plane is needed: the Kubernetes API is a recorder.

    .venv/bin/pytest -m integration tests/integration/test_watchdog_ends_processes.py -s
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.enforce.cgroup import PodRef
from agent.enforce.ending import HostProcesses, nothing_listens
from agent.loop import Agent
from agent.main import Runner, build, mps_client_lists, sim_allocator
from agent.settings import Settings
from agent.simgpu.simalloc import Allocator
from app.kube.calls import Request

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests/standin/gpu_alloc.py"
SIM = {"driver_version": "580.159.04", "gpus": [{"model": "H100-80GB"}]}


class Recorder:
    """The Kubernetes API as the agent sees it: every request kept, no pods on the node."""

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self.requests: list[Request] = []
        self.pods = pods or []

    def __call__(self, req: Request) -> dict[str, Any]:
        self.requests.append(req)
        if req.method == "GET" and req.path == "/api/v1/pods":
            return {"items": self.pods}
        if req.path.startswith("/api/v1/nodes/"):
            return {"metadata": {"uid": "node-uid", "labels": {}}}
        return {}


def agent_settings(tmp_path: Path, watchdog: bool) -> Settings:
    sim = tmp_path / "gpus.yaml"
    sim.write_text(yaml.safe_dump(SIM))
    return Settings(
        node="n1", sim=sim, sim_state=tmp_path / "state", sim_allocator=tmp_path / "sim-gpu/alloc.sock",
        mps=False, port=0, watchdog=watchdog,
    )  # fmt: skip


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def hold(
    allocator: Allocator, uuid: str, mib: int, started: list[subprocess.Popen[str]]
) -> subprocess.Popen[str]:
    """A real process that holds `mib` MiB on the GPU until it is ended (a CUDA context's memory)."""
    socket = str(allocator.socket_path)
    p = subprocess.Popen(
        [sys.executable, str(STANDIN), "--socket", socket, "--hold", f"alloc {uuid} {mib}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    started.append(p)
    assert p.stdout is not None
    first, second = p.stdout.readline(), p.stdout.readline()
    assert first.startswith("1: ok used=") and second.strip() == "holding", (first, second)
    return p


def start(tmp_path: Path, watchdog: bool, send: Recorder) -> tuple[Agent, Allocator, str]:
    settings = agent_settings(tmp_path, watchdog)
    agent = build(settings, send, time.time, mps_client_lists(settings))
    allocator = sim_allocator(settings, agent)
    assert allocator is not None
    allocator.start()
    return agent, allocator, agent.nvml.uuid(0)


def test_a_host_process_on_a_shared_gpu_is_ended_and_its_runtime_printed(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    agent, allocator, uuid = start(tmp_path, True, Recorder())
    runner = Runner(agent, interval_s=Settings(node="n1").interval_s)  # the agent's default cycle: 5 s
    runner.start()
    ran: list[float] = []
    try:
        for _ in range(3):
            began = time.monotonic()
            p = hold(allocator, uuid, 1024, holders)
            assert p.wait(timeout=30) == -signal.SIGKILL
            ran.append(time.monotonic() - began)
    finally:
        runner.stop()
        allocator.stop()
    runtimes = ", ".join(f"{s:.1f}" for s in ran)
    cycle = runner.interval_s
    print(f"\nwatchdog: a host process on a shared GPU ran {runtimes} s before SIGKILL (cycle {cycle:g} s)")
    # The GPU's process list no longer has it once its context is gone.
    agent.step()
    assert [p.pid for p in agent.sampler.sample().gpus[0].processes] == []


def test_with_the_watchdog_off_the_process_keeps_running(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    agent, allocator, uuid = start(tmp_path, False, Recorder())
    try:
        p = hold(allocator, uuid, 1024, holders)
        for _ in range(3):
            status = agent.step()
        assert p.poll() is None  # still running
        assert [q.pid for q in status.gpus[0].processes] == [p.pid]  # and seen on the GPU
    finally:
        allocator.stop()


def test_a_process_is_signalled_only_while_it_is_the_one_judged(tmp_path: Path) -> None:
    """The host side alone: a pid whose cgroup no longer names the pod judged, or an agent outside the host's
    pid namespace, signals nothing; the process judged is ended."""
    p = subprocess.Popen(["sleep", "60"])
    try:
        host = HostProcesses(Path("/proc"))
        reused = host.end(p.pid, PodRef("another-pod", "c"), mps_client=False)
        assert (reused.signalled, reused.note) == (False, "already gone (its pid now names another process)")
        (tmp_path / "self").symlink_to("1")  # a /proc of another pid namespace: "self" is not our pid there
        elsewhere = HostProcesses(tmp_path).end(p.pid, None, mps_client=False)
        assert not elsewhere.signalled and "hostPID" in elsewhere.note
        assert p.poll() is None
        ended = host.end(p.pid, host.resolver.pod_of(p.pid), mps_client=False)
        assert ended.signalled and ended.ran_s is not None and ended.ran_s >= 0
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_daemon_that_died_is_told_from_one_that_listens(tmp_path: Path) -> None:
    """A daemon killed leaves its control socket behind; no client can reach it, so no process is one."""
    path = tmp_path / "control"
    assert nothing_listens(path)  # no socket at all
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    daemon.bind(str(path))
    daemon.listen()
    assert not nothing_listens(path)
    daemon.close()  # as a SIGKILL leaves it: the file stays, nothing listens
    assert path.exists() and nothing_listens(path)
