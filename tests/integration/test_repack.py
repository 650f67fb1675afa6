"""`gpupack repack` on the real control plane: Deployments + a PDB, evictions through the Eviction API,
replacements re-created by the ReplicaSet controller and placed by the real scheduler + our extender."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import podshapes
import pytest
from kubernetes import client
from test_extender import MODEL, POOL, create_gpunodes, extender, gpu_pod, outcome, setup

from app.core import names
from app.core.model import Allocation
from app.kube.client import Kube
from tests.devcluster import Cluster, wait_for

__all__ = ["extender", "setup"]  # fixtures shared with test_extender

APP = "gpupack.test/app"
Run = Callable[..., subprocess.CompletedProcess[str]]


def deployment(
    name: str, namespace: str, replicas: int, milli: int, annotations: dict[str, str]
) -> dict[str, Any]:
    """A Deployment whose pods are as the webhook leaves them (fraction `milli` on one GPU)."""
    pod = gpu_pod("x", namespace, namespace, milli=milli)
    ann = {**pod["metadata"]["annotations"], **annotations}
    meta = {"labels": pod["metadata"]["labels"], "annotations": ann}
    spec = {**pod["spec"], "terminationGracePeriodSeconds": 0}
    return podshapes.deployment(name, {APP: name}, {"metadata": meta, "spec": spec}, replicas)


def bound_pods(core: Any, namespace: str) -> dict[str, tuple[str, Allocation]]:
    """name -> (uid, allocation) of every bound, not terminating pod."""
    out = {}
    for p in core.list_namespaced_pod(namespace).items:
        if p.spec.node_name and p.metadata.deletion_timestamp is None:
            alloc = Allocation.from_annotations(p.metadata.annotations or {})
            assert alloc is not None and alloc.node == p.spec.node_name, p.metadata.name
            out[p.metadata.name] = (p.metadata.uid, alloc)
    return out


def used_gpus(pods: dict[str, tuple[str, Allocation]]) -> dict[tuple[str, int], int]:
    milli: dict[tuple[str, int], int] = {}
    for _, a in pods.values():
        for i in a.gpu_indexes:
            milli[(a.node, i)] = milli.get((a.node, i), 0) + a.milli
    assert all(v <= 1000 for v in milli.values()), milli
    return milli


def fragment(
    core: Any, apps: Any, namespace: str, gpus: int, extra: Callable[[], None] = lambda: None
) -> None:
    """Every GPU ends up holding one 0.25 pod: 0.75 fillers first, then the quarters, then the fillers go."""
    for i in range(gpus):
        core.create_namespaced_pod(namespace, gpu_pod(f"filler-{i}", namespace, namespace, milli=750))
        wait_for(lambda i=i: outcome(core, namespace, f"filler-{i}"), 30, f"filler-{i} bound")
    assert len(used_gpus(bound_pods(core, namespace))) == gpus
    apps.create_namespaced_deployment(namespace, deployment("web", namespace, 8, 250, {}))
    extra()
    wait_for(lambda: len(bound_pods(core, namespace)) == 2 * gpus, 60, "every quarter bound")
    for i in range(gpus):
        core.delete_namespaced_pod(f"filler-{i}", namespace, grace_period_seconds=0)
    wait_for(lambda: len(bound_pods(core, namespace)) == gpus, 60, "fillers gone")
    assert set(used_gpus(bound_pods(core, namespace)).values()) == {250}


@pytest.fixture
def cli(cluster: Cluster, run_gpupack: Run) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    env = {**os.environ}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_gpupack(
            "repack", *args, "--kubeconfig", str(cluster.kubeconfig), "--policy", "binpack",
            "--heartbeat-timeout", "86400", env=env,
        )  # fmt: skip

    yield run


def ready_web(core: Any, namespace: str) -> int:
    n = 0
    for p in core.list_namespaced_pod(namespace, label_selector=f"{APP}=web").items:
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        n += ready and p.metadata.deletion_timestamp is None
    return n


def test_repack_frees_five_gpus_under_a_max_unavailable_one_pdb(  # noqa: PLR0917  (pytest fixtures)
    extender: Callable[..., str], setup: Kube, kube: Any, core: Any, namespace: str, gpu_nodes: Any, cli: Run
) -> None:
    nodes = gpu_nodes(2, gpus_per_node=5, model=MODEL, labels={POOL: namespace})
    create_gpunodes(setup, nodes, 5)
    extender("binpack")
    apps = client.AppsV1Api(kube)

    def pinned() -> None:
        bare = gpu_pod("bare", namespace, namespace, milli=250)
        core.create_namespaced_pod(namespace, bare)
        apps.create_namespaced_deployment(
            namespace, deployment("keep", namespace, 1, 250, {names.MOVABLE: "false"})
        )

    fragment(core, apps, namespace, 10, pinned)
    client.PolicyV1Api(kube).create_namespaced_pod_disruption_budget(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {APP: "web"}}},
        },
    )
    wait_for(lambda: ready_web(core, namespace) == 8, 60, "8 web pods Ready")

    def pdb_ready() -> bool:
        st = client.PolicyV1Api(kube).read_namespaced_pod_disruption_budget("web", namespace).status
        return st is not None and st.observed_generation == 1 and st.disruptions_allowed == 1

    wait_for(pdb_ready, 60, "PDB web allows one disruption")
    before = bound_pods(core, namespace)
    keep = {n: v for n, v in before.items() if n == "bare" or n.startswith("keep-")}
    assert len(keep) == 2

    planned = cli("--plan", "--json", "--namespace", namespace)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["gpusFreed"] >= 5
    assert plan["evictions"] == len(plan["moves"])
    moved = {m["pod"] for m in plan["moves"]}
    assert not moved & {f"{namespace}/{n}" for n in keep}
    kept = {k["pod"]: k["reason"] for k in plan["kept"]}
    assert kept[f"{namespace}/bare"] == "bare pod: no controller would re-create it"
    keep_pod = next(n for n in keep if n.startswith("keep-"))
    assert kept[f"{namespace}/{keep_pod}"] == 'opted out (gpupack.io/movable: "false")'
    table = cli("--plan", "--namespace", namespace)
    assert f"{plan['evictions']} evictions free {plan['gpusFreed']} GPUs" in table.stdout, table.stdout
    print(table.stdout)

    # Watch the budget from outside while --apply runs: never fewer than 7 of 8 web pods Ready.
    lowest = [8]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            lowest[0] = min(lowest[0], ready_web(core, namespace))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        applied = cli("--apply", "--json", "--namespace", namespace)
    finally:
        stop.set()
        watcher.join()
    assert applied.returncode == 0, applied.stdout + applied.stderr
    report = json.loads(applied.stdout)["report"]
    assert report["stoppedAt"] is None
    assert [s["outcome"] for s in report["steps"]] == ["moved"] * report["planned"]
    assert report["evictions"] == report["planned"] == json.loads(applied.stdout)["plan"]["evictions"]
    assert lowest[0] >= 7, f"{lowest[0]} web pods Ready at one point: the PDB allows one down"

    after = bound_pods(core, namespace)
    assert len(after) == len(before)
    idle_before = 10 - len(used_gpus(before))
    idle_after = 10 - len(used_gpus(after))
    assert idle_after - idle_before >= 5
    for n, v in keep.items():
        assert after[n] == v, f"{n} was moved"
    print(f"repack: {report['evictions']} evictions freed {idle_after - idle_before} of 10 GPUs")


def test_apply_stops_when_a_replacement_lands_off_plan(  # noqa: PLR0917  (pytest fixtures)
    extender: Callable[..., str],
    setup: Kube,
    kube: Any,
    core: Any,
    namespace: str,
    gpu_nodes: Any,
    cli: Run,
    tmp_path: Path,
) -> None:
    nodes = gpu_nodes(2, gpus_per_node=4, model=MODEL, labels={POOL: namespace})
    create_gpunodes(setup, nodes, 4)
    extender("binpack")
    fragment(core, client.AppsV1Api(kube), namespace, 8)
    planned = cli("--plan", "--json", "--namespace", namespace)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["evictions"] >= 2
    first = plan["moves"][0]
    target = first["to"][names.ALLOC_NODE]
    assert first["from"][names.ALLOC_NODE] != target
    saved = tmp_path / "plan.json"
    saved.write_text(planned.stdout)
    before = bound_pods(core, namespace)

    # The cluster changes after the plan: the first move's target node is cordoned.
    core.patch_node(target, {"spec": {"unschedulable": True}})
    try:
        applied = cli("--apply", "--json", "--from", str(saved))
    finally:
        core.patch_node(target, {"spec": {"unschedulable": False}})
    assert applied.returncode == 3, applied.stdout + applied.stderr
    report = json.loads(applied.stdout)["report"]
    assert report["stoppedAt"] == first["pod"]
    assert report["evictions"] == 1
    (step,) = report["steps"]
    assert step["outcome"] == "off-plan"
    assert step["landed"][names.ALLOC_NODE] != target
    after = bound_pods(core, namespace)
    assert len(after) == 8
    # nothing but the first pod was touched
    evicted = first["pod"].split("/", 1)[1]
    assert {n: v for n, v in after.items() if n in before} == {
        n: v for n, v in before.items() if n != evicted
    }


def test_repack_for_a_pending_pod_moves_one_quarter_and_the_pod_binds(  # noqa: PLR0917  (pytest fixtures)
    extender: Callable[..., str], setup: Kube, kube: Any, core: Any, namespace: str, gpu_nodes: Any, cli: Run
) -> None:
    (node,) = gpu_nodes(1, gpus_per_node=2, model=MODEL, labels={POOL: namespace})
    create_gpunodes(setup, [node], 2)
    extender("binpack")
    apps = client.AppsV1Api(kube)
    # gpu A: a bare 0.5 pod; gpu B: one 0.25 pod of a Deployment (a 0.75 filler steers it there, then goes)
    for name, milli in (("anchor", 500), ("filler", 750)):
        core.create_namespaced_pod(namespace, gpu_pod(name, namespace, namespace, milli=milli))
        wait_for(lambda name=name: outcome(core, namespace, name) == node, 30, f"{name} bound")
    apps.create_namespaced_deployment(namespace, deployment("web", namespace, 1, 250, {}))
    wait_for(lambda: len(bound_pods(core, namespace)) == 3, 60, "the web pod bound")
    core.delete_namespaced_pod("filler", namespace, grace_period_seconds=0)
    wait_for(lambda: len(bound_pods(core, namespace)) == 2, 60, "filler gone")
    before = bound_pods(core, namespace)
    (web,) = (n for n in before if n.startswith("web-"))
    anchor_gpu, web_gpu = before["anchor"][1].gpu_indexes, before[web][1].gpu_indexes
    assert anchor_gpu != web_gpu

    # a whole-GPU pod fits nowhere: 0.5 and 0.75 free
    core.create_namespaced_pod(namespace, gpu_pod("big", namespace, namespace, milli=1000))
    wait_for(lambda: outcome(core, namespace, "big") == "unschedulable", 60, "big unschedulable")
    planned = cli("--plan", "--json", "--for", f"{namespace}/big", "--namespace", namespace)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["goal"] == "room" and plan["for"] == f"{namespace}/big"
    (move,) = plan["moves"]
    assert move["pod"] == f"{namespace}/{web}"
    assert move["to"][names.ALLOC_GPU_INDEXES] == ",".join(map(str, anchor_gpu))
    assert plan["room"] == {"node": node, "gpus": list(web_gpu)}
    assert {k["pod"] for k in plan["kept"] if k["pod"].startswith(f"{namespace}/")} == {f"{namespace}/anchor"}
    print(cli("--plan", "--for", f"{namespace}/big", "--namespace", namespace).stdout)

    applied = cli("--apply", "--json", "--for", f"{namespace}/big", "--namespace", namespace)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    report = json.loads(applied.stdout)["report"]
    assert [s["outcome"] for s in report["steps"]] == ["moved"]
    wait_for(lambda: outcome(core, namespace, "big") == node, 60, "big bound")
    after = bound_pods(core, namespace)
    assert after["big"][1].gpu_indexes == web_gpu
    assert after["anchor"] == before["anchor"]
    (moved,) = (v for n, v in after.items() if n.startswith("web-"))
    assert moved[1].gpu_indexes == anchor_gpu
    used_gpus(after)  # nothing over-committed
