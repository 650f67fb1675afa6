"""Whether a node and its GPUs can take a demand, and the human-readable reason when they cannot."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.errors import PlacementReason, ReasonKind
from app.model import MILLI_PER_GPU, Demand, Gpu, Node

# Foreign processes (outside any gpupack pod) grow and shrink as they run; where a GPU has any, keep this
# much head-room on top of what they use now. A GPU with no foreign usage needs none: gpupack pods are
# held to their reservations, so a whole-GPU pod fits an idle GPU exactly.
FOREIGN_MARGIN_MIB = 256


def share(milli: int) -> str:
    """Milli as a GPU share for messages: 500 -> "0.50", 805 -> "0.805"."""
    return f"{milli / MILLI_PER_GPU:.2f}" if milli % 10 == 0 else f"{milli / MILLI_PER_GPU:.3f}"


def memory_room(gpu: Gpu, margin_mib: int = FOREIGN_MARGIN_MIB) -> int:
    """MiB a new reservation may take: total - gpupack reservations - foreign usage - margin (if foreign)."""
    return gpu.memory_free_mib - (margin_mib if gpu.foreign_mib > 0 else 0)


def gpu_fits(gpu: Gpu, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> bool:
    """One GPU can take one device's worth of `demand` (model, health, milli and memory room)."""
    if not gpu.healthy or not demand.accepts(gpu.model):
        return False
    milli, mib = demand.on(gpu.memory_mib)
    return milli <= gpu.milli_free and mib <= memory_room(gpu, margin_mib)


def live_load(gpu: Gpu) -> tuple[int, int]:
    """Sort key among GPUs a policy scores equal: least utilised, then most NVML-free memory.

    Unknown readings (simulator, no agent data) sort as idle and empty, so ties fall to the index.
    """
    return (gpu.utilization_percent or 0, -(gpu.live_free_mib if gpu.live_free_mib is not None else 0))


def fitting_gpus(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> list[Gpu]:
    """The node's GPUs that can each take one device of `demand`: least loaded first, then by index.

    Policies keep the first of the GPUs they score equal, so this order is their tie-break.
    """
    return sorted((g for g in node.gpus if gpu_fits(g, demand, margin_mib)), key=tie_order)


def tie_order(gpu: Gpu) -> tuple[int, int, int]:
    return (*live_load(gpu), gpu.index)


def best_fit(gpus: Sequence[Gpu], count: int) -> tuple[int, ...]:
    """`count` GPU indexes with the least free compute (least loaded, then first index, on ties)."""
    return tuple(sorted(g.index for g in sorted(gpus, key=lambda g: (g.milli_free, *tie_order(g)))[:count]))


def node_misfit(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> PlacementReason | None:
    """None when `node` can take `demand`; otherwise the first rule it breaks."""

    def why(rule: str, kind: ReasonKind = ReasonKind.NODE) -> PlacementReason:
        return PlacementReason(node.name, None, rule, kind)

    if not node.schedulable:
        return why(node.unschedulable_reason or "node is not schedulable")
    if node.cpu_milli_free is not None and demand.cpu_milli > node.cpu_milli_free:
        return why(f"needs {demand.cpu_milli} CPU milli: {node.cpu_milli_free} free", ReasonKind.CAPACITY)
    if node.memory_mib_free is not None and demand.host_memory_mib > node.memory_mib_free:
        return why(
            f"needs {demand.host_memory_mib} MiB host memory: {node.memory_mib_free} MiB free",
            ReasonKind.CAPACITY,
        )
    if demand.count and demand.needs_mps and not node.mps:
        return why(f"pod asks for isolation=mps, but {node.mps_reason or 'no MPS daemon serves this node'}")
    if demand.count == 0:
        return None
    if len(fitting_gpus(node, demand, margin_mib)) >= demand.count:
        return None
    return _gpu_shortfall(node, demand, margin_mib)


# Checks in the order a GPU must pass them: (passes, what the demand needs, what a GPU offers, unit).
_Check = Callable[[Gpu, Demand, int], tuple[bool, int, int]]


def _milli_check(g: Gpu, d: Demand, _: int) -> tuple[bool, int, int]:
    need = d.on(g.memory_mib)[0]
    return need <= g.milli_free, need, g.milli_free


def _memory_check(g: Gpu, d: Demand, margin: int) -> tuple[bool, int, int]:
    need = d.on(g.memory_mib)[1]
    room = memory_room(g, margin)
    return need <= room, need, room


def _gpu_shortfall(node: Node, demand: Demand, margin_mib: int) -> PlacementReason:
    if not node.gpus:
        return PlacementReason(node.name, None, "node has no GPUs")
    gpus = [g for g in node.gpus if g.healthy]
    if not gpus:
        return PlacementReason(node.name, None, "no healthy GPU")
    gpus = [g for g in gpus if demand.accepts(g.model)]
    if not gpus:
        wanted = "|".join(sorted(demand.models))
        return PlacementReason(
            node.name, None, f"GPU model {node.model} is not one of {wanted}", ReasonKind.MODEL
        )
    checks: tuple[tuple[_Check, Callable[[int], str]], ...] = (
        (_milli_check, share),
        (_memory_check, lambda v: f"{v} MiB"),
    )
    for check, fmt in checks:
        results = [check(g, demand, margin_mib) for g in gpus]
        passing = [g for g, r in zip(gpus, results, strict=True) if r[0]]
        if len(passing) < demand.count:
            need = max(r[1] for r in results)
            best = max(r[2] for r in results)
            if demand.count == 1:
                rule = f"no GPU with {fmt(need)} free: best has {fmt(max(best, 0))}"
            else:
                rule = f"needs {demand.count} GPUs with {fmt(need)} free: {len(passing)} have it"
            if check is _memory_check:
                rule += _foreign_note(gpus, margin_mib)
            return PlacementReason(node.name, None, rule, ReasonKind.CAPACITY)
        gpus = passing
    # Unreachable while the checks mirror gpu_fits.
    return PlacementReason(node.name, None, "no fitting GPU", ReasonKind.CAPACITY)


def _foreign_note(gpus: Sequence[Gpu], margin_mib: int) -> str:
    """Where foreign processes take memory, say so: it is the part of "free" users cannot see in our pods."""
    foreign = [g for g in gpus if g.foreign_mib > 0]
    if not foreign:
        return ""
    g = max(foreign, key=lambda g: g.foreign_mib)
    return (
        f" (gpu{g.index}: {g.memory_mib} MiB total, {g.memory_used_mib} MiB reserved by gpupack pods,"
        f" {g.foreign_mib} MiB used by processes outside gpupack pods, {margin_mib} MiB margin)"
    )


class FitFilter:
    """The filter every built-in policy shares: node state, host resources, then per-GPU fit."""

    margin_mib: int = FOREIGN_MARGIN_MIB

    def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
        return node_misfit(node, demand, self.margin_mib)


def demand_milli(node: Node, demand: Demand) -> int:
    """Milli per device the demand takes on this node's GPU model."""
    return demand.on(node.gpus[0].memory_mib)[0] if node.gpus and demand.count else 0
