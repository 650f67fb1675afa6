"""The one incremental chooser: a policy's verdicts on a changing list of nodes, per demand shape (pure).

The extender (the cluster cache's node views at their natural-order positions), the simulator (its
shuffled cluster) and the planners of repack and autoscale (`Engine.place`: `place` over any nodes in
any order) choose through an Engine. Between two choices only the nodes that took or gave back a pod
change, and pods come in a few shapes, so:

- each node state is interned once, by identity where the caller hands out one object per state (the
  cluster cache, the planners), by value where it builds new objects for equal states (the simulator);
  what is known of a state is kept with it: each shape's verdict, the GPUs the policy would use there,
  what the policy's array form reads of it;
- each shape keeps a heap of its fitting positions by (-score, position) and judges again only the
  positions logged as changed since it was last asked (one log, so a change costs nothing per shape);
- a shape's first pass, and any batch of changes, goes to the policy's array form where the registry
  has one for it (`Registry.array_form`, e.g. FragAware's in `fragaware_array`);
- what the engine keeps of each verdict is its standing, plugged in: `RefusalStanding` (the extender,
  the planners) keeps every node's refusal or score, as the policy answered (the refusal's text is
  rendered only where an answer reports it); `HeadroomStanding` (the simulator)
  keeps only the fitting nodes' scores, judges a share demand from each state's `fit.Headroom`, and for a
  policy whose score falls with the headroom lets a node that only took pods keep its stale entry as an
  upper bound, judged again only when that entry reaches the top.

`place` is the definition: ties on score go to the lowest position, and every answer is the policy's own
(the oracle tests compare the engine with `place` on random clusters).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from app.core.errors import PlacementReason
from app.core.model import Demand, Node
from app.core.placement.base import ArrayForm, Evaluates, Judged, Policy, registry
from app.core.placement.fit import (
    Headroom,
    HeadroomScore,
    fits_check,
    headroom,
    headroom_fits,
    is_share,
    uses_fit_filter,
    within,
)
from app.core.placement.place import Placement

# Changed nodes from which a catch-up judges them in one array pass (numpy's per-call cost is ~0.1 ms).
BATCH_MIN = 16
# Interned node states kept (each pins its node): this many, or four per position where that is more (a
# few passes over the nodes: 20 000 at 5 000 nodes). A table that fills up forgets every state no position
# holds now, with what was remembered of it: the views a node had before its last change, and the
# one-request views (holds applied).
STATES_SIZE = 4096
STATES_PER_POSITION = 4
Refusal = tuple[PlacementReason, str]  # a refusal and its text, rendered when read, once per node state


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's answer for one node state: a refusal, or the node's raw score."""

    node: Node
    reason: PlacementReason | None
    score: float = 0.0  # meaningful only without a reason

    @property
    def fits(self) -> bool:
        return self.reason is None


def _rule(reason: PlacementReason) -> str:
    return reason.rule


_UNJUDGED = math.nan  # memo default: no score is NaN (None is a real answer, "does not fit")


def _unset(_: int) -> object:
    raise AssertionError("judged through the refusal standing")


@dataclass(slots=True)
class Shape:
    """One demand's standing over the engine's positions."""

    demand: Demand
    # Judged from headroom (a share demand where no refusal is needed): memo keyed by headroom state.
    by_room: bool
    # A share demand that did not fit a node keeps not fitting while the node only shrinks.
    share: bool
    # Stale entries are upper bounds: a node is judged again when its entry reaches the top, or when it
    # appears in the growth log (a change that gave it room).
    lazy: bool
    array: ArrayForm | None  # the policy's array form, where it covers this demand
    judge: Callable[[int], object] = _unset  # HeadroomStanding: position -> score, None when unfit
    keys: list[int] = field(default_factory=list)  # position -> memo key (the engine's list, kept current)
    seen: int = 0  # log position (absolute) up to which changes are on the heap
    full: bool = True  # judge every position at the next catch-up (new, reset or too far behind)
    heap: list[tuple[float, int, int]] = field(default_factory=list)  # (-score, position, version)
    # State id (headroom state id where `by_room`) -> the refusal or the score in RefusalStanding, the
    # score (None when the node does not fit) in HeadroomStanding.
    memo: dict[int, object] = field(default_factory=dict)
    gpus: dict[int, tuple[int, ...]] = field(default_factory=dict)  # state id -> GPUs the policy uses
    unfit: list[int] = field(default_factory=list)  # position -> version it last did not fit (share)
    judged: list[int] = field(default_factory=list)  # lazy: position -> version last judged
    # RefusalStanding: each position's current refusal or score (None: no node), the refusals by position,
    # the engine's nodes, and each refused state's text (rendered when first read: most never are).
    answers: list[Judged | None] = field(default_factory=list)
    refusals: dict[int, PlacementReason] = field(default_factory=dict)
    nodes: list[Node | None] = field(default_factory=list)
    describe: Callable[[PlacementReason], str] = _rule
    rendered: dict[int, Refusal] = field(default_factory=dict)  # state id -> its refusal with the text

    @property
    def verdicts(self) -> Verdicts:
        """Each position's verdict (None: no node), built when read."""
        return Verdicts(self.nodes, self.answers)

    @property
    def refused(self) -> Refused:
        """Each refused position's refusal with its text."""
        return Refused(self)

    def refusal(self, i: int) -> Refusal:
        """Position i's refusal with its text, rendered once per node state."""
        sid = self.keys[i]
        got = self.rendered.get(sid)
        if got is None:
            reason = self.refusals[i]
            got = self.rendered[sid] = (reason, self.describe(reason))
        return got


_V = TypeVar("_V")


def _keep_only(table: dict[int, _V], live: set[int]) -> None:
    """Drop the entries of `table` whose state id is not in `live`, in place."""
    for sid in [sid for sid in table if sid not in live]:
        del table[sid]


class Verdicts:
    """Each position's `Verdict` (None: no node), built from the standing's answers when read."""

    __slots__ = ("_answers", "_nodes")

    def __init__(self, nodes: Sequence[Node | None], answers: Sequence[Judged | None]) -> None:
        self._nodes, self._answers = nodes, answers

    def __len__(self) -> int:
        return len(self._answers)

    def __getitem__(self, i: int) -> Verdict | None:
        got = self._answers[i]
        if got is None:
            return None
        node = self._nodes[i]
        assert node is not None
        return _verdict(node, got)

    def __iter__(self) -> Iterator[Verdict | None]:
        return (self[i] for i in range(len(self._answers)))


class Refused(Mapping[int, Refusal]):
    """Position -> its refusal with the text, for the positions that do not fit."""

    __slots__ = ("_shape",)

    def __init__(self, shape: Shape) -> None:
        self._shape = shape

    def __getitem__(self, i: int) -> Refusal:
        return self._shape.refusal(i)

    def __iter__(self) -> Iterator[int]:
        return iter(self._shape.refusals)

    def __len__(self) -> int:
        return len(self._shape.refusals)


def _verdict(node: Node, got: Judged) -> Verdict:
    return Verdict(node, got) if isinstance(got, PlacementReason) else Verdict(node, None, got)


class Engine:
    """One policy's choices over positions 0..n-1 (the tie-break order), kept current by `reset`/`set`.

    `standing`: what is kept of each verdict and how positions are judged (`RefusalStanding`, the
    default, or `HeadroomStanding`). `by_value`: intern node states by value, for callers that build a
    new object for an equal state; the policy's answers must then not depend on the node's name, so the
    standing must keep no refusals (a refusal names its node).
    """

    def __init__(
        self,
        policy: Policy,
        standing: Standing | None = None,
        *,
        by_value: bool = False,
        max_shapes: int | None = None,
        states_size: int = STATES_SIZE,
    ) -> None:
        self.standing: Standing = standing if standing is not None else RefusalStanding()
        if by_value and self.standing.keeps_refusals:
            raise ValueError("states interned by value cannot carry refusals (a refusal names its node)")
        self.policy = policy
        self.name = policy.name
        self.by_value = by_value
        self.max_shapes = max_shapes
        self.states_size = states_size
        # The policy's array form pays on a pass over many distinct node states: the extender's first
        # pass for a shape, a relist. By value, equal states already collapse such a pass to a few dozen
        # (the simulator's fleet), too few for the array's per-call cost: judged one by one there.
        self.array = registry.array_form(policy) if not by_value else None
        self.evaluate = policy.evaluate if isinstance(policy, Evaluates) else None
        self.fits = fits_check(policy)
        # Each position's headroom is kept where the standing judges share demands from it.
        self.margin = self.standing.headroom_margin(policy)
        self.scorer = policy if isinstance(policy, HeadroomScore) else None
        # Positions.
        self.nodes: list[Node | None] = []
        self.version: list[int] = []
        self.state: list[int] = []  # position -> state id (-1: none, or no shape reads state ids yet)
        # Whether positions carry state ids: from the start where the standing keys its memo by state, else
        # from the first shape not judged from headroom (a replay whose shapes all are skips interning).
        self.interning = self.standing.keys_by_state
        self.log: list[int] = []  # positions changed, oldest first (from absolute index `log_start`)
        self.log_start = 0
        self.grown: list[int] = []  # changes that left a node's headroom not `within` the old one
        self.grown_start = 0
        self.grown_at: list[int] = []  # position -> its version after the last such change
        self.rooms: list[Headroom] = []
        self.room_states: dict[Headroom, int] = {}
        self.room_state: list[int] = []
        # Node states.
        self._interned: dict[object, tuple[Node, int] | int] = {}
        self._next_state = 0
        self.reads: dict[int, object] = {}  # state id -> what the array form reads of it
        self.shapes: dict[Demand, Shape] = {}

    # --- node states ---

    def intern(self, node: Node) -> int:
        """The state id of `node`: equal for the same object (by value: for equal states)."""
        table = self._interned
        if self.by_value:
            key: object = _signature(node)
            sid = table.get(key)
            if isinstance(sid, int):
                return sid
        else:
            key = id(node)
            hit = table.get(key)
            if hit is not None and not isinstance(hit, int) and hit[0] is node:
                return hit[1]
        if len(table) >= max(self.states_size, STATES_PER_POSITION * len(self.nodes)):
            self._forget_states()
        sid = self._next_state
        self._next_state += 1
        table[key] = sid if self.by_value else (node, sid)
        return sid

    def _forget_states(self) -> None:
        """Forget every node state no position holds now: ids are never reused, so what was remembered of
        those just goes, and the positions' own states keep their answers (no pass judges them again).

        Only these are worth keeping: a node's earlier views and one request's views (holds applied) are
        never asked about again. In place: a pass under way holds these tables."""
        live = set(self.state)
        table = self._interned
        for key in [k for k, v in table.items() if (v if isinstance(v, int) else v[1]) not in live]:
            del table[key]
        _keep_only(self.reads, live)
        for shape in self.shapes.values():
            if not shape.by_room:  # a headroom-keyed memo is by room state: few, by value, kept
                _keep_only(shape.memo, live)
            _keep_only(shape.gpus, live)
            _keep_only(shape.rendered, live)

    def read(self, node: Node) -> object:
        """What the policy's array form reads of `node`'s state (kept per state)."""
        assert self.array is not None
        sid = self.intern(node)
        out = self.reads.get(sid, _MISSING)
        if out is _MISSING:
            out = self.reads[sid] = self.array.read(node)
        return out

    def prepare(self) -> None:
        """Read every position's node for the array form and let it work out what no demand changes of
        them, now (when the extender turns Ready) rather than in the first pass for a new shape; in the
        order that pass hands them over (`judge_array`: by position, each state once)."""
        if self.array is None:
            return
        first: dict[int, Node] = {}
        for sid, node in zip(self.state, self.nodes, strict=True):
            if node is not None and sid not in first:
                first[sid] = node
        self.array.prepare([self.read(node) for node in first.values()])

    # --- positions ---

    def reset(self, nodes: Sequence[Node | None]) -> None:
        """Every position anew (None: no node there); remembered verdicts on unchanged states stay."""
        n = len(nodes)
        # Refilled in place: the shapes' judging closures hold these lists.
        self.nodes[:] = nodes
        self.version[:] = [0] * n
        self.state[:] = self._states(nodes)
        self.log_start += len(self.log)
        self.log.clear()
        self.grown_start += len(self.grown)
        self.grown.clear()
        self.grown_at[:] = [0] * n
        if self.margin is not None:
            self.rooms[:] = [headroom(node, self.margin) if node is not None else _NO_ROOM for node in nodes]
            self.room_state[:] = [self.room_states.setdefault(r, len(self.room_states)) for r in self.rooms]
        for shape in self.shapes.values():
            shape.full = True

    def _states(self, nodes: Sequence[Node | None]) -> list[int]:
        intern = self.intern
        return [-1 if node is None or not self.interning else intern(node) for node in nodes]

    def set(self, i: int, node: Node | None) -> None:
        """Position `i` now holds `node` (None: gone)."""
        v = self.version[i] = self.version[i] + 1
        self.nodes[i] = node
        if self.interning:
            self.state[i] = -1 if node is None else self.intern(node)
        self.log.append(i)
        if self.margin is not None:
            before = self.rooms[i]
            room = self.rooms[i] = headroom(node, self.margin) if node is not None else _NO_ROOM
            self.room_state[i] = self.room_states.setdefault(room, len(self.room_states))
            if not within(room, before):
                self.grown.append(i)
                self.grown_at[i] = v
        if len(self.log) > 8 * len(self.nodes) + 4096:
            self._trim()

    def _trim(self) -> None:
        """Keep the log and the heaps bounded (a long-lived extender): drop all but the last n logged
        changes, and the heap entries of states gone since; a shape further behind judges every position
        again at its next catch-up (no more work than its backlog)."""
        n = len(self.nodes)
        keep = self.log_start + len(self.log) - n
        keep_grown = self.grown_start + len(self.grown) - n
        version = self.version
        for shape in self.shapes.values():
            if shape.seen < (keep_grown if shape.lazy else keep):
                shape.full = True
            elif not shape.lazy:  # stale entries of nodes that changed since (a lazy shape's are its bounds)
                shape.heap = [e for e in shape.heap if e[2] == version[e[1]]]
                heapq.heapify(shape.heap)
        del self.log[: keep - self.log_start]
        self.log_start = keep
        if keep_grown > self.grown_start:
            del self.grown[: keep_grown - self.grown_start]
            self.grown_start = keep_grown

    # --- shapes ---

    def shape(self, demand: Demand) -> Shape:
        """`demand`'s standing, brought up to date with every change."""
        shape = self.shapes.get(demand)
        if shape is None:
            if self.max_shapes is not None and len(self.shapes) >= self.max_shapes:
                self.shapes.clear()  # many one-off shapes: start over rather than grow
            shape = self.shapes[demand] = self._new_shape(demand)
        n = len(self.nodes)
        if shape.full:
            shape.full = False
            shape.heap = []
            shape.unfit, shape.judged = [-1] * n, [-1] * n
            self.standing.restart(shape, n)
            shape.seen = self.grown_start + len(self.grown) if shape.lazy else self.log_start + len(self.log)
            self.standing.judge(self, shape, range(n))
            return shape
        log, start = (self.grown, self.grown_start) if shape.lazy else (self.log, self.log_start)
        end = start + len(log)
        if end > shape.seen:
            todo = log[shape.seen - start :]
            shape.seen = end
            self.standing.judge(self, shape, todo if len(todo) == 1 else set(todo))  # any order: heap orders
        return shape

    def _new_shape(self, demand: Demand) -> Shape:
        share = self.margin is not None and is_share(demand)
        by_room = share and self.scorer is not None
        lazy = by_room and self.scorer is not None and self.scorer.score_falls_with_room
        array = self.array if self.array is not None and self.array.covers(demand) else None
        shape = Shape(demand, by_room, share, lazy, None if by_room else array)
        if not by_room and not self.interning:
            self.interning = True
            self.state[:] = self._states(self.nodes)
        shape.keys = self.room_state if by_room else self.state
        self.standing.prepare(self, shape)
        return shape

    def judge_array(self, shape: Shape, todo: list[int]) -> None:
        """Fill the memo for the states of `todo` that it lacks, in one array pass."""
        assert shape.array is not None
        memo, state, nodes = shape.memo, self.state, self.nodes
        wanted: dict[int, Node] = {}
        for i in todo:
            sid = state[i]
            if sid not in memo and sid not in wanted:
                node = nodes[i]
                assert node is not None
                wanted[sid] = node
        if len(wanted) < BATCH_MIN:
            return
        batch = list(wanted.values())
        # `read` per node, by the state ids already at hand (a call per node is a tenth of the pass).
        assert self.array is not None  # a shape has an array form only where the engine does
        reads, read = self.reads, self.array.read
        rows = [
            reads[sid] if sid in reads else reads.setdefault(sid, read(node)) for sid, node in wanted.items()
        ]
        answers = shape.array.judge(batch, rows, shape.demand)
        self.standing.remember(memo, wanted.items(), answers)

    def score(self, shape: Shape, node: Node, sid: int) -> float:
        """The policy's score of `node` (state `sid`) for `shape`, keeping the GPUs it would use."""
        if self.evaluate is None:
            return self.policy.score(node, shape.demand)
        score, gpus = self.evaluate(node, shape.demand)
        shape.gpus[sid] = gpus
        return score

    def best(self, shape: Shape, accept: Callable[[int], bool] | None = None) -> int | None:
        """The fitting position with the highest score (ties: the lowest position) that `accept`s."""
        heap, version, lazy, judged = shape.heap, self.version, shape.lazy, shape.judged
        memo, keys, judge, unfit = shape.memo, shape.keys, shape.judge, shape.unfit
        pop, replace = heapq.heappop, heapq.heapreplace
        skipped: list[tuple[float, int, int]] = []  # valid entries `accept` passed over: pushed back
        found = None
        while heap:
            top = heap[0]
            i = top[1]
            v = version[i]
            if top[2] == v:
                if accept is None or accept(i):
                    found = i
                    break
                skipped.append(pop(heap))
                continue
            if lazy and judged[i] != v:  # its stale entry was the best bound left: judge it again
                # as `HeadroomStanding.judge` does (only that standing has lazy shapes)
                judged[i] = v
                key = keys[i]
                s = memo.get(key, _UNJUDGED)
                if s is _UNJUDGED:
                    s = memo[key] = judge(i)
                if s is not None:
                    replace(heap, (-s, i, v))  # type: ignore[operator]  # one sift for the pop and the push
                    continue
                unfit[i] = v
            pop(heap)
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def choose(self, demand: Demand) -> int | None:
        """The position `place` would choose for `demand` now (None: no node fits)."""
        return self.best(self.shape(demand))

    def gpus(self, i: int, demand: Demand) -> tuple[int, ...]:
        """The GPUs the policy uses for `demand` on position i's node (remembered per state)."""
        node = self.nodes[i]
        assert node is not None
        return self._gpus(node, self.state[i], demand)

    def _gpus(self, node: Node, sid: int, demand: Demand) -> tuple[int, ...]:
        evaluate = self.evaluate
        if evaluate is None or sid < 0 or (shape := self.shapes.get(demand)) is None:
            return self.policy.choose_gpus(node, demand)
        got = shape.gpus.get(sid)
        if got is None:
            got = shape.gpus[sid] = evaluate(node, demand)[1]
        return got

    # --- place() over any nodes, with remembered verdicts (the planners) ---

    def verdict(self, node: Node, demand: Demand) -> Verdict:
        """The policy's verdict on `node` for `demand`, remembered per node state (a standing that
        keeps refusals only)."""
        shape = self.shapes.get(demand)
        if shape is None:
            if self.max_shapes is not None and len(self.shapes) >= self.max_shapes:
                self.shapes.clear()
            shape = self.shapes[demand] = self._new_shape(demand)
        return self.standing.verdict(self, shape, node)

    def place(self, nodes: Iterable[Node], demand: Demand) -> Placement | tuple[PlacementReason, ...]:
        """`place(nodes, demand, policy)`, answered from remembered verdicts for states seen before."""
        best: Node | None = None
        best_score = 0.0
        reasons: list[PlacementReason] = []
        for node in nodes:
            v = self.verdict(node, demand)
            if v.reason is not None:
                reasons.append(v.reason)
            elif best is None or v.score > best_score:
                best, best_score = node, v.score
        if best is None:
            return tuple(reasons)
        return Placement(best, self._gpus(best, self.intern(best), demand))


class Standing(Protocol):
    """What an engine keeps of each verdict, and how it judges positions for a shape."""

    # Keeps refusals, which name their node: node states cannot be interned by value.
    keeps_refusals: bool
    # Every shape's memo is keyed by node state, so positions carry state ids from the start.
    keys_by_state: bool

    def headroom_margin(self, policy: Policy) -> int | None:
        """The foreign-memory margin of each position's `fit.Headroom`, where share demands are judged
        from it (None: no headroom kept)."""
        ...

    def prepare(self, engine: Engine, shape: Shape) -> None:
        """Set up a new shape."""
        ...

    def restart(self, shape: Shape, n: int) -> None:
        """Before `shape` judges all `n` positions anew."""
        ...

    def judge(self, engine: Engine, shape: Shape, todo: Iterable[int]) -> None:
        """Judge the positions of `todo` for `shape` at their current versions, onto its heap."""
        ...

    def remember(
        self, memo: dict[int, object], judged: Iterable[tuple[int, Node]], answers: Iterable[Judged | None]
    ) -> None:
        """Enter an array form's answers on the (state id, node) pairs of `judged` in `memo`, but for the
        nodes it leaves to the policy (None)."""
        ...

    def verdict(self, engine: Engine, shape: Shape, node: Node) -> Verdict:
        """The verdict on any `node` for `shape`, remembered per state."""
        ...


class RefusalStanding:
    """Every position's verdict kept current: its refusal (with the text `describe` gives, rendered when
    read, once per state), or its score. What the extender reports per node and what the planners' `place`
    reads."""

    keeps_refusals = True
    keys_by_state = True

    def __init__(self, describe: Callable[[PlacementReason], str] = _rule) -> None:
        self.describe = describe

    def headroom_margin(self, policy: Policy) -> int | None:
        return None  # every demand is judged by the policy's own filter: each refusal is reported

    def prepare(self, engine: Engine, shape: Shape) -> None:
        shape.nodes, shape.describe = engine.nodes, self.describe

    def restart(self, shape: Shape, n: int) -> None:
        shape.answers, shape.refusals = [None] * n, {}

    def judge(self, engine: Engine, shape: Shape, todo: Iterable[int]) -> None:
        nodes, version, heap = engine.nodes, engine.version, shape.heap
        answers, refusals, memo, state = shape.answers, shape.refusals, shape.memo, engine.state
        todo = [i for i in todo if nodes[i] is not None or self._gone(shape, i)]
        if shape.array is not None and len(todo) >= BATCH_MIN:
            engine.judge_array(shape, todo)
        fitting: list[tuple[float, int, int]] = []
        for i in todo:
            sid = state[i]
            got = memo.get(sid)
            if got is None:
                node = nodes[i]
                assert node is not None
                got = memo[sid] = self._judge_one(engine, shape, node, sid)
            answers[i] = got  # type: ignore[call-overload]  # the memo holds this standing's answers
            if isinstance(got, PlacementReason):
                refusals[i] = got
            else:
                refusals.pop(i, None)
                fitting.append((-got, i, version[i]))  # type: ignore[operator]  # a score
        if heap:
            for entry in fitting:
                heapq.heappush(heap, entry)
        else:  # a shape's first pass, or after a reset: one heapify rather than a push per node
            heap[:] = fitting
            heapq.heapify(heap)

    def _gone(self, shape: Shape, i: int) -> bool:
        """Position `i` holds no node: forget its verdict (False: nothing to judge)."""
        shape.answers[i] = None
        shape.refusals.pop(i, None)
        return False

    def _judge_one(self, engine: Engine, shape: Shape, node: Node, sid: int) -> Judged:
        """The policy's refusal of `node` for `shape`, or its score."""
        reason = engine.policy.filter(node, shape.demand)
        return reason if reason is not None else engine.score(shape, node, sid)

    def remember(
        self, memo: dict[int, object], judged: Iterable[tuple[int, Node]], answers: Iterable[Judged | None]
    ) -> None:
        for (sid, _), got in zip(judged, answers, strict=True):
            if got is not None:
                memo[sid] = got

    def verdict(self, engine: Engine, shape: Shape, node: Node) -> Verdict:
        sid = engine.intern(node)
        got = shape.memo.get(sid)
        if got is None:
            got = shape.memo[sid] = self._judge_one(engine, shape, node, sid)
        return _verdict(node, got)  # type: ignore[arg-type]  # the memo holds this standing's answers


class HeadroomStanding:
    """Only the fitting positions' scores (the simulator's replay): a share demand is judged from each
    state's `fit.Headroom` where the policy's filter is the shared fit check, and a share a node did not
    fit is not judged again while the node only shrinks."""

    keeps_refusals = False
    keys_by_state = False  # a replay whose shapes are all judged from headroom never interns a node

    def headroom_margin(self, policy: Policy) -> int | None:
        return policy.margin_mib if uses_fit_filter(policy) else None

    def prepare(self, engine: Engine, shape: Shape) -> None:
        """Each position judged by a closure over the engine's lists (reset() refills them in place), as
        cheap per call as the replay needs."""
        demand, share = shape.demand, shape.share
        nodes, rooms, state = engine.nodes, engine.rooms, engine.state
        policy, fits = engine.policy, engine.fits
        if shape.by_room:
            assert engine.scorer is not None
            score_room = engine.scorer.score_headroom

            def by_headroom(i: int) -> object:
                room = rooms[i]
                return score_room(room, demand) if headroom_fits(room, demand) else None

            shape.judge = by_headroom
            return
        evaluate = engine.evaluate
        gpus = shape.gpus

        def by_node(i: int) -> object:
            node = nodes[i]
            assert node is not None
            if not (headroom_fits(rooms[i], demand) if share else fits(node, demand)):
                return None
            if evaluate is None:
                return policy.score(node, demand)
            score, gpus[state[i]] = evaluate(node, demand)
            return score

        shape.judge = by_node

    def restart(self, shape: Shape, n: int) -> None:
        pass

    def judge(self, engine: Engine, shape: Shape, todo: Iterable[int]) -> None:
        # The memoized score (None: unfit, remembered for a share until the node grows), inlined rather
        # than a call per position, as this is the replay's hottest loop.
        nodes, version, heap, push = engine.nodes, engine.version, shape.heap, heapq.heappush
        unfit, grown_at, memo, keys, judge = shape.unfit, engine.grown_at, shape.memo, shape.keys, shape.judge
        share, judged = shape.share, (shape.judged if shape.lazy else None)
        for i in todo:
            # Skipped: no node, or a share it did not fit while the node has only shrunk since.
            if unfit[i] < grown_at[i] and nodes[i] is not None:
                key = keys[i]
                got = memo.get(key, _UNJUDGED)
                if got is _UNJUDGED:
                    got = memo[key] = judge(i)
                v = version[i]
                if judged is not None:
                    judged[i] = v
                if got is not None:
                    push(heap, (-got, i, v))  # type: ignore[operator]  # a score
                elif share:
                    unfit[i] = v

    def remember(
        self, memo: dict[int, object], judged: Iterable[tuple[int, Node]], answers: Iterable[Judged | None]
    ) -> None:
        for (sid, _), got in zip(judged, answers, strict=True):
            if got is not None:
                memo[sid] = None if isinstance(got, PlacementReason) else got

    def verdict(self, engine: Engine, shape: Shape, node: Node) -> Verdict:
        raise ValueError("verdicts carry refusals: build the engine with a RefusalStanding")


@dataclass(frozen=True, slots=True)
class Standings:
    """What one extender request sees: the engine's verdicts by node name, overridden by `adjusted`'s
    (nodes this request sees other than their view: holds, the pod's own share, a stale heartbeat)."""

    engine: Engine
    shape: Shape
    rank: Mapping[str, int]  # natural-order position of every node that has one: the tie-break order
    adjusted: Mapping[str, Verdict | None]

    def score(self, name: str) -> float | None:
        """The node's raw score; None where it does not fit or there is no node by that name (no
        `Verdict` built: prioritize asks this of every node kube-scheduler sends)."""
        if name in self.adjusted:
            v = self.adjusted[name]
            return v.score if v is not None and v.reason is None else None
        i = self.rank.get(name)
        got = None if i is None else self.shape.answers[i]
        return None if got is None or isinstance(got, PlacementReason) else got

    def refusals(self, names: Collection[str]) -> dict[str, Refusal]:
        """Why each node of `names` that does not fit refuses, with the text."""
        shape, adjusted, nodes = self.shape, self.adjusted, self.engine.nodes
        # Each refusal with its text as rendered before for the node's state, else rendered now.
        refused, rendered, keys, render = shape.refusals, shape.rendered, shape.keys, shape.refusal
        out: dict[str, Refusal] = {}
        if len(refused) <= len(names):
            for at in refused:
                node = nodes[at]
                if node is not None and node.name in names and node.name not in adjusted:
                    out[node.name] = rendered.get(keys[at]) or render(at)
        else:
            rank = self.rank
            for n in names:
                i = rank.get(n)
                if i is not None and n not in adjusted and i in refused:
                    out[n] = rendered.get(keys[i]) or render(i)
        describe = shape.describe
        for n, v in adjusted.items():
            if v is not None and v.reason is not None and n in names:
                out[n] = (v.reason, describe(v.reason))
        return out

    def best(self, names: Collection[str]) -> str | None:
        """`place`'s node among `names`: the highest score, ties to the lowest rank; None if none fits."""
        nodes, adjusted = self.engine.nodes, self.adjusted

        def accept(i: int) -> bool:
            node = nodes[i]
            return node is not None and node.name in names and node.name not in adjusted

        i = self.engine.best(self.shape, accept)
        top = None
        if i is not None:
            score = self.shape.answers[i]
            node = nodes[i]
            assert isinstance(score, float | int) and node is not None  # a fitting position's score
            top = (-score, i, node.name)
        for n, v in adjusted.items():
            if v is not None and v.reason is None and n in names:
                entry = (-v.score, self.rank[n], n)
                if top is None or entry < top:
                    top = entry
        return None if top is None else top[2]


def judge(node: Node, demand: Demand, policy: Policy) -> Verdict:
    """The policy's verdict on one node, not remembered (a node one request sees differently)."""
    reason = policy.filter(node, demand)
    return Verdict(node, reason) if reason is not None else Verdict(node, None, policy.score(node, demand))


def _signature(node: Node) -> tuple[object, ...]:
    """What the policies read of a node, for interning states by value (the name is left out): every Gpu
    field but the UUID, which differs between equal states. A list comprehension over the fields: this runs
    on every change in a replay."""
    gpus = [
        (
            g.index,
            g.model,
            g.memory_mib,
            g.milli_used,
            g.memory_used_mib,
            g.foreign_mib,
            g.live_free_mib,
            g.utilization_percent,
            g.healthy,
            g.mig_profile,
            g.parent,
            g.sharing,
            g.memory_enforcement,
        )
        for g in node.gpus
    ]
    return (node.cpu_milli_free, node.memory_mib_free, node.schedulable, node.mps, tuple(gpus))


_MISSING = object()
_NO_ROOM = Headroom(False, False, None, None, (), 0, 0, False)  # a position without a node fits nothing
