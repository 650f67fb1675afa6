"""Grow and shrink with demand: the real Karpenter (kwok provider) adds and removes GPU nodes for gpupack.

`make dev` with --autoscaler runs the control plane, gpupack's extender (asking for nodes with placeholder
pods), webhook and agents, Karpenter's kwok provider with a pool of 8-GPU nodes, and an agent on every node
Karpenter adds. One node is there from the start and is filled; then 40 pods of mixed shares arrive and stay
pending until Karpenter has added the nodes gpupack asked for. Then demand drops, `gpupack repack --goal
nodes --apply` empties nodes within a PodDisruptionBudget, and Karpenter removes the empty ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from app.core import names
from app.core.autoscale import placeholders as ph
from tests.devcluster import GPUPACK_NAMESPACE, BinariesError, Cluster, ensure_binaries, wait_for
from tests.devcluster.addons import EXTENDER
from tests.devcluster.karpenter import NODEPOOL_LABEL
from tests.devcluster.processes import log_tail

MODEL = "A100-80GB"
NS = "autoscale"
PLACEHOLDER_NS = GPUPACK_NAMESPACE  # the extender's lease namespace, where its placeholders live
# 40 pods: (deployment, share, replicas). Packed: 10 x (0.75 + 0.25), 5 x (0.5 + 0.5), 10 x 0.3 on 4 GPUs.
SHARES = [("q3", "0.75", 10), ("q1", "0.25", 10), ("half", "0.5", 10), ("third", "0.3", 10)]
Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def dev(
    tmp_path_factory: pytest.TempPathFactory, run_devcluster: Run
) -> Iterator[tuple[Path, dict[str, str]]]:
    try:
        bins = ensure_binaries()
    except BinariesError as exc:
        pytest.fail(f"needs Kubernetes binaries and they cannot be built:\n{exc}", pytrace=False)
    d = tmp_path_factory.mktemp("autoscale") / "dev"
    env = {**os.environ, "GPUPACK_K8S_BIN": str(bins)}
    up = run_devcluster(
        "up", "--dir", str(d), "--nodes", "1", "--gpus-per-node", "8", "--gpu-model", MODEL,
        "--autoscaler", env=env, timeout=600,
    )  # fmt: skip
    try:
        if up.returncode != 0:
            pytest.fail(
                f"dev up --autoscaler failed ({up.returncode}):\n{up.stderr}\n{logs(d)}", pytrace=False
            )
        yield d, env
    finally:
        run_devcluster("down", "--dir", str(d), env=env, timeout=120)


def logs(d: Path, lines: int = 25) -> str:
    return "\n".join(f"---- {p.name}\n{log_tail(p, lines)}" for p in sorted((d / "logs").glob("*.log")))


@pytest.fixture(scope="module")
def api(dev: tuple[Path, dict[str, str]]) -> Iterator[Any]:
    with config.new_client_from_config(config_file=str(dev[0] / "kubeconfig")) as c:
        yield c


def deployment(name: str, share: str, replicas: int, namespace: str = NS) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {names.GPU_FRACTION: share}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        },
    }


DISRUPTED_TAINT = "karpenter.sh/disrupted"  # Karpenter's taint on a node it is removing


def gpupack_pods(core: Any) -> list[Any]:
    return [p for p in core.list_namespaced_pod(NS).items if not p.metadata.deletion_timestamp]


def karpenter_nodes(core: Any) -> list[str]:
    return sorted(n.metadata.name for n in core.list_node(label_selector=NODEPOOL_LABEL).items)


def over_committed(pods: list[Any]) -> dict[tuple[str, str], int]:
    used: Counter[tuple[str, str]] = Counter()
    for p in pods:
        ann = p.metadata.annotations or {}
        for i in (ann.get(names.ALLOC_GPU_INDEXES) or "").split(","):
            if i:
                used[(ann[names.ALLOC_NODE], i)] += int(ann[names.ALLOC_GPU_MILLI])
    return {k: v for k, v in used.items() if v > 1000}


def nodes_for(requests: list[int], per_node: int = 8) -> int:
    free: list[int] = []
    for want in sorted(requests, reverse=True):
        i = next((i for i, left in enumerate(free) if left >= want), None)
        if i is None:
            free.append(per_node - want)
        else:
            free[i] -= want
    return len(free)


def test_scale_up_as_asked_then_repack_and_scale_down(
    dev: tuple[Path, dict[str, str]], api: Any, run_gpupack: Run
) -> None:
    d, env = dev
    core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NS}})
        # A full cluster: the one static node's 8 GPUs taken whole.
        apps.create_namespaced_deployment(NS, deployment("fill", "1.0", 8))
        wait_for(
            lambda: sum(1 for p in gpupack_pods(core) if p.spec.node_name) == 8, 60, "the static node full"
        )
        assert karpenter_nodes(core) == []

        # 40 pods of mixed shares: pending until Karpenter adds what gpupack asks for.
        t0 = time.monotonic()
        for name, share, replicas in SHARES:
            apps.create_namespaced_deployment(NS, deployment(name, share, replicas))
        asked: list[list[int]] = []

        def watch_placeholders() -> bool:
            found = core.list_namespaced_pod(
                "gpupack-system", label_selector=f"{ph.LABEL_PLACEHOLDER}=true"
            ).items
            shapes = sorted(int(p.metadata.labels[ph.LABEL_GPUS]) for p in found)
            if shapes and (not asked or asked[-1] != shapes):
                asked.append(shapes)
            return sum(1 for p in gpupack_pods(core) if p.spec.node_name) == 48

        wait_for(watch_placeholders, 150, "every pod bound", interval=0.5)
        scale_up_s = time.monotonic() - t0
        pods = gpupack_pods(core)
        assert not over_committed(pods)
        added = karpenter_nodes(core)
        assert asked, "gpupack never asked for GPUs"
        largest = max(asked, key=sum)
        assert abs(len(added) - nodes_for(largest)) <= 1, (asked, added)
        assert sum(largest) <= 8 * len(added)
        print(f"asked {asked}; Karpenter added {len(added)} nodes; all 48 pods bound in {scale_up_s:.1f}s")
        wait_for(
            lambda: (
                not core.list_namespaced_pod(
                    "gpupack-system", label_selector=f"{ph.LABEL_PLACEHOLDER}=true"
                ).items
            ),
            30,
            "placeholders withdrawn",
        )

        # Demand drops; a budget guards the 0.5 shares while repack empties nodes.
        policy.create_namespaced_pod_disruption_budget(
            NS,
            {
                "metadata": {"name": "half"},
                "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "half"}}},
            },
        )
        for name, replicas in (("q3", 2), ("q1", 3), ("third", 3), ("half", 4)):
            apps.patch_namespaced_deployment_scale(name, NS, {"spec": {"replicas": replicas}})
        wait_for(lambda: len(gpupack_pods(core)) == 8 + 2 + 3 + 3 + 4, 60, "scaled down")
        before = {p.metadata.uid for p in gpupack_pods(core)}
        violations: list[str] = []
        stop = threading.Event()

        def guard() -> None:
            while not stop.is_set():
                ready = [
                    p
                    for p in gpupack_pods(core)
                    if p.metadata.labels.get("app") == "half" and p.spec.node_name
                ]
                if len(ready) < 3:
                    violations.append(f"{len(ready)} of the 0.5 shares bound")
                stop.wait(0.2)

        watcher = threading.Thread(target=guard, daemon=True)
        watcher.start()
        repack = run_gpupack(
            "repack",
            "--goal",
            "nodes",
            "--apply",
            "--json",
            "--kubeconfig",
            str(d / "kubeconfig"),
            env=env,
            timeout=150,
        )
        stop.set()
        watcher.join()
        assert repack.returncode == 0, repack.stdout + repack.stderr
        report = json.loads(repack.stdout)
        assert not violations, violations

        # Karpenter removes every node left empty; gpupack pods are never evicted by it (do-not-disrupt).
        def no_empty_node() -> bool:
            used = {p.spec.node_name for p in gpupack_pods(core)}
            return all(n in used for n in karpenter_nodes(core))

        wait_for(no_empty_node, 90, "Karpenter removing the emptied nodes")
        left = karpenter_nodes(core)
        assert len(left) < len(added), (added, left, report["plan"])
        after = gpupack_pods(core)
        assert len(after) == len(before) and all(p.spec.node_name for p in after)
        moved = [s["pod"] for s in report["report"]["steps"] if s["outcome"] == "moved"]
        replaced = before - {p.metadata.uid for p in after}
        assert len(replaced) == len(moved), (replaced, moved)  # only the pods repack moved were replaced
        assert not over_committed(after)
        print(f"repack moved {len(moved)} pods; Karpenter nodes {len(added)} -> {len(left)}")
    except BaseException:
        print(logs(d))
        raise


def test_a_scale_up_that_loses_the_apiserver_midway_asks_for_no_node_twice(
    dev: tuple[Path, dict[str, str]], api: Any
) -> None:
    """The apiserver crashes (SIGKILL, restarted on the same data) while gpupack's placeholders wait for
    Karpenter: the extender's watches and lease break, its view goes stale. Afterwards every pod is bound,
    gpupack asked for the 16 GPUs once (no second set of placeholders for the same pods), nothing is
    over-committed, and the placeholders are withdrawn. How many nodes Karpenter adds is Karpenter's
    business after such a crash (it has been seen to add two more, empty, for the placeholders it had
    already served): printed, not asserted."""
    d, _env = dev
    cluster = Cluster.load(d)
    assert cluster is not None
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = "autoscale-restart"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        # The cluster as the test before left it, settled: a node it emptied is removed by Karpenter first,
        # or its GPUs would count as free here and vanish midway (gpupack then rightly asks for them again).
        wait_for(lambda: settled(core), 120, "Karpenter done removing emptied nodes")
        # Whole GPUs: every free GPU of the nodes there now is taken first, then 16 more need 2 new nodes.
        free = len(free_whole_gpus(core))
        before = set(karpenter_nodes(core))
        log_at = (d / "logs" / f"{EXTENDER}.log").stat().st_size
        wanted = free + 16
        apps.create_namespaced_deployment(ns, deployment("whole", "1.0", wanted, ns))

        def placeholder_gpus() -> int:
            return sum(int(p.metadata.labels[ph.LABEL_GPUS]) for p in placeholders(core))

        def asked_and_waiting() -> bool:
            """gpupack has asked for all 16 GPUs and part of its ask still waits for Karpenter. The
            ReplicaSet creates the pods in batches, so the ask can come in rounds and Karpenter can serve the
            first before the last is made (8-GPU nodes: one asked for 5 GPUs brings 3 more)."""
            waiting = placeholder_gpus()
            served = 8 * len(set(karpenter_nodes(core)) - before)
            return waiting > 0 and waiting + served >= 16

        wait_for(asked_and_waiting, 90, "gpupack asking for the 16 GPUs", interval=0.2)
        crash_at = (d / "logs" / f"{EXTENDER}.log").stat().st_size
        cluster.restart_process("kube-apiserver")  # SIGKILL; same port, certificates and etcd data
        t0 = time.monotonic()

        def bound() -> int:
            return sum(1 for p in core.list_namespaced_pod(ns).items if p.spec.node_name)

        wait_for(lambda: bound() == wanted, 240, f"all {wanted} pods bound after the restart", interval=1.0)
        added = set(karpenter_nodes(core)) - before
        rounds, after = reconciled(d, log_at), reconciled(d, crash_at)
        print(f"{free} GPUs free before; {wanted} pods bound {time.monotonic() - t0:.1f}s after the restart")
        print(f"Karpenter added {len(added)} nodes; gpupack's rounds: {rounds}")
        assert all(e["gpus_wanted"] <= 16 for e in rounds), rounds  # never more than the pods need
        assert sum(e["placeholders_created"] for e in after) == 0, after  # not asked again after the crash
        everyone = [p for p in core.list_pod_for_all_namespaces().items if not p.metadata.deletion_timestamp]
        assert not over_committed(everyone)
        wait_for(lambda: not placeholders(core), 60, "placeholders withdrawn")
    except BaseException:
        print(logs(d))
        raise
    finally:
        apps.delete_namespaced_deployment("whole", ns)
        core.delete_namespace(ns)


def settled(core: Any) -> bool:
    """Every Karpenter node holds a gpupack pod that is not terminating, and none is being removed: with
    consolidation WhenEmpty, Karpenter then removes no node until the pods change."""
    used = {p.spec.node_name for p in gpupack_pods(core)}
    return all(
        n.metadata.name in used
        and not n.metadata.deletion_timestamp
        and not any(t.key == DISRUPTED_TAINT for t in n.spec.taints or [])
        for n in core.list_node(label_selector=NODEPOOL_LABEL).items
    )


def placeholders(core: Any) -> list[Any]:
    return list(core.list_namespaced_pod(PLACEHOLDER_NS, label_selector=f"{ph.LABEL_PLACEHOLDER}=true").items)


def reconciled(d: Path, since: int) -> list[dict[str, Any]]:
    """The extender's "placeholders reconciled" records (what it asked, created and deleted) after `since`."""
    return [e for e in extender_events(d, since) if e.get("msg") == "autoscale placeholders reconciled"]


def extender_events(d: Path, since: int) -> list[dict[str, Any]]:
    """The extender's structured log records written after byte `since` of its log, in order."""
    with (d / "logs" / f"{EXTENDER}.log").open("rb") as f:
        f.seek(since)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the harness's own header lines
        if isinstance(record, dict):
            out.append(record)
    return out


def free_whole_gpus(core: Any) -> list[tuple[str, str]]:
    """(node, GPU index) of every GPU of a node with a published GPUNode that no pod holds any share of."""
    custom = client.CustomObjectsApi(core.api_client)
    gpunodes = custom.list_cluster_custom_object(
        names.GPUNODE_GROUP, names.GPUNODE_VERSION, names.GPUNODE_PLURAL
    )["items"]
    used = {
        (ann[names.ALLOC_NODE], i)
        for p in core.list_pod_for_all_namespaces().items
        if not p.metadata.deletion_timestamp
        for ann in [p.metadata.annotations or {}]
        if ann.get(names.ALLOC_NODE)
        for i in ann.get(names.ALLOC_GPU_INDEXES, "").split(",")
        if i
    }
    return [
        (g["metadata"]["name"], str(gpu["index"]))
        for g in gpunodes
        for gpu in (g.get("status") or {}).get("gpus") or []
        if (g["metadata"]["name"], str(gpu["index"])) not in used
    ]
