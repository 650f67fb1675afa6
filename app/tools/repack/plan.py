"""The repack planner (pure): which pods to evict, in which order, so the extender packs them tighter.

Every move is predicted with the placement code the extender runs: the replacement of an evicted pod goes
where `place` puts it, both while the evicted pod is still terminating (its share held) and once it is gone,
and the planner accepts the move only when both answers are the same GPUs. Evictions are sequential: each
waits for its replacement to be bound and every PodDisruptionBudget covering the pod to allow a disruption
again, so a PDB allows a move when it allows one disruption now (the plan's own eviction in flight counted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from app.core.model import MILLI_PER_GPU, Allocation, Demand, Node
from app.core.placement import Placement, Policy, to_allocation
from app.core.placement.engine import Engine


class Goal(StrEnum):
    GPUS = "gpus"  # free the most whole GPUs
    NODES = "nodes"  # free the most whole nodes (every GPU idle)
    ROOM = "room"  # make room for one pending pod (app.tools.repack.room)


GpuRef = tuple[str, int]  # (node, GPU index)


@dataclass(frozen=True, slots=True)
class PodRef:
    """One running gpupack pod as the planner sees it."""

    key: str  # namespace/name
    uid: str
    alloc: Allocation
    demand: Demand
    blocked: str = ""  # why it must not be moved ("" = its controller re-creates it and it may move)
    pdbs: tuple[str, ...] = ()  # namespace/name of every PodDisruptionBudget that selects it
    nodes: frozenset[str] | None = None  # nodes its selectors and affinity allow (None: any)


@dataclass(frozen=True, slots=True)
class Move:
    pod: str  # namespace/name
    uid: str
    source: Allocation
    target: Allocation  # where the extender will place the replacement
    pdbs: tuple[str, ...] = ()
    frees: tuple[GpuRef, ...] = ()  # GPUs left idle once this move (and those before it) are done

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "uid": self.uid,
            "from": self.source.to_annotations(),
            "to": self.target.to_annotations(),
            "pdbs": list(self.pdbs),
            "frees": [{"node": n, "gpu": i} for n, i in self.frees],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Move:
        source = Allocation.from_annotations(raw["from"])
        target = Allocation.from_annotations(raw["to"])
        if source is None or target is None:
            raise ValueError(f"move of {raw.get('pod')!r}: 'from' and 'to' must be allocations")
        return cls(
            pod=str(raw["pod"]),
            uid=str(raw["uid"]),
            source=source,
            target=target,
            pdbs=tuple(str(p) for p in raw.get("pdbs", ())),
            frees=tuple((str(f["node"]), int(f["gpu"])) for f in raw.get("frees", ())),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    goal: Goal
    policy: str
    moves: tuple[Move, ...]
    freed_gpus: tuple[GpuRef, ...]  # idle after the plan and in use before it
    freed_nodes: tuple[str, ...]  # every GPU idle after the plan, some in use before it
    kept: tuple[tuple[str, str], ...]  # (pod, why it stays) for pods the planner may not move

    @property
    def evictions(self) -> int:
        return len(self.moves)

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal": str(self.goal),
            "policy": self.policy,
            "evictions": self.evictions,
            "gpusFreed": len(self.freed_gpus),
            "nodesFreed": len(self.freed_nodes),
            "freedGpus": [{"node": n, "gpu": i} for n, i in self.freed_gpus],
            "freedNodes": list(self.freed_nodes),
            "moves": [m.to_dict() for m in self.moves],
            "kept": [{"pod": p, "reason": r} for p, r in self.kept],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Plan:
        return cls(
            goal=Goal(raw["goal"]),
            policy=str(raw["policy"]),
            moves=tuple(Move.from_dict(m) for m in raw["moves"]),
            freed_gpus=tuple((str(f["node"]), int(f["gpu"])) for f in raw.get("freedGpus", ())),
            freed_nodes=tuple(str(n) for n in raw.get("freedNodes", ())),
            kept=tuple((str(k["pod"]), str(k["reason"])) for k in raw.get("kept", ())),
        )


def with_share(node: Node, alloc: Allocation, demand: Demand, sign: int) -> Node:
    """`node` with one pod's GPU share and host requests added (+1) or taken away (-1)."""
    return node.reserve((alloc,), sign).charge_host(sign * demand.cpu_milli, sign * demand.host_memory_mib)


def blocked_by_budget(pod: PodRef, budgets: Mapping[str, int]) -> str:
    """Why the pod's PodDisruptionBudgets forbid evicting it now ("" when they all allow one disruption)."""
    for pdb in pod.pdbs:
        allowed = budgets.get(pdb, 0)
        if allowed < 1:
            return f"PodDisruptionBudget {pdb} allows {allowed} disruptions now"
    return ""


class State:
    """The cluster as the plan leaves it so far: nodes in placement order, pods per GPU, pinned GPUs."""

    def __init__(self, nodes: Sequence[Node], pods: Iterable[PodRef]) -> None:
        self.order = [n.name for n in nodes]
        self.nodes = {n.name: n for n in nodes}
        self.on_gpu: dict[GpuRef, set[str]] = {}
        self.pods: dict[str, PodRef] = {}
        for p in pods:
            if p.alloc.node not in self.nodes:
                continue
            self.pods[p.uid] = p
            for i in p.alloc.gpu_indexes:
                self.on_gpu.setdefault((p.alloc.node, i), set()).add(p.uid)
        self.pinned: set[GpuRef] = set()  # GPUs holding a pod the plan may not move (or a replacement)

    def copy(self) -> State:
        """A trial copy; the sets in `on_gpu` are shared, so change them only through `move_pod`."""
        out = object.__new__(State)
        out.order = self.order
        out.nodes = dict(self.nodes)
        out.on_gpu = dict(self.on_gpu)
        out.pods = dict(self.pods)
        out.pinned = set(self.pinned)
        return out

    def move_pod(self, uid: str, source: Allocation, target: Allocation) -> None:
        for i in source.gpu_indexes:
            ref = (source.node, i)
            self.on_gpu[ref] = self.on_gpu[ref] - {uid}
        for i in target.gpu_indexes:
            ref = (target.node, i)
            self.on_gpu[ref] = self.on_gpu.get(ref, set()) | {uid}

    def relocate(self, pod: PodRef, target: Allocation) -> Move:
        """Carry out one move on this (trial) state; the plan never moves the replacement again."""
        self.nodes = self.take(pod)
        self.nodes[target.node] = with_share(self.nodes[target.node], target, pod.demand, +1)
        self.move_pod(pod.uid, pod.alloc, target)
        self.pinned.update((target.node, i) for i in target.gpu_indexes)
        del self.pods[pod.uid]
        return Move(pod.key, pod.uid, pod.alloc, target, pod.pdbs)

    def pin_kept(self, budgets: Mapping[str, int]) -> tuple[tuple[str, str], ...]:
        """Pin the GPUs of every pod the plan may not move; (pod, why) for each, by pod name."""
        kept = []
        for p in sorted(self.pods.values(), key=lambda p: p.key):
            why = p.blocked or blocked_by_budget(p, budgets)
            if why:
                kept.append((p.key, why))
                self.pinned.update((p.alloc.node, i) for i in p.alloc.gpu_indexes)
        return tuple(kept)

    def used(self, ref: GpuRef) -> bool:
        return bool(self.on_gpu.get(ref))

    def node_used(self, name: str) -> bool:
        return any(self.used((name, g.index)) for g in self.nodes[name].gpus)

    def ordered(self, nodes: dict[str, Node], allowed: frozenset[str] | None) -> list[Node]:
        return [nodes[n] for n in self.order if allowed is None or n in allowed]

    def take(self, pod: PodRef) -> dict[str, Node]:
        nodes = dict(self.nodes)
        nodes[pod.alloc.node] = with_share(nodes[pod.alloc.node], pod.alloc, pod.demand, -1)
        return nodes


def predict(state: State, pod: PodRef, engine: Engine) -> Allocation | None:
    """Where the extender puts the pod's replacement, if that does not depend on when the old pod goes."""
    after = state.take(pod)
    answers = []
    for nodes in (state.nodes, after):
        got = engine.place(state.ordered(nodes, pod.nodes), pod.demand)
        if not isinstance(got, Placement):
            return None
        answers.append((got.node.name, got.gpus))
    if answers[0] != answers[1]:
        return None
    name, gpus = answers[1]
    return to_allocation(after[name], pod.demand, gpus)


def _target_helps(state: State, target: Allocation, drained: set[GpuRef], goal: Goal) -> bool:
    """The replacement lands on capacity already in use and outside what is being drained."""
    refs = [(target.node, i) for i in target.gpu_indexes]
    if any(r in drained for r in refs):
        return False
    if goal is Goal.NODES:
        return target.node not in {n for n, _ in drained} and state.node_used(target.node)
    return all(state.used(r) for r in refs)


def _drain(
    state: State, source: set[GpuRef], engine: Engine, goal: Goal, budgets: Mapping[str, int]
) -> tuple[State, list[Move]] | None:
    """Move every pod off `source`, or None when one of them cannot go somewhere that helps."""
    trial = state.copy()
    uids = sorted(
        {u for r in source for u in trial.on_gpu.get(r, ())},
        key=lambda u: (-trial.pods[u].alloc.milli * len(trial.pods[u].alloc.gpu_indexes), trial.pods[u].key),
    )
    moves: list[Move] = []
    for uid in uids:
        pod = trial.pods[uid]
        if pod.blocked or blocked_by_budget(pod, budgets):
            return None
        if goal is Goal.GPUS and pod.alloc.milli >= MILLI_PER_GPU:
            return None  # a whole-GPU pod only fits an idle GPU: moving it frees none
        if goal is Goal.NODES:
            # The executor taints the node it empties (app.tools.repack.drain): kube-scheduler sends no
            # replacement back there, so neither does the prediction (else the best fit is often the hole just
            # left).
            gone = {n for n, _ in source}
            pod = replace(pod, nodes=frozenset(n for n in (pod.nodes or trial.order) if n not in gone))
        target = predict(trial, pod, engine)
        if target is None or not _target_helps(trial, target, source, goal):
            return None
        moves.append(trial.relocate(pod, target))
    return trial, moves


def _sources(state: State, goal: Goal) -> list[set[GpuRef]]:
    """Units to drain, cheapest first: fewest pods, least share, last in placement order."""
    rank = {n: i for i, n in enumerate(state.order)}
    units: list[tuple[tuple[int, int, int, int], set[GpuRef]]] = []
    groups: list[set[GpuRef]]
    if goal is Goal.NODES:
        groups = [{(n, g.index) for g in state.nodes[n].gpus} for n in state.order]
    else:
        groups = [{(n, g.index)} for n in state.order for g in state.nodes[n].gpus]
    for refs in groups:
        used = [r for r in refs if state.used(r)]
        if not used or any(r in state.pinned for r in used):
            continue
        uids = {u for r in used for u in state.on_gpu[r]}
        share = sum(state.pods[u].alloc.milli for u in uids)
        node, idx = min(used)
        units.append(((len(uids), share, -rank[node], -idx), refs))
    return [refs for _, refs in sorted(units, key=lambda u: u[0])]


def plan(
    nodes: Sequence[Node],
    pods: Sequence[PodRef],
    budgets: Mapping[str, int],
    policy: Policy,
    *,
    goal: Goal = Goal.GPUS,
    max_evictions: int | None = None,
) -> Plan:
    """The moves that free the most GPUs (or nodes) for the fewest evictions.

    `nodes` in placement order (the extender's natural name order), with every pod's share applied;
    `budgets` maps each PodDisruptionBudget (namespace/name) to its status.disruptionsAllowed.
    """
    engine = Engine(policy)  # one place() per trial: unchanged nodes answer from remembered verdicts
    state = State(nodes, pods)
    kept = state.pin_kept(budgets)
    used_before = {r for r in state.on_gpu if state.used(r)}
    nodes_before = {n for n in state.order if state.node_used(n)}
    moves: list[Move] = []
    left = max_evictions
    progress = True
    while progress:
        progress = False
        for source in _sources(state, goal):
            used = [r for r in source if state.used(r)]
            if not used or any(r in state.pinned for r in used):
                continue  # an earlier drain of this pass emptied it or moved a replacement onto it
            done = _drain(state, source, engine, goal, budgets)
            if done is None:
                continue
            trial, new = done
            if left is not None and len(new) > left:
                continue
            freed = tuple(sorted(r for r in used_before if state.used(r) and not trial.used(r)))
            state = trial
            new[-1] = replace(new[-1], frees=freed)
            moves.extend(new)
            if left is not None:
                left -= len(new)
            progress = True
    freed_gpus = tuple(sorted(r for r in used_before if not state.used(r)))
    freed_nodes = tuple(n for n in state.order if n in nodes_before and not state.node_used(n))
    return Plan(goal, policy.name, tuple(moves), freed_gpus, freed_nodes, kept)
