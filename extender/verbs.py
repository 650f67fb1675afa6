"""Filter and prioritize over the placement engine's standings (pure); /explain is app.core.explain's."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

from app.core import explain as app_explain
from app.core import request
from app.core.errors import ReasonKind, RequestError
from app.core.explain import NO_GPUNODE
from app.core.placement import normalize_scores
from app.core.placement.engine import Standings
from extender.metrics import PendingReason

# /explain is app.core.explain.explain, shared with `gpupack explain`.
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
    """Which of `names` can take the demand `standings` judged; with `decide`, only `place`'s node passes.

    With `decide` and a node that fits, the answer is that node alone, without the other nodes' statuses:
    kube-scheduler reads FailedNodes and FailedAndUnresolvableNodes only when no node passes (the pod's
    FitError and preemption); a line per node would make the answer, and the work behind it, grow with
    the cluster for nothing. Other fitting nodes are left out too: kube-scheduler drops nodes an extender
    does not return.
    """
    if decide:
        best = standings.best(Names(names))
        if best is not None:
            return FilterOutcome([best])
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
        passed = []  # nothing fits (best is None above)
    else:
        fitting = wanted - unresolvable.keys() - failed.keys()
        passed = sorted(fitting, key=rank.__getitem__)
    if not passed:
        # The most actionable class wins: capacity first, then model, then node state.
        precedence = (PendingReason.NO_FIT, PendingReason.MODEL, PendingReason.UNSCHEDULABLE)
        refusal = next((c for c in precedence if c in classes), PendingReason.UNSCHEDULABLE)
        return FilterOutcome([], failed, unresolvable, refusal)
    return FilterOutcome(passed, failed, unresolvable)


# Lookups answered by scanning the list before a set of the names is built (see Names).
SCANS = 4


class Names(Collection[str]):
    """`in` over the node names of one request, without a set of them unless it pays.

    The engine asks about its best nodes first, and those are almost always among the names
    kube-scheduler sends: scanning the list for a few (C string compares, 40 µs for 5 000 names at
    worst) costs less than building a set of every name (190 µs). Past `SCANS` lookups it builds the set.
    """

    __slots__ = ("_names", "_scans", "_set")

    def __init__(self, names: Sequence[str]) -> None:
        self._names = names
        self._set: set[str] | None = None
        self._scans = 0

    def __contains__(self, name: object) -> bool:
        if self._set is None:
            if self._scans < SCANS:
                self._scans += 1
                return name in self._names
            self._set = set(self._names)
        return name in self._set

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def prioritize(names: Sequence[str], standings: Standings) -> list[tuple[str, int]]:
    """0..10 per node in `names` order: the policy's raw score, min-max normalised; unfit nodes get 0."""
    raw = {name: standings.score(name) for name in names}
    scaled = normalize_scores(raw)
    return [(n, scaled[n]) for n in names]
