"""Spread: the node with the largest free GPU share after placement, and its emptiest GPUs."""

from __future__ import annotations

from app.core.model import MILLI_PER_GPU, Demand, Node
from app.core.placement import mig
from app.core.placement.base import Policy, registry
from app.core.placement.fit import FitFilter, Headroom, demand_milli, fitting_gpus, share_taken, tie_order
from app.core.placement.workload import TargetWorkload


class Spread(FitFilter):
    name = "spread"
    score_falls_with_room = True  # less free share, same healthy GPUs: a lower score

    def score(self, node: Node, demand: Demand) -> float:
        if demand.mig:
            return mig.score(node, demand)
        healthy = sum(1 for g in node.gpus if g.healthy and not g.is_mig)
        return _score(node.milli_free_total, healthy, demand_milli(node, demand) * demand.count)

    def score_headroom(self, room: Headroom, demand: Demand) -> float:
        """`score(node, demand)` for a share demand (`fit.is_share`), from `fit.headroom(node)`."""
        return _score(room.milli_free_total, room.healthy, share_taken(room, demand))

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        if demand.mig:
            return mig.choose(node, demand, self.margin_mib)
        gpus = sorted(
            fitting_gpus(node, demand, self.margin_mib), key=lambda g: (-g.milli_free, *tie_order(g))
        )
        return tuple(sorted(g.index for g in gpus[: demand.count]))


def _score(milli_free_total: int, healthy: int, taken: int) -> float:
    """The share of the node's healthy whole GPUs left free once `taken` milli are placed."""
    if healthy == 0:
        return 0.0
    return (milli_free_total - taken) / (healthy * MILLI_PER_GPU)


@registry.register("spread")
def _create(_: TargetWorkload) -> Policy:
    return Spread()
