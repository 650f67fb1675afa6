"""Making room for one pod that fits nowhere (pure): the fewest moves of movable pods after which it fits.

The room is cleared on one node: on each GPU the pod needs, the movable pods there leave, largest first,
until the GPU has the pod's share free (on a multi-GPU pod, the GPUs cheapest to clear). Every move is
predicted with the extender's placement code exactly as `plan` predicts its moves (same GPUs whether or
not the evicted pod is still terminating), must land outside the GPUs being cleared, and the pod must then
fit (`place` answers) with every move done. Candidates are tried fewest moves first, then least share
moved, then in placement order; pinned pods (no controller, opted out, a PDB that allows no disruption
now) never move, nor does a pod whose shape fits nowhere as the cluster is (the room is no target for it,
and the moves before it only take capacity elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from app.core.model import Demand, Node
from app.core.placement import Placement, Policy
from app.core.placement.engine import Engine
from app.tools.repack.plan import (
    Goal,
    GpuRef,
    Move,
    Plan,
    PodRef,
    State,
    blocked_by_budget,
    predict,
    with_share,
)

DEFAULT_MAX_MOVES = 4


@dataclass(frozen=True, slots=True)
class Room:
    """Where the pending pod fits once `plan`'s moves are done (no moves: it fits now)."""

    node: str
    gpus: tuple[int, ...]
    plan: Plan


@dataclass(frozen=True, slots=True)
class _Clearing:
    node: str
    refs: frozenset[GpuRef]  # the GPUs being cleared
    uids: tuple[str, ...]  # the pods to move off them, in move order
    milli: int  # share moved

    def rank(self, order: Mapping[str, int]) -> tuple[int, int, int, tuple[GpuRef, ...]]:
        return (len(self.uids), self.milli, order[self.node], tuple(sorted(self.refs)))


def _gpu_clearing(
    state: State, movable: set[str], node: Node, index: int, demand: Demand, *, most: int
) -> list[str] | None:
    """The fewest movable pods on one GPU whose leaving gives it `demand`'s share, largest first."""
    gpu = node.gpu(index)
    if not gpu.healthy or not demand.accepts(gpu.model):
        return None
    milli, memory = demand.on(gpu.memory_mib)
    short_milli, short_mib = milli - gpu.milli_free, memory - gpu.memory_free_mib
    uids = sorted(
        (u for u in state.on_gpu.get((node.name, index), ()) if u in movable),
        key=lambda u: (-state.pods[u].alloc.milli, state.pods[u].key),
    )
    taken: list[str] = []
    for uid in uids:
        if short_milli <= 0 and short_mib <= 0:
            break
        if len(taken) == most:
            return None
        taken.append(uid)
        short_milli -= state.pods[uid].alloc.milli
        short_mib -= state.pods[uid].alloc.memory_mib
    return taken if short_milli <= 0 and short_mib <= 0 else None


def _clearings(
    state: State, movable: set[str], name: str, demand: Demand, *, engine: Engine, most: int
) -> list[_Clearing]:
    """Ways to clear room for `demand` on one node with at most `most` moves."""
    node = state.nodes[name]
    per_gpu: list[tuple[int, int, list[str]]] = []
    for g in node.gpus:
        taken = _gpu_clearing(state, movable, node, g.index, demand, most=most)
        if taken is not None:
            per_gpu.append((len(taken), g.index, taken))
    per_gpu.sort()
    if demand.count == 1:
        options = [({g}, taken) for _, g, taken in per_gpu]
    else:  # the cheapest `count` GPUs together
        chosen = per_gpu[: demand.count]
        if len(chosen) < demand.count:
            return []
        options = [({g for _, g, _ in chosen}, [u for _, _, t in chosen for u in t])]
    out = []
    for gpus, taken in options:
        uids = tuple(dict.fromkeys(taken))
        if len(uids) > most:
            continue
        trial = node
        for uid in uids:
            trial = with_share(trial, state.pods[uid].alloc, state.pods[uid].demand, -1)
        if not engine.verdict(trial, demand).fits:
            continue  # host CPU or memory, the model, MPS: moving these pods does not make it fit
        milli = sum(state.pods[u].alloc.milli * len(state.pods[u].alloc.gpu_indexes) for u in uids)
        out.append(_Clearing(name, frozenset((name, g) for g in gpus), uids, milli))
    return out


def _carry_out(state: State, clearing: _Clearing, engine: Engine) -> tuple[State, list[Move]] | None:
    """Move the clearing's pods, each where the extender puts it and off the room; None if one cannot."""
    trial = state.copy()
    moves = []
    for uid in clearing.uids:
        pod = trial.pods[uid]
        target = predict(trial, pod, engine)
        if target is None or any((target.node, i) in clearing.refs for i in target.gpu_indexes):
            return None
        moves.append(trial.relocate(pod, target))
    return trial, moves


def make_room(
    nodes: Sequence[Node],
    pods: Sequence[PodRef],
    budgets: Mapping[str, int],
    policy: Policy | Engine,
    demand: Demand,
    *,
    allowed: frozenset[str] | None = None,
    max_moves: int = DEFAULT_MAX_MOVES,
    fits_now: Callable[[PodRef], bool] | None = None,
) -> Room | None:
    """The fewest moves (at most `max_moves`) after which `demand` fits; None when no such set exists.

    `nodes` in placement order with every running pod's share applied (not the pending pod's);
    `allowed` are the nodes the pending pod's selectors and affinity allow (None: any);
    `budgets` maps each PodDisruptionBudget (namespace/name) to its status.disruptionsAllowed;
    `fits_now` answers as `place` would whether a running pod's shape fits somewhere as the cluster is
    (the simulator's incremental index; default: `place` over `nodes`).
    """
    # A caller's engine is kept: its remembered verdicts on unchanged nodes carry over between calls.
    engine = policy if isinstance(policy, Engine) else Engine(policy)
    state = State(nodes, pods)
    kept = state.pin_kept(budgets)

    def fits(s: State, d: Demand = demand, where: frozenset[str] | None = allowed) -> Placement | None:
        got = engine.place(s.ordered(s.nodes, where), d)
        return got if isinstance(got, Placement) else None

    # A pod that fits nowhere else now cannot move: the room's own GPUs are no target, and every
    # replacement only takes capacity elsewhere. (Host CPU freed on the room's node is not counted on.)
    elsewhere: dict[tuple[Demand, frozenset[str] | None], bool] = {}

    def can_go(p: PodRef) -> bool:
        key = (p.demand, p.nodes)
        if key not in elsewhere:
            elsewhere[key] = fits_now(p) if fits_now else fits(state, p.demand, p.nodes) is not None
        return elsewhere[key]

    movable = {
        uid for uid, p in state.pods.items() if not (p.blocked or blocked_by_budget(p, budgets)) and can_go(p)
    }

    def room(got: Placement, moves: Sequence[Move]) -> Room:
        return Room(got.node.name, got.gpus, Plan(Goal.ROOM, engine.name, tuple(moves), (), (), kept))

    now = fits(state)
    if now is not None:
        return room(now, ())
    order = {n: i for i, n in enumerate(state.order)}
    hosts = {state.pods[u].alloc.node for u in movable}
    options = [
        c
        for name in state.order
        if name in hosts and (allowed is None or name in allowed)
        for c in _clearings(state, movable, name, demand, engine=engine, most=max_moves)
    ]
    for clearing in sorted(options, key=lambda c: c.rank(order)):
        done = _carry_out(state, clearing, engine)
        if done is None:
            continue
        trial, moves = done
        got = fits(trial)
        if got is not None:
            return room(got, moves)
    return None
