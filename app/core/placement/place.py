"""Choosing a node and GPUs for one demand with a policy, node by node: the reference chooser.

The definition the placement engine (`app.core.placement.engine`) is tested against: the extender (/filter,
/prioritize, /explain), `gpupack explain`, the simulator, repack and autoscale choose through the engine,
which must decide exactly as `place` does. Only the tests and the simulator's unindexed replay (its oracle
run) call `place` itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from app.core.errors import PlacementReason
from app.core.model import Allocation, Demand, Node
from app.core.placement.base import Policy


class Placement(NamedTuple):
    node: Node
    gpus: tuple[int, ...]


def place(nodes: Iterable[Node], demand: Demand, policy: Policy) -> Placement | tuple[PlacementReason, ...]:
    """The best node for `demand` and the GPUs to use there, or every node's reason for refusing.

    Ties on score go to the node that comes first in `nodes`, so callers control tie-breaking by order.
    """
    best: Node | None = None
    best_score = 0.0
    reasons: list[PlacementReason] = []
    for node in nodes:
        reason = policy.filter(node, demand)
        if reason is not None:
            reasons.append(reason)
            continue
        s = policy.score(node, demand)
        if best is None or s > best_score:
            best, best_score = node, s
    if best is None:
        return tuple(reasons)
    return Placement(best, policy.choose_gpus(best, demand))


def score_nodes(nodes: Iterable[Node], demand: Demand, policy: Policy) -> dict[str, float | None]:
    """Each node's raw score, None for nodes the policy filters out."""
    return {n.name: None if policy.filter(n, demand) is not None else policy.score(n, demand) for n in nodes}


def normalize_scores(scores: Mapping[str, float | None], top: int = 10) -> dict[str, int]:
    """Min-max rescale raw scores to 0..top (the extender's priority range); filtered nodes get 0."""
    real = [s for s in scores.values() if s is not None]
    if not real:
        return dict.fromkeys(scores, 0)
    lo, hi = min(real), max(real)
    span = hi - lo
    return {
        name: 0 if s is None else (top if span == 0 else round((s - lo) * top / span))
        for name, s in scores.items()
    }


def to_allocation(node: Node, demand: Demand, gpu_indexes: tuple[int, ...]) -> Allocation:
    """The allocation recording `demand` on `gpu_indexes` of `node` (per-device share and memory limit)."""
    if not gpu_indexes:
        raise ValueError("an allocation needs at least one GPU")
    gpus = [node.gpu(i) for i in gpu_indexes]
    per_device = [demand.on(g.memory_mib) for g in gpus]
    uuids = tuple([g.uuid for g in gpus])  # lists, not generators: once per placement in a replay
    return Allocation(
        node=node.name,
        gpu_indexes=tuple(gpu_indexes),
        gpu_uuids=uuids if all(uuids) else (),
        milli=max([m for m, _ in per_device]),
        memory_mib=min([mib for _, mib in per_device]),
        hard_limit_mib=demand.hard_limit_on(g.memory_mib for g in gpus),
    )
