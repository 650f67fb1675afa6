"""How long does the extender take to sync a big cluster, and how much memory does it hold then?

The API's list pages are written to files first (JSON as the apiserver sends it: 500 objects a page,
pods with managedFields, status conditions and container statuses). A fresh process then runs the
extender's three informers (GPUNodes, pods, Nodes) over a stand-in API client that reads those pages
(`app.kube.calls.read_reply` of the bytes, as app.kube.client does: the pod pages straight into the pod
informer's shape), and reports the time until all three are synced plus what the replica does as it turns
Ready (every node's view and array rows built, the heap frozen), the first filter after that (the pod
shape's ranking), the resident memory then and its peak.
Medians of --runs fresh processes.

Usage: .venv/bin/python bench/coldstart.py [--nodes 5000] [--pods-per-node 10] [--runs 3]
                                          [--against CHECKOUT]
Writes bench/results/coldstart.json. With --against (another version's checkout, e.g. a `git worktree` of
the commit before a change), that version's child runs on the same pages in turn with this one's, each
round, for a same-run comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core import catalog, names  # noqa: E402
from app.core.model import Allocation  # noqa: E402
from app.kube import gpunode, paths  # noqa: E402

MODEL = "A100-40GB"
GPUS = 8
PAGE = 500
SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def node_obj(name: str) -> dict[str, Any]:
    cond = {"lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {
                "kubernetes.io/hostname": name,
                names.NODE_LABEL_ENABLED: "true",
                names.NODE_LABEL_GPU_MODEL: MODEL,
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"providerID": f"kwok://{name}"},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110", names.RESOURCE_GPU_MILLI: "8000"},
            "capacity": {"cpu": "96", "memory": "1Ti", "pods": "110", names.RESOURCE_GPU_MILLI: "8000"},
            "conditions": [
                {**cond, "type": t, "status": "False", "reason": f"Kubelet{t}", "message": "ok"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ]
            + [{**cond, "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}],
            "nodeInfo": {"kubeletVersion": "v1.34.10", "architecture": "amd64", "operatingSystem": "linux"},
        },
    }


def gpunode_obj(name: str, beat: float) -> dict[str, Any]:
    spec, status = gpunode.idle(name, MODEL, GPUS, beat)
    return {
        **gpunode.GPUNode.of(name, spec, status).wire(),
        "metadata": {"name": name, "resourceVersion": "1"},
    }


def pod_obj(node: str, i: int, gpu: bool) -> dict[str, Any]:
    """A running pod as the apiserver lists it; `gpu`: a gpupack pod with its allocation."""
    name = f"{node}-p{i}"
    ann: dict[str, str] = {}
    labels = {"app": "bench", "pod-template-hash": "5d8f7c9b6"}
    res: dict[str, str] = {"cpu": "2", "memory": "8Gi"}
    env: list[dict[str, Any]] = [{"name": "LOG_LEVEL", "value": "info"}]
    if gpu:
        milli = (100, 250, 500)[i % 3]
        mem = catalog.lookup(MODEL).memory_mib
        g = i % GPUS
        ann = {names.GPU_FRACTION: f"{milli / 1000:.2f}"}
        ann.update(Allocation(node, (g,), (f"GPU-{node}-{g}",), milli, milli * mem // 1000).to_annotations())
        labels[names.LABEL_MANAGED] = "true"
        res[names.RESOURCE_GPU_MILLI] = str(milli)
        field = f"metadata.annotations['{names.ALLOC_GPU_UUIDS}']"
        env.append(
            {"name": names.ENV_NVIDIA_VISIBLE_DEVICES, "valueFrom": {"fieldRef": {"fieldPath": field}}}
        )
    ts = "2026-01-01T00:00:00Z"
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": ts,
            "labels": labels,
            "annotations": ann,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench-5d8f7c9b6", "uid": "rs"}
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": ts,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {
                            ".": {}, "f:image": {}, "f:resources": {"f:limits": {}, "f:requests": {}}
                        }}},
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": ts,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:status": {
                            "f:conditions": {}, "f:containerStatuses": {}, "f:phase": {}, "f:podIP": {}
                        }
                    },
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "gpupack-scheduler" if gpu else "default-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/bench/worker:1.0",
                    "command": ["python", "-m", "worker"],
                    "resources": {"requests": res, "limits": res},
                    "env": env,
                    "volumeMounts": [
                        {"name": "kube-api-access", "mountPath": SA_PATH, "readOnly": True}
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]
                    },
                }
            ],
            "restartPolicy": "Always",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300}
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": ts}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "10.0.0.1",
            "podIP": "10.1.0.1",
            "startTime": ts,
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example/bench/worker:1.0",
                    "imageID": "registry.example/bench/worker@sha256:0123456789abcdef",
                    "containerID": f"containerd://{i:064x}",
                    "started": True,
                    "state": {"running": {"startedAt": ts}},
                }
            ],
        },
    }  # fmt: skip


def write_pages(root: Path, n_nodes: int, pods_per_node: int) -> dict[str, int]:
    """One file per list page, per collection, as the apiserver would send them."""
    now = time.time()
    node_names = [f"node-{i}" for i in range(n_nodes)]
    collections = {
        "gpunodes": (gpunode_obj(n, now) for n in node_names),
        "nodes": (node_obj(n) for n in node_names),
        # Half the pods on each node are gpupack's, half are other workloads (their CPU counts too).
        "pods": (pod_obj(n, i, gpu=i % 2 == 0) for n in node_names for i in range(pods_per_node)),
    }
    counts: dict[str, int] = {}
    for name, objs in collections.items():
        page: list[dict[str, Any]] = []
        pages = 0
        count = 0
        for obj in objs:
            page.append(obj)
            count += 1
            if len(page) == PAGE:
                _write_page(root, name, pages, page, last=False)
                pages, page = pages + 1, []
        _write_page(root, name, pages, page, last=True)
        counts[name] = count
    return counts


def _write_page(root: Path, name: str, n: int, items: list[dict[str, Any]], last: bool) -> None:
    meta = {"resourceVersion": "99999", "continue": "" if last else str(n + 1)}
    (root / f"{name}-{n}.json").write_text(json.dumps({"kind": "List", "metadata": meta, "items": items}))


def child(root: Path) -> dict[str, Any]:
    """In a fresh process: sync the three informers from the page files, then one filter."""
    t0 = time.perf_counter()
    from app.core import podview, request
    from app.core.placement import registry
    from app.kube.assume import AssumeCache
    from app.kube.cache import ClusterCache
    from app.kube.calls import read_reply
    from extender import verbs
    from extender.config import Settings
    from extender.rankings import Rankings
    from extender.runtime import informer_config, informers, settle_heap

    imports_s = time.perf_counter() - t0
    rss_start = _rss_mib()

    class Pages:
        """The API as the informers see it: each list page is the bytes of one file."""

        def send(self, req: Any) -> Any:
            name = {paths.gpunodes(): "gpunodes", paths.pods(): "pods", paths.nodes(): "nodes"}[req.path]
            token = dict(req.query or ()).get("continue") or "0"
            return read_reply(req, (root / f"{name}-{token}.json").read_bytes())

        def watch(self, *a: Any, **k: Any) -> Any:
            raise AssertionError("not watched")

    cache = ClusterCache(AssumeCache(), heartbeat_timeout_s=1e9)
    t1, c1 = time.perf_counter(), time.process_time()
    for informer in informers(Pages(), cache, informer_config(Settings())):  # as the extender wires them
        informer.list_all()
    synced_s = time.perf_counter() - t1
    synced_cpu_s = time.process_time() - c1  # without the waits for a shared CPU
    policy = registry.create("fragaware")
    rankings = Rankings(cache, policy)
    # What the replica does as it turns Ready: every node's view and array rows built, then the heap frozen.
    t_prep = time.perf_counter()
    rankings.prepare()
    settle_heap()
    prepare_s = time.perf_counter() - t_prep
    rss_synced = _rss_mib()
    pod = {"metadata": {"annotations": {names.GPU_FRACTION: "0.25"}}, "spec": {"containers": [{"name": "c"}]}}
    demand = request.pod_demand(podview.read(pod))
    assert not isinstance(demand, tuple)
    node_names = cache.node_names()
    t2 = time.perf_counter()
    with rankings.standings(demand) as standings:
        out = verbs.filter_nodes(node_names, standings, True)
    first_filter_s = time.perf_counter() - t2
    assert len(out.passed) == 1
    return {
        "imports_s": round(imports_s, 2),
        "sync_s": round(synced_s, 2),
        "sync_cpu_s": round(synced_cpu_s, 2),
        "first_filter_s": round(first_filter_s, 2),
        "ready_prepare_s": round(prepare_s, 2),
        "ready_s": round(imports_s + synced_s + prepare_s, 2),
        "rss_at_start_mib": rss_start,
        "rss_synced_mib": rss_synced,
        "rss_after_first_filter_mib": _rss_mib(),
        "rss_peak_mib": _rss_mib("VmHWM"),
        "gpupack_pods": len(cache.pods()),
    }


def _rss_mib(key: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    return -1


def _list_query_check() -> None:
    """The stand-in reads `continue` from the request's query, as app.kube.calls.list_request sets it."""
    from app.kube import calls

    req = calls.list_request(paths.pods(), "", PAGE, "7")
    assert dict(req.query or ()).get("continue") == "7", req.query


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods-per-node", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="another version's checkout (a git worktree): its own bench/coldstart.py --child runs on the"
        " same pages, in turn with this code's, each round; the JSON gets its runs and the per-round ratios",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(REPO / "bench/results/coldstart.json"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child))))
        return 0
    _list_query_check()
    out: dict[str, Any] = {
        "inputs": {k: v for k, v in vars(args).items() if k != "child"},
        "command": " ".join(["bench/coldstart.py", *sys.argv[1:]]),
        "commit": _commit(REPO),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        # The build machine is shared: a load average above the CPU count means these are contended numbers.
        "loadavg_at_start": [round(x, 1) for x in os.getloadavg()],
    }
    versions = {"this": REPO}
    if args.against:
        versions["against"] = Path(args.against).resolve()
    runs: dict[str, list[dict[str, Any]]] = {who: [] for who in versions}
    with tempfile.TemporaryDirectory(prefix="gpupack-coldstart-") as tmp:
        root = Path(tmp)
        out["objects"] = write_pages(root, args.nodes, args.pods_per_node)
        out["list_bytes_mib"] = round(sum(p.stat().st_size for p in root.iterdir()) / 2**20, 1)
        for _ in range(args.runs):
            for who, checkout in versions.items():  # in turn: both versions see the same load
                script = checkout / "bench/coldstart.py"
                cmd = [sys.executable, str(script), "--child", str(root)]
                done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=checkout)
                runs[who].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(who, json.dumps(runs[who][-1]), flush=True)
    out["runs"] = runs["this"]
    out["median"] = _median(runs["this"])
    if args.against:
        before = runs["against"]
        out["against"] = {"checkout": str(versions["against"]), "commit": _commit(versions["against"])}
        out["against"].update(runs=before, median=_median(before))
        # This code over the other, round by round (each pair ran back to back), then the median.
        out["ratio_median"] = {
            key: round(
                statistics.median(a[key] / b[key] for a, b in zip(runs["this"], before, strict=True)), 2
            )
            for key in ("sync_s", "sync_cpu_s", "ready_s", "rss_synced_mib", "rss_peak_mib")
        }
    out["loadavg_at_end"] = [round(x, 1) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("median", "ratio_median") if k in out}))
    return 0


def _median(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], int | float)}


def _commit(checkout: Path) -> str:
    """The checkout's commit, with "+changes" when its tracked files differ from it."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"], check=False).returncode != 0
    return head.stdout.strip() + ("+changes" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
