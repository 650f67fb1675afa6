"""Best fit: the node left with the least free CPU and GPU, and the fullest GPU that fits."""

from __future__ import annotations

from app.core.model import Demand, Node
from app.core.placement import mig
from app.core.placement.base import Policy, registry
from app.core.placement.fit import FitFilter, Headroom, best_fit, demand_milli, fitting_gpus, share_taken
from app.core.placement.workload import TargetWorkload

# The FGD simulator's normalisers (MaxSpecCpu, MaxSpecGpu): the largest node in the openb cluster.
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


class BinPack(FitFilter):
    """The openb simulator's BestFit score, truncated to an integer as there, so ties go to node order."""

    name = "binpack"
    score_falls_with_room = False  # a fuller node scores higher

    def score(self, node: Node, demand: Demand) -> float:
        if demand.mig:
            return mig.score(node, demand)
        taken = demand_milli(node, demand) * demand.count
        return _score(node.cpu_milli_free, node.milli_free_total, demand.cpu_milli, taken)

    def score_headroom(self, room: Headroom, demand: Demand) -> float:
        """`score(node, demand)` for a share demand (`fit.is_share`), from `fit.headroom(node)`."""
        return _score(room.cpu_milli_free, room.milli_free_total, demand.cpu_milli, share_taken(room, demand))

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        if demand.mig:
            return mig.choose(node, demand, self.margin_mib)
        return best_fit(fitting_gpus(node, demand, self.margin_mib), demand.count)


def _score(cpu_milli_free: int | None, milli_free_total: int, cpu_milli: int, taken: int) -> int:
    cpu_after = 0 if cpu_milli_free is None else cpu_milli_free - cpu_milli
    gpu_after = milli_free_total - taken
    return int(100 * (1 - (0.5 * cpu_after / MAX_CPU_MILLI + 0.5 * gpu_after / MAX_GPU_MILLI)))


@registry.register("binpack")
def _create(_: TargetWorkload) -> Policy:
    return BinPack()
