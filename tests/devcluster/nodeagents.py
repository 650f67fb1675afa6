"""The agent DaemonSet's stand-in for nodes an autoscaler adds: one simulated agent per node, while it lives.

`make dev` starts one agent per node it creates. Nodes that Karpenter adds later need the same, as a
DaemonSet would give them: this process (`python -m tests.devcluster.nodeagents --dir DIR`) watches Nodes of
any Karpenter NodePool and runs `gpupack agent run --sim` for each (simulated NVML: GPUs of the node's
`gpupack.io/gpu-model` label, as many as its `nvidia.com/gpu` capacity), and stops it when the node goes.
The agents are its children, in its process group: `make down` stops them with it.

Each agent's token is bound to a stand-in pod on its node (as for the other dev agents). Here that pod also
names a DaemonSet as its owner, because an autoscaler ignores DaemonSet pods when it decides a node is
empty (Karpenter: IsOwnedByDaemonSet); a bare pod would keep every added node forever. The DaemonSet
object selects no node, so its controller creates nothing and adopts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from app.core import catalog, log, names
from app.core.errors import KubeError
from app.kube import calls, paths
from app.kube.calls import Request
from app.kube.client import Kube

from .addons import (
    SIM_SAMPLES_RELPATH,
    Components,
    agent_anchor_pod,
    agent_spec,
    sim_file_for,
)
from .binaries import repo_root
from .cluster import Cluster
from .identities import GPUPACK_NAMESPACE
from .ports import free_ports

_log = log.get("gpupack.devcluster.nodeagents")
NODEPOOL_LABEL = "karpenter.sh/nodepool"
STANDIN_DAEMONSET = "gpupack-agent-standin"
DAEMONSETS = f"/apis/apps/v1/namespaces/{GPUPACK_NAMESPACE}/daemonsets"
GPU_RESOURCE = "nvidia.com/gpu"


def standin_daemonset() -> dict[str, Any]:
    """A DaemonSet that runs nowhere: the owner the stand-in agent pods name."""
    labels = {"app.kubernetes.io/name": STANDIN_DAEMONSET}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": STANDIN_DAEMONSET, "namespace": GPUPACK_NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"dev.gpupack.io/no-such-node": "true"},
                    "containers": [{"name": "agent", "image": "gpupack"}],
                },
            },
        },
    }


def owned_anchor_pod(node: str, owner_uid: str) -> dict[str, Any]:
    body = agent_anchor_pod(node)
    body["metadata"]["ownerReferences"] = [
        # Not the controller: the DaemonSet controller leaves pods it does not control alone.
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": STANDIN_DAEMONSET, "uid": owner_uid}
    ]
    return body


def shape(node: Mapping[str, Any]) -> tuple[str, int] | None:
    """(model, GPUs) of an autoscaler's node, from its model label and allocatable GPUs; None if it has none.

    Allocatable, not capacity: Karpenter's kwok provider sets capacity to what the pods it launched the node
    for requested, and allocatable to the instance type's.
    """
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    model, gpus = labels.get(names.NODE_LABEL_GPU_MODEL), str(allocatable.get(GPU_RESOURCE, ""))
    if not model or not gpus.isdigit() or int(gpus) < 1:
        return None
    try:
        return catalog.lookup(model).name, int(gpus)
    except KeyError:
        return None


class Launcher:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        root = repo_root()
        self.samples = list((root / SIM_SAMPLES_RELPATH).glob("*.yaml")) if root is not None else []

    def owner_uid(self, kube: Kube) -> str:
        try:
            kube.send(Request("POST", DAEMONSETS, standin_daemonset()))
        except KubeError as exc:
            if exc.code != 409:
                raise
        got = kube.send(Request("GET", f"{DAEMONSETS}/{STANDIN_DAEMONSET}"))
        return str(got["metadata"]["uid"])

    def start_agent(self, api: Any, kube: Kube, node: str, *, gpus_of: tuple[str, int], owner: str) -> None:
        model, gpus = gpus_of
        try:
            kube.send(calls.create(owned_anchor_pod(node, owner)))
        except KubeError as exc:
            if exc.code != 409:
                raise
        kubeconfig = Components.agent_kubeconfig(self.cluster, api, node)  # reuses the anchor pod above
        sim = sim_file_for(model, gpus, self.samples, self.cluster.dir / "sim")
        (port,) = free_ports(1)
        spec = agent_spec(node, sim=sim, port=port, kubeconfig=kubeconfig, state_dir=self.cluster.dir)
        logf = self.cluster.layout.log(spec.name).open("ab")
        self.agents[node] = subprocess.Popen(
            spec.argv, stdout=logf, stderr=subprocess.STDOUT, env=_env(spec.env)
        )
        _log.info(
            "agent started", extra={"node": node, "model": model, "gpus": gpus, "pid": self.agents[node].pid}
        )

    def stop_agent(self, node: str) -> None:
        proc = self.agents.pop(node)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        _log.info("agent stopped", extra={"node": node})

    def sync(self, api: Any, kube: Kube, owner: str) -> None:
        listed = kube.send(calls.list_request(paths.nodes(), NODEPOOL_LABEL)).get("items") or []
        present: dict[str, tuple[str, int]] = {}
        for node in listed:
            meta = node.get("metadata") or {}
            got = shape(node)
            if got is not None and not meta.get("deletionTimestamp"):
                present[str(meta.get("name"))] = got
        for name in [n for n in self.agents if n not in present or self.agents[n].poll() is not None]:
            self.stop_agent(name)
        for name, got in present.items():
            if name not in self.agents:
                self.start_agent(api, kube, name, gpus_of=got, owner=owner)

    def run(self, interval_s: float) -> None:
        stopping = [False]

        def on_term(_sig: int, _frame: FrameType | None) -> None:
            stopping[0] = True

        signal.signal(signal.SIGTERM, on_term)
        with self.cluster.api_client() as api:
            kube = Kube(api)
            owner = self.owner_uid(kube)
            while not stopping[0]:
                try:
                    self.sync(api, kube, owner)
                except KubeError as exc:  # the apiserver restarting, say: try again next round
                    _log.warning("sync failed", extra={"error": str(exc)})
                time.sleep(interval_s)
        for name in list(self.agents):
            self.stop_agent(name)


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.devcluster.nodeagents", description=__doc__)
    parser.add_argument("--dir", type=Path, required=True, help="the dev cluster's state directory")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two node lists")
    args = parser.parse_args(argv)
    cluster = Cluster.load(args.dir)
    if cluster is None:
        print(f"no dev cluster in {args.dir}", file=sys.stderr)
        return 2
    Launcher(cluster).run(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
