"""Agents (--sim), the extender and kube-scheduler together: live memory, stale heartbeats, verification.

Every component is a real process against the session's control plane: one agent per kwok node, each
reading its own simulated GPU file (rewritten by the tests to inject processes), the extender on the port
kube-scheduler calls, and pods placed by kube-scheduler through it. Each test keeps its pods to its own
nodes with a pool label (its namespace), so nodes left by other tests never take part.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from podshapes import webhook_pod
from simagents import SimAgents, write_sim

from app.core import catalog, names
from app.core.model import Allocation
from app.kube.gpunode import GPUNode, read
from tests.devcluster import (
    GPUPACK_NAMESPACE,
    Cluster,
    ComponentSpec,
    HealthCheck,
    WaitTimeoutError,
    wait_for,
)
from tests.devcluster.addons import MANIFEST_RELPATH, install_rbac, rbac_objects

REPO = Path(__file__).resolve().parents[2]
MODEL = "T4"
MEM = catalog.lookup(MODEL).memory_mib
POOL = "gpupack.test/pool"
HEARTBEAT_S = 2  # the agents' heartbeat: their GPUNodes go stale 3 heartbeats (6 s) after they stop
EXTENDER = "gpupack-extender"
FOREIGN_PID = 900


@pytest.fixture(scope="module")
def installed(kube: Any, gpunode_crd: None) -> None:
    """The GPUNode CRD (shared fixture) and the extender and agent RBAC of the rendered chart."""
    docs = yaml.safe_load_all((REPO / MANIFEST_RELPATH).read_text())
    install_rbac(kube, rbac_objects(docs, components=("extender", "agent")))


@dataclass(frozen=True)
class Extender:
    url: str  # https, as kube-scheduler calls it
    opener: urllib.request.OpenerDirector  # presents the scheduler's client certificate


@pytest.fixture(scope="module")
def extender(cluster: Cluster, installed: None) -> Iterator[Extender]:
    """The extender where kube-scheduler calls it (binpack); staleness = each agent's staleAfterSeconds."""
    url = cluster.extender_url.rstrip("/")
    argv = (
        sys.executable, "-m", "app.cli", "extender", "serve",
        "--kubeconfig", str(cluster.kubeconfig_for(EXTENDER)),
        "--host", "127.0.0.1", "--port", str(cluster.extender_port), *cluster.extender_tls_flags(),
        "--policy", "binpack",
        # The chart's Role allows only the Lease named gpupack-extender; one left by an extender another
        # module stopped expires within its own (short) duration.
        "--lease-namespace", GPUPACK_NAMESPACE, "--lease-duration", "3",
    )  # fmt: skip
    health = HealthCheck(f"http://127.0.0.1:{cluster.extender_ops_port}/readyz")
    cluster.start_process(ComponentSpec(EXTENDER, argv, health=health, ready_timeout_s=90))
    yield Extender(url, cluster.extender_opener())
    cluster.stop_process(EXTENDER)


def _get(ext: Extender, path: str) -> Any:
    with ext.opener.open(ext.url + path, timeout=5) as resp:
        return resp.read().decode()


def state_of(ext: Extender, node: str) -> dict[str, Any] | None:
    """The extender's /state row for `node` (None until its informer has the GPUNode)."""
    rows = json.loads(_get(ext, "/state"))["nodes"]
    return next((r for r in rows if r["name"] == node), None)


def explain(ext: Extender, namespace: str, pod: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        _get(ext, "/explain?" + urllib.parse.urlencode({"pod": f"{namespace}/{pod}"}))
    )
    return out


def explain_row(ext: Extender, namespace: str, pod: str, node: str) -> dict[str, Any]:
    out = explain(ext, namespace, pod)
    return next(r for r in out["nodes"] if r["node"] == node)


@pytest.fixture
def agents(cluster: Cluster, installed: None, tmp_path: Path) -> Iterator[SimAgents]:
    a = SimAgents(cluster, tmp_path, HEARTBEAT_S, extra_args=("--no-mps",))
    yield a
    a.stop_all()


@pytest.fixture
def node_with_agent(
    agents: SimAgents, extender: Extender, gpu_nodes: Callable[..., list[str]], namespace: str
) -> Callable[[list[dict[str, Any]]], str]:
    """One kwok node in this test's pool with `gpus` simulated, its agent running, seen by the extender."""

    def make(gpus: list[dict[str, Any]]) -> str:
        (n,) = gpu_nodes(1, gpus_per_node=len(gpus), model=MODEL, labels={POOL: namespace})
        write_sim(agents.sim(n), gpus)
        agents.start(n)

        def seen() -> dict[str, Any] | None:
            row = state_of(extender, n)
            return row if row and row["schedulable"] and len(row["gpus"]) == len(gpus) else None

        wait_for(seen, 30, f"the extender sees {n}'s GPUNode, schedulable")
        return n

    return make


def gpu_pod(
    name: str, namespace: str, fraction: str, count: int = 1, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """A pod as the webhook leaves it (tests/integration/podshapes.py), on this test's pool of nodes."""
    milli = round(float(fraction) * 1000)
    pod = webhook_pod(
        name, pool=(POOL, namespace), milli=milli, count=count, namespace=namespace, annotations=extra
    )
    pod["metadata"]["annotations"][names.GPU_FRACTION] = fraction  # as the user wrote it
    return pod


def bound(core: Any, namespace: str, name: str) -> tuple[str, Allocation] | None:
    """(node, allocation) once the pod is bound."""
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.spec.node_name:
        return None
    alloc = Allocation.from_annotations(pod.metadata.annotations or {})
    assert alloc is not None, f"{name} is bound to {pod.spec.node_name} without allocation annotations"
    return pod.spec.node_name, alloc


def unschedulable(core: Any, namespace: str, name: str) -> str | None:
    """The PodScheduled=False message once kube-scheduler gave up on the pod (None while it has not)."""
    pod = core.read_namespaced_pod(name, namespace)
    assert not pod.spec.node_name, f"{name} was bound to {pod.spec.node_name}"
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


class NotRetriedError(AssertionError):
    """kube-scheduler did not retry a pod the extender refused after the refusal's cause went away."""


# kube-scheduler puts a pod every node refused into its unschedulable pool and retries it only on a cluster
# event (or after 5 minutes). GPUNode changes are no such event, so the agent bumps a Node annotation
# (gpupack.io/capacity-changed-at) when its node can take more: these tests fail without that nudge.
RETRY_S = 15  # kube-scheduler's test backoff is 1-2 s: a retried pod is bound well within this


def retried(core: Any, namespace: str, name: str) -> tuple[str, Allocation]:
    """(node, allocation) once kube-scheduler retried the pod and it got bound; NotRetriedError otherwise."""
    try:
        got: tuple[str, Allocation] = wait_for(lambda: bound(core, namespace, name), RETRY_S, f"{name} bound")
    except WaitTimeoutError:
        raise NotRetriedError(f"{name} still Pending {RETRY_S}s after the extender would place it") from None
    return got


def events(core: Any, namespace: str, uid: str) -> list[Any]:
    return list(core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={uid}").items)


def gpunode(kube: Any, name: str) -> GPUNode | None:
    try:
        obj = client.CustomObjectsApi(kube).get_cluster_custom_object(
            names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return read(obj)


def gpu_row(url: str, node: str, index: int) -> dict[str, Any]:
    return dict((state_of(url, node) or {"gpus": [{}] * (index + 1)})["gpus"][index])


FOREIGN_NOTE = "used by processes outside gpupack pods"


def test_memory_held_outside_gpupack_steers_placement(
    node_with_agent: Callable[[list[dict[str, Any]]], str],
    agents: SimAgents,
    extender: Extender,
    core: Any,
    namespace: str,
) -> None:
    # GPU 0 holds a process outside any pod using 90 % of its memory; on paper both GPUs are empty.
    foreign = int(MEM * 0.9)
    busy = {"model": MODEL, "processes": [{"pid": FOREIGN_PID, "used_mib": foreign}]}
    n = node_with_agent([busy, {"model": MODEL}])
    wait_for(lambda: gpu_row(extender, n, 0).get("foreignMiB") == foreign, 15, "GPU 0's foreign usage seen")

    # Best fit would pick GPU 0 (first index on a tie); foreign memory rules it out, so GPU 1 it is.
    core.create_namespaced_pod(namespace, gpu_pod("a", namespace, "0.5"))
    node, alloc = wait_for(lambda: bound(core, namespace, "a"), 30, "pod a bound")
    assert (node, alloc.gpu_indexes, alloc.milli) == (n, (1,), 500)

    # 0.6 fits neither: GPU 1 has 0.50 left, GPU 0 has the share but not the memory.
    core.create_namespaced_pod(namespace, gpu_pod("b", namespace, "0.6"))
    message = wait_for(lambda: unschedulable(core, namespace, "b"), 30, "pod b unschedulable")
    row = explain_row(extender, namespace, "b", n)
    assert not row["fits"] and FOREIGN_NOTE in row["reason"], row
    assert FOREIGN_NOTE in message, message  # kube-scheduler passes the extender's reason on

    # The process exits: once the agent reports it, pod b goes where it now fits - GPU 0, the only one.
    write_sim(agents.sim(n), [{"model": MODEL}, {"model": MODEL}])
    wait_for(lambda: gpu_row(extender, n, 0).get("foreignMiB") == 0, 15, "GPU 0 free of foreign usage")
    # Only this node's row: other tests' nodes share the session cluster, and the pod's node affinity
    # (which /explain does not apply) keeps it in this test's pool.
    row = explain_row(extender, namespace, "b", n)
    assert row["fits"], row
    node, alloc = retried(core, namespace, "b")
    assert (node, alloc.gpu_indexes, alloc.milli) == (n, (0,), 600)


def test_whole_gpu_pods_schedule_on_idle_gpus(
    node_with_agent: Callable[[list[dict[str, Any]]], str], extender: str, core: Any, namespace: str
) -> None:
    # Real GPUs report driver memory as used even when idle; it belongs to no process, so it is no
    # reservation and no foreign usage either.
    n = node_with_agent([{"model": MODEL, "base_used_mib": 420} for _ in range(3)])
    assert gpu_row(extender, n, 0)["liveFreeMiB"] == MEM - 420
    core.create_namespaced_pod(namespace, gpu_pod("one", namespace, "1"))
    node, alloc = wait_for(lambda: bound(core, namespace, "one"), 30, "whole-GPU pod bound")
    assert (node, alloc.gpu_indexes, alloc.milli, alloc.memory_mib) == (n, (0,), 1000, MEM)
    core.create_namespaced_pod(namespace, gpu_pod("two", namespace, "1", count=2))
    node, alloc = wait_for(lambda: bound(core, namespace, "two"), 30, "2-GPU pod bound")
    assert (node, alloc.gpu_indexes, alloc.milli) == (n, (1, 2), 1000)


def test_two_halves_share_a_gpu_when_the_first_uses_all_of_its_half(
    node_with_agent: Callable[[list[dict[str, Any]]], str],
    agents: SimAgents,
    extender: str,
    core: Any,
    namespace: str,
) -> None:
    n = node_with_agent([{"model": MODEL}])
    first = core.create_namespaced_pod(namespace, gpu_pod("h1", namespace, "0.5"))
    _, alloc = wait_for(lambda: bound(core, namespace, "h1"), 30, "first half bound")
    # The first pod allocates every MiB of its half: NVML now shows half the GPU used.
    proc = {"pid": 6001, "used_mib": alloc.memory_mib, "pod_uid": first.metadata.uid, "container": "main"}
    write_sim(agents.sim(n), [{"model": MODEL, "processes": [proc]}])
    wait_for(
        lambda: gpu_row(extender, n, 0).get("liveFreeMiB") == MEM - alloc.memory_mib,
        15,
        "the extender sees the first pod's usage",
    )
    assert gpu_row(extender, n, 0)["foreignMiB"] == 0  # its own pod's usage is not foreign
    core.create_namespaced_pod(namespace, gpu_pod("h2", namespace, "0.5"))
    node, second = wait_for(lambda: bound(core, namespace, "h2"), 30, "second half bound")
    assert (node, second.gpu_indexes) == (n, (0,))


def test_foreign_process_blocks_a_second_half_on_a_16gib_gpu(
    agents: SimAgents,
    extender: str,
    gpu_nodes: Callable[..., list[str]],
    core: Any,
    namespace: str,
) -> None:
    model = "V100M16"
    total = catalog.lookup(model).memory_mib
    (n,) = gpu_nodes(1, gpus_per_node=1, model=model, labels={POOL: namespace})
    write_sim(agents.sim(n), [{"model": model}])
    agents.start(n)
    wait_for(lambda: (state_of(extender, n) or {}).get("schedulable"), 30, f"the extender sees {n}")
    core.create_namespaced_pod(namespace, gpu_pod("idle", namespace, "0.5"))
    wait_for(lambda: bound(core, namespace, "idle"), 30, "the idle 0.5 tenant bound")
    foreign = 7987  # 7.8 GiB held by a process that belongs to no gpupack pod
    write_sim(agents.sim(n), [{"model": model, "processes": [{"pid": FOREIGN_PID, "used_mib": foreign}]}])
    wait_for(lambda: gpu_row(extender, n, 0).get("foreignMiB") == foreign, 15, "foreign usage seen")
    core.create_namespaced_pod(namespace, gpu_pod("second", namespace, "0.5"))
    message = wait_for(lambda: unschedulable(core, namespace, "second"), 30, "second 0.5 refused")
    assert f"{foreign} MiB {FOREIGN_NOTE}" in message, message
    assert f"{total} MiB total" in message, message


def test_an_mps_pod_never_lands_on_a_node_without_mps(
    node_with_agent: Callable[[list[dict[str, Any]]], str], extender: str, core: Any, namespace: str
) -> None:
    n = node_with_agent([{"model": MODEL}])  # the agents here run with --no-mps
    assert (state_of(extender, n) or {}).get("mps") is False
    core.create_namespaced_pod(namespace, gpu_pod("m", namespace, "0.5", extra={names.ISOLATION: "mps"}))
    message = wait_for(lambda: unschedulable(core, namespace, "m"), 30, "mps pod refused")
    assert "isolation=mps" in message and "MPS is disabled" in message, message
    # Without an explicit isolation the pod co-locates (no MPS limits), as documented.
    core.create_namespaced_pod(namespace, gpu_pod("plain", namespace, "0.5"))
    node, _ = wait_for(lambda: bound(core, namespace, "plain"), 30, "plain pod bound")
    assert node == n


def test_a_pod_requiring_per_cgroup_memory_stays_pending_on_an_older_driver_naming_both(
    node_with_agent: Callable[[list[dict[str, Any]]], str],
    extender: str,
    core: Any,
    kube: Any,
    namespace: str,
) -> None:
    n = node_with_agent([{"model": MODEL}])  # the simulated driver is 550.54.15, below r615
    status = gpunode(kube, n)
    assert status is not None
    (gpu,) = status.status.gpus
    assert gpu.isolation is not None and gpu.isolation.driver_version.startswith("550.")
    assert gpu.isolation.memory == "none"
    pod = gpu_pod("strict", namespace, "0.5", extra={names.MEMORY_ENFORCEMENT: "per-cgroup"})
    core.create_namespaced_pod(namespace, pod)
    message = wait_for(lambda: unschedulable(core, namespace, "strict"), 30, "the pod refused")
    want = (
        f"pod requires GPU memory enforcement 'per-cgroup' ({names.MEMORY_ENFORCEMENT}), "
        "but this node's GPUs give at most 'none'"
    )
    assert want in message, message
    assert want in json.dumps(explain_row(extender, namespace, "strict", n)), explain(
        extender, namespace, "strict"
    )


def test_stale_agent_makes_its_node_unschedulable_until_it_returns(
    node_with_agent: Callable[[list[dict[str, Any]]], str],
    agents: SimAgents,
    extender: Extender,
    core: Any,
    namespace: str,
) -> None:
    n = node_with_agent([{"model": MODEL}])
    agents.stop(n)

    def stale() -> dict[str, Any] | None:
        row = state_of(extender, n)
        return row if row is not None and not row["schedulable"] else None

    row = wait_for(stale, 3 * HEARTBEAT_S + 10, f"{n} unschedulable once its agent stopped")
    assert "heartbeat" in row["reason"], row

    # The only node in the pool has every GPU free, yet nothing goes there while its agent is silent.
    core.create_namespaced_pod(namespace, gpu_pod("s", namespace, "0.5"))
    message = wait_for(lambda: unschedulable(core, namespace, "s"), 30, "pod s unschedulable")
    reason = explain_row(extender, namespace, "s", n)
    assert not reason["fits"] and "heartbeat" in reason["reason"], reason
    assert "heartbeat" in message, message

    agents.start(n)
    wait_for(lambda: (state_of(extender, n) or {}).get("schedulable"), 15, f"{n} schedulable again")
    row = explain_row(extender, namespace, "s", n)
    assert row["fits"], row
    node, alloc = retried(core, namespace, "s")
    assert (node, alloc.gpu_indexes) == (n, (0,))


def test_agent_verifies_a_scheduled_pod_against_its_allocation(
    node_with_agent: Callable[[list[dict[str, Any]]], str],
    agents: SimAgents,
    core: Any,
    kube: Any,
    namespace: str,
) -> None:
    n = node_with_agent([{"model": MODEL}, {"model": MODEL}])
    pod = core.create_namespaced_pod(namespace, gpu_pod("w", namespace, "0.5"))
    uid = pod.metadata.uid
    node, alloc = wait_for(lambda: bound(core, namespace, "w"), 30, "pod w bound")
    assert node == n and len(alloc.gpu_indexes) == 1 and alloc.memory_mib > 0
    (gpu,) = alloc.gpu_indexes
    wait_for(
        lambda: core.read_namespaced_pod("w", namespace).status.phase == "Running", 30, "pod w Running (kwok)"
    )

    def with_process(used_mib: int) -> list[dict[str, Any]]:
        proc = {"pid": 5001, "used_mib": used_mib, "pod_uid": uid, "container": "main"}
        return [{"model": MODEL, "processes": [proc] if i == gpu else []} for i in range(2)]

    def pod_metric(name: str) -> float | None:
        return agents.metric(n, name, namespace=namespace, pod="w", gpu=str(gpu))

    def violations() -> float:
        return agents.metric(n, "gpupack_agent_violations_total", kind="over_memory") or 0.0

    before = violations()

    # Within its limit: reported on its GPU as the pod's, checked, and no complaint.
    within = alloc.memory_mib - 1000
    write_sim(agents.sim(n), with_process(within))

    def attributed() -> GPUNode | None:
        gn = gpunode(kube, n)
        if gn is None or gn.status is None:
            return None
        procs = gn.status.gpus[gpu].processes
        return gn if [(p.pid, p.pod_uid) for p in procs] == [(5001, uid)] else None

    gn = wait_for(attributed, 15, "the process in GPUNode status as the pod's, on its GPU")
    assert gn.status is not None
    assert all(not g.processes for g in gn.status.gpus if g.index != gpu)
    # The per-pod gauges are set in the cycle that verified the pod; a violation found there is already sent.
    wait_for(lambda: pod_metric("gpupack_agent_pod_memory_used_mib") == within, 15, "per-pod usage metric")
    assert pod_metric("gpupack_agent_pod_memory_limit_mib") == alloc.memory_mib
    assert [e.reason for e in events(core, namespace, uid) if e.reason.startswith("Gpupack")] == []
    assert violations() == before

    # Over its limit: a Warning Event on the pod and one more violation counted.
    over = alloc.memory_mib + 500
    write_sim(agents.sim(n), with_process(over))

    def over_event() -> Any:
        return next((e for e in events(core, namespace, uid) if e.reason == "GpupackMemoryOverLimit"), None)

    ev = wait_for(over_event, 15, "GpupackMemoryOverLimit event on the pod")
    assert ev.type == "Warning", ev
    assert f"use {over} MiB on GPU {gpu}" in ev.message and f"{alloc.memory_mib} MiB limit" in ev.message, (
        ev.message
    )
    wait_for(lambda: violations() == before + 1, 10, "violations_total{kind=over_memory} incremented")
