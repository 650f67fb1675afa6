"""Carrying out a repack plan through the Eviction API, one move at a time, stopping at the first surprise."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from app.core.errors import KubeError
from app.core.model import Allocation
from app.core.objects import as_object, string_map
from app.kube import calls, paths
from app.kube.informers import KubeApi
from app.kube.snapshot import list_all
from app.tools.repack import drain
from app.tools.repack.candidates import controller_of
from app.tools.repack.plan import Goal, Move, Plan


class Outcome(StrEnum):
    MOVED = "moved"  # evicted; the replacement is bound where the plan said and the pod is gone
    DRY_RUN = "dry-run"  # the apiserver accepted the eviction as a dry run; nothing changed
    CHANGED = "changed"  # the pod is not as the plan found it (gone, re-created, moved, no controller)
    REFUSED = "refused"  # the Eviction API said no (a PodDisruptionBudget: 429)
    OFF_PLAN = "off-plan"  # the replacement was bound somewhere else than planned
    TIMEOUT = "timeout"  # a budget, the replacement or the old pod's exit did not come in time
    FAILED = "failed"  # any other API error


@dataclass(frozen=True, slots=True)
class Step:
    move: Move
    outcome: Outcome
    detail: str = ""
    replacement: str = ""  # namespace/name of the pod that took over
    landed: Allocation | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.move.pod,
            "outcome": str(self.outcome),
            "detail": self.detail,
            "replacement": self.replacement,
            "landed": self.landed.to_annotations() if self.landed else None,
        }


@dataclass(frozen=True, slots=True)
class Report:
    planned: int
    steps: tuple[Step, ...]

    @property
    def stopped(self) -> Step | None:
        """The step that ended the run early, if one did."""
        last = self.steps[-1] if self.steps else None
        return last if last is not None and last.outcome not in {Outcome.MOVED, Outcome.DRY_RUN} else None

    @property
    def evictions(self) -> int:
        """Pods actually evicted (an off-plan or timed-out step evicted its pod too)."""
        return sum(s.outcome in {Outcome.MOVED, Outcome.OFF_PLAN, Outcome.TIMEOUT} for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        stop = self.stopped
        return {
            "planned": self.planned,
            "evictions": self.evictions,
            "stoppedAt": stop.move.pod if stop else None,
            "steps": [s.to_dict() for s in self.steps],
        }


class _StopError(Exception):
    def __init__(
        self, outcome: Outcome, detail: str, replacement: str = "", landed: Allocation | None = None
    ):
        super().__init__(detail)
        self.step = (outcome, detail, replacement, landed)


def _same_place(a: Allocation, b: Allocation) -> bool:
    return (a.node, a.gpu_indexes) == (b.node, b.gpu_indexes)


def _alloc(pod: Mapping[str, Any]) -> Allocation | None:
    try:
        return Allocation.from_annotations(string_map(as_object(pod.get("metadata")).get("annotations")))
    except ValueError:
        return None


@dataclass
class Executor:
    kube: KubeApi
    timeout_s: float = 120.0
    poll_s: float = 0.25
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    on_step: Callable[[Step], None] = field(default=lambda _: None)

    def run(self, plan: Plan, *, max_evictions: int | None = None, dry_run: bool = False) -> Report:
        moves = plan.moves if max_evictions is None else plan.moves[:max_evictions]
        steps: list[Step] = []
        # Emptying nodes: each takes no new share from just before its first pod moves
        # (app.tools.repack.drain), as the planner predicted; a node emptied later may still take pods moved
        # off an earlier one.
        emptying = set(plan.freed_nodes) if plan.goal is Goal.NODES and not dry_run else set()
        draining: list[str] = []
        try:
            for move in moves:
                node = move.source.node
                if node in emptying and node not in draining:
                    draining.append(node)
                    self._taint(node, draining=True)
                try:
                    outcome, detail, replacement, landed = self._step(move, dry_run)
                except _StopError as stop:
                    outcome, detail, replacement, landed = stop.step
                step = Step(move, outcome, detail, replacement, landed)
                steps.append(step)
                self.on_step(step)
                if outcome not in {Outcome.MOVED, Outcome.DRY_RUN}:
                    break
        finally:
            for node in draining:
                self._untaint(node)
        return Report(len(moves), tuple(steps))

    def _untaint(self, node: str) -> None:
        try:
            self._taint(node, draining=False)
        except KubeError as exc:
            if not exc.is_not_found:  # gone: the autoscaler removed the node it emptied
                raise

    def _taint(self, node: str, *, draining: bool, attempts: int = 5) -> None:
        """Add or remove the draining taint: read the node, write its whole taint list; again on a 409."""
        for attempt in range(attempts):
            req = drain.change(self.kube.send(drain.get(node)), draining=draining)
            if req is None:
                return
            try:
                self.kube.send(req)
                return
            except KubeError as exc:
                if not exc.is_conflict or attempt == attempts - 1:
                    raise

    def _step(self, move: Move, dry_run: bool) -> tuple[Outcome, str, str, Allocation | None]:
        ns, name = move.pod.split("/", 1)
        pod = self._current(ns, name, move)
        owner = controller_of(pod)
        if owner is None:
            raise _StopError(Outcome.CHANGED, "the pod has no controller any more")
        for pdb in move.pdbs:
            self._wait_budget(pdb)
        before = {str(as_object(p.get("metadata")).get("uid")) for p in self._siblings(ns, owner[2])}
        try:
            self.kube.send(calls.eviction(ns, name, move.uid, dry_run))
        except KubeError as exc:
            outcome = Outcome.REFUSED if exc.code == 429 else Outcome.FAILED
            raise _StopError(outcome, f"eviction: {exc}") from None
        if dry_run:
            return Outcome.DRY_RUN, "the apiserver accepted the eviction (dry run)", "", None
        before.add(move.uid)
        found: list[tuple[str, Allocation]] = []

        def replaced() -> bool:
            for p in self._siblings(ns, owner[2]):
                meta = as_object(p.get("metadata"))
                alloc = _alloc(p)
                bound = str(as_object(p.get("spec")).get("nodeName") or "")
                if str(meta.get("uid")) not in before and bound and alloc is not None and alloc.node == bound:
                    found.append((f"{ns}/{meta.get('name')}", alloc))
                    return True
            return False

        self._until(replaced, f"a replacement of {move.pod} to be bound")
        replacement, landed = found[0]
        if not _same_place(landed, move.target):
            where = f"{landed.node}/gpu{','.join(map(str, landed.gpu_indexes))}"
            raise _StopError(
                Outcome.OFF_PLAN, f"replacement bound to {where}, not as planned", replacement, landed
            )
        try:
            self._until(lambda: self._gone(ns, name, move.uid), f"{move.pod} to terminate")
        except _StopError as stop:
            raise _StopError(stop.step[0], stop.step[1], replacement, landed) from None
        return Outcome.MOVED, "", replacement, landed

    def _current(self, ns: str, name: str, move: Move) -> dict[str, Any]:
        try:
            pod = self.kube.send(calls.get_pod(ns, name))
        except KubeError as exc:
            if exc.is_not_found:
                raise _StopError(Outcome.CHANGED, "the pod is gone") from None
            raise _StopError(Outcome.FAILED, f"reading the pod: {exc}") from None
        meta = as_object(pod.get("metadata"))
        if str(meta.get("uid")) != move.uid:
            raise _StopError(Outcome.CHANGED, "the pod was re-created since the plan")
        alloc = _alloc(pod)
        if alloc is None or not _same_place(alloc, move.source) or meta.get("deletionTimestamp"):
            raise _StopError(Outcome.CHANGED, "the pod moved or is terminating since the plan")
        return pod

    def _wait_budget(self, key: str) -> None:
        self._until(lambda: self._budget(key) >= 1, f"PodDisruptionBudget {key} to allow a disruption")

    def _budget(self, key: str) -> int:
        ns, name = key.split("/", 1)
        pdb = self.kube.send(calls.get_pdb(ns, name))
        meta, status = as_object(pdb.get("metadata")), as_object(pdb.get("status"))
        if status.get("observedGeneration") != meta.get("generation"):
            return 0
        return int(status.get("disruptionsAllowed") or 0)

    def _siblings(self, ns: str, owner_uid: str) -> list[dict[str, Any]]:
        pods = list_all(self.kube, paths.pods(ns), calls.MANAGED_SELECTOR)
        return [p for p in pods if (controller_of(p) or ("", "", ""))[2] == owner_uid]

    def _gone(self, ns: str, name: str, uid: str) -> bool:
        try:
            pod = self.kube.send(calls.get_pod(ns, name))
        except KubeError as exc:
            if exc.is_not_found:
                return True
            raise
        return str(as_object(pod.get("metadata")).get("uid")) != uid

    def _until(self, done: Callable[[], bool], what: str) -> None:
        deadline = self.clock() + self.timeout_s
        while True:
            try:
                if done():
                    return
            except KubeError as exc:
                raise _StopError(Outcome.FAILED, f"waiting for {what}: {exc}") from None
            if self.clock() >= deadline:
                raise _StopError(Outcome.TIMEOUT, f"waited {self.timeout_s:g} s for {what}")
            self.sleep(self.poll_s)
