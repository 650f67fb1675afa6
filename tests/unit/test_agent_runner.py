"""The agent's cycle runner and its app: the lifespan runs the cycles, a bad simulated file stops with 2."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from agent.loop import Agent, AgentConfig
from agent.main import Runner, create_app, reporter_config
from agent.mps import MpsConfig, MpsSupervisor
from agent.nvml.simulated import SimulatedNvml
from agent.settings import Settings
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
