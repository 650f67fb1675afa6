"""The node agent as real processes (--sim) against the real control plane: GPUNode, labels, resources."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from simagents import SimAgents, write_sim

from app.core import catalog, names
from app.core.model import Allocation
from app.kube.gpunode import GPUNode, read
from tests.devcluster import Cluster, wait_for
from tests.devcluster.addons import install_rbac

REPO = Path(__file__).resolve().parents[2]
MODEL = "T4"
MEM = catalog.lookup(MODEL).memory_mib
HEARTBEAT_S = 2  # so staleness (3 heartbeats) shows within seconds


@pytest.fixture(scope="module")
def installed(cluster: Cluster, kube: Any, gpunode_crd: None) -> None:
    """The CRD and the agent's RBAC, exactly as deploy/ ships them."""
    docs = yaml.safe_load_all((REPO / "deploy/agent/rbac.yaml").read_text())
    # The ServiceAccount is implied by the harness's static token.
    install_rbac(kube, [d for d in docs if d["kind"] in {"ClusterRole", "ClusterRoleBinding"}])


def qty(resources: dict[str, str], key: str) -> int | None:
    """A resource quantity as an int ("2k" == 2000: the API server stores quantities canonically)."""
    raw = resources.get(key)
    return None if raw is None else int(parse_quantity(raw))


@pytest.fixture
def agents(cluster: Cluster, installed: None, tmp_path: Path) -> Iterator[SimAgents]:
    a = SimAgents(cluster, tmp_path, HEARTBEAT_S)
    yield a
    a.stop_all()


def writes(metrics_text: str) -> float:
    """Successful API writes so far, from the agent's own counter."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("gpupack_agent_kube_writes_total{") and 'result="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def fresh(gn: GPUNode) -> bool:
    """The agent wrote within its own staleness limit (what the extender checks at each request)."""
    return not gn.heartbeat.stale_reason(time.time())


def get_gpunode(kube: Any, name: str) -> GPUNode | None:
    api = client.CustomObjectsApi(kube)
    try:
        obj = api.get_cluster_custom_object(
            names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return read(obj)


def reported(kube: Any, name: str, cond: Callable[[GPUNode], bool]) -> Callable[[], GPUNode | None]:
    def check() -> GPUNode | None:
        gn = get_gpunode(kube, name)
        return gn if gn is not None and gn.status is not None and cond(gn) else None

    return check


def test_agents_publish_gpunode_labels_and_resources(
    agents: SimAgents, gpu_nodes: Callable[..., list[str]], core: Any, kube: Any
) -> None:
    # The kwok nodes start out advertising 8 A100s; the agents must correct that to what NVML sees.
    nodes = gpu_nodes(2, gpus_per_node=8, model="A100-40GB")
    for n in nodes:
        write_sim(agents.sim(n), [{"model": MODEL}, {"model": MODEL, "base_used_mib": 300}])
        agents.start(n)
    for n in nodes:
        gn = wait_for(reported(kube, n, lambda g: len(g.status.gpus) == 2), 30, f"GPUNode {n}")  # type: ignore[union-attr]
        assert [(g.index, g.model, g.memory_mib) for g in gn.spec.gpus] == [(0, MODEL, MEM), (1, MODEL, MEM)]
        assert gn.status is not None and fresh(gn)
        assert gn.status.stale_after_seconds == 3 * HEARTBEAT_S
        assert [g.memory_used_mib for g in gn.status.gpus] == [0, 300]
        assert gn.status.mps.isolation == "none"  # no MPS binary here

        def node_ok(n: str = n) -> bool:
            node = core.read_node(n)
            labels, cap = node.metadata.labels, node.status.capacity or {}
            return (
                labels.get(names.NODE_LABEL_GPU_MODEL) == MODEL
                and labels.get(names.NODE_LABEL_GPU_MEMORY_MAX_MIB) == str(MEM)
                and labels.get(names.NODE_LABEL_ENABLED) == "true"
                and qty(cap, names.RESOURCE_GPU_MILLI) == 2000
                and qty(cap, names.RESOURCE_GPU_MEMORY_MIB) == 2 * MEM
                and qty(node.status.allocatable or {}, names.RESOURCE_GPU_MILLI) == 2000
            )

        wait_for(node_ok, 30, f"labels and extended resources on {n}")
    # GPUNodes are owned by their Node (garbage-collected with it).
    raw = client.CustomObjectsApi(kube).get_cluster_custom_object(
        names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL, nodes[0]
    )
    assert raw["metadata"]["ownerReferences"][0]["uid"] == core.read_node(nodes[0]).metadata.uid
    text = agents.metrics(nodes[0])
    assert 'gpupack_agent_gpu_memory_used_mib{gpu="1"' in text


def test_status_follows_the_gpus_and_resources_are_reasserted(
    agents: SimAgents, gpu_nodes: Callable[..., list[str]], core: Any, kube: Any
) -> None:
    (n,) = gpu_nodes(1, gpus_per_node=2, model=MODEL)
    write_sim(agents.sim(n), [{"model": MODEL}, {"model": MODEL}])
    agents.start(n)
    wait_for(reported(kube, n, lambda g: len(g.status.gpus) == 2), 30, "first report")  # type: ignore[union-attr]

    # A process outside any pod appears: used memory rises and the process is listed as foreign.
    write_sim(
        agents.sim(n), [{"model": MODEL}, {"model": MODEL, "processes": [{"pid": 777, "used_mib": 5000}]}]
    )
    gn = wait_for(
        reported(kube, n, lambda g: g.status.gpus[1].memory_used_mib == 5000),  # type: ignore[union-attr]
        15,
        "foreign process in status",
    )
    assert gn.status is not None
    assert [(p.pid, p.pod_uid) for p in gn.status.gpus[1].processes] == [(777, "")]
    assert gn.status.gpus[1].memory_free_mib == MEM - 5000

    # GPU 0 is lost: it is reported unhealthy and no longer advertised; GPU 1 still reports.
    write_sim(agents.sim(n), [{"model": MODEL, "lost": True}, {"model": MODEL}])
    gn = wait_for(reported(kube, n, lambda g: not g.status.gpus[0].healthy), 15, "lost GPU")  # type: ignore[union-attr]
    assert gn.status is not None
    assert "NVML_ERROR_GPU_IS_LOST" in gn.status.gpus[0].reason
    assert gn.status.gpus[1].healthy and gn.status.gpus[1].memory_used_mib == 0
    assert gn.spec.gpus[0].uuid == gn.status.gpus[0].uuid  # inventory kept while lost
    wait_for(
        lambda: qty(core.read_node(n).status.capacity or {}, names.RESOURCE_GPU_MILLI) == 1000,
        15,
        "capacity without the lost GPU",
    )

    # The kubelet drops extended resources when it re-registers: the agent puts them back within a heartbeat.
    ours = {names.RESOURCE_GPU_MILLI: None, names.RESOURCE_GPU_MEMORY_MIB: None}
    patch = {"status": {"capacity": ours, "allocatable": ours}}
    cleared = core.patch_node_status(n, patch)
    assert names.RESOURCE_GPU_MILLI not in (cleared.status.capacity or {})
    wait_for(
        lambda: qty(core.read_node(n).status.capacity or {}, names.RESOURCE_GPU_MILLI) == 1000,
        3 * HEARTBEAT_S + 5,
        "extended resources re-asserted",
    )


def test_wrong_gpu_raises_an_event_on_the_pod(
    agents: SimAgents, gpu_nodes: Callable[..., list[str]], core: Any, kube: Any, namespace: str
) -> None:
    (n,) = gpu_nodes(1, gpus_per_node=2, model=MODEL)
    write_sim(agents.sim(n), [{"model": MODEL}, {"model": MODEL}])
    agents.start(n)
    gn = wait_for(reported(kube, n, lambda g: len(g.status.gpus) == 2), 30, "first report")  # type: ignore[union-attr]
    alloc = Allocation(n, (0,), (gn.spec.gpus[0].uuid,), 500, 4000)
    pod = core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "train",
                "labels": {names.LABEL_MANAGED: "true"},
                "annotations": alloc.to_annotations(),
            },
            "spec": {"nodeName": n, "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    uid = pod.metadata.uid
    # Its process shows up on GPU 1 instead of its GPU 0.
    write_sim(
        agents.sim(n),
        [{"model": MODEL}, {"model": MODEL, "processes": [{"pid": 4242, "used_mib": 1000, "pod_uid": uid}]}],
    )

    def event() -> Any:
        evs = core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={uid}").items
        return next((e for e in evs if e.reason == "GpupackWrongGPU"), None)

    ev = wait_for(event, 20, "GpupackWrongGPU event")
    assert ev.type == "Warning" and "run on GPU 1" in ev.message
    gn = wait_for(
        reported(kube, n, lambda g: any(p.pod_uid == uid for p in g.status.gpus[1].processes)),  # type: ignore[union-attr]
        15,
        "process attributed to the pod",
    )
    assert gn.status is not None and gn.status.summary.memory_allocated_mib == 4000


def test_stopped_agent_goes_stale_and_recovers_on_restart(
    agents: SimAgents, gpu_nodes: Callable[..., list[str]], kube: Any
) -> None:
    (n,) = gpu_nodes(1, gpus_per_node=1, model=MODEL)
    write_sim(agents.sim(n), [{"model": MODEL}])
    agents.start(n)

    def heartbeat() -> float:
        gn = get_gpunode(kube, n)
        return gn.status.heartbeat_time if gn and gn.status else 0.0

    first = wait_for(lambda: heartbeat() or None, 30, "first heartbeat")
    wait_for(lambda: heartbeat() > first, 3 * HEARTBEAT_S + 5, "heartbeat advancing")

    # With nothing changing, the agent writes twice per heartbeat: GPUNode status + node status.
    window = 5 * HEARTBEAT_S
    before, t0 = writes(agents.metrics(n)), time.monotonic()
    time.sleep(window)
    after, elapsed = writes(agents.metrics(n)), time.monotonic() - t0
    print(f"steady-state writes: {after - before:.0f} in {elapsed:.1f}s (heartbeat {HEARTBEAT_S}s)")
    assert after - before <= 2 * (elapsed / HEARTBEAT_S + 1)
    agents.stop(n)
    last = heartbeat()
    time.sleep(3 * HEARTBEAT_S + 1.5)  # longer than the staleness threshold
    assert heartbeat() == last, "heartbeat advanced with the agent stopped"
    gn = get_gpunode(kube, n)
    assert gn is not None and not fresh(gn)
    assert gn.heartbeat.stale_reason(time.time()).startswith("gpupack agent heartbeat is")

    agents.start(n)
    wait_for(lambda: heartbeat() > last, 3 * HEARTBEAT_S + 10, "fresh heartbeat after restart")
    gn = get_gpunode(kube, n)
    assert gn is not None and fresh(gn)
