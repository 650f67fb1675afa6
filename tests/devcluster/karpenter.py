"""Karpenter's kwok cloud provider in the dev cluster: its objects (pure) and the process that runs it.

`make dev` with --autoscaler runs the real Karpenter (sigs.k8s.io/karpenter/kwok, built by
tests/karpenter/build.sh) against our control plane. It creates Nodes that kwok keeps Ready, exactly as on
a cloud it would create instances; the node pool's instance types carry 8 GPUs (`nvidia.com/gpu`, as a
cloud GPU instance type advertises them) and its template labels the GPU model gpupack places on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from app.core import catalog, names
from app.core.errors import KubeError
from app.kube.calls import MERGE_PATCH, Request
from app.kube.client import Kube

from .addons import EXTENDER, Components, Definitions, install_crd, install_rbac
from .binaries import BinariesError, repo_root
from .identities import GPUPACK_NAMESPACE
from .layout import Layout
from .ports import free_ports
from .processes import ComponentSpec, HealthCheck

if TYPE_CHECKING:
    from .cluster import Cluster

Progress = Callable[[str], None]

BUILD_RELPATH = Path("tests/karpenter/build.sh")
NODE_CLASS = "gpupack-dev"
NODE_POOL_PREFIX = "gpupack-"
KARPENTER = "karpenter"
ZONE = "test-zone-a"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
NODE_CLASSES = "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses"
NODE_POOLS = "/apis/karpenter.sh/v1/nodepools"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


@dataclass(frozen=True, slots=True)
class GpuPool:
    """One Karpenter NodePool of `gpus`-GPU `model` nodes, at most `max_nodes` of them."""

    model: str
    gpus: int = 8
    max_nodes: int = 8

    @property
    def name(self) -> str:
        return NODE_POOL_PREFIX + self.model.lower()

    @property
    def instance_type(self) -> str:
        return f"gpu-{self.model.lower()}-{self.gpus}x"


def instance_types(pools: list[GpuPool]) -> list[dict[str, Any]]:
    """The kwok provider's instance-types file: one GPU type per pool (INSTANCE_TYPES_FILE_PATH)."""
    out = []
    for pool in pools:
        out.append(
            {
                "name": pool.instance_type,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": {
                    "cpu": "96",
                    "memory": "1024Gi",
                    "pods": "110",
                    "nvidia.com/gpu": str(pool.gpus),
                },
                "offerings": [
                    {
                        "Price": 4.0 * pool.gpus,
                        "Available": True,
                        "Requirements": [
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                        ],
                    }
                ],
            }
        )
    return out


def node_class() -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
        "spec": {},
    }


def node_class_ready_status(now: str) -> dict[str, Any]:
    """The status a cloud provider's node-class controller would publish; kwok's has none, so we do."""
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": now,
        "observedGeneration": 1,
    }
    return {"status": {"conditions": [condition]}}


def node_pool(pool: GpuPool, consolidate_after: str = "10s") -> dict[str, Any]:
    """A NodePool of GPU nodes labelled with their model, removed by Karpenter once empty."""
    spec = catalog.lookup(pool.model)
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool.name},
        "spec": {
            "template": {
                "metadata": {
                    # The model label the gpupack agent sets too: Karpenter needs it up front to know that
                    # this pool's nodes satisfy a placeholder's node selector. Not gpupack.io/enabled: its
                    # absence is what marks a node still to come for a placeholder (app.core.autoscale).
                    "labels": {
                        names.NODE_LABEL_GPU_MODEL: spec.name,
                        names.NODE_LABEL_GPU_MEMORY_MAX_MIB: str(spec.memory_mib),
                    }
                },
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NODE_CLASS,
                    },
                    "requirements": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [pool.instance_type]},
                    ],
                    "expireAfter": "Never",
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": consolidate_after},
            "limits": {"nvidia.com/gpu": str(pool.gpus * pool.max_nodes)},
        },
    }


def binaries(progress: Callable[[str], None]) -> Path:
    """The dir holding `karpenter-kwok` and `crds/` ($GPUPACK_KARPENTER, else tests/karpenter/build.sh)."""
    root = repo_root()
    if root is None or not (root / BUILD_RELPATH).is_file():
        raise BinariesError(f"{BUILD_RELPATH} not found: run from a source checkout or set GPUPACK_KARPENTER")
    progress("Karpenter kwok provider (tests/karpenter/build.sh; a first build takes minutes)")
    done = subprocess.run(["bash", str(root / BUILD_RELPATH)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BinariesError(f"{BUILD_RELPATH} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def spec(bins: Path, kubeconfig: Path, types_file: Path, ports: tuple[int, int]) -> ComponentSpec:
    """The karpenter-kwok process: leader election in gpupack-system, probes and metrics on `ports`."""
    metrics, health = ports
    env = {
        "KUBECONFIG": str(kubeconfig),
        "SYSTEM_NAMESPACE": "gpupack-system",
        "LEADER_ELECTION_NAMESPACE": "gpupack-system",
        "DISABLE_LEADER_ELECTION": "true",
        "INSTANCE_TYPES_FILE_PATH": str(types_file),
        "METRICS_PORT": str(metrics),
        "HEALTH_PROBE_PORT": str(health),
        # Short batches: the dev cluster has a handful of pending placeholders, not a busy queue.
        "BATCH_MAX_DURATION": "2s",
        "BATCH_IDLE_DURATION": "500ms",
        "LOG_LEVEL": "info",
    }
    return ComponentSpec(
        name=KARPENTER,
        argv=(str(bins / "karpenter-kwok"),),
        health=HealthCheck(f"http://127.0.0.1:{health}/healthz"),
        env=env,
        ready_timeout_s=90,
    )


def write_instance_types(layout: Layout, pools: list[GpuPool]) -> Path:
    path = layout.dir / "karpenter-instance-types.json"
    path.write_text(json.dumps(instance_types(pools), indent=2) + "\n")
    return path


def extender_rbac(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """What the extender needs to ask for nodes: placeholder pods in its namespace, their PriorityClass.

    The same rules as the chart renders with extender.autoscale.pools set (deploy/helm/gpupack).
    """
    name = "gpupack-extender-autoscale"
    subject = [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "create", "delete"]}],
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subject,
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["create"]}
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subject,
        },
    ]


def extender_flags(pool: GpuPool, interval_s: float = 2.0, grace_s: float = 2.0) -> tuple[str, ...]:
    """`extender serve` flags that turn the scale-up requests on for this pool (short dev timings)."""
    return (
        "--autoscale-pool", f"{catalog.lookup(pool.model).name}:{pool.gpus}",
        "--autoscale-interval", f"{interval_s:g}", "--autoscale-grace", f"{grace_s:g}",
    )  # fmt: skip


def nodeagents_spec(cluster_dir: Path) -> ComponentSpec:
    return ComponentSpec(
        name="gpupack-nodeagents",
        argv=(sys.executable, "-m", "tests.devcluster.nodeagents", "--dir", str(cluster_dir)),
    )


class KarpenterAddon:
    """Karpenter's CRDs and objects, the karpenter-kwok process, and the agents for the nodes it adds."""

    name = "karpenter"

    def __init__(self, pool: GpuPool, consolidate_after: str = "10s") -> None:
        self.pool = pool
        self.consolidate_after = consolidate_after

    def start(self, cluster: Cluster, nodes: Sequence[str], progress: Progress) -> None:
        del nodes  # Karpenter only ever adds nodes of its own pools
        bins = binaries(progress)
        with cluster.api_client() as api:
            for crd in sorted((bins / "crds").glob("*.yaml")):
                install_crd(api, yaml.safe_load(crd.read_text()))
            install_rbac(api, extender_rbac(GPUPACK_NAMESPACE, EXTENDER))
            kube = Kube(api)
            _create(kube, NODE_CLASSES, node_class())
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            status_path = f"{NODE_CLASSES}/{NODE_CLASS}/status"
            kube.send(Request("PATCH", status_path, node_class_ready_status(now), content_type=MERGE_PATCH))
            _create(kube, NODE_POOLS, node_pool(self.pool, self.consolidate_after))
        types_file = write_instance_types(cluster.layout, [self.pool])
        ports = free_ports(2)
        cluster.start_process(spec(bins, cluster.kubeconfig, types_file, (ports[0], ports[1])), progress)
        cluster.start_process(nodeagents_spec(cluster.dir), progress)


def _create(kube: Kube, collection: str, body: dict[str, Any]) -> None:
    """POST `body` to `collection`; one that exists already is fine (an addon re-run)."""
    try:
        kube.send(Request("POST", collection, body))
    except KubeError as exc:
        if not exc.is_conflict:
            raise


def autoscaler_addons(model: str, gpus: int = 8) -> tuple[Any, ...]:
    """`make dev` with --autoscaler: the usual addons, the extender asking for nodes, then Karpenter."""
    pool = GpuPool(model, gpus)
    return (Definitions(), Components(extender_extra=extender_flags(pool)), KarpenterAddon(pool))
