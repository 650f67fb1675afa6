"""Simulated node agents for integration tests: one `gpupack agent run --sim` process per kwok node."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.devcluster import Cluster, ComponentSpec, HealthCheck
from app.devcluster.ports import free_ports


def write_sim(path: Path, gpus: list[dict[str, Any]]) -> None:
    """Replace a simulated GPU set atomically (the agent may read at any moment), with a fresh mtime."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"gpus": gpus}))
    os.replace(tmp, path)
    st = path.stat()  # a distinct mtime even when rewritten within the filesystem's timestamp granularity
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


class SimAgents:
    """Start/stop agent processes for kwok nodes, each with its own simulated GPU file in `tmp`."""

    def __init__(self, cluster: Cluster, tmp: Path, heartbeat_s: int, extra_args: Sequence[str] = ()) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.heartbeat_s = heartbeat_s
        self.extra_args = tuple(extra_args)
        self.ports: dict[str, int] = {}
        self.running: set[str] = set()

    def sim(self, node: str) -> Path:
        return self.tmp / f"{node}.yaml"

    def start(self, node: str) -> None:
        port = self.ports.setdefault(node, free_ports(1)[0])
        argv = (
            sys.executable, "-m", "app.cli", "agent", "run",
            "--node", node,
            "--kubeconfig", str(self.cluster.kubeconfig_for("gpupack-agent")),
            "--sim", str(self.sim(node)),
            "--heartbeat", f"{self.heartbeat_s}s", "--interval", "0.5s", "--min-write-interval", "1s",
            "--host", "127.0.0.1", "--port", str(port),
            "--mps-pipe-dir", str(self.tmp / "mps" / node),
            *self.extra_args,
        )  # fmt: skip
        health = HealthCheck(f"http://127.0.0.1:{port}/healthz")
        self.cluster.start_process(ComponentSpec(f"agent-{node}", argv, health=health, ready_timeout_s=60))
        self.running.add(node)

    def stop(self, node: str) -> None:
        self.cluster.stop_process(f"agent-{node}")  # SIGTERM, then waits for the process to go
        self.running.discard(node)

    def stop_all(self) -> None:
        for node in list(self.running):
            self.stop(node)

    def metrics(self, node: str) -> str:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.ports[node]}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, node: str, name: str, **labels: str) -> float | None:
        """One sample of the agent's /metrics (counters by their `_total` name), None when absent."""
        for family in text_string_to_metric_families(self.metrics(node)):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return None
