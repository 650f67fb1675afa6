"""`gpupack top`: per-GPU allocation bars from GPUNodes + pod annotations (like kubectl inspect gpushare)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Collection, Mapping, Sequence

from app.core import names, quota
from app.core.errors import FieldError, KubeError
from app.core.fragmentation import fragmented_milli, typical_milli
from app.core.model import MILLI_PER_GPU, Allocation, ClusterState, Gpu
from app.kube import paths, snapshot
from app.kube.cache import ClusterCache
from app.kube.client import Kube
from app.kube.informers import KubeApi

BAR_WIDTH = 20


def bar(milli: int, width: int = BAR_WIDTH) -> str:
    """[#####-----] for a share in milli (clamped to the bar; overcommit shows as a trailing '!')."""
    filled = min(width, round(milli * width / MILLI_PER_GPU))
    return "[" + "#" * filled + "-" * (width - filled) + "]" + ("!" if milli > MILLI_PER_GPU else "")


def gpu_label(g: Gpu) -> tuple[str, str]:
    """(GPU, MODEL) columns: a MIG device shows as parent/slot and its model with its profile."""
    return g.device, f"{g.model} {g.mig_profile}" if g.is_mig else g.model


def _gpus(milli: int) -> str:
    return f"{milli / MILLI_PER_GPU:.2f}"


def namespace_share(
    state: ClusterState, allocations: Mapping[str, Allocation], namespaces: Mapping[str, str], namespace: str
) -> ClusterState:
    """The cluster as one namespace holds it: each GPU's reserved share and memory are its pods' only.

    `allocations` by pod UID, `namespaces` each pod UID's namespace (a hold whose pod is gone has none).
    """
    held: dict[tuple[str, int], tuple[int, int]] = {}
    for uid, alloc in allocations.items():
        if namespaces.get(uid) != namespace:
            continue
        for index in alloc.gpu_indexes:
            milli, mib = held.get((alloc.node, index), (0, 0))
            held[(alloc.node, index)] = (milli + alloc.milli, mib + alloc.memory_mib)
    nodes = {}
    for name, node in state.nodes.items():
        gpus = tuple(
            dataclasses.replace(g, milli_used=milli, memory_used_mib=mib)
            for g in node.gpus
            for milli, mib in (held.get((name, g.index), (0, 0)),)
        )
        nodes[name] = dataclasses.replace(node, gpus=gpus)
    return ClusterState(nodes)


def render(
    state: ClusterState,
    pods: Mapping[tuple[str, int], list[str]],
    *,
    typical: int = 0,
    nodes: Collection[str] | None = None,
    namespace: str | None = None,
) -> str:
    """One line per GPU (and per MIG device) and a summary per node (fragmented share included), then totals.

    Node and cluster totals count whole GPUs; MIG devices (each full or free) are totalled apart.

    `typical`: the request size fragmentation is measured against (the most common allocated share).
    `nodes` keeps only those nodes; `namespace` keeps the GPUs holding a pod of that namespace, counts only
    its pods, and sums `state` as that namespace's share (pass `namespace_share`): free GPUs and
    fragmentation are the cluster's, so they are left out.
    """
    header = f"{'NODE':<20} {'GPU':>5} {'MODEL':<18} {'ALLOCATED':<{BAR_WIDTH + 2}} {'SHARE':>6} "
    header += f"{'MEMORY(MiB)':>15} PODS"
    lines = [header]
    total = used = in_use = frag = migs = migs_used = 0
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
            gpu, model = gpu_label(g)
            lines.append(
                f"{name:<20} {gpu:>5} {model:<18} {bar(g.milli_used)} {_gpus(g.milli_used):>6} "
                f"{mem:>15} {len(here)}{'' if g.healthy else '  (unhealthy)'}{flag}"
            )
            flag = ""
        if namespace and not shown:
            continue
        whole = [g for g in node.gpus if not g.is_mig]
        node_migs = [g for g in node.gpus if g.is_mig]
        node_used = sum(g.milli_used for g in whole)
        node_frag = fragmented_milli(whole, typical)
        node_free = sum(g.milli_used <= 0 for g in whole)
        in_mig = sum(g.milli_used > 0 for g in node_migs)
        held = (
            f"{_gpus(node_used)} of {len(whole)} GPUs allocated to {namespace}"
            if namespace
            else f"{_gpus(node_used)} of {len(whole)} GPUs allocated, {node_free} free, "
            f"fragmented {_gpus(node_frag)}"
        )
        lines.append(
            f"{'':<20} {name}: {held}"
            + (f"; {in_mig} of {len(node_migs)} MIG devices in use" if node_migs else "")
        )
        migs += len(node_migs)
        migs_used += in_mig
        total += len(whole)
        used += node_used
        in_use += len(whole) - node_free
        frag += node_frag
    if namespace:
        held = f"{_gpus(used)} GPUs allocated, on {in_use} of {total} GPUs" if total else "no GPU"
        lines.append(f"\n{namespace}: {held}")
        if migs:
            lines.append(f"{namespace}: {migs_used} MIG devices")
        return "\n".join(lines)
    eff = used / (in_use * MILLI_PER_GPU) if in_use else 0.0
    lines.append(
        f"\n{total} GPUs: {used / MILLI_PER_GPU:.2f} allocated, {in_use} in use, {total - in_use} free; "
        f"packing efficiency {eff:.1%}; fragmented {_gpus(frag)} GPUs "
        f"(free share on GPUs in use below the typical {_gpus(typical)} request)"
    )
    if migs:
        lines.append(f"{migs} MIG devices: {migs_used} in use, {migs - migs_used} free")
    return "\n".join(lines)


def render_quota(uses: Sequence[quota.QuotaUse], namespace: str | None = None) -> str:
    """One line per gpupack resource a namespace's ResourceQuota caps: used against hard, with a bar.

    Share resources (`*-milli`) read in GPUs, memory in MiB; a bar past its end ends in '!' (a quota
    lowered below what its namespace already uses).
    """
    where = f"namespace {namespace}" if namespace else "any namespace"
    if not uses:
        return f"no ResourceQuota on {names.RESOURCE_PREFIX}* resources in {where}"
    width = max(len(u.resource) for u in uses)
    lines = [
        f"{'NAMESPACE':<20} {'QUOTA':<16} {'RESOURCE':<{width}} {'USED':<{BAR_WIDTH + 2}} {'USED/HARD':>22}"
    ]
    for u in uses:
        scale, digits, unit = (MILLI_PER_GPU, 2, "GPUs") if u.resource.endswith("-milli") else (1, 0, "MiB")
        amount = f"{float(u.used / scale):.{digits}f}/{float(u.hard / scale):.{digits}f} {unit}"
        lines.append(
            f"{u.namespace:<20} {u.quota:<16} {u.resource:<{width}} {bar(round(u.ratio * MILLI_PER_GPU))} "
            f"{amount:>22} {u.ratio:>5.0%}"
        )
    return "\n".join(lines)


def quota_view(kube: KubeApi, namespace: str | None) -> str:
    """GPU quota use per namespace (every namespace when `namespace` is None), from one list of quotas.

    A caller who may not list ResourceQuotas there still gets the GPU bars: the view then says why not.
    """
    try:
        quotas = snapshot.list_all(kube, paths.resource_quotas(namespace))
    except KubeError as exc:
        if exc.code != 403:
            raise
        return f"GPU quota not shown: {exc.message}"
    return render_quota(quota.uses(quotas), namespace)


def collect(kube: KubeApi) -> ClusterCache:
    """One list of GPUNodes and gpupack pods into a cache (no watch)."""
    return snapshot.read(kube, with_nodes=False).cache()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("top", help="per-GPU allocation bars from GPUNodes and pod annotations")
    p.add_argument("--node", action="append", help="show only this node (repeatable)")
    p.add_argument(
        "--namespace",
        help="show only GPUs holding pods of this namespace, count only those, and its GPU quota use "
        "(default: every namespace's quota use)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        kube = Kube.connect(args.kubeconfig)
        cache = collect(kube)
        quotas = quota_view(kube, args.namespace)
    except KubeError as exc:
        print(f"gpupack top: {exc}", file=sys.stderr)
        return 1
    state = cache.snapshot()
    if args.namespace:
        owners = {p.uid: p.namespace for p in cache.pods()}
        state = namespace_share(state, cache.allocations(), owners, args.namespace)
    unknown = sorted(set(args.node or ()) - set(state.nodes))
    if unknown:
        print(f"gpupack top: {FieldError('--node', unknown[0], 'must name a GPUNode')}", file=sys.stderr)
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
    print(f"\n{quotas}")
    return 0
