"""The agent's cycle runner and its app: the lifespan runs the cycles, a bad simulated file stops with 2."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from agent.loop import Agent, AgentConfig
from agent.main import Runner, create_app, reporter_config
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.settings import Settings
from agent.simgpu.simulated import SimulatedNvml
from app.kube.calls import Request
from tests.devcluster import wait_for

DEFAULT_CADENCE = reporter_config(Settings(node="n1"))  # the agent's settings' defaults


def make_agent(sim: Path, send: Any = None) -> Agent:
    nvml = SimulatedNvml(sim, "n1")
    mps = MpsSupervisor(MpsConfig(enabled=False))

    def no_api(req: Request) -> dict[str, Any]:
        return {}

    return Agent(
        AgentConfig("n1", DEFAULT_CADENCE),
        nvml=nvml,
        resolver=nvml,
        mps=mps,
        send=send or no_api,
        clock=lambda: 1.0,
    )


def test_an_invalid_simulated_file_ends_the_runner_with_2(tmp_path: Path) -> None:
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"gpus": [{"model": "T4", "bogus": 1}]}))
    fatal = threading.Event()
    runner = Runner(make_agent(sim), interval_s=0.01, on_fatal=fatal.set)
    assert runner.run() == 2
    assert runner.exit_code == 2 and fatal.is_set()


def test_a_failing_cycle_does_not_stop_the_next(tmp_path: Path) -> None:
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}]}))
    calls: list[str] = []

    def flaky(req: Request) -> dict[str, Any]:
        calls.append(req.path)
        if len(calls) == 1:
            raise RuntimeError("a bug in one cycle")
        return {}

    agent = make_agent(sim, flaky)
    runner = Runner(agent, interval_s=0.01)
    runner.start()
    try:
        wait_for(lambda: agent.last_step is not None, 10, "a cycle after the failing one")
    finally:
        runner.stop()
    assert runner.exit_code == 0


def test_the_apps_lifespan_runs_the_cycles(tmp_path: Path) -> None:
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}]}))
    agent = make_agent(sim)
    runner = Runner(agent, interval_s=0.01)
    with TestClient(create_app(Settings(node="n1"), agent, runner)) as client:
        wait_for(lambda: client.get("/healthz").status_code == 200, 10, "healthy after a cycle")
        assert client.get("/healthz").json()["nvml"] is True
    assert runner._thread is not None and not runner._thread.is_alive()  # stopped with the app


def test_a_real_node_never_imports_the_simulated_gpu() -> None:
    """The simulated GPU is a backend chosen by name (--sim): an agent built for real NVML, with MPS and the
    runtime handler's socket on, has loaded none of it."""
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "import agent.command\n"
        "from agent.main import build, mps_client_lists, node_server, sim_allocator\n"
        "from agent.settings import Settings\n"
        "s = Settings(node='n1', mps=True, node_socket=Path('/nonexistent/agent.sock'))\n"
        "lists = mps_client_lists(s)\n"
        "agent = build(s, send=lambda r: {}, clock=lambda: 0.0, mps_clients=lists)\n"
        "class Kube:\n"
        "    def send(self, r): return {}\n"
        "    def watch(self, path, query, timeout_s=300): return iter(())\n"
        "assert node_server(s, Kube(), agent, lists) is not None\n"
        "assert sim_allocator(s, agent) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('agent.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert "agent.nvml.pynvml_backend" in loaded  # the probe did build the real backend
    assert [m for m in loaded if m.startswith("agent.simgpu")] == []
