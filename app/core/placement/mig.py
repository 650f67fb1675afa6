"""Where a MIG demand goes on a node: the smallest free MIG devices that fit, the same for every policy."""

from __future__ import annotations

from app.core.model import Demand, Gpu, Node
from app.core.placement.fit import FOREIGN_MARGIN_MIB, fitting_gpus, tie_order


def slice_order(gpu: Gpu) -> tuple[int, ...]:
    """Smallest MIG device first (least memory wasted on the request), then the usual tie-break."""
    return (gpu.memory_mib, *tie_order(gpu))


def choose(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> tuple[int, ...]:
    """The `count` smallest free MIG devices of the node that can take `demand` (ascending indexes)."""
    fits = sorted(fitting_gpus(node, demand, margin_mib), key=slice_order)
    return tuple(sorted(g.index for g in fits[: demand.count]))


def score(node: Node, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> float:
    """Higher for the node whose chosen MIG devices are smaller: least memory left unused by the pod.

    A profile request wastes nothing anywhere, so ties fall to the caller's node order, as for every policy.
    """
    chosen = choose(node, demand, margin_mib)
    return -float(sum(node.gpu(i).memory_mib for i in chosen))
