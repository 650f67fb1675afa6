"""Spread: the node with the largest free GPU share after placement, and its emptiest GPUs."""

from __future__ import annotations

from app.model import MILLI_PER_GPU, Demand, Node
from app.placement import mig
from app.placement.base import Policy, registry
from app.placement.fit import FitFilter, demand_milli, fitting_gpus, tie_order
from app.placement.workload import TargetWorkload


class Spread(FitFilter):
    name = "spread"

    def score(self, node: Node, demand: Demand) -> float:
        if demand.mig:
            return mig.score(node, demand)
        healthy = sum(1 for g in node.gpus if g.healthy and not g.is_mig)
        if healthy == 0:
            return 0.0
        after = node.milli_free_total - demand_milli(node, demand) * demand.count
        return after / (healthy * MILLI_PER_GPU)

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        if demand.mig:
            return mig.choose(node, demand, self.margin_mib)
        gpus = sorted(
            fitting_gpus(node, demand, self.margin_mib), key=lambda g: (-g.milli_free, *tie_order(g))
        )
        return tuple(sorted(g.index for g in gpus[: demand.count]))


@registry.register("spread")
def _create(_: TargetWorkload) -> Policy:
    return Spread()
