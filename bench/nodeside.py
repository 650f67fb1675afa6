"""What gpupack's node side adds to a pod's start and stop, on a real kubelet + containerd node (root).

The real-node tier's cluster (tests/realnode/chart.py: gpupack installed by its chart, a simulated r615
GPU pair, the STAND-IN MPS control daemon) runs three kinds of pod on the same node, interleaved:

- `mps`: a gpupack MPS share (`gpu-fraction`, isolation mps): gpupack's RuntimeClass handler asks the agent
  at create (one apiserver read, the pod's MPS directory), its createRuntime hook sets per-cgroup limits, and
  a stop is drained through the MPS control daemon;
- `shared`: a gpupack share without MPS (isolation none): the node's default runtime (gpupack's guard, no
  agent call) keeps its allocation;
- `plain`: a pod with no GPU keys on the same node: the guard gives it `NVIDIA_VISIBLE_DEVICES=void`.

Per pod: create → bound (scheduled), bound → Running (what the node does: sandbox, handler, container) and
delete → gone (the stop: the handler's drain for `mps`, then the kubelet's kill and cleanup). Each pod's
container exits on SIGTERM at once, so the stop measures the node, not a grace period. Times are the bench's
own clock polling the apiserver every 20 ms (a phase is seen up to 20 ms late, alike for every kind).
First one pod at a time (--pods of each kind), then --burst of each kind created at once.

The MPS daemon is the stand-in (a Python script per control command); NVIDIA's binary answers faster, so
the `mps` stop here bounds the real one from above (UNVERIFIED on a GPU).

Run (root): .venv/bin/python bench/nodeside.py [--pods 50 --burst 30 --out bench/results/nodeside.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.core import names  # noqa: E402
from app.core.errors import KubeError  # noqa: E402
from app.kube.calls import Request  # noqa: E402
from app.kube.client import Kube  # noqa: E402
from bench.quantiles import nearest_rank  # noqa: E402
from tests.devcluster import ensure_binaries, kubeletnode  # noqa: E402
from tests.realnode import chart  # noqa: E402

KINDS = {
    "mps": {names.GPU_FRACTION: "0.02", names.ISOLATION: "mps"},
    "shared": {names.GPU_FRACTION: "0.02", names.ISOLATION: "none"},
    "plain": {},
}
POLL_S = 0.02
TIMEOUT_S = 120.0
# Runs until SIGTERM, then exits at once (busybox sh: the trap runs between sleeps of 0.1 s).
COMMAND = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"]


def a_pod(name: str, kind: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(KINDS[kind])},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": kubeletnode.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": kubeletnode.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": COMMAND,
                }
            ],
        },
    }


def running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


class Timer:
    """One pod's phases on the bench's clock."""

    def __init__(self, kube: Kube, namespace: str, name: str, kind: str) -> None:
        self.kube, self.path, self.kind = kube, f"/api/v1/namespaces/{namespace}/pods/{name}", kind
        self.t: dict[str, float] = {}

    def poll(self) -> bool:
        """One look at the pod; True once it is Running (or failed: raised)."""
        pod = self.kube.send(Request("GET", self.path))
        now = time.monotonic()
        if pod.get("spec", {}).get("nodeName"):
            self.t.setdefault("bound", now)
        for s in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (s.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("CreateContainerError", "RunContainerError"):
                raise RuntimeError(f"{self.path}: {waiting.get('reason')}: {waiting.get('message')}")
        if running(pod):
            self.t.setdefault("running", now)
            return True
        return False

    def gone(self) -> bool:
        try:
            self.kube.send(Request("GET", self.path))
        except KubeError as exc:
            if exc.is_not_found:
                self.t.setdefault("gone", time.monotonic())
                return True
            raise
        return False


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(POLL_S)


def start_and_stop(kube: Kube, namespace: str, node: str, names_kinds: list[tuple[str, str]]) -> list[Timer]:
    """Create the pods at once, wait until each runs, delete them at once, wait until each is gone."""
    timers = [Timer(kube, namespace, n, k) for n, k in names_kinds]
    for tm, (n, k) in zip(timers, names_kinds, strict=True):
        tm.t["created"] = time.monotonic()
        kube.send(Request("POST", f"/api/v1/namespaces/{namespace}/pods", a_pod(n, k, node)))
    until(lambda: all([tm.poll() for tm in timers if "running" not in tm.t] or [True]), "pods Running")
    for tm in timers:
        tm.t["deleted"] = time.monotonic()
        kube.send(Request("DELETE", tm.path))
    until(lambda: all([tm.gone() for tm in timers if "gone" not in tm.t] or [True]), "pods gone")
    return timers


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = nearest_rank(ordered, 0.99)
    return {
        "p50": round(statistics.median(ordered) * 1000, 1),
        "p99": round(p99 * 1000, 1),
        "n": len(ordered),
    }


def phases(timers: list[Timer]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in KINDS:
        mine = [tm.t for tm in timers if tm.kind == kind]
        if not mine:
            continue
        out[kind] = {
            "create_to_bound_ms": ms([t["bound"] - t["created"] for t in mine]),
            "bound_to_running_ms": ms([t["running"] - t["bound"] for t in mine]),
            "delete_to_gone_ms": ms([t["gone"] - t["deleted"] for t in mine]),
        }
    return out


def added(by_kind: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """What each gpupack kind adds over `plain` on the node: start (bound → Running) and stop."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("mps", "shared"):
        for phase in ("bound_to_running_ms", "delete_to_gone_ms"):
            for q in ("p50", "p99"):
                out.setdefault(kind, {})[f"{phase.removesuffix('_ms')}_{q}_added_ms"] = round(
                    by_kind[kind][phase][q] - by_kind["plain"][phase][q], 1
                )
    return out


def measure(kube: Kube, node: str, pods: int, burst_size: int) -> tuple[list[Timer], dict[str, Any]]:
    kube.send(Request("POST", "/api/v1/namespaces", {"metadata": {"name": "bench"}}))
    one: list[Timer] = []
    for i in range(pods):
        for kind in KINDS:  # interleaved: machine noise falls on every kind alike
            one += start_and_stop(kube, "bench", node, [(f"{kind}-{i}", kind)])
        print(f"one at a time: {i + 1}/{pods} of each kind", file=sys.stderr, flush=True)
    burst: dict[str, Any] = {}
    for kind in KINDS:
        print(f"burst: {burst_size} {kind} pods at once", file=sys.stderr, flush=True)
        timers = start_and_stop(kube, "bench", node, [(f"{kind}-burst-{i}", kind) for i in range(burst_size)])
        burst[kind] = phases(timers)[kind]
    return one, burst


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--pods", type=int, default=50, help="pods of each kind, one at a time")
    ap.add_argument("--burst", type=int, default=30, help="pods of each kind created at once")
    ap.add_argument("--out", default=str(REPO / "bench/results/nodeside.json"))
    args = ap.parse_args()
    bins, helm_bin = ensure_binaries(), chart.helm_binary()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="gpupack-nodeside-") as tmp,
        chart.real_node_installed(Path(tmp), bins, helm_bin, model="A100-40GB", gpus=2) as (cluster, node),
    ):
        up_s = time.monotonic() - t0
        kube = Kube.connect(str(cluster.kubeconfig))
        try:
            one, burst = measure(kube, node.name, args.pods, args.burst)
        finally:
            kube.close()
    single = phases(one)
    doc = {
        "bench": "nodeside",
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "inputs": {"pods_each_kind": args.pods, "burst_each_kind": args.burst, "poll_ms": POLL_S * 1000,
                   "kinds": {k: v or "no GPU keys" for k, v in KINDS.items()}},
        "real_node_up_s": round(up_s, 1),
        "one_at_a_time": single,
        "one_at_a_time_added_over_plain": added(single),
        "burst": burst,
        "burst_added_over_plain": added(burst),
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"one_at_a_time_added_over_plain": doc["one_at_a_time_added_over_plain"],
                      "burst_added_over_plain": doc["burst_added_over_plain"]}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
