"""Autoscaling sized by gpupack's packing: GPUs provisioned vs the packing lower bound, GPU-hours with and
without repack-driven scale-down, for an openb trace slice arriving in waves (bench/results/autoscale.json).

Simulated (no cluster): the placement is the extender's (`place` with the chosen policy), the scale-up
request is `app.core.autoscale.plan` (the extender's leader loop calls exactly it), the repack is
`app.tools.repack.plan` with goal `nodes` (as `gpupack repack --goal nodes`). The autoscaler is a model of
what Karpenter documents: it packs the pending placeholder pods onto new nodes of the pool's instance type
(first fit, largest first) and removes a node once it is empty. For comparison, the same pending pods are
also put to it the way an autoscaler sees them without gpupack's sizing: one placeholder per pod asking
for its GPUs whole (KAI's node-scale-adjuster style).

Pods: the first --pods GPU pods of the trace by creation time, in --waves equal waves --wave-minutes
apart; each lives its trace lifetime scaled so that the median lifetime is --median-waves waves (clipped
to [0.5, 6] waves). GPU model constraints are dropped: one node pool of --model serves every pod.
Run: .venv/bin/python bench/autoscale.py [--trace gpushare40 --pods 320 --waves 8 --policy <default>]

With --live N, it also measures the time from pending to bound on a real control plane: `make dev` with
--autoscaler (the real Karpenter kwok provider, one static node kept full), then N waves of the slice's first
pods as Deployments, each wave waiting until every pod is bound; per pod, from its creation to its
PodScheduled condition (one-second resolution, as the API stores them).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from packing import _git_commit, _sha256, pod_file  # noqa: E402

from app.core.autoscale.plan import PendingPod, Pool, plan  # noqa: E402
from app.core.model import MILLI_PER_GPU, Allocation, Demand, Node  # noqa: E402
from app.core.placement import DEFAULT_POLICY, Placement, Policy, place, registry, to_allocation  # noqa: E402
from app.tools.repack.plan import Goal, PodRef  # noqa: E402
from app.tools.repack.plan import plan as repack_plan  # noqa: E402
from app.tools.sim.loader import load_pods  # noqa: E402


@dataclass(frozen=True, slots=True)
class Arrival:
    key: str
    demand: Demand
    at: float  # hours
    until: float  # hours


def slice_of(
    traces_dir: Path, trace: str, *, pods: int, waves: int, wave_h: float, median_waves: float
) -> list[Arrival]:
    path = traces_dir / pod_file(trace)
    demands = {p.name: p.demand for p in load_pods(path)}
    with path.open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_gpu"]) > 0]
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    rows = rows[:pods]
    lifetimes = [max(1, int(r["deletion_time"]) - int(r["creation_time"])) for r in rows]
    scale = median_waves * wave_h / statistics.median(lifetimes)
    per_wave = math.ceil(len(rows) / waves)
    out = []
    for i, (r, life) in enumerate(zip(rows, lifetimes, strict=True)):
        at = (i // per_wave) * wave_h
        hours = min(max(life * scale, 0.5 * wave_h), 6 * wave_h)
        out.append(Arrival(r["name"], replace(demands[r["name"]], models=frozenset()), at, at + hours))
    return out


def karpenter_nodes(requests: list[int], gpus_per_node: int) -> int:
    """Nodes an autoscaler launches for placeholders asking for these GPU counts: first fit, largest first."""
    free: list[int] = []
    for want in sorted(requests, reverse=True):
        for i, left in enumerate(free):
            if left >= want:
                free[i] -= want
                break
        else:
            free.append(gpus_per_node - want)
    return len(free)


class Sim:
    def __init__(self, pool: Pool, policy: Policy, repack: bool) -> None:
        self.pool, self.policy, self.repack = pool, policy, repack
        self.nodes: dict[str, Node] = {}
        self.allocs: dict[str, tuple[Allocation, Demand]] = {}
        self.launched = 0
        self.removed = 0
        self.evictions = 0
        self.gpu_hours = 0.0
        self.now = 0.0
        self.waves: list[dict[str, Any]] = []

    def advance(self, t: float) -> None:
        self.gpu_hours += (t - self.now) * sum(len(n.gpus) for n in self.nodes.values())
        self.now = t

    def _bind(self, key: str, demand: Demand) -> bool:
        got = place(self.nodes.values(), demand, self.policy)
        if not isinstance(got, Placement):
            return False
        alloc = to_allocation(got.node, demand, got.gpus)
        self.nodes[got.node.name] = got.node.reserve((alloc,))
        self.allocs[key] = (alloc, demand)
        return True

    def depart(self, key: str) -> None:
        alloc, _ = self.allocs.pop(key)
        self.nodes[alloc.node] = self.nodes[alloc.node].reserve((alloc,), -1)

    def scale_down(self) -> None:
        if self.repack:
            refs = [PodRef(k, k, a, d) for k, (a, d) in self.allocs.items()]
            got = repack_plan(list(self.nodes.values()), refs, {}, self.policy, goal=Goal.NODES)
            for m in got.moves:
                self.depart(m.uid)
                _, demand = m.source, next(r.demand for r in refs if r.uid == m.uid)
                self.nodes[m.target.node] = self.nodes[m.target.node].reserve((m.target,))
                self.allocs[m.uid] = (m.target, demand)
            self.evictions += len(got.moves)
        for name in [n for n, node in self.nodes.items() if not any(g.milli_used for g in node.gpus)]:
            del self.nodes[name]
            self.removed += 1

    def arrive(self, wave: list[Arrival]) -> None:
        pending = [a for a in wave if not self._bind(a.key, a.demand)]
        asked = plan(
            list(self.nodes.values()),
            [PendingPod(a.key, a.demand) for a in pending],
            [self.pool],
            self.policy,
        )
        ours = karpenter_nodes([r.gpus for r in asked.requests], self.pool.gpus)
        naive_gpus = [a.demand.count for a in pending if a.key not in asked.fit_now]
        naive = karpenter_nodes(naive_gpus, self.pool.gpus)
        for _ in range(ours):
            name = f"node-{self.launched}"
            self.nodes[name] = self.pool.empty_node(name)
            self.launched += 1
        unbound = [a.key for a in pending if not self._bind(a.key, a.demand)]
        live_milli = sum(d.milli * d.count for _, d in self.allocs.values() if d.milli)
        self.waves.append(
            {
                "at_h": self.now,
                "arrived": len(wave),
                "pending_after_placement": len(pending),
                "gpus_requested": asked.gpus,
                "gpus_requested_one_per_pod": sum(naive_gpus),
                "nodes_launched": ours,
                "nodes_launched_one_per_pod": naive,
                "unbound_after_scale_up": len(unbound),
                "gpus_provisioned": sum(len(n.gpus) for n in self.nodes.values()),
                "gpus_in_use": sum(1 for n in self.nodes.values() for g in n.gpus if g.milli_used),
                "packing_lower_bound_gpus": math.ceil(live_milli / MILLI_PER_GPU),
            }
        )
        if unbound:
            raise AssertionError(f"pods left unbound after the scale-up: {unbound[:5]}")


def run(arrivals: list[Arrival], pool: Pool, policy_name: str, repack: bool) -> dict[str, Any]:
    sim = Sim(pool, registry.create(policy_name), repack)
    times = sorted({a.at for a in arrivals} | {a.until for a in arrivals})
    t0 = time.perf_counter()
    for t in times:
        sim.advance(t)
        for a in arrivals:
            if a.until == t and a.key in sim.allocs:
                sim.depart(a.key)
        sim.scale_down()
        wave = [a for a in arrivals if a.at == t]
        if wave:
            sim.arrive(wave)
    provisioned = [w["gpus_provisioned"] for w in sim.waves]
    bound = [w["packing_lower_bound_gpus"] for w in sim.waves]
    return {
        "repack": repack,
        "gpu_hours": round(sim.gpu_hours, 2),
        "nodes_launched": sim.launched,
        "nodes_removed": sim.removed,
        "evictions": sim.evictions,
        "provisioned_over_lower_bound_per_wave": [
            round(p / b, 3) for p, b in zip(provisioned, bound, strict=True)
        ],
        "waves": sim.waves,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def live(arrivals: list[Arrival], waves: int, per_wave: int, model: str) -> dict[str, Any]:
    """Pending-to-bound times through the dev cluster with Karpenter (see the module docstring)."""
    import os
    import subprocess
    import tempfile

    from kubernetes import client, config

    from app.core import names
    from app.core.autoscale import placeholders as ph
    from tests.devcluster import ensure_binaries, wait_for
    from tests.devcluster.karpenter import NODEPOOL_LABEL

    env = {**os.environ, "GPUPACK_K8S_BIN": str(ensure_binaries())}
    cli = [sys.executable, "-m", "tests.devcluster"]  # the dev cluster, as `make dev` starts it
    with tempfile.TemporaryDirectory(prefix="gpupack-autoscale-") as tmp:
        d = Path(tmp) / "dev"
        up = [*cli, "up", "--dir", str(d), "--nodes", "1", "--gpu-model", model, "--autoscaler"]
        t0 = time.monotonic()
        subprocess.run(up, env=env, cwd=REPO, check=True, capture_output=True, timeout=600)
        up_s = time.monotonic() - t0
        try:
            with config.new_client_from_config(config_file=str(d / "kubeconfig")) as api:
                core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
                core.create_namespace({"metadata": {"name": "bench"}})

                def deploy(name: str, share: str, replicas: int) -> None:
                    labels = {"app": name}
                    template = {
                        "metadata": {"labels": labels, "annotations": {names.GPU_FRACTION: share}},
                        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                    }
                    spec = {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template}
                    apps.create_namespaced_deployment("bench", {"metadata": {"name": name}, "spec": spec})

                def bound() -> list[Any]:
                    return [p for p in core.list_namespaced_pod("bench").items if p.spec.node_name]

                deploy("fill", "1.0", 8)
                wait_for(lambda: len(bound()) == 8, 120, "the static node full")
                out = []
                total = 8
                for w in range(waves):
                    wave = arrivals[w * per_wave : (w + 1) * per_wave]
                    shares = Counter(
                        f"{(a.demand.milli or MILLI_PER_GPU) / MILLI_PER_GPU:.2f}"
                        for a in wave
                        if a.demand.count == 1
                    )
                    t_wave = time.monotonic()
                    for share, n in sorted(shares.items()):
                        deploy(f"w{w}-{share.replace('.', '')}", share, n)
                    total += sum(shares.values())
                    asked: list[int] = []

                    def done(asked: list[int] = asked, total: int = total) -> bool:
                        sel = f"{ph.LABEL_PLACEHOLDER}=true"
                        held = core.list_namespaced_pod("gpupack-system", label_selector=sel).items
                        gpus = sum(int(p.metadata.labels[ph.LABEL_GPUS]) for p in held)
                        asked.append(gpus)
                        return len(bound()) == total

                    wait_for(done, 300, f"wave {w} bound", interval=0.5)
                    times = []
                    for p in bound():
                        if not p.metadata.labels.get("app", "").startswith(f"w{w}-"):
                            continue
                        cond = next(c for c in p.status.conditions or [] if c.type == "PodScheduled")
                        times.append(
                            (cond.last_transition_time - p.metadata.creation_timestamp).total_seconds()
                        )
                    out.append(
                        {
                            "wave": w,
                            "pods": len(times),
                            "wall_s_until_all_bound": round(time.monotonic() - t_wave, 1),
                            "pending_to_bound_s": {
                                "median": statistics.median(times),
                                "p90": sorted(times)[int(0.9 * (len(times) - 1))],
                                "max": max(times),
                            },
                            "gpus_asked_max": max(asked),
                            "karpenter_nodes": len(core.list_node(label_selector=NODEPOOL_LABEL).items),
                        }
                    )
                return {"dev_up_s": round(up_s, 1), "model": model, "waves": out}
        finally:
            subprocess.run(
                [*cli, "down", "--dir", str(d)],
                env=env,
                cwd=REPO,
                check=False,
                capture_output=True,
                timeout=120,
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces-dir", default="/work/shared/traces")
    ap.add_argument("--trace", default="gpushare40")
    ap.add_argument("--pods", type=int, default=320)
    ap.add_argument("--waves", type=int, default=8)
    ap.add_argument("--wave-minutes", type=float, default=30.0)
    ap.add_argument("--median-waves", type=float, default=2.0)
    ap.add_argument("--model", default="A100-80GB")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--policy", default=DEFAULT_POLICY, choices=registry.names())
    ap.add_argument("--live", type=int, default=0, metavar="WAVES", help="also measure on the dev cluster")
    ap.add_argument(
        "--live-pods", type=int, default=20, help="pods per live wave (single-GPU ones of the slice)"
    )
    ap.add_argument("--out", default=str(REPO / "bench/results/autoscale.json"))
    args = ap.parse_args()
    pool = Pool.parse(f"{args.model}:{args.gpus_per_node}")
    traces = Path(args.traces_dir)
    arrivals = slice_of(
        traces,
        args.trace,
        pods=args.pods,
        waves=args.waves,
        wave_h=args.wave_minutes / 60,
        median_waves=args.median_waves,
    )
    runs = [run(arrivals, pool, args.policy, repack) for repack in (False, True)]
    doc = {
        "bench": "autoscale",
        "inputs": {
            "trace": args.trace,
            "trace_sha256": _sha256(traces / pod_file(args.trace)),
            "pods": len(arrivals),
            "waves": args.waves,
            "wave_minutes": args.wave_minutes,
            "median_lifetime_waves": args.median_waves,
            "pool": f"{pool.model}:{pool.gpus}",
            "policy": args.policy,
        },
        "versions": {"git": _git_commit(), "python": platform.python_version()},
        "summary": {
            "gpus_requested_total": sum(w["gpus_requested"] for w in runs[0]["waves"]),
            "gpus_requested_one_per_pod_total": sum(
                w["gpus_requested_one_per_pod"] for w in runs[0]["waves"]
            ),
            "nodes_launched_total": sum(w["nodes_launched"] for w in runs[0]["waves"]),
            "nodes_launched_one_per_pod_total": sum(
                w["nodes_launched_one_per_pod"] for w in runs[0]["waves"]
            ),
            "peak_provisioned_over_lower_bound": max(runs[0]["provisioned_over_lower_bound_per_wave"]),
            "peak_in_use_over_lower_bound": max(
                round(w["gpus_in_use"] / w["packing_lower_bound_gpus"], 3) for w in runs[0]["waves"]
            ),
            "gpu_hours_without_repack": runs[0]["gpu_hours"],
            "gpu_hours_with_repack": runs[1]["gpu_hours"],
            "repack_evictions": runs[1]["evictions"],
        },
        "runs": runs,
    }
    if args.live:
        doc["live"] = live(arrivals, args.live, args.live_pods, pool.model)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
