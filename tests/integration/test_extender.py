"""The extender as a real process behind the real kube-scheduler: binds, packing = simulator, crash safety."""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from podshapes import webhook_pod

from app.core import catalog, names, podview, units
from app.core.hostres import HostResources
from app.core.model import Allocation, ClusterState, Demand
from app.core.placement import Placement, place, registry, to_allocation
from app.core.request import pod_demand
from app.kube import gpunode
from app.kube.client import Kube
from app.kube.stores import node_order_key
from tests.devcluster import GPUPACK_NAMESPACE, Cluster, ComponentSpec, HealthCheck, wait_for
from tests.devcluster.addons import install_rbac
from tests.devcluster.nodes import NODE_CPU, NODE_MEMORY

REPO = Path(__file__).resolve().parents[2]
POOL = "gpupack.test/pool"
MODEL = "A100-40GB"
LEASE_NS = GPUPACK_NAMESPACE
PROC = "gpupack-extender"

EXTENDER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["gpupack.io"], "resources": ["gpunodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["list", "watch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]


def extender_rbac() -> list[dict[str, Any]]:
    """The extender's ClusterRole and its binding to the gpupack-extender ServiceAccount."""
    return [
        {"kind": "ClusterRole", "metadata": {"name": "gpupack-extender"}, "rules": EXTENDER_RULES},
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpupack-extender"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpupack-extender",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "gpupack-extender", "namespace": LEASE_NS}],
        },
    ]


@pytest.fixture(scope="module")
def setup(cluster: Cluster, kube: Any, gpunode_crd: None) -> Iterator[Kube]:
    """CRD, the extender's RBAC (what the chart must ship); yields an admin client.

    The lease namespace (gpupack-system) is the harness's own: it creates it at start. The GPUNodes this
    module creates are deleted at its end: their kwok Nodes go with the module, and a GPUNode outliving its
    Node would steer later modules (explain, top, quota) that list every GPUNode.
    """
    install_rbac(kube, extender_rbac())
    admin = Kube.connect(str(cluster.kubeconfig))
    before = _gpunode_names(kube)
    yield admin
    for name in _gpunode_names(kube) - before:
        client.CustomObjectsApi(kube).delete_cluster_custom_object(
            names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL, name
        )


def _gpunode_names(kube: Any) -> set[str]:
    listed = client.CustomObjectsApi(kube).list_cluster_custom_object(
        names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL
    )
    return {item["metadata"]["name"] for item in listed["items"]}


def scheduler_extender_url(cluster: Cluster) -> str:
    """Where kube-scheduler actually sends extender calls (read from its rendered config)."""
    conf = yaml.safe_load(cluster.layout.scheduler_config.read_text())
    return str(conf["extenders"][0]["urlPrefix"]).rstrip("/")


def start_extender(cluster: Cluster, policy: str = "binpack") -> str:
    url = scheduler_extender_url(cluster)
    port = url.rsplit(":", 1)[1]
    argv = (
        sys.executable, "-m", "app.cli", "extender", "serve",
        "--kubeconfig", str(cluster.kubeconfig_for("gpupack-extender")),
        "--host", "127.0.0.1", "--port", port, *cluster.extender_tls_flags(), "--policy", policy,
        "--lease-namespace", LEASE_NS, "--lease-duration", "3",
        "--heartbeat-timeout", "86400",  # the GPUNodes here are written once, not kept alive by agents
    )  # fmt: skip
    health = HealthCheck(f"http://127.0.0.1:{cluster.extender_ops_port}/readyz")
    cluster.start_process(ComponentSpec(PROC, argv, health=health, ready_timeout_s=90))
    return url


@pytest.fixture
def extender(cluster: Cluster, setup: Kube) -> Iterator[Callable[..., str]]:
    def start(policy: str = "binpack") -> str:
        return start_extender(cluster, policy)

    yield start
    if any(p.name == PROC for p in cluster.processes):
        cluster.stop_process(PROC)


def gpunode_body(name: str, gpus: int, beat: float, model: str = MODEL) -> dict[str, Any]:
    """A GPUNode as a healthy agent would report it: every GPU idle."""
    mem = catalog.lookup(model).memory_mib
    uuids = [f"GPU-{name}-{i}" for i in range(gpus)]
    spec = gpunode.GPUNodeSpec(
        node_name=name,
        gpus=tuple(
            gpunode.GpuSpec(
                uuid=u, index=i, model=model, product_name=model, memory_mib=mem, mps_capable=True
            )
            for i, u in enumerate(uuids)
        ),
    )
    status = gpunode.GPUNodeStatus(
        heartbeat_time=beat,
        gpus=tuple(
            gpunode.GpuStatus(uuid=u, index=i, healthy=True, memory_free_mib=mem) for i, u in enumerate(uuids)
        ),
    )
    return gpunode.GPUNode.of(name, spec, status).wire()


def create_gpunodes(kube: Kube, nodes: Sequence[str], gpus: int) -> None:
    for name in nodes:
        body = gpunode.read(gpunode_body(name, gpus, time.time()))
        assert body.status is not None
        kube.send(gpunode.create(name, body.spec))
        kube.send(gpunode.patch_status(name, body.status))


def gpu_pod(
    name: str, namespace: str, pool: str, *, milli: int = 0, mem: int = 0, count: int = 1, scheduler: str = ""
) -> dict[str, Any]:
    """A pod as the webhook leaves it (tests/integration/podshapes.py), on this test's pool of nodes."""
    return webhook_pod(
        name, pool=(POOL, pool), milli=milli, mem=mem, count=count, namespace=namespace, scheduler=scheduler
    )


def outcome(core: Any, namespace: str, name: str) -> str | None:
    """The node the pod is bound to, "unschedulable" once the scheduler gave up on it, else None."""
    pod = core.read_namespaced_pod(name, namespace)
    if pod.spec.node_name:
        return str(pod.spec.node_name)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return "unschedulable"
    return None


def allocations(core: Any, namespace: str) -> dict[str, tuple[str, Allocation | None]]:
    """pod name -> (bound node or "", allocation from its annotations)."""
    out = {}
    for p in core.list_namespaced_pod(namespace).items:
        out[p.metadata.name] = (
            p.spec.node_name or "",
            Allocation.from_annotations(p.metadata.annotations or {}),
        )
    return out


def assert_no_overcommit(allocs: dict[str, tuple[str, Allocation | None]], gpu_mem: int) -> None:
    milli: dict[tuple[str, int], int] = defaultdict(int)
    mem: dict[tuple[str, int], int] = defaultdict(int)
    for pod, (node, a) in allocs.items():
        if not node:
            continue
        assert a is not None, f"{pod} is bound to {node} without an allocation"
        assert a.node == node, f"{pod}: allocation on {a.node}, bound to {node}"
        for i in a.gpu_indexes:
            milli[(node, i)] += a.milli
            mem[(node, i)] += a.memory_mib
    assert all(v <= 1000 for v in milli.values()), {k: v for k, v in milli.items() if v > 1000}
    assert all(v <= gpu_mem for v in mem.values()), {k: v for k, v in mem.items() if v > gpu_mem}


def test_ordinary_pod_schedules_without_the_extender(
    cluster: Cluster, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    assert not any(p.name == PROC and p.alive() for p in cluster.processes)
    gpu_nodes(1, gpus_per_node=1, labels={POOL: namespace})
    body = {
        "metadata": {"name": "cpu", "namespace": namespace},
        "spec": {"nodeSelector": {POOL: namespace}, "containers": [{"name": "c", "image": "busybox"}]},
    }
    core.create_namespaced_pod(namespace, body)
    wait_for(lambda: outcome(core, namespace, "cpu") not in (None, "unschedulable"), 30, "plain pod bound")


def mixed_pods(n: int) -> list[dict[str, int]]:
    """A deterministic mix of fraction, memory and multi-GPU requests."""
    shapes = [
        {"milli": 250}, {"milli": 500}, {"milli": 1000, "count": 2}, {"mem": 8192}, {"milli": 750},
        {"milli": 500, "count": 2}, {"mem": 20480}, {"milli": 1000}, {"milli": 300},
        {"mem": 4096, "count": 2},
    ]  # fmt: skip
    return [shapes[(i * 7) % len(shapes)] for i in range(n)]


def predict(
    nodes: Sequence[str], gpus: int, shapes: Sequence[dict[str, int]], policy: str
) -> list[Allocation | None]:
    """The simulator's answer: `place` pod by pod over the same nodes in the same (natural) order.

    The nodes offer the kwok nodes' allocatable CPU and memory, as the extender sees them.
    """
    host = HostResources(int(NODE_CPU) * 1000, units.memory_mib(NODE_MEMORY).mib)
    state = ClusterState()
    for name in sorted(nodes, key=node_order_key):
        gn = gpunode.read(gpunode_body(name, gpus, beat=1.0))
        node = gn.to_model_node()
        state.nodes[name] = replace(node, cpu_milli_free=host.cpu_milli, memory_mib_free=host.memory_mib)
    pol = registry.create(policy)
    out: list[Allocation | None] = []
    for s in shapes:
        d = pod_demand(
            podview.read(
                gpu_pod(
                    "p", "ns", "pool", milli=s.get("milli", 0), mem=s.get("mem", 0), count=s.get("count", 1)
                )
            )
        )
        assert isinstance(d, Demand)
        got = place(list(state.nodes.values()), d, pol)
        if isinstance(got, Placement):
            a = to_allocation(got.node, d, got.gpus)
            state.apply(a)
            out.append(a)
        else:
            out.append(None)
    return out


def test_packing_matches_the_simulator(
    extender: Callable[..., str], setup: Kube, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    nodes = gpu_nodes(20, gpus_per_node=8, model=MODEL, labels={POOL: namespace})
    create_gpunodes(setup, nodes, 8)
    extender("binpack")
    shapes = mixed_pods(300)
    expected = predict(nodes, 8, shapes, "binpack")
    assert 0 < sum(e is None for e in expected) < 100  # the mix overflows the cluster
    # Whole and multi-GPU pods are part of the mix, and the simulator places them on empty GPUs.
    assert any(e is not None and e.milli == 1000 and len(e.gpu_indexes) == 2 for e in expected)
    for i, s in enumerate(shapes):
        name = f"p{i:03d}"
        core.create_namespaced_pod(namespace, gpu_pod(name, namespace, namespace, **s))
        wait_for(lambda name=name: outcome(core, namespace, name), 30, f"{name} bound or unschedulable")
    allocs = allocations(core, namespace)
    assert_no_overcommit(allocs, catalog.lookup(MODEL).memory_mib)
    got = [allocs[f"p{i:03d}"] for i in range(len(shapes))]
    for i, (exp, (node, a)) in enumerate(zip(expected, got, strict=True)):
        if exp is None:
            assert node == "", f"p{i:03d} should not fit, bound to {node}"
        else:
            assert (node, a) == (exp.node, exp), f"p{i:03d}"


def test_sigkill_mid_burst_loses_and_duplicates_nothing(  # noqa: PLR0917  (pytest fixtures)
    cluster: Cluster, extender: Callable[..., str], setup: Kube, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    nodes = gpu_nodes(4, gpus_per_node=8, model=MODEL, labels={POOL: namespace})
    create_gpunodes(setup, nodes, 8)
    extender("fragaware")
    shapes = [{"milli": (250, 500, 100)[i % 3]} for i in range(90)]  # 85 % of 32 GPUs: everything fits

    def create_all() -> None:
        for i, s in enumerate(shapes):
            core.create_namespaced_pod(namespace, gpu_pod(f"b{i:02d}", namespace, namespace, **s))

    creator = threading.Thread(target=create_all)
    creator.start()

    def bound() -> int:
        return sum(1 for node, _ in allocations(core, namespace).values() if node)

    try:
        wait_for(lambda: bound() >= 15, 60, "some pods bound")
        os.kill(cluster.process(PROC).pid, signal.SIGKILL)  # pods are still being created and bound
        at_kill = bound()
        start_extender(cluster, "fragaware")  # a new identity: waits for the dead one's lease to expire
    finally:
        creator.join()
    wait_for(lambda: bound() == len(shapes), 180, "every pod bound after the restart")
    assert at_kill < len(shapes)
    allocs = allocations(core, namespace)
    assert_no_overcommit(allocs, catalog.lookup(MODEL).memory_mib)
    for name, (node, a) in allocs.items():
        assert a is not None and a.node == node, name
        milli = shapes[int(name[1:])]["milli"]
        assert a.milli == milli, name


def _post(cluster: Cluster, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST as kube-scheduler does: HTTPS with the scheduler's client certificate."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with cluster.extender_opener().open(req, timeout=10) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def test_extender_answers_only_the_schedulers_client_certificate(
    cluster: Cluster, extender: Callable[..., str], namespace: str
) -> None:
    """/bind (and every other verb) without the client certificate: refused in the TLS handshake."""
    url = extender("binpack")
    args = {"PodName": "nobody", "PodNamespace": namespace, "PodUID": "", "Node": "n"}
    req = urllib.request.Request(
        f"{url}/bind", json.dumps(args).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    no_cert = ssl.create_default_context(cafile=str(cluster.ca_file))  # trusts the server, presents nothing
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=no_cert)
    )
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)) as err:
        opener.open(req, timeout=10).read()
    assert not isinstance(err.value, urllib.error.HTTPError)  # no HTTP status at all: TLS said no
    # the same call with the scheduler's certificate is answered (the pod does not exist)
    assert "not found" in _post(cluster, f"{url}/bind", args)["Error"].lower()
    # probes and metrics stay on the plain ops port
    plain = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with plain.open(f"http://127.0.0.1:{cluster.extender_ops_port}/metrics", timeout=10) as resp:
        assert b"gpupack_extender_binds_total" in resp.read()


def test_two_binds_racing_for_the_last_share_one_wins(  # noqa: PLR0917  (pytest fixtures)
    cluster: Cluster, extender: Callable[..., str], setup: Kube, core: Any, namespace: str, gpu_nodes: Any
) -> None:
    (node,) = gpu_nodes(1, gpus_per_node=1, model=MODEL, labels={POOL: namespace})
    create_gpunodes(setup, [node], 1)
    url = extender("binpack")
    uids = {}
    for name in ("r1", "r2"):  # no scheduler picks these up: we are the scheduler here
        p = core.create_namespaced_pod(
            namespace, gpu_pod(name, namespace, namespace, milli=600, scheduler="none")
        )
        uids[name] = p.metadata.uid
    results: dict[str, str] = {}
    gate = threading.Barrier(2)

    def bind(name: str) -> None:
        gate.wait()
        args = {"PodName": name, "PodNamespace": namespace, "PodUID": uids[name], "Node": node}
        results[name] = _post(cluster, f"{url}/bind", args)["Error"]

    threads = [threading.Thread(target=bind, args=(n,)) for n in uids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(bool(e) for e in results.values()) == [False, True], results
    loser = next(e for e in results.values() if e)
    assert "no GPU with 0.60 free: best has 0.40" in loser
    allocs = allocations(core, namespace)
    assert sum(1 for n, _ in allocs.values() if n) == 1
    assert_no_overcommit(allocs, catalog.lookup(MODEL).memory_mib)
