"""The repack executor against a fake API: what it sends, and where it stops."""

from __future__ import annotations

from typing import Any

from app.core import names
from app.core.errors import KubeError
from app.core.model import Allocation
from app.kube.calls import JsonDict, Request
from app.tools.repack.apply import Executor, Outcome
from app.tools.repack.plan import Goal, Move, Plan

SRC = Allocation("n1", (3,), ("GPU-n1-3",), 250, 10240)
DST = Allocation("n0", (0,), ("GPU-n0-0",), 250, 10240)
OWNER = [{"kind": "ReplicaSet", "name": "web-1", "uid": "rs", "controller": True}]


def pod_obj(name: str, uid: str, alloc: Allocation | None, node: str = "") -> JsonDict:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "ownerReferences": OWNER,
            "annotations": alloc.to_annotations() if alloc else {},
        },
        "spec": {"nodeName": node or (alloc.node if alloc else "")},
    }


class FakeKube:
    """Pods in one namespace, one PDB; an eviction deletes the pod and the 'controller' re-creates it."""

    def __init__(self, lands: Allocation, refuse: bool = False, allowed: int = 1) -> None:
        self.pods = {"web-a": pod_obj("web-a", "u1", SRC)}
        self.lands, self.refuse, self.allowed = lands, refuse, allowed
        self.sent: list[Request] = []

    def send(self, req: Request) -> JsonDict:
        self.sent.append(req)
        if req.path.endswith("/eviction"):
            if self.refuse:
                raise KubeError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
            if not req.body.get("deleteOptions", {}).get("dryRun"):
                del self.pods["web-a"]
                self.pods["web-b"] = pod_obj("web-b", "u2", self.lands)
            return {}
        if "poddisruptionbudgets" in req.path:
            return {
                "metadata": {"generation": 1},
                "status": {"observedGeneration": 1, "disruptionsAllowed": self.allowed},
            }
        if req.method == "GET" and req.path.endswith("/pods"):
            return {"items": list(self.pods.values()), "metadata": {}}
        name = req.path.rsplit("/", 1)[1]
        if name not in self.pods:
            raise KubeError(404, "NotFound", f'pods "{name}" not found')
        return self.pods[name]

    def watch(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError


def the_plan() -> Plan:
    move = Move("ns/web-a", "u1", SRC, DST, pdbs=("ns/web",), frees=(("n1", 3),))
    return Plan(Goal.GPUS, "binpack", (move,), (("n1", 3),), (), ())


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def executor(kube: FakeKube, clock: Clock | None = None) -> Executor:
    c = clock or Clock()
    return Executor(kube, timeout_s=5, poll_s=1, clock=c, sleep=c.sleep)


def test_a_move_that_lands_as_planned_is_done_and_the_eviction_names_the_uid() -> None:
    kube = FakeKube(lands=DST)
    report = executor(kube).run(the_plan())
    assert [s.outcome for s in report.steps] == [Outcome.MOVED]
    assert report.steps[0].replacement == "ns/web-b"
    assert report.stopped is None and report.evictions == 1
    (ev,) = [r for r in kube.sent if r.path.endswith("/eviction")]
    assert ev.path == "/api/v1/namespaces/ns/pods/web-a/eviction"
    assert ev.body["deleteOptions"] == {"preconditions": {"uid": "u1"}}


def test_a_replacement_elsewhere_stops_the_run_as_off_plan() -> None:
    elsewhere = Allocation("n1", (1,), ("GPU-n1-1",), 250, 10240)
    report = executor(FakeKube(lands=elsewhere)).run(the_plan())
    step = report.stopped
    assert step is not None and step.outcome is Outcome.OFF_PLAN
    assert step.detail == "replacement bound to n1/gpu1, not as planned"
    assert report.evictions == 1
    assert report.to_dict()["stoppedAt"] == "ns/web-a"


def test_a_pdb_refusal_stops_without_waiting() -> None:
    clock = Clock()
    report = executor(FakeKube(lands=DST, refuse=True), clock).run(the_plan())
    step = report.stopped
    assert step is not None and step.outcome is Outcome.REFUSED
    assert "disruption budget" in step.detail
    assert report.evictions == 0 and clock.t == 0


def test_a_budget_that_never_allows_times_out_before_any_eviction() -> None:
    kube = FakeKube(lands=DST, allowed=0)
    report = executor(kube).run(the_plan())
    step = report.stopped
    assert step is not None and step.outcome is Outcome.TIMEOUT
    assert step.detail == "waited 5 s for PodDisruptionBudget ns/web to allow a disruption"
    assert not any(r.path.endswith("/eviction") for r in kube.sent)


def test_dry_run_changes_nothing_and_a_changed_pod_is_a_surprise() -> None:
    kube = FakeKube(lands=DST)
    report = executor(kube).run(the_plan(), dry_run=True)
    assert [s.outcome for s in report.steps] == [Outcome.DRY_RUN]
    assert set(kube.pods) == {"web-a"}
    (ev,) = [r for r in kube.sent if r.path.endswith("/eviction")]
    assert ev.body["deleteOptions"]["dryRun"] == ["All"]
    kube.pods["web-a"]["metadata"]["annotations"][names.ALLOC_GPU_INDEXES] = "2"
    changed = executor(kube).run(the_plan())
    assert changed.stopped is not None and changed.stopped.outcome is Outcome.CHANGED


def test_max_evictions_cuts_the_plan() -> None:
    report = executor(FakeKube(lands=DST)).run(the_plan(), max_evictions=0)
    assert report.planned == 0 and report.steps == ()


def test_the_human_output_names_each_step_and_where_it_stopped() -> None:
    from app.tools.repack.command import render_plan, render_report, render_step

    elsewhere = Allocation("n1", (1,), ("GPU-n1-1",), 250, 10240)
    report = executor(FakeKube(lands=elsewhere)).run(the_plan())
    assert render_step(report.steps[0]) == (
        "off-plan ns/web-a -> ns/web-b on n1/gpu1: replacement bound to n1/gpu1, not as planned"
    )
    assert render_report(report) == "1 of 1 planned evictions carried out; stopped at ns/web-a (off-plan)"
    table = render_plan(the_plan()).splitlines()
    assert table[0].split() == ["POD", "FROM", "TO", "GPUS", "FREED"]
    assert table[1].split() == ["ns/web-a", "n1/gpu3", "n0/gpu0", "n1/gpu3"]
    assert table[-1] == "1 evictions free 1 GPUs and 0 whole nodes (goal gpus, policy binpack)"
