"""Answers remembered per node object (`NodeMemo`), and a memoizing Policy wrapper built on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from app.errors import PlacementReason
from app.model import Demand, Node
from app.placement.base import Policy

# Between two scheduling calls only the node that got the last pod changes, and pods come in few
# shapes, so nearly every (node state, demand) pair was answered before. A changed node is a new
# object, so it can never hit an answer given for its old state.
# Bounds keep memory flat whatever the workload: each entry pins a Node, so a few shapes x a few node
# passes is plenty, and a table that fills up is simply started over.
DEFAULT_SIZE = 20_000  # answers per demand shape (4 passes over a 5 000-node cluster)
MAX_SHAPES = 32  # demand shapes remembered at once; real clusters ask for a handful

T = TypeVar("T")


class NodeMemo(Generic[T]):
    """One answer per node object, at most `size` of them; a table that fills up is started over.

    Keyed by the node object's identity, not its value: hashing a Node (every GPU field) costs more than
    the lookup saves. Each entry keeps its node alive, so the id cannot be reused while the entry exists,
    and an entry is trusted only when it holds that very object. ClusterCache hands out one object per
    node state, so an unchanged node is the same object from call to call, and a changed node is a new
    object that can never hit an answer given for its old state. Plain dict, no lock: single dict reads
    and writes are atomic, and a lost write only costs a recomputation.
    """

    __slots__ = ("_table", "compute", "size")

    def __init__(self, compute: Callable[[Node], T], size: int) -> None:
        self.compute = compute
        self.size = size
        self._table: dict[int, tuple[Node, T]] = {}

    def __call__(self, node: Node) -> T:
        """`compute(node)`, answered from the table for a node object it holds."""
        hit = self._table.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        out = self.compute(node)
        if len(self._table) >= self.size:
            self._table.clear()  # old node states are garbage by now; the live ones come back in one pass
        self._table[id(node)] = (node, out)
        return out


class MemoPolicy:
    """Same answers as `inner`, remembered per (node, demand) in a NodeMemo per demand and question."""

    def __init__(self, inner: Policy, size: int = DEFAULT_SIZE, shapes: int = MAX_SHAPES) -> None:
        self.inner = inner
        self.name = inner.name
        self.size = size
        self.shapes = shapes
        self._tables: dict[Demand, _Table] = {}
        self._last: tuple[Demand, _Table] | None = None  # one request passes one Demand object for every node

    def _table(self, demand: Demand) -> _Table:
        last = self._last
        if last is not None and last[0] is demand:
            return last[1]
        table = self._tables.get(demand)
        if table is None:
            if len(self._tables) >= self.shapes:  # many one-off shapes: start over rather than grow
                self._tables.clear()
            table = self._tables.setdefault(demand, _Table(self.inner, demand, self.size))
        self._last = (demand, table)
        return table

    def filter(self, node: Node, demand: Demand) -> PlacementReason | None:
        return self._table(demand).filter(node)

    def score(self, node: Node, demand: Demand) -> float:
        return self._table(demand).score(node)

    def choose_gpus(self, node: Node, demand: Demand) -> tuple[int, ...]:
        return self.inner.choose_gpus(node, demand)  # once per bind: not worth a cache


class _Table:
    """One demand's answers by node."""

    __slots__ = ("filter", "score")

    def __init__(self, inner: Policy, demand: Demand, size: int) -> None:
        self.filter: NodeMemo[PlacementReason | None]
        self.filter = NodeMemo(lambda node: inner.filter(node, demand), size)
        self.score: NodeMemo[float] = NodeMemo(lambda node: inner.score(node, demand), size)
