"""Churn: GPU pods created and deleted at a steady rate against the dev cluster; nothing may leak.

`python -m tests.devcluster up` (kwok GPU nodes, gpupack's extender, webhook and one simulated agent per node,
the real kube-scheduler) takes --rate gpupack pods a second for --seconds, each a `gpu-fraction` share
(0.1, 0.25 or 0.5 in turn) deleted --lifetime seconds after its creation. Reported:

- every pod bound within --deadline seconds of its creation (kube-scheduler + the extender's filter,
  prioritize and bind), as p50 / p99 / max of create → bound on the bench's clock (polled each second);
- errors: API calls that failed, pods never bound;
- after the last delete: what the extender still holds (its /state: GPUs with an allocation, pods on GPUs,
  assume-cache holds) — all must come back to zero (no allocation leaked, no hold left);
- the resident memory of the extender and of the agents, sampled every --sample seconds, with the slope of a
  least-squares line through it (MiB per minute; flat is what a steady load should give).

Run: .venv/bin/python bench/churn.py [--seconds 3600 --rate 10 --out bench/results/churn.json]
The 3-minute version runs in `make test` (tests/integration/test_churn_smoke.py), asserting leaks and errors
only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.core import names  # noqa: E402
from app.core.errors import KubeError  # noqa: E402
from app.kube.calls import Request  # noqa: E402
from app.kube.client import Kube  # noqa: E402
from bench.packing import _git_commit  # noqa: E402
from bench.quantiles import nearest_rank  # noqa: E402
from tests.devcluster import Cluster, ensure_binaries  # noqa: E402
from tests.devcluster.addons import AGENT_PREFIX, EXTENDER  # noqa: E402

SHARES = ("0.1", "0.25", "0.5")
NAMESPACE = "churn"


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process and its children (a component's session), MiB; None once gone."""
    total_kib = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(status.parent.name) != pid and fields.get("PPid", "").strip() != str(pid):
            continue
        total_kib += int(fields.get("VmRSS", "0 kB").split()[0])
    return round(total_kib / 1024, 1) if total_kib else None


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB), in MiB per minute (0 with fewer than 2 points)."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return round(60 * sum((x - mx) * (y - my) for x, y in points) / var, 3) if var else 0.0


def pod(name: str, share: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {names.GPU_FRACTION: share}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "main", "image": "busybox"}]},
    }


def extender_state(cluster: Cluster) -> dict[str, Any]:
    with cluster.extender_opener().open(cluster.extender_url.rstrip("/") + "/state", timeout=10) as resp:
        state: dict[str, Any] = json.loads(resp.read())
    return state


def leftovers(state: dict[str, Any]) -> dict[str, int]:
    gpus = [g for n in state["nodes"] for g in n["gpus"]]
    return {
        "gpus_with_allocation": sum(1 for g in gpus if g["milliAllocated"] or g["memoryAllocatedMiB"]),
        "pods_on_gpus": sum(len(g["pods"]) for g in gpus),
        "holds": int(state["held"]),
        "pending": len(state["pending"]),
    }


def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    kube = Kube.connect(str(cluster.kubeconfig))
    procs = {
        p.name: p.pid for p in cluster.processes if p.name == EXTENDER or p.name.startswith(AGENT_PREFIX)
    }
    memory: dict[str, list[tuple[float, float]]] = {"extender": [], "agents": []}
    created: dict[str, float] = {}  # name -> creation time
    bound: dict[str, float] = {}  # name -> seconds from creation to bound
    errors: list[str] = []
    try:
        kube.send(Request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}))
        t0 = time.monotonic()
        next_create, next_look, next_sample, n = t0, t0, t0, 0
        to_delete: list[tuple[float, str]] = []
        while True:
            now = time.monotonic()
            if now - t0 >= args.seconds and not to_delete:
                break
            if now - t0 < args.seconds and now >= next_create:
                name = f"c{n}"
                try:
                    kube.send(
                        Request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, SHARES[n % 3]))
                    )
                    created[name] = time.monotonic()
                    to_delete.append((created[name] + args.lifetime, name))
                except KubeError as exc:
                    errors.append(f"create {name}: {exc}")
                n += 1
                next_create += 1 / args.rate
            while to_delete and to_delete[0][0] <= now:
                _, name = to_delete.pop(0)
                try:
                    kube.send(Request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"))
                except KubeError as exc:
                    if not exc.is_not_found:
                        errors.append(f"delete {name}: {exc}")
            if now >= next_look:
                listed = kube.send(Request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods"))
                seen = time.monotonic()
                for item in listed.get("items", []):
                    name = item["metadata"]["name"]
                    if item.get("spec", {}).get("nodeName") and name in created and name not in bound:
                        bound[name] = seen - created[name]
                next_look = now + 1.0
            if now >= next_sample:
                ext = rss_mib(procs.get(EXTENDER, -1))
                agents = [rss_mib(pid) for name, pid in procs.items() if name != EXTENDER]
                if ext is not None:
                    memory["extender"].append((now - t0, ext))
                if agents and all(a is not None for a in agents):
                    memory["agents"].append((now - t0, round(sum(a or 0 for a in agents), 1)))
                next_sample = now + args.sample
                print(
                    f"{now - t0:6.0f}s created {n} bound {len(bound)} errors {len(errors)} "
                    f"extender {ext} MiB",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(min(0.01, 1 / args.rate))
        unbound = [p for p in created if p not in bound or bound[p] > args.deadline]
        deadline = time.monotonic() + 60
        left = leftovers(extender_state(cluster))
        while any(left.values()) and time.monotonic() < deadline:  # the last deletes' watch events
            time.sleep(1)
            left = leftovers(extender_state(cluster))
    finally:
        kube.close()
    waits = sorted(bound.values()) or [0.0]
    return {
        "pods_created": len(created),
        "bound_within_deadline": len(created) - len(unbound),
        "unbound_or_late": len(unbound),
        "create_to_bound_s": {
            "p50": round(statistics.median(waits), 2),
            "p99": round(nearest_rank(waits, 0.99), 2),
            "max": round(waits[-1], 2),
        },
        "errors": errors[:20],
        "error_count": len(errors),
        "left_after_last_delete": left,
        "memory_mib": {
            k: {
                "first": v[0][1] if v else None,
                "last": v[-1][1] if v else None,
                "slope_mib_per_min": slope_per_min(v),
            }
            for k, v in memory.items()
        },
        "memory_samples": {k: v for k, v in memory.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--rate", type=float, default=10.0, help="pods created a second")
    ap.add_argument("--lifetime", type=float, default=5.0, help="seconds from a pod's creation to its delete")
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds a pod may take to be bound")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--out", default=str(REPO / "bench/results/churn.json"))
    ap.add_argument("--logs", help="copy the dev cluster's logs here at the end")
    args = ap.parse_args()
    env = {**os.environ, "GPUPACK_K8S_BIN": str(ensure_binaries())}
    cli = [sys.executable, "-m", "tests.devcluster"]
    load_at_start = [round(x, 1) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="gpupack-churn-") as tmp:
        d = Path(tmp) / "dev"
        up = [*cli, "up", "--dir", str(d), "--nodes", str(args.nodes)]
        subprocess.run(up, env=env, cwd=REPO, check=True, capture_output=True, timeout=600)
        try:
            cluster = Cluster.load(d)
            assert cluster is not None, f"no dev cluster in {d}"
            result = run(cluster, args)
        finally:
            if args.logs:  # what the cluster said goes with it otherwise: keep it to explain an anomaly
                shutil.copytree(d / "logs", args.logs, dirs_exist_ok=True)
            subprocess.run([*cli, "down", "--dir", str(d)], env=env, cwd=REPO, check=False, timeout=300)
    doc = {
        "bench": "churn",
        "inputs": {k: v for k, v in vars(args).items() if k not in ("out", "logs")},
        "versions": {"git": _git_commit(), "python": platform.python_version()},
        "loadavg_at_start": load_at_start,
        "loadavg_at_end": [round(x, 1) for x in os.getloadavg()],
        **result,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    summary = {k: v for k, v in doc.items() if k not in ("memory_samples", "errors")}
    print(json.dumps(summary, indent=2))
    return (
        0
        if not result["error_count"]
        and not result["unbound_or_late"]
        and not any(result["left_after_last_delete"].values())
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
