"""How fast is the extender: filter+prioritize latency at scale; kube-scheduler throughput with vs without it.

Part 1 (one process): the FastAPI app behind uvicorn on 127.0.0.1, called over one keep-alive HTTP
connection as kube-scheduler does (JSON in and out, routing, validation; no TLS), over an in-memory cache
of N nodes x 8 GPUs holding 10 pods per GPU; one filter + one prioritize call per pod, with every node
name in the request (nodeCacheCapable), as kube-scheduler sends them. --runs passes over one state,
each with a fresh extender; medians of the passes' percentiles. What is timed: sending the request,
the extender's whole answer, reading and decoding the reply. The request body is encoded before the
clock starts (kube-scheduler encodes in Go: Python's json.dumps of 5 000 names, 0.3 ms, is not the
extender's cost); the server and this client share the process, so their CPU still competes. Next to
the wall clock, the process's CPU time over the same warm calls: the cost without the waits for a
shared CPU.
Part 2 (real control plane, tests.devcluster): one kwok cluster of --cluster-nodes nodes x 8 GPUs, the real
kube-scheduler calling our extender process as deployed, and a second kube-scheduler with the same
configuration but no extender. Per round, three bursts of --pods pods: plain (CPU only), no_extender (the pod
the webhook makes, gpupack's extended resources, scheduled by the scheduler without the extender) and
gpupack (the same pod through filter, prioritize and bind); pods/s = pods / (create of the first .. last one
bound), and each process's CPU per pod, as is and less its idle rate just before the burst. The goal is
gpupack / no_extender >= 1.0.

Usage: .venv/bin/python bench/extender.py [--nodes 1000,5000] [--calls 200] [--runs 3] [--pods 300]
       [--rounds 2] [--cluster-nodes 20] [--node-lease-s 40]
Writes bench/results/extender.json: latency_run + latency, throughput_run + throughput (a run with
--nodes '' keeps the latency part; a run with --pods 0 keeps the throughput part).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core import catalog, names  # noqa: E402
from app.core.model import Allocation, Demand  # noqa: E402
from app.core.placement import registry  # noqa: E402
from app.kube import gpunode  # noqa: E402
from app.kube.assume import AssumeCache  # noqa: E402
from app.kube.cache import ClusterCache  # noqa: E402

MODEL = "A100-40GB"
GPUS = 8
PODS_PER_GPU = 10
SMALL_SHARES = (20, 50, 80, 100)  # milli of the resident pods: ~62 % of each GPU on average


# The env the webhook gives the GPU container (the extender refuses pods without it).
GPU_ENV: dict[str, Any] = {
    "name": names.ENV_NVIDIA_VISIBLE_DEVICES,
    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"}},
}


def gpunode_obj(name: str, beat: float) -> dict[str, Any]:
    spec, status = gpunode.idle(name, MODEL, GPUS, beat)
    return gpunode.GPUNode.of(name, spec, status).wire()


def pod_obj(name: str, milli: int, node: str = "", alloc: Allocation | None = None) -> dict[str, Any]:
    ann = {names.GPU_FRACTION: f"{milli / 1000:.2f}"}
    if alloc is not None:
        ann.update(alloc.to_annotations())
    res = {names.RESOURCE_GPU_MILLI: str(milli)}
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            # As every pod kube-scheduler sends has (its informer's copy): the extender keeps its reading of
            # a pod by uid and resourceVersion, so prioritize does not read the pod filter read.
            "resourceVersion": "2" if node else "1",
            "annotations": ann,
            "labels": {names.LABEL_MANAGED: "true"},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": res, "limits": res}, "env": [GPU_ENV]}],
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


def build_cache(n_nodes: int, rng: random.Random) -> tuple[ClusterCache, list[str]]:
    now = time.time()
    cache = ClusterCache(AssumeCache(), heartbeat_timeout_s=1e9)
    node_names = [f"node-{i}" for i in range(n_nodes)]
    cache.set_gpunodes([gpunode_obj(n, now) for n in node_names])
    mem = catalog.lookup(MODEL).memory_mib

    def pods() -> Iterator[dict[str, Any]]:  # a generator: 400 000 pod dicts need not exist at once
        for n in node_names:
            for g in range(GPUS):
                for k in range(PODS_PER_GPU):
                    milli = rng.choice(SMALL_SHARES)
                    alloc = Allocation(n, (g,), (f"GPU-{n}-{g}",), milli, milli * mem // 1000)
                    yield pod_obj(f"{n}-{g}-{k}", milli, n, alloc)

    cache.set_pods(pods())
    return cache, node_names


def latency(n_nodes: int, calls: int, policy_name: str, runs: int) -> dict[str, Any]:
    """`runs` passes of `calls` pods over one cluster state, each with a fresh extender (no ranking yet)."""
    rng = random.Random(7)
    t0 = time.perf_counter()
    cache, node_names = build_cache(n_nodes, rng)
    build_s = time.perf_counter() - t0
    passes = [_latency_pass(cache, node_names, calls, policy_name, (rng, run)) for run in range(runs)]

    def med(key: str, pct: str) -> float:
        return round(statistics.median(p[key][pct] for p in passes), 2)

    keys = (
        "filter_ms",
        "prioritize_ms",
        "warm_filter_plus_prioritize_ms",
        "warm_filter_plus_prioritize_cpu_ms",
        "without_decide_in_filter_ms",
    )
    return {
        "nodes": n_nodes,
        "gpus": n_nodes * GPUS,
        "resident_pods": n_nodes * GPUS * PODS_PER_GPU,
        "policy": policy_name,
        "calls": calls,
        "runs": runs,
        "state_build_s": round(build_s, 2),
        "median_of_runs": {k: {pct: med(k, pct) for pct in ("p50", "p99", "max")} for k in keys},
        # Each run's extender is prepared as at Ready (views and rows built: `ready_prepare_ms`), so this is
        # the judging of a shape no request asked for before, in a live extender.
        "first_call_per_shape_ms_median": [
            round(statistics.median(p["first_call_per_shape_ms"][i] for p in passes), 1) for i in range(3)
        ],
        "runs_detail": passes,
    }


def _latency_pass(
    cache: ClusterCache, node_names: list[str], calls: int, policy_name: str, seq: tuple[random.Random, int]
) -> dict[str, Any]:
    """One extender (fresh rankings) served by uvicorn on 127.0.0.1, called over one keep-alive connection."""
    from extender.binder import Binder
    from extender.config import Settings
    from extender.main import create_app
    from extender.runtime import settle_heap
    from tests.static_runtime import StaticRuntime

    rng, run = seq  # pod names differ per run: a pod of an earlier run is bound already
    policy = registry.create(policy_name)
    rt = StaticRuntime(cache, policy, Binder(_NoKube(), cache, policy))
    # As the extender does when it turns Ready: every node's view and array row built, then the heap frozen.
    t_prep = time.perf_counter()
    rt.rankings.prepare()
    prepare_ms = (time.perf_counter() - t_prep) * 1e3
    settle_heap()
    with _served(create_app(Settings(policy=policy_name), runtime=rt)) as post:
        filter_ms: list[float] = []
        prio_ms: list[float] = []
        both_ms: list[float] = []
        cpu_ms: list[float] = []
        passed = []
        for i in range(calls):
            pod = pod_obj(f"new-{run}-{i}", (100, 250, 500)[i % 3])
            body = _encode(pod, node_names)
            c1, t1 = time.process_time(), time.perf_counter()
            ok = post("/filter", body)["NodeNames"]
            t2, c2 = time.perf_counter(), time.process_time()
            body = _encode(pod, ok)  # what kube-scheduler sends next: the nodes that passed
            c2b, t2b = time.process_time(), time.perf_counter()
            post("/prioritize", body)
            t3 = time.perf_counter() - (t2b - t2)
            c3 = time.process_time() - (c2b - c2)
            _assume_bound(cache, policy, pod, ok[0])  # the chosen node changes, as after a real bind
            passed.append(len(ok))
            filter_ms.append((t2 - t1) * 1e3)
            prio_ms.append((t3 - t2) * 1e3)
            both_ms.append((t3 - t1) * 1e3)
            cpu_ms.append((c3 - c1) * 1e3)
        # Every fitting node returned (decide_in_filter off): prioritize then scores them all.
        rt.decide_in_filter = False
        open_ms: list[float] = []
        for i in range(min(calls, 50)):
            pod = pod_obj(f"open-{run}-{i}", rng.choice((100, 250, 500)))
            body = _encode(pod, node_names)
            t1 = time.perf_counter()
            ok = post("/filter", body)["NodeNames"]
            t2 = time.perf_counter()
            body = _encode(pod, ok)
            t2b = time.perf_counter()
            post("/prioritize", body)
            open_ms.append((time.perf_counter() - (t2b - t2) - t1) * 1e3)
    return {
        "filter_ms": _pct(filter_ms[3:]),
        "prioritize_ms": _pct(prio_ms[3:]),
        # The first call for each of the 3 pod shapes judges every node (no ranking for it yet).
        "first_call_per_shape_ms": [round(x, 1) for x in both_ms[:3]],
        "ready_prepare_ms": round(prepare_ms, 1),
        "warm_filter_plus_prioritize_ms": _pct(both_ms[3:]),
        # CPU time of the process (uvicorn's thread and this client) over the same calls: what a pair
        # costs without the waits for a shared CPU that the wall-clock figures include.
        "warm_filter_plus_prioritize_cpu_ms": _pct(cpu_ms[3:]),
        "nodes_passing_filter_median": statistics.median(passed),
        "without_decide_in_filter_ms": _pct(open_ms),
    }


def _encode(pod: dict[str, Any], node_names: list[str]) -> bytes:
    """A filter or prioritize request body, as kube-scheduler sends it (nodeCacheCapable)."""
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": node_names}).encode()


@contextmanager
def _served(app: Any) -> Iterator[Callable[[str, bytes], Any]]:
    """`app` behind uvicorn in a thread (plain HTTP; kube-scheduler adds TLS), POSTed over one connection."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def post(path: str, body: bytes) -> Any:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)

    try:
        yield post
    finally:
        conn.close()
        server.should_exit = True
        thread.join(10)


def _assume_bound(cache: ClusterCache, policy: Any, pod: dict[str, Any], node_name: str) -> None:
    """What the watch delivers after a bind: the pod bound, with its allocation annotations."""
    from app.core import podview
    from app.core.placement import to_allocation
    from app.core.request import pod_demand

    node = cache.node(node_name)
    demand = pod_demand(podview.read(pod))
    assert node is not None and isinstance(demand, Demand)
    alloc = to_allocation(node, demand, policy.choose_gpus(node, demand))
    milli = int(pod["spec"]["containers"][0]["resources"]["limits"][names.RESOURCE_GPU_MILLI])
    cache.upsert_pod(pod_obj(pod["metadata"]["name"], milli, node_name, alloc))


class _NoKube:
    def send(self, req: Any) -> Any:
        raise AssertionError("latency bench never binds")

    def watch(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("latency bench never watches")


def _pct(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "p50": round(s[len(s) // 2], 2),
        "p99": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2),
        "max": round(s[-1], 2),
        "mean": round(statistics.fmean(s), 2),
    }


# The three kinds of burst, alternating within each round on one cluster:
#   plain:       CPU only; kube-scheduler (the one calling the extender) never calls it for them.
#   no_extender: the gpupack pod as the webhook leaves it (gpupack's extended resources, annotation, env),
#                scheduled by a second kube-scheduler, same binary and config but no extender: the
#                kube-scheduler alone, fitting the pod on the nodes' extended resources. Without the managed
#                label, so the extender does not follow pods it never placed.
#   gpupack:     the same pod with the managed label, scheduled through filter, prioritize and bind.
KINDS = ("plain", "no_extender", "gpupack")
NO_EXTENDER_SCHEDULER = "bench-no-extender"


def throughput(n_pods: int, rounds: int, n_nodes: int, node_lease_s: int) -> dict[str, Any]:
    """Real kube-scheduler on one kwok cluster: the three KINDS of pods, alternating bursts per round."""
    import yaml
    from kubernetes import client

    from app.kube import calls
    from app.kube.client import Kube
    from tests.devcluster import Cluster, ComponentSpec, HealthCheck, ensure_binaries, wait_for
    from tests.devcluster.nodes import node_body, node_names, wait_for_ready_nodes

    bins = ensure_binaries()
    with tempfile.TemporaryDirectory(prefix="gpupack-bench-") as tmp:
        cluster = Cluster.prepare(Path(tmp), bins)
        cluster.meta["node_lease_s"] = node_lease_s
        cluster.start()
        try:
            api = cluster.api_client()
            core = client.CoreV1Api(api)
            ext = client.ApiextensionsV1Api(api)
            crd = yaml.safe_load((REPO / "deploy/crds/gpunodes.gpupack.io.yaml").read_text())
            ext.create_custom_resource_definition(crd)
            wait_for(
                lambda: any(
                    c.type == "Established" and c.status == "True"
                    for c in ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions
                    or []
                ),
                30,
                "CRD established",
            )
            if not any(ns.metadata.name == "gpupack-system" for ns in core.list_namespace().items):
                core.create_namespace({"metadata": {"name": "gpupack-system"}})
            t_nodes = time.perf_counter()
            kube = Kube.connect(str(cluster.kubeconfig))
            nodes = node_names("bench-", n_nodes)
            # A few at once: one by one, 5 000 nodes' writes (and their GPUNodes' two each) take minutes of
            # round trips. kwok then marks them Ready at its own pace.
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda n: kube.send(calls.create(node_body(n, GPUS, MODEL))), nodes))
            wait_for_ready_nodes(api, nodes, 60 + n_nodes / 10)
            nodes_ready_s = time.perf_counter() - t_nodes
            now = time.time()
            t_gpunodes = time.perf_counter()

            def publish(n: str) -> None:  # what the node's agent does at its start
                gn = gpunode.read(gpunode_obj(n, now))
                assert gn.status is not None
                kube.send(gpunode.create(n, gn.spec))
                kube.send(gpunode.patch_status(n, gn.status))

            with ThreadPoolExecutor(4) as pool:
                list(pool.map(publish, nodes))
            gpunodes_s = time.perf_counter() - t_gpunodes
            conf = yaml.safe_load(cluster.layout.scheduler_config.read_text())
            url = str(conf["extenders"][0]["urlPrefix"]).rstrip("/")
            argv = (
                sys.executable, "-m", "app.cli", "extender", "serve", "--kubeconfig", str(cluster.kubeconfig),
                "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], *cluster.extender_tls_flags(),
                "--policy", "fragaware", "--lease-namespace", "gpupack-system", "--lease-duration", "3",
                "--heartbeat-timeout", "86400", "--log-level", "warning",
            )  # fmt: skip
            # kube-scheduler calls the verbs over mutual TLS; probes use the plain ops port.
            health = HealthCheck(f"http://127.0.0.1:{cluster.extender_ops_port}/readyz")
            t_ext = time.perf_counter()
            cluster.start_process(ComponentSpec("extender", argv, health=health, ready_timeout_s=180))
            extender_ready_s = time.perf_counter() - t_ext
            cluster.start_process(_scheduler_without_extender(cluster, conf, Path(tmp)))
            procs = {p.name: p.pid for p in cluster.processes}
            results: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
            for r in range(rounds):
                for kind in KINDS:
                    ns = f"{kind.replace('_', '-')}-{r}"
                    core.create_namespace({"metadata": {"name": ns}})
                    results[kind].append(_burst(core, ns, n_pods, kind, procs=procs))
                    print(kind, r, json.dumps(results[kind][-1]), flush=True)
            rate = {k: [b["pods_per_s"] for b in results[k]] for k in KINDS}
            med = {k: statistics.median(rate[k]) for k in KINDS}

            def median_cpu(kind: str, key: str) -> dict[str, float]:
                rows = [b[key] for b in results[kind]]
                return {name: round(statistics.median(r[name] for r in rows), 2) for name in rows[0]}

            return {
                "nodes": n_nodes,
                "gpus_per_node": GPUS,
                "pods_per_burst": n_pods,
                "rounds": rounds,
                "node_lease_s": node_lease_s,
                "setup_s": {
                    "nodes_created_and_ready": round(nodes_ready_s, 1),
                    "gpunodes_created": round(gpunodes_s, 1),
                    "extender_ready": round(extender_ready_s, 1),
                },
                **{f"{k}_pods_per_s": [round(x, 1) for x in rate[k]] for k in KINDS},
                **{f"{k}_median": round(med[k], 1) for k in KINDS},
                # Same cluster, same run, rounds alternating. The goal (>= 1.0) is gpupack over the same pods
                # scheduled without the extender; the ratio over CPU-only pods is kept for the earlier runs.
                "ratio_gpupack_over_no_extender": round(med["gpupack"] / med["no_extender"], 2),
                "ratio_gpupack_over_no_extender_per_round": [
                    round(g / p, 2) for g, p in zip(rate["gpupack"], rate["no_extender"], strict=True)
                ],
                "ratio_gpupack_over_plain": round(med["gpupack"] / med["plain"], 2),
                # CPU time each process spent during a burst (create of the first pod .. last one bound), per
                # pod, median of the rounds: the cost without the waits for a shared CPU ("total": the sum
                # over the processes). "net" less each process's idle rate measured just before the burst.
                "cpu_ms_per_pod_median": {k: median_cpu(k, "cpu_ms_per_pod") for k in KINDS},
                "net_cpu_ms_per_pod_median": {k: median_cpu(k, "net_cpu_ms_per_pod") for k in KINDS},
                "bursts": results,
            }
        finally:
            cluster.stop()


def _scheduler_without_extender(cluster: Any, conf: dict[str, Any], tmp: Path) -> Any:
    """A second kube-scheduler: the same binary, flags and configuration, less the extender, own name."""
    import dataclasses

    import yaml

    from tests.devcluster import components
    from tests.devcluster.ports import free_ports

    plain_conf = {k: v for k, v in conf.items() if k != "extenders"}
    plain_conf["profiles"] = [{**conf["profiles"][0], "schedulerName": NO_EXTENDER_SCHEDULER}]
    path = tmp / "kube-scheduler-no-extender.yaml"
    path.write_text(yaml.safe_dump(plain_conf, sort_keys=False))
    port = free_ports(1)[0]
    spec = components.scheduler(cluster.bin_dir, cluster.layout, cluster.ports)
    argv = tuple(
        f"--config={path}"
        if a.startswith("--config=")
        else f"--secure-port={port}"
        if a.startswith("--secure-port=")
        else a
        for a in spec.argv
    )
    assert spec.health is not None
    health = dataclasses.replace(
        spec.health, url=spec.health.url.replace(f":{cluster.ports.scheduler}/", f":{port}/")
    )
    return dataclasses.replace(spec, name="kube-scheduler-no-extender", argv=argv, health=health)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (from /proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pod_body(i: int, kind: str) -> dict[str, Any]:
    """Pod `p<i>` of a burst of `kind` (see KINDS)."""
    meta: dict[str, Any] = {"name": f"p{i}"}
    res: dict[str, str] = {"cpu": "10m"}
    spec: dict[str, Any] = {}
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if kind != "plain":
        meta["annotations"] = {names.GPU_FRACTION: "0.25"}
        res = {**res, names.RESOURCE_GPU_MILLI: "250"}
        container["env"] = [GPU_ENV]  # as the webhook leaves it: the extender places only such pods
    if kind == "gpupack":
        meta["labels"] = {names.LABEL_MANAGED: "true"}
    if kind == "no_extender":
        spec["schedulerName"] = NO_EXTENDER_SCHEDULER
    container["resources"] = {"requests": res, "limits": res}
    return {"metadata": meta, "spec": {**spec, "containers": [container]}}


IDLE_WINDOW_S = 10.0


def _burst(core: Any, ns: str, n: int, kind: str, *, procs: dict[str, int]) -> dict[str, Any]:
    """Create `n` pods as fast as possible; pods/s from the first create to the last one bound.

    Before it, each process's CPU rate with no pod coming (informers, leases, kwok's heartbeats, the last
    burst's deletions settling) over IDLE_WINDOW_S: subtracted from the burst's CPU, it leaves what the pods
    cost each process.
    """
    from tests.devcluster import wait_for

    idle0 = {name: _cpu_s(pid) for name, pid in procs.items()}
    time.sleep(IDLE_WINDOW_S)
    cpu0 = {name: _cpu_s(pid) for name, pid in procs.items()}
    idle_ms_per_s = {name: (cpu0[name] - idle0[name]) * 1e3 / IDLE_WINDOW_S for name in procs}
    t0 = time.perf_counter()
    for i in range(n):
        core.create_namespaced_pod(ns, _pod_body(i, kind))

    def all_bound() -> bool:
        # One unbound pod is enough to know: the apiserver answers from its watch cache, whatever the size.
        return not core.list_namespaced_pod(ns, field_selector="spec.nodeName=", limit=1).items

    wait_for(all_bound, 600, f"{n} pods bound in {ns}", interval=0.1)
    wall = time.perf_counter() - t0
    cpu_ms = {name: (_cpu_s(pid) - cpu0[name]) * 1e3 for name, pid in procs.items()}
    gross = {name: ms / n for name, ms in cpu_ms.items()}
    net = {name: (ms - idle_ms_per_s[name] * wall) / n for name, ms in cpu_ms.items()}
    gross["total"], net["total"] = sum(gross.values()), sum(net.values())
    # Free the GPUs before the next round, so every round starts from the same empty cluster.
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns, limit=1).items, 300, f"pods of {ns} gone", interval=0.2)
    return {
        "pods_per_s": n / wall,
        "wall_s": round(wall, 2),
        "idle_cpu_ms_per_s": {name: round(v, 1) for name, v in sorted(idle_ms_per_s.items())},
        "cpu_ms_per_pod": {name: round(v, 2) for name, v in sorted(gross.items())},
        "net_cpu_ms_per_pod": {name: round(v, 2) for name, v in sorted(net.items())},
        "loadavg_1m_after": round(os.getloadavg()[0], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,5000", help="node counts for the latency part")
    ap.add_argument("--calls", type=int, default=200, help="filter+prioritize calls per node count")
    ap.add_argument("--policy", default="fragaware")
    ap.add_argument("--runs", type=int, default=3, help="latency passes per node count (medians reported)")
    ap.add_argument("--pods", type=int, default=300, help="pods per throughput burst (0 skips part 2)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cluster-nodes", type=int, default=20)
    ap.add_argument(
        "--node-lease-s",
        type=int,
        default=40,
        help="kwok's node lease (renewed every quarter of it, as a kubelet does); 40 = the kubelet's default",
    )
    ap.add_argument("--out", default=str(REPO / "bench/results/extender.json"))
    ap.add_argument(
        "--keep-latency",
        action="store_true",
        help="accepted for older commands: a run with --nodes '' always keeps the file's latency part",
    )
    args = ap.parse_args()
    out_path = Path(args.out)
    # The file holds one run per part: {latency_run, latency, throughput_run, throughput}. A run of one part
    # keeps the other part's run as it is; a throughput result it replaces moves to throughput_earlier.
    out: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.nodes:
        out["latency_run"] = _run_meta(args)
        out["latency"] = []
        for n in (int(x) for x in args.nodes.split(",") if x):
            res = latency(n, args.calls, args.policy, args.runs)
            print(json.dumps(res), flush=True)
            out["latency"].append(res)
            out_path.write_text(json.dumps(out, indent=2) + "\n")  # keep what is done if part 2 fails
        out["latency_run"]["loadavg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    if args.pods:
        run = _run_meta(args)
        result = throughput(args.pods, args.rounds, args.cluster_nodes, args.node_lease_s)
        print(json.dumps(result), flush=True)
        if "throughput" in out:
            earlier = {"run": out.get("throughput_run"), "throughput": out["throughput"]}
            out["throughput_earlier"] = [earlier, *out.get("throughput_earlier", [])]
        out["throughput_run"] = {**run, "loadavg_at_end": [round(x, 1) for x in os.getloadavg()]}
        out["throughput"] = result
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _run_meta(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "inputs": vars(args),
        "command": " ".join(["python", *(shlex.quote(a) for a in sys.argv)]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        # The build machine is shared: a load average above the CPU count means these are contended numbers.
        "loadavg_at_start": [round(x, 1) for x in os.getloadavg()],
        # uvicorn's "auto" picks these when installed (gpupack depends on both), else h11 and asyncio.
        "uvicorn_http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "uvicorn_loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "latency_timed": "request sent (body encoded before the clock) .. reply read and decoded",
    }


if __name__ == "__main__":
    sys.exit(main())
