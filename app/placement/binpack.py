"""Best fit: the node left with the least free CPU and GPU, and the fullest GPU that fits."""

from __future__ import annotations

from app.model import Demand, Node
from app.placement import mig
from app.placement.base import Policy, registry
from app.placement.fit import FitFilter, best_fit, demand_milli, fitting_gpus
from app.placement.workload import TargetWorkload

# The FGD simulator's normalisers (MaxSpecCpu, MaxSpecGpu): the largest node in the openb cluster.
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


class BinPack(FitFilter):
    """The openb simulator's BestFit score, truncated to an integer as there, so ties go to node order."""

    name = "binpack"

    def score(self, node: Node, demand: Demand) -> float:
        if demand.mig:
            return mig.score(node, demand)
        cpu_after = 0 if node.cpu_milli_free is None else node.cpu_milli_free - demand.cpu_milli
        gpu_after = node.milli_free_total - demand_milli(node, demand) * demand.count
        return int(100 * (1 - (0.5 * cpu_after / MAX_CPU_MILLI + 0.5 * gpu_after / MAX_GPU_MILLI)))

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        if demand.mig:
            return mig.choose(node, demand, self.margin_mib)
        return best_fit(fitting_gpus(node, demand, self.margin_mib), demand.count)


@registry.register("binpack")
def _create(_: TargetWorkload) -> Policy:
    return BinPack()
