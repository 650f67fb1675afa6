"""One demand's verdict on every node, kept current by judging again only the nodes that changed (pure).

A scheduler extender answers filter and prioritize for every node on every call, yet between two calls
only the node that got the last pod (and any whose pods or inventory moved) changes. A Ranking keeps,
per node name, the policy's verdict on the node object it last judged and the fitting nodes sorted by
(-score, rank); `Standings` overlays the few nodes one request sees differently (holds, the pod's own
share, a stale heartbeat). Its `best` is `place`'s choice: the highest score, ties to the lowest rank.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from app.errors import PlacementReason
from app.model import Demand, Node
from app.placement import batch
from app.placement.base import Policy


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's answer for one node state: a refusal, or the node's raw score."""

    node: Node
    reason: PlacementReason | None
    score: float = 0.0  # meaningful only without a reason

    @property
    def fits(self) -> bool:
        return self.reason is None


def judge(node: Node, demand: Demand, policy: Policy) -> Verdict:
    reason = policy.filter(node, demand)
    return Verdict(node, reason) if reason is not None else Verdict(node, None, policy.score(node, demand))


def judge_all(
    nodes: list[Node], demand: Demand, policy: Policy, rows: batch.Rows | None = None
) -> list[Verdict]:
    """`judge` on every node: in one array pass where `batch` covers the policy, else one by one."""
    if not batch.covers(policy, demand):
        return [judge(node, demand, policy) for node in nodes]
    out = []
    for node, answer in zip(nodes, batch.judge(nodes, demand, policy, rows), strict=True):
        if answer is None:
            out.append(judge(node, demand, policy))
        elif isinstance(answer, PlacementReason):
            out.append(Verdict(node, answer))
        else:
            out.append(Verdict(node, None, answer))
    return out


# Changed nodes from which an update judges them in one array pass (numpy's per-call cost is ~0.1 ms).
BATCH_MIN = 16
Entry = tuple[float, int, str]  # (-score, rank, name): sorted ascending, the best node comes first
Refusal = tuple[PlacementReason, str]  # a refusal and its text, rendered once per node state


def _rule(reason: PlacementReason) -> str:
    return reason.rule


class Ranking:
    """Verdicts on every node for one demand, updated from the names that changed since `token`."""

    def __init__(
        self,
        demand: Demand,
        policy: Policy,
        describe: Callable[[PlacementReason], str] = _rule,
        rows: batch.Rows | None = None,
    ) -> None:
        self.demand = demand
        self.policy = policy
        self.describe = describe  # a refusal's text, as the caller shows it
        self.rows = rows if rows is not None else batch.Rows()  # share one between the rankings of a cache
        self.token: int | None = None  # the change-log position the verdicts reflect; None: nothing yet
        self.rank: Mapping[str, int] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.refused: dict[str, Refusal] = {}
        self._fitting: list[Entry] = []

    def update(
        self, token: int, changed: Mapping[str, Node | None], rank: Mapping[str, int], full: bool
    ) -> None:
        """Judge the `changed` nodes again (None: gone); with `full`, `changed` is every node."""
        if full:
            old = self.verdicts
            self.verdicts, self.refused, self.rank = {}, {}, rank
            fitting: list[Entry] = []
            current = {name: node for name, node in changed.items() if node is not None}
            kept = {n: v for n, v in old.items() if (node := current.get(n)) is not None and v.node is node}
            todo = [name for name in current if name not in kept]
            judged = judge_all([current[n] for n in todo], self.demand, self.policy, self.rows)
            kept.update(zip(todo, judged, strict=True))
            for name in current:
                v = kept[name]
                self.verdicts[name] = v
                if v.reason is None:
                    fitting.append((-v.score, rank[name], name))
                else:
                    self.refused[name] = (v.reason, self.describe(v.reason))
            fitting.sort()
            self._fitting = fitting
        else:
            for name in changed:
                self._forget(name)
            present = {name: node for name, node in changed.items() if node is not None}
            nodes = list(present.values())
            if len(nodes) >= BATCH_MIN:
                verdicts = judge_all(nodes, self.demand, self.policy, self.rows)
            else:
                verdicts = [judge(node, self.demand, self.policy) for node in nodes]
            for name, v in zip(present, verdicts, strict=True):
                self._put(name, v)
        self.token = token

    def _forget(self, name: str) -> None:
        v = self.verdicts.pop(name, None)
        if v is None:
            return
        if v.reason is not None:
            del self.refused[name]
            return
        entry = (-v.score, self.rank[name], name)
        i = bisect_left(self._fitting, entry)
        del self._fitting[i]

    def _put(self, name: str, v: Verdict) -> None:
        self.verdicts[name] = v
        if v.reason is None:
            insort(self._fitting, (-v.score, self.rank[name], name))
        else:
            self.refused[name] = (v.reason, self.describe(v.reason))

    def best(self, names: Collection[str], skip: Collection[str]) -> Entry | None:
        """The first fitting entry among `names` that is not in `skip`."""
        return next((e for e in self._fitting if e[2] in names and e[2] not in skip), None)

    def standings(self, adjusted: Mapping[str, Node | None]) -> Standings:
        """This ranking with `adjusted` (nodes one request sees differently from their view) judged on top."""
        return Standings(
            self,
            {
                n: None if node is None else judge(node, self.demand, self.policy)
                for n, node in adjusted.items()
            },
        )


@dataclass(frozen=True, slots=True)
class Standings:
    """What one request sees: the ranking's verdicts, overridden per node by `adjusted`'s."""

    ranking: Ranking
    adjusted: Mapping[str, Verdict | None]

    @property
    def rank(self) -> Mapping[str, int]:
        """Natural-order position of every node that has one (a GPUNode): the tie-break order."""
        return self.ranking.rank

    def verdict(self, name: str) -> Verdict | None:
        """None: no node by that name."""
        if name in self.adjusted:
            return self.adjusted[name]
        return self.ranking.verdicts.get(name)

    def refusals(self, names: Collection[str]) -> dict[str, Refusal]:
        """Why each node of `names` that does not fit refuses, with the text."""
        refused, adjusted = self.ranking.refused, self.adjusted
        if len(refused) <= len(names):
            out = {n: r for n, r in refused.items() if n in names and n not in adjusted}
        else:
            out = {n: r for n in names if n not in adjusted and (r := refused.get(n)) is not None}
        for n, v in adjusted.items():
            if v is not None and v.reason is not None and n in names:
                out[n] = (v.reason, self.ranking.describe(v.reason))
        return out

    def best(self, names: Collection[str]) -> str | None:
        """`place`'s node among `names`: the highest score, ties to the lowest rank; None if none fits."""
        top = self.ranking.best(names, self.adjusted)
        for n, v in self.adjusted.items():
            if v is not None and v.reason is None and n in names:
                entry = (-v.score, self.rank[n], n)
                if top is None or entry < top:
                    top = entry
        return None if top is None else top[2]
