"""The FGD replay (arrivals until the cluster is full, no departures) with repack: none, periodic, on failure.

Arrivals are exactly `gpupack simulate`'s (shuffled trace, inflated to `inflate` x capacity, failed pods
dropped). `periodic`: every `every_pct` % of arrived capacity the repack planner (`app/tools/repack/plan.py`)
runs and its moves are carried out. `on-failure`: when a GPU pod fits nowhere, `app/tools/repack/room.py`
plans the fewest moves (at most `max_moves`) after which it fits; they are carried out (each replacement
re-placed by the policy where the plan said: the replay asserts it) and the pod is placed. The metric is the
paper's: unallocated GPU % at arrived = 100 % (mean of the rows whose arrived % rounds to 100).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from app.core.model import MILLI_PER_GPU, Node
from app.core.placement import Policy, TargetWorkload
from app.core.placement.engine import Engine
from app.tools.repack.room import DEFAULT_MAX_MOVES, make_room
from app.tools.sim.engine import arrival_sequence
from app.tools.sim.loader import TracePod
from bench.workloads.churn import Replay


class Mode(StrEnum):
    NONE = "none"
    PERIODIC = "periodic"
    ON_FAILURE = "on-failure"


@dataclass(frozen=True, slots=True)
class SaturateResult:
    policy: str
    seed: int
    mode: Mode
    unallocated_pct_at_100: float
    placed: int  # arrivals placed (directly or after a repack)
    failed: int  # arrivals dropped
    evictions: int
    rescued: int  # arrivals placed only thanks to an on-failure repack
    # At the first failed GPU arrival: running GPU pods, and how many of them fit somewhere as the cluster
    # is (the only ones any move can start with).
    running_at_first_failure: int
    could_move_at_first_failure: int
    seconds: float

    @property
    def evictions_per_placed_pod(self) -> float:
        return self.evictions / self.placed if self.placed else 0.0


def saturate(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: Policy,
    workload: TargetWorkload,
    *,
    seed: int,
    mode: Mode = Mode.NONE,
    inflate: float = 1.02,
    max_moves: int = DEFAULT_MAX_MOVES,
    every_pct: float = 5.0,
    max_evictions: int | None = 200,
) -> SaturateResult:
    """One seed; the same seed gives the same arrivals whatever the mode."""
    started = time.perf_counter()
    capacity = MILLI_PER_GPU * sum(len(n.gpus) for n in nodes)
    seq, order = arrival_sequence(pods, len(nodes), capacity, seed, inflate)
    # The room planner's answers for unchanged nodes carry over between failures; it asks about every
    # pod shape of the trace (a few hundred), not the handful a live cluster has.
    engine = Engine(policy)
    sim = Replay(nodes, policy, workload, order)
    arrived = evictions = failed = rescued = 0
    at_100: list[float] = []
    next_repack = every_pct
    first: tuple[int, int] | None = None
    for pod in seq:
        arrived += pod.gpu_milli
        placed = sim.arrive(pod.demand)
        if not placed and first is None and pod.demand.count:
            first = _could_move(sim)
        if not placed and mode is Mode.ON_FAILURE and pod.demand.count:
            room = make_room(
                sim.cluster.nodes,
                sim.pod_refs(),
                {},
                engine,
                pod.demand,
                max_moves=max_moves,
                fits_now=lambda p: sim.chooser.choose(p.demand) is not None,
            )
            if room is not None:
                sim.carry_out(room.plan.moves)
                evictions += room.plan.evictions
                placed = sim.arrive(pod.demand)
                if not placed:
                    raise AssertionError(f"{pod.name}: no room after the planned moves")
                rescued += 1
        failed += not placed
        pct = 100 * arrived / capacity
        if mode is Mode.PERIODIC and pct >= next_repack:
            evictions += sim.repack(max_evictions)[0]
            next_repack += every_pct
        if round(pct) == 100:
            at_100.append(sim.unallocated_pct())
    if not at_100:
        raise ValueError(f"inflate={inflate}: the arrivals never reach 100 % of capacity")
    return SaturateResult(
        policy=policy.name,
        seed=seed,
        mode=mode,
        unallocated_pct_at_100=sum(at_100) / len(at_100),
        placed=len(seq) - failed,
        failed=failed,
        evictions=evictions,
        rescued=rescued,
        running_at_first_failure=first[0] if first else 0,
        could_move_at_first_failure=first[1] if first else 0,
        seconds=time.perf_counter() - started,
    )


def _could_move(sim: Replay) -> tuple[int, int]:
    """(running GPU pods, those whose shape fits somewhere now)."""
    pods = [p for p in sim.running.values() if p.alloc]
    fits = {d: sim.chooser.choose(d) is not None for d in {p.demand for p in pods}}
    return len(pods), sum(fits[p.demand] for p in pods)
