"""Filter, prioritize and explain as pure functions over Nodes, a Demand and a placement Policy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app import explain as app_explain
from app import request
from app.errors import ReasonKind, RequestError
from app.explain import NO_GPUNODE, reason_text
from app.model import Demand, Node
from app.placement import Placement, Policy, normalize_scores, place, score_nodes
from extender.metrics import PendingReason

# /explain is app.explain.explain, shared with `gpupack explain`.
explain = app_explain.explain


# The pending-pods metric's reason label, by the kind placement tags each refusal with.
PENDING_REASON = {
    ReasonKind.CAPACITY: PendingReason.NO_FIT,
    ReasonKind.MODEL: PendingReason.MODEL,
    ReasonKind.NODE: PendingReason.UNSCHEDULABLE,
}


def invalid_request(errors: tuple[RequestError, ...]) -> str:
    """The scheduler's text for a pod whose GPU request cannot be read."""
    return f"invalid GPU request: {request.render(errors)}"


@dataclass(frozen=True, slots=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)  # preemption could help (capacity)
    unresolvable: dict[str, str] = field(default_factory=dict)  # it could not (model, agent, request)
    refusal: PendingReason | None = None  # set when no node passed


def filter_nodes(
    names: Sequence[str],
    nodes: Mapping[str, Node | None],
    demand: request.PodDemand,
    policy: Policy,
    decide: bool,
) -> FilterOutcome:
    """Which of `names` can take `demand`; with `decide`, only the node `place` picks passes.

    `nodes` must be in the order placement breaks ties in (ClusterCache.nodes: natural name order).
    """
    if not isinstance(demand, Demand):
        msg = invalid_request(demand)
        return FilterOutcome([], unresolvable=dict.fromkeys(names, msg), refusal=PendingReason.INVALID)
    passed: list[Node] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    classes: set[PendingReason] = set()
    # Walk `nodes` (natural name order, as ClusterCache gives them) so `passed` is already in the
    # order place() breaks ties in; names the mapping lacks have no GPUNode.
    wanted = set(names)
    for name in [n for n in names if n not in nodes]:
        unresolvable[name] = NO_GPUNODE
        classes.add(PendingReason.UNSCHEDULABLE)
    for name, node in nodes.items():
        if name not in wanted:
            continue
        if node is None:
            unresolvable[name] = NO_GPUNODE
            classes.add(PendingReason.UNSCHEDULABLE)
            continue
        reason = policy.filter(node, demand)
        if reason is None:
            passed.append(node)
            continue
        cls = PENDING_REASON[reason.kind]
        classes.add(cls)
        (failed if cls is PendingReason.NO_FIT else unresolvable)[name] = reason_text(reason)
    if not passed:
        # The most actionable class wins: capacity first, then model, then node state.
        precedence = (PendingReason.NO_FIT, PendingReason.MODEL, PendingReason.UNSCHEDULABLE)
        refusal = next((c for c in precedence if c in classes), PendingReason.UNSCHEDULABLE)
        return FilterOutcome([], failed, unresolvable, refusal)
    if decide and len(passed) > 1:
        chosen = place(passed, demand, policy)
        assert isinstance(chosen, Placement)  # every node in `passed` passed filter
        best = chosen.node.name
        # No per-node score here: it would double the cost of filter on big clusters; /explain has them.
        for node in passed:
            if node.name != best:
                failed[node.name] = f"fits, but policy {policy.name} places it on {best} (see /explain)"
        return FilterOutcome([best], failed, unresolvable)
    return FilterOutcome([n.name for n in passed], failed, unresolvable)


def ordered(nodes: Mapping[str, Node | None]) -> list[Node]:
    """The nodes that exist, in the mapping's order (ClusterCache.nodes gives natural name order)."""
    return [n for n in nodes.values() if n is not None]


def prioritize(
    names: Sequence[str], nodes: Mapping[str, Node | None], demand: request.PodDemand, policy: Policy
) -> list[tuple[str, int]]:
    """0..10 per node in `names` order: the policy's raw score, min-max normalised; unfit nodes get 0."""
    if not isinstance(demand, Demand):
        return [(n, 0) for n in names]
    raw: dict[str, float | None] = dict.fromkeys(names)
    raw.update(score_nodes(ordered({n: nodes.get(n) for n in names}), demand, policy))
    scaled = normalize_scores(raw)
    return [(n, scaled[n]) for n in names]
