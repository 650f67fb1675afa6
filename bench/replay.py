"""Does a live cluster pack like the simulator? The same openb arrivals through both, pod for pod.

A slice of the openb `default` trace (GPU pods with their real CPU, memory and GPU shapes, in one shuffled
arrival order) is created through the real kube-apiserver, our webhook, kube-scheduler and extender on kwok
nodes built from the openb node list; the same order is placed by the simulator's engine
(`app.tools.sim.engine.replay`). Reports the share of pods that landed on the same node and GPU(s) and both
runs' unallocated GPU %. One fresh control plane per policy. Writes bench/results/replay.json.

    .venv/bin/python bench/replay.py [--policies fragaware binpack] [--nodes 48] [--seed 42]

GPUPACK_REPLAY_DIR=/some/empty/dir keeps the control plane's and our components' logs of the last policy.
CPU-only pods of the trace are left out: kube-scheduler places them with its own scoring (they never
reach the extender), so the simulator's choice for them is not a claim about the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.core import catalog, names  # noqa: E402
from app.core.model import MILLI_PER_GPU, Allocation, Demand, Gpu, Node  # noqa: E402
from app.core.placement import default_workload, registry  # noqa: E402
from app.kube import gpunode  # noqa: E402
from app.kube.client import Kube  # noqa: E402
from app.tools.sim.engine import replay  # noqa: E402
from app.tools.sim.loader import TracePod, load_pods  # noqa: E402
from tests.devcluster import Cluster, ensure_binaries, node_body, wait_for  # noqa: E402
from tests.devcluster.addons import (  # noqa: E402
    CRD_RELPATH,
    EXTENDER,
    MANIFEST_RELPATH,
    WEBHOOK,
    Components,
    extender_spec,
    install_crd,
    install_rbac,
    rbac_objects,
    webhook_spec,
)
from tests.devcluster.nodes import wait_for_ready_nodes  # noqa: E402

TRACES = REPO.parent / "shared" / "traces"
NAMESPACE = "replay"
POD_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def progress(msg: str) -> None:
    print(f"[replay {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pick_nodes(path: Path, count: int) -> list[TraceNode]:
    """Every k-th GPU node of the openb list (keeps its model mix), named so natural order = list order."""
    rows = [line.split(",") for line in path.read_text().splitlines()[1:] if line.strip()]
    step = max(1, len(rows) // count)
    chosen = rows[::step][:count]
    return [
        TraceNode(f"rp-{i:03d}", int(r[1]), int(r[2]), int(r[3]), r[4].strip()) for i, r in enumerate(chosen)
    ]


def arrivals(
    pods: Sequence[TracePod], capacity_milli: int, seed: int, fill: float, minimum: int
) -> list[TracePod]:
    """GPU pods in one shuffled order until they ask for `fill` x capacity (at least `minimum` pods)."""
    gpu_pods = sorted((p for p in pods if p.demand.count > 0), key=lambda p: p.name)
    random.Random(seed).shuffle(gpu_pods)
    out: list[TracePod] = []
    total = 0
    for p in gpu_pods:
        if total >= fill * capacity_milli and len(out) >= minimum:
            break
        out.append(p)
        total += p.gpu_milli
    return out


def pod_body(i: int, pod: TracePod) -> dict[str, Any]:
    """The user's pod: a fraction (or whole GPUs) and its CPU/memory; the webhook does the rest."""
    d = pod.demand
    assert d.milli is not None
    fraction = "1" if d.milli == MILLI_PER_GPU else f"{d.milli / MILLI_PER_GPU:.2f}"
    ann = {names.GPU_FRACTION: fraction}
    if d.count > 1:
        ann[names.GPU_FRACTION_NUM_DEVICES] = str(d.count)
    requests = {"cpu": f"{d.cpu_milli}m", "memory": f"{d.host_memory_mib}Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i:04d}", "namespace": NAMESPACE, "annotations": ann},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests}}]},
    }


def gpunode_objects(node: TraceNode) -> tuple[gpunode.GPUNodeSpec, gpunode.GPUNodeStatus]:
    return gpunode.idle(node.name, node.model, node.gpus, time.time())


def outcome(core: Any, name: str) -> tuple[str, Allocation | None] | None:
    """("node", allocation) once bound, ("", None) once kube-scheduler gave up, None while undecided."""
    pod = core.read_namespaced_pod(name, NAMESPACE)
    if pod.spec.node_name:
        return str(pod.spec.node_name), Allocation.from_annotations(pod.metadata.annotations or {})
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return "", None
    return None


Where = tuple[str, tuple[int, ...]] | None


def explain(cluster: Cluster, pod: str, wanted: Sequence[str]) -> list[dict[str, Any]]:
    """The extender's /explain rows for `wanted` nodes (its view now, the pod's own share excluded)."""
    query = urllib.parse.urlencode({"pod": f"{NAMESPACE}/{pod}"})
    url = cluster.extender_url.rstrip("/")
    with cluster.extender_opener().open(f"{url}/explain?{query}", timeout=10) as resp:
        rows: list[dict[str, Any]] = json.loads(resp.read())["nodes"]
    return [r for r in rows if r["node"] in wanted]


def run_cluster(
    policy: str, nodes: list[TraceNode], seq: list[TracePod], sim: list[Where]
) -> tuple[list[Where], dict[str, Any] | None]:
    """Each pod's outcome in the cluster, and the extender's view of the first pod placed differently."""
    from kubernetes import client

    with tempfile.TemporaryDirectory(prefix="gpupack-replay-") as tmp_:
        tmp = os.environ.get("GPUPACK_REPLAY_DIR") or tmp_  # keep the logs of a run to study a mismatch
        cluster = Cluster.prepare(Path(tmp), ensure_binaries())
        progress(f"{policy}: starting the control plane")
        cluster.start()
        try:
            with cluster.api_client() as api:
                install_crd(api, yaml.safe_load((REPO / CRD_RELPATH).read_text()))
                docs = yaml.safe_load_all((REPO / MANIFEST_RELPATH).read_text())
                install_rbac(api, rbac_objects(docs, components=("extender", "webhook")))
                core = client.CoreV1Api(api)
                core.create_namespace({"metadata": {"name": NAMESPACE}})
                progress(f"{policy}: {len(nodes)} kwok nodes from the openb node list")
                for n in nodes:
                    core.create_node(
                        node_body(n.name, n.gpus, n.model, cpu=f"{n.cpu_milli}m", memory=f"{n.memory_mib}Mi")
                    )
                wait_for_ready_nodes(api, [n.name for n in nodes], 120)
                kube = Kube.connect(str(cluster.kubeconfig))
                for n in nodes:
                    spec, status = gpunode_objects(n)
                    kube.send(gpunode.create(n.name, spec))
                    kube.send(gpunode.patch_status(n.name, status))
                ext = extender_spec(
                    cluster.extender_port,
                    cluster.extender_ops_port,
                    cluster.kubeconfig_for(EXTENDER),
                    cluster.extender_tls,
                    extra=("--policy", policy, "--heartbeat-timeout", "86400"),
                )
                web = webhook_spec(
                    cluster.webhook_port,
                    cluster.webhook_cert_file,
                    cluster.webhook_key_file,
                    cluster.ca_file,
                    cluster.kubeconfig_for(WEBHOOK),
                )
                cluster.start_processes([ext, web], lambda m: progress(f"{policy}: {m}"))
                Components().register_webhook(cluster)
                out: list[Where] = []
                first_diff: dict[str, Any] | None = None
                started = time.monotonic()
                for i, pod in enumerate(seq):
                    name = f"p{i:04d}"
                    core.create_namespaced_pod(NAMESPACE, pod_body(i, pod))
                    node, alloc = wait_for(
                        lambda name=name: outcome(core, name), POD_TIMEOUT_S, f"{name} decided"
                    )
                    if not node:
                        # The simulator drops a pod that fits nowhere; so does the cluster here, or a later
                        # retry could place it after the state it was refused in.
                        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
                        out.append(None)
                    else:
                        assert alloc is not None and alloc.node == node, f"{name}: bound to {node}, {alloc}"
                        out.append((node, alloc.gpu_indexes))
                    if first_diff is None and out[-1] != sim[i]:
                        wanted = [w[0] for w in (out[-1], sim[i]) if w is not None]
                        first_diff = {
                            "pod": name,
                            "sim": sim[i],
                            "cluster": out[-1],
                            "explain_after": explain(cluster, name, wanted) if node else [],
                        }
                    if (i + 1) % 50 == 0 or i + 1 == len(seq):
                        rate = (i + 1) / (time.monotonic() - started)
                        progress(f"{policy}: {i + 1}/{len(seq)} pods decided ({rate:.1f}/s)")
                return out, first_diff
        finally:
            for proc in (EXTENDER, WEBHOOK):
                if any(p.name == proc for p in cluster.processes):
                    cluster.stop_process(proc)
            cluster.stop()


def model_nodes(nodes: list[TraceNode]) -> list[Node]:
    return [
        Node(
            n.name,
            tuple(
                Gpu(i, n.model, catalog.lookup(n.model).memory_mib, f"GPU-{n.name}-{i}")
                for i in range(n.gpus)
            ),
            cpu_milli_free=n.cpu_milli,
            memory_mib_free=n.memory_mib,
        )
        for n in nodes
    ]


def unallocated_pct(nodes: list[TraceNode], seq: list[TracePod], placed: list[Any]) -> float:
    capacity = MILLI_PER_GPU * sum(n.gpus for n in nodes)
    used = sum(p.gpu_milli for p, w in zip(seq, placed, strict=True) if w is not None)
    return 100.0 * (capacity - used) / capacity


def run_policy(policy: str, nodes: list[TraceNode], seq: list[TracePod]) -> dict[str, Any]:
    demands: list[Demand] = [p.demand for p in seq]
    sim_where, _ = replay(model_nodes(nodes), demands, registry.create(policy), default_workload())
    sim: list[Where] = [None if w is None else (nodes[w[0]].name, tuple(w[1])) for w in sim_where]
    t0 = time.monotonic()
    live, first_diff = run_cluster(policy, nodes, seq, sim)
    seconds = time.monotonic() - t0
    same = sum(1 for a, b in zip(sim, live, strict=True) if a == b)
    both_placed = [(a, b) for a, b in zip(sim, live, strict=True) if a is not None and b is not None]
    return {
        "policy": policy,
        "pods": len(seq),
        "match_pct": round(100.0 * same / len(seq), 2),
        "placed_sim": sum(1 for a in sim if a is not None),
        "placed_cluster": sum(1 for b in live if b is not None),
        "same_node_and_gpus_among_both_placed": sum(1 for a, b in both_placed if a == b),
        "unallocated_pct_sim": round(unallocated_pct(nodes, seq, sim), 3),
        "unallocated_pct_cluster": round(unallocated_pct(nodes, seq, live), 3),
        "first_difference": first_diff,
        "cluster_seconds": round(seconds, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", nargs="+", default=["fragaware", "binpack"])
    ap.add_argument("--nodes", type=int, default=48, help="kwok nodes taken from the openb GPU node list")
    ap.add_argument("--seed", type=int, default=42, help="shuffles the trace's arrival order")
    ap.add_argument("--fill", type=float, default=1.05, help="GPU request of the slice / cluster capacity")
    ap.add_argument("--min-pods", type=int, default=400)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/replay.json")
    args = ap.parse_args(argv)
    unknown = [p for p in args.policies if p not in registry.names()]
    if unknown:
        ap.error(f"--policies: unknown {unknown}; known: {', '.join(registry.names())}")
    nodes = pick_nodes(args.traces / "openb_node_list_gpu_node.csv", args.nodes)
    capacity = MILLI_PER_GPU * sum(n.gpus for n in nodes)
    seq = arrivals(
        load_pods(args.traces / "openb_pod_list_default.csv"), capacity, args.seed, args.fill, args.min_pods
    )
    progress(f"{len(nodes)} nodes, {capacity // MILLI_PER_GPU} GPUs; {len(seq)} GPU pods (seed {args.seed})")
    results = [run_policy(p, nodes, seq) for p in args.policies]
    report = {
        "bench": "replay",
        "trace": "openb default (GPU pods)",
        "nodes": len(nodes),
        "gpus": capacity // MILLI_PER_GPU,
        "seed": args.seed,
        "fill": args.fill,
        "python": platform.python_version(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'policy':<10} {'pods':>5} {'match %':>8} {'unalloc sim':>12} {'unalloc cluster':>16}")
    for r in results:
        print(
            f"{r['policy']:<10} {r['pods']:>5} {r['match_pct']:>8.2f} {r['unallocated_pct_sim']:>12.3f}"
            f" {r['unallocated_pct_cluster']:>16.3f}"
        )
    print(f"wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
