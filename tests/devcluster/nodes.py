"""Fake GPU nodes: the Node body (pure) and creating nodes that kwok keeps Ready."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core import catalog, names
from app.kube import calls, paths
from app.kube.client import Kube

from .components import KWOK_NODE_ANNOTATION
from .poll import WaitTimeoutError, wait_for

NODE_CPU = "32"
NODE_MEMORY = "256Gi"
NODE_PODS = "110"


# Dev-cluster node annotations: the MIG layout its simulated agent is to report (`make dev` with --mig).
MIG_LAYOUT_ANNOTATION = "dev.gpupack.io/mig-layout"  # comma list of profiles, e.g. "3g.40gb,1g.10gb"
MIG_GPUS_ANNOTATION = "dev.gpupack.io/mig-gpus"  # how many of its GPUs (the first ones) are partitioned


@dataclass(frozen=True, slots=True)
class MigLayout:
    """The MIG devices each of a node's first `gpus` GPUs is partitioned into (no profiles: no MIG)."""

    profiles: tuple[str, ...] = ()
    gpus: int = 0

    @classmethod
    def parse(cls, raw: str, gpus: int) -> MigLayout:
        return cls(tuple(p.strip() for p in raw.split(",") if p.strip()), gpus)

    def error(self, model: str, gpus_per_node: int) -> str:
        """Why this layout cannot be made on `gpus_per_node` GPUs of `model` ("" when it can)."""
        if not self.profiles:
            return ""
        if not 1 <= self.gpus <= gpus_per_node:
            return f"MIG GPUs per node={self.gpus}: must be from 1 to the GPUs per node ({gpus_per_node})"
        return catalog.mig_layout_error(catalog.lookup(model), self.profiles)

    def annotations(self) -> dict[str, str]:
        if not self.profiles:
            return {}
        return {MIG_LAYOUT_ANNOTATION: ",".join(self.profiles), MIG_GPUS_ANNOTATION: str(self.gpus)}

    @classmethod
    def of(cls, annotations: Mapping[str, str]) -> MigLayout:
        raw = annotations.get(MIG_LAYOUT_ANNOTATION, "")
        gpus = annotations.get(MIG_GPUS_ANNOTATION, "0")
        return cls.parse(raw, int(gpus) if gpus.isdigit() else 0)


def node_body(
    name: str,
    gpus: int,
    model: str,
    *,
    cpu: str = NODE_CPU,
    memory: str = NODE_MEMORY,
    labels: dict[str, str] | None = None,
    mig: MigLayout | None = None,
) -> dict[str, Any]:
    """A kwok-managed Node advertising `gpus` GPUs of `model` the way the gpupack agent would (DESIGN.md).

    Labels: gpupack.io/enabled, gpu-model, gpu-memory-max-mib. Capacity = allocatable, including
    gpupack.io/gpu-milli (1000 per GPU) and gpupack.io/gpu-memory-mib (sum of GPU memory). `model` is a
    catalogue name or alias; KeyError (listing the known models) otherwise.
    """
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: must be >= 1")
    spec = catalog.lookup(model)
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": NODE_PODS,
        names.RESOURCE_GPU_MILLI: str(1000 * gpus),
        names.RESOURCE_GPU_MEMORY_MIB: str(spec.memory_mib * gpus),
    }
    key, value = KWOK_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                key: value,
                "node.alpha.kubernetes.io/ttl": "0",
                **(mig or MigLayout()).annotations(),
            },
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                names.NODE_LABEL_ENABLED: "true",
                names.NODE_LABEL_GPU_MODEL: spec.name,
                names.NODE_LABEL_GPU_MEMORY_MAX_MIB: str(spec.memory_mib),
                **(labels or {}),
            },
        },
        "spec": {"providerID": f"kwok://{name}"},
        # The apiserver keeps status on Node create (a kubelet registers this way), and kwok's
        # node-initialize stage keeps capacity/allocatable that are already set.
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "kwok",
                "kubeProxyVersion": "kwok",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
        },
    }


def node_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def create_gpu_nodes(
    api_client: Any,
    count: int,
    gpus_per_node: int,
    model: str,
    *,
    prefix: str = "gpu-node-",
    labels: dict[str, str] | None = None,
    ready_timeout_s: float = 60.0,
    mig: MigLayout | None = None,
) -> list[str]:
    """Create `count` fake GPU nodes named <prefix>0.. and wait until kwok reports each Ready."""
    kube = Kube(api_client)
    created = node_names(prefix, count)
    for name in created:
        kube.send(calls.create(node_body(name, gpus_per_node, model, labels=labels, mig=mig)))
    wait_for_ready_nodes(api_client, created, ready_timeout_s)
    return created


def wait_for_ready_nodes(api_client: Any, wanted: Sequence[str], timeout_s: float) -> None:
    kube = Kube(api_client)
    missing = list(wanted)

    def all_ready() -> bool:
        listed = kube.send(calls.list_request(paths.nodes())).get("items") or []
        ready = {n["metadata"]["name"] for n in listed if is_ready(n)}
        missing[:] = [n for n in wanted if n not in ready]
        return not missing

    try:
        wait_for(all_ready, timeout_s, "nodes Ready")
    except WaitTimeoutError:
        raise WaitTimeoutError(f"kwok did not report Ready within {timeout_s:.0f}s: {missing}") from None
