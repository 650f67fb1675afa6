"""Filter and prioritize over a ranking's standings (pure); /explain is app.explain's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app import explain as app_explain
from app import request
from app.errors import ReasonKind, RequestError
from app.explain import NO_GPUNODE
from app.placement import normalize_scores
from app.placement.ranking import Standings
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


def refuse_invalid(names: Sequence[str], errors: tuple[RequestError, ...]) -> FilterOutcome:
    """No node can take a pod whose GPU request cannot be read."""
    return FilterOutcome(
        [], unresolvable=dict.fromkeys(names, invalid_request(errors)), refusal=PendingReason.INVALID
    )


def filter_nodes(names: Sequence[str], standings: Standings, decide: bool) -> FilterOutcome:
    """Which of `names` can take the demand `standings` judged; with `decide`, only `place`'s node passes."""
    wanted = set(names)
    rank = standings.rank
    failed: dict[str, str] = {}
    unresolvable = dict.fromkeys(wanted - rank.keys(), NO_GPUNODE)
    classes = {PendingReason.UNSCHEDULABLE} if unresolvable else set()
    refused = standings.refusals(wanted)
    for name, (reason, text) in refused.items():
        cls = PENDING_REASON[reason.kind]
        classes.add(cls)
        (failed if cls is PendingReason.NO_FIT else unresolvable)[name] = text
    if decide:
        # The other fitting nodes are left out of the answer: kube-scheduler drops nodes an extender does
        # not return, and their statuses would be read only if no node passed. A line per node would make
        # the answer (and kube-scheduler's decoding of it) grow with the cluster for nothing.
        best = standings.best(wanted)
        passed = [] if best is None else [best]
    else:
        fitting = wanted - unresolvable.keys() - failed.keys()
        passed = sorted(fitting, key=rank.__getitem__)
    if not passed:
        # The most actionable class wins: capacity first, then model, then node state.
        precedence = (PendingReason.NO_FIT, PendingReason.MODEL, PendingReason.UNSCHEDULABLE)
        refusal = next((c for c in precedence if c in classes), PendingReason.UNSCHEDULABLE)
        return FilterOutcome([], failed, unresolvable, refusal)
    return FilterOutcome(passed, failed, unresolvable)


def prioritize(names: Sequence[str], standings: Standings) -> list[tuple[str, int]]:
    """0..10 per node in `names` order: the policy's raw score, min-max normalised; unfit nodes get 0."""
    raw: dict[str, float | None] = {}
    for name in names:
        v = standings.verdict(name)
        raw[name] = v.score if v is not None and v.reason is None else None
    scaled = normalize_scores(raw)
    return [(n, scaled[n]) for n in names]
