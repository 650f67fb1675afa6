"""`gpupack top`: per-GPU allocation bars from GPUNodes + pod annotations (like kubectl inspect gpushare)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from app.errors import KubeError
from app.kube import calls, paths
from app.kube.cache import ClusterCache
from app.kube.client import Kube
from app.kube.informers import KubeApi
from app.model import MILLI_PER_GPU, ClusterState

BAR_WIDTH = 20


def bar(milli: int, width: int = BAR_WIDTH) -> str:
    """[#####-----] for a share in milli (clamped to the bar; overcommit shows as a trailing '!')."""
    filled = min(width, round(milli * width / MILLI_PER_GPU))
    return "[" + "#" * filled + "-" * (width - filled) + "]" + ("!" if milli > MILLI_PER_GPU else "")


def render(state: ClusterState, pods: Mapping[tuple[str, int], list[str]]) -> str:
    """One line per GPU, then cluster totals."""
    header = f"{'NODE':<20} {'GPU':>3} {'MODEL':<12} {'ALLOCATED':<{BAR_WIDTH + 2}} {'SHARE':>6} "
    header += f"{'MEMORY(MiB)':>15} PODS"
    lines = [header]
    total = used = in_use = 0
    for name in state.nodes:
        node = state.nodes[name]
        flag = "" if node.schedulable else f"  (unschedulable: {node.unschedulable_reason})"
        for g in node.gpus:
            total += 1
            used += g.milli_used
            in_use += g.milli_used > 0
            here = pods.get((name, g.index), [])
            mem = f"{g.memory_used_mib}/{g.memory_mib}"
            share = g.milli_used / MILLI_PER_GPU
            lines.append(
                f"{name:<20} {g.index:>3} {g.model:<12} {bar(g.milli_used)} {share:>6.2f} "
                f"{mem:>15} {len(here)}{'' if g.healthy else '  (unhealthy)'}{flag}"
            )
            flag = ""
    lines.append(
        f"\n{total} GPUs: {used / MILLI_PER_GPU:.2f} allocated, {in_use} in use, {total - in_use} free; "
        f"packing efficiency {state.packing_efficiency:.1%}"
    )
    return "\n".join(lines)


def collect(kube: KubeApi) -> ClusterCache:
    """One list of GPUNodes and gpupack pods into a cache (no watch)."""
    cache = ClusterCache()
    cache.set_gpunodes(_list(kube, paths.gpunodes(), ""))
    cache.set_pods(_list(kube, paths.pods(), calls.MANAGED_SELECTOR))
    return cache


def _list(kube: KubeApi, path: str, selector: str) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    token = ""
    while True:
        page = kube.send(calls.list_request(path, selector, 500, token))
        items.extend(page.get("items") or [])
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="per-GPU allocation bars from GPUNodes and pod annotations")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        kube = Kube.connect(args.kubeconfig)
        cache = collect(kube)
    except KubeError as exc:
        print(f"gpupack top: {exc}", file=sys.stderr)
        return 1
    print(render(cache.snapshot(), cache.pods_by_gpu()))
    return 0
