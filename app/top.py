"""`gpupack top`: per-GPU allocation bars from GPUNodes + pod annotations (like kubectl inspect gpushare)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Mapping

from app.errors import KubeError
from app.fragmentation import fragmented_milli, typical_milli
from app.kube import snapshot
from app.kube.cache import ClusterCache
from app.kube.client import Kube
from app.kube.informers import KubeApi
from app.model import MILLI_PER_GPU, ClusterState

BAR_WIDTH = 20


def bar(milli: int, width: int = BAR_WIDTH) -> str:
    """[#####-----] for a share in milli (clamped to the bar; overcommit shows as a trailing '!')."""
    filled = min(width, round(milli * width / MILLI_PER_GPU))
    return "[" + "#" * filled + "-" * (width - filled) + "]" + ("!" if milli > MILLI_PER_GPU else "")


def _gpus(milli: int) -> str:
    return f"{milli / MILLI_PER_GPU:.2f}"


def render(
    state: ClusterState,
    pods: Mapping[tuple[str, int], list[str]],
    *,
    typical: int = 0,
    nodes: Collection[str] | None = None,
    namespace: str | None = None,
) -> str:
    """One line per GPU and a summary per node (fragmented share included), then cluster totals.

    `typical`: the request size fragmentation is measured against (the most common allocated share).
    `nodes` keeps only those nodes; `namespace` keeps the GPUs holding a pod of that namespace and
    counts only its pods.
    """
    header = f"{'NODE':<20} {'GPU':>3} {'MODEL':<12} {'ALLOCATED':<{BAR_WIDTH + 2}} {'SHARE':>6} "
    header += f"{'MEMORY(MiB)':>15} PODS"
    lines = [header]
    total = used = in_use = frag = 0
    prefix = f"{namespace}/" if namespace else ""
    for name, node in state.nodes.items():
        if nodes is not None and name not in nodes:
            continue
        flag = "" if node.schedulable else f"  (unschedulable: {node.unschedulable_reason})"
        shown = 0
        for g in node.gpus:
            here = [p for p in pods.get((name, g.index), []) if p.startswith(prefix)]
            if namespace and not here:
                continue
            shown += 1
            mem = f"{g.memory_used_mib}/{g.memory_mib}"
            lines.append(
                f"{name:<20} {g.index:>3} {g.model:<12} {bar(g.milli_used)} {_gpus(g.milli_used):>6} "
                f"{mem:>15} {len(here)}{'' if g.healthy else '  (unhealthy)'}{flag}"
            )
            flag = ""
        if namespace and not shown:
            continue
        node_used = sum(g.milli_used for g in node.gpus)
        node_frag = fragmented_milli(node.gpus, typical)
        node_free = sum(g.milli_used <= 0 for g in node.gpus)
        lines.append(
            f"{'':<20} {name}: {_gpus(node_used)} of {len(node.gpus)} GPUs allocated, {node_free} free, "
            f"fragmented {_gpus(node_frag)}"
        )
        total += len(node.gpus)
        used += node_used
        in_use += len(node.gpus) - node_free
        frag += node_frag
    eff = used / (in_use * MILLI_PER_GPU) if in_use else 0.0
    lines.append(
        f"\n{total} GPUs: {used / MILLI_PER_GPU:.2f} allocated, {in_use} in use, {total - in_use} free; "
        f"packing efficiency {eff:.1%}; fragmented {_gpus(frag)} GPUs "
        f"(free share on GPUs in use below the typical {_gpus(typical)} request)"
    )
    return "\n".join(lines)


def collect(kube: KubeApi) -> ClusterCache:
    """One list of GPUNodes and gpupack pods into a cache (no watch)."""
    return snapshot.read(kube, with_nodes=False).cache()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="per-GPU allocation bars from GPUNodes and pod annotations")
    p.add_argument("--node", action="append", help="show only this node (repeatable)")
    p.add_argument("--namespace", help="show only GPUs holding pods of this namespace, and count only those")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        kube = Kube.connect(args.kubeconfig)
        cache = collect(kube)
    except KubeError as exc:
        print(f"gpupack top: {exc}", file=sys.stderr)
        return 1
    state = cache.snapshot()
    unknown = sorted(set(args.node or ()) - set(state.nodes))
    if unknown:
        print(f"gpupack top: --node={unknown[0]!r}: no GPUNode of that name", file=sys.stderr)
        return 1
    print(
        render(
            state,
            cache.pods_by_gpu(),
            typical=typical_milli(cache.allocations().values()),
            nodes=set(args.node) if args.node else None,
            namespace=args.namespace,
        )
    )
    return 0
