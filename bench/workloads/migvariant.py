"""A MIG variant of a trace: partitioned GPUs, shares as MIG memory requests, physical GPUs used (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.core.catalog import GpuModel, MigProfile
from app.core.model import MILLI_PER_GPU, Demand, Gpu, Node, mig_index


def partition(node: Node, layout: Sequence[MigProfile], gpus: int) -> Node:
    """`node` with its first `gpus` GPUs in MIG mode, each split into one MIG device per `layout` entry."""
    out: list[Gpu] = []
    for n, g in enumerate(node.gpus):
        if n >= gpus:
            out.append(g)
            continue
        for slot, profile in enumerate(layout):
            out.append(
                Gpu(
                    index=mig_index(g.index, slot),
                    model=g.model,
                    memory_mib=profile.memory_mib,
                    mig_profile=profile.name,
                    parent=g.index,
                )
            )
    whole = [g for g in out if not g.is_mig]
    return replace(node, gpus=(*whole, *(g for g in out if g.is_mig)))


def as_mig(demand: Demand, model: GpuModel, largest_mib: int) -> Demand:
    """A one-GPU share as `gpu-memory` with `isolation: mig` (its share of `model`'s memory, rounded up).

    A share no MIG device of the layout can hold (more than `largest_mib`), and any other GPU demand,
    asks for whole GPUs instead: what a user would write where the share cannot be a MIG device.
    """
    if demand.count != 1 or demand.milli is None or demand.milli >= MILLI_PER_GPU:
        return as_whole(demand)
    mib = -(-demand.milli * model.memory_mib // MILLI_PER_GPU)
    if mib > largest_mib:
        return as_whole(demand)
    return replace(demand, milli=None, memory_mib=mib, mig=True)


def as_whole(demand: Demand) -> Demand:
    """Any GPU demand as whole GPUs (what a device plugin without sharing gives); CPU-only stays so."""
    if demand.count == 0:
        return demand
    return replace(demand, milli=MILLI_PER_GPU, memory_mib=None, mig=False, mig_profile="")


def physical_gpus_used(nodes: Sequence[Node]) -> int:
    """GPUs holding any allocation: whole GPUs in use plus partitioned GPUs with a MIG device in use."""
    whole = sum(1 for n in nodes for g in n.gpus if not g.is_mig and g.milli_used > 0)
    partitioned = {(n.name, g.parent) for n in nodes for g in n.gpus if g.is_mig and g.milli_used > 0}
    return whole + len(partitioned)
