"""Each component's /metrics carries only its own gpupack_* series, with all three loaded in one process."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from agent.loop import Agent, AgentConfig
from agent.main import create_app as agent_app
from agent.main import reporter_config
from agent.mpsdaemon.mps import MpsConfig, MpsSupervisor
from agent.settings import Settings as AgentSettings
from agent.simgpu.simulated import SimulatedNvml
from app.core.placement import registry
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.calls import Request
from extender.binder import Binder
from extender.config import Settings as ExtenderSettings
from extender.main import create_app as extender_app
from tests.static_runtime import StaticRuntime
from webhook.main import create_app as webhook_app
from webhook.settings import Settings as WebhookSettings

DEFAULT_CADENCE = reporter_config(AgentSettings(node="n1"))  # the agent's settings' defaults

PREFIXES = ("gpupack_webhook_", "gpupack_extender_", "gpupack_agent_")


def scrape(client: TestClient) -> set[str]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {f.name for f in text_string_to_metric_families(response.text) if f.name.startswith("gpupack_")}


class NoKube:
    """No API server: these tests only scrape."""

    def send(self, req: Request) -> dict[str, Any]:
        return {}

    def watch(self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300) -> Iterator[Any]:
        return iter(())


def webhook_client() -> TestClient:
    return TestClient(webhook_app(WebhookSettings()))


def extender_client() -> TestClient:
    cache = ClusterCache(AssumeCache(ttl_s=60))
    policy = registry.create("binpack")
    runtime = StaticRuntime(cache, policy, Binder(NoKube(), cache, policy))
    return TestClient(extender_app(ExtenderSettings(), runtime=runtime))


def agent_client(tmp_path: Path) -> TestClient:
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"gpus": [{"model": "T4"}]}))
    nvml = SimulatedNvml(sim, "n1")
    mps = MpsSupervisor(MpsConfig(enabled=False))
    agent = Agent(
        AgentConfig("n1", DEFAULT_CADENCE),
        nvml=nvml,
        resolver=nvml,
        mps=mps,
        send=NoKube().send,
        clock=lambda: 0.0,
    )
    agent.step()  # per-GPU gauges exist once a cycle ran
    return TestClient(agent_app(AgentSettings(node="n1"), agent))


@pytest.mark.parametrize(
    ("component", "expected"),
    [
        ("webhook", {"gpupack_webhook_reviews", "gpupack_webhook_cert_reloads"}),
        ("extender", {"gpupack_extender_binds", "gpupack_extender_leader", "gpupack_extender_pending_pods"}),
        (
            "agent",
            {"gpupack_agent_mps_up", "gpupack_agent_heartbeat_age_seconds", "gpupack_agent_gpu_healthy"},
        ),
    ],
)
def test_metrics_carry_only_the_components_own_series(
    component: str, expected: set[str], tmp_path: Path
) -> None:
    clients = {
        "webhook": webhook_client,
        "extender": extender_client,
        "agent": lambda: agent_client(tmp_path),
    }
    with clients[component]() as client:
        names = scrape(client)
    assert expected <= names, sorted(expected - names)
    own = f"gpupack_{component}_"
    assert {n for n in names if not n.startswith(own)} == set()


def test_no_gpupack_series_in_the_process_wide_registry() -> None:
    assert webhook_client() and extender_client()  # every component's metrics module is imported
    leaked = {m.name for m in REGISTRY.collect() if m.name.startswith(PREFIXES)}
    assert leaked == set()
