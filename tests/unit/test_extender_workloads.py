"""The extender's target workload: the learning rule, and when a new one replaces the policy."""

from __future__ import annotations

import copy
import random

import pytest

from app.core.model import Demand
from app.core.placement import default_workload, registry
from app.core.placement.workload import MIN_LEARNED_PODS, WEIGHT_STEP, learned
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.calls import JsonDict, Request
from extender.binder import Binder
from extender.config import Settings
from extender.runtime import KubeRuntime
from extender.workloads import BUILTIN, LEARN_EVERY_S, LEARNED, WorkloadClock, target, workload_of
from tests.static_runtime import StaticRuntime
from tests.unit.test_extender_app import FakeKube, gpunode, pod
from tests.unit.test_extender_runtime import Apiserver, step_all

T4 = frozenset({"T4"})


def demands(n_pinned: int, n_free: int) -> list[Demand]:
    pinned = Demand(milli=500, count=1, models=T4, cpu_milli=2000)
    free = Demand(milli=250, count=1, cpu_milli=1000)
    return [pinned] * n_pinned + [free] * n_free


def test_too_few_pods_learn_nothing_and_enough_learn_their_shapes() -> None:
    assert learned(demands(10, MIN_LEARNED_PODS - 11)) is None
    wl = learned(demands(30, MIN_LEARNED_PODS - 30))
    assert wl is not None
    by_models = {s.models: s for s in wl.shapes}
    assert by_models[T4].milli == 500 and by_models[T4].cpu_milli == 2000
    assert by_models[T4].weight == pytest.approx(30 / MIN_LEARNED_PODS)
    assert by_models[frozenset()].weight == pytest.approx(1 - 30 / MIN_LEARNED_PODS)


def test_learning_is_deterministic_and_a_pod_more_does_not_move_it() -> None:
    ds = demands(300, 700)
    shuffled = list(ds)
    random.Random(1).shuffle(shuffled)
    a, b = learned(ds), learned(shuffled)
    assert a is not None and b is not None and a.shapes == b.shapes
    c = learned(demands(301, 700))  # 0.03 points of weight: below the rounding step
    assert c is not None and c.shapes == a.shapes
    d = learned(demands(500, 500))  # a material move
    assert d is not None and d.shapes != a.shapes
    for s in a.shapes:
        assert round(s.weight / WEIGHT_STEP) * WEIGHT_STEP == pytest.approx(s.weight)


class State:
    def __init__(self, policy: str = "fragaware") -> None:
        self.cache = ClusterCache(AssumeCache(ttl_s=60))
        self.cache.set_gpunodes([gpunode("a1", model="T4", mem=15109), gpunode("b1")])
        self.kube = FakeKube(self.cache)
        p = registry.create(policy)
        self.rt = StaticRuntime(self.cache, p, Binder(self.kube, self.cache, p))

    def add_pods(self, n: int, model: str = "T4", start: int = 0) -> None:
        for i in range(start, start + n):
            p = pod(f"p{i}", 500)
            if model:
                p["metadata"]["annotations"]["gpupack.io/gpu-model"] = model
            self.kube.add(p)


def test_first_look_takes_the_fleet_then_only_a_fleet_change_or_the_slow_cadence() -> None:
    s = State()
    s.add_pods(MIN_LEARNED_PODS)
    clock = WorkloadClock(LEARNED)
    first = s.rt.refresh_workload(clock, now=0.0)
    assert first is not None and dict(first.fleet) == {"T4": 2, "V100M16": 2}
    rankings = s.rt.rankings
    s.add_pods(MIN_LEARNED_PODS, model="", start=MIN_LEARNED_PODS)  # the distribution moves...
    assert s.rt.refresh_workload(clock, now=LEARN_EVERY_S - 1) is None  # ...but is not read per request
    assert s.rt.rankings is rankings
    s.cache.upsert_gpunode(gpunode("b2"))  # a node joins: looked at at once
    second = s.rt.refresh_workload(clock, now=LEARN_EVERY_S - 1)
    assert second is not None and dict(second.fleet)["V100M16"] == 4
    assert len(second.shapes) == 2 and s.rt.rankings is not rankings
    assert s.rt.binder.policy is s.rt.policy
    assert s.rt.refresh_workload(clock, now=2 * LEARN_EVERY_S) is None  # due, but nothing changed


def test_builtin_keeps_the_built_in_shapes_and_a_failover_learns_the_same() -> None:
    s = State()
    s.add_pods(MIN_LEARNED_PODS)
    fixed = s.rt.refresh_workload(WorkloadClock(BUILTIN), now=0.0)
    assert fixed is not None and fixed.shapes == default_workload().shapes
    assert s.rt.refresh_workload(WorkloadClock(BUILTIN), now=10 * LEARN_EVERY_S) is None
    # Another replica with the same pods reaches the same workload, however its pods arrived.
    other = ClusterCache(AssumeCache(ttl_s=60))
    other.set_gpunodes([gpunode("b1"), gpunode("a1", model="T4", mem=15109)])
    other.set_pods(list(reversed(list(s.kube.pods.values()))))
    a, b = target(s.cache, LEARNED), target(other, LEARNED)
    assert a.shapes == b.shapes and a.fleet == b.fleet


def test_a_policy_without_a_workload_never_switches() -> None:
    s = State(policy="binpack")
    before = s.rt.policy
    assert s.rt.refresh_workload(WorkloadClock(LEARNED), now=0.0) is None
    assert s.rt.policy is before


def test_the_workload_setting_names_its_rule() -> None:
    errors = Settings(workload="mine").validate()
    assert [e.as_flag() for e in errors] == ["--workload='mine': must be one of learned, builtin"]


class ListingApiserver(Apiserver):
    """The runtime tests' apiserver, listing these GPUNodes and pods."""

    def __init__(self, gpunodes: list[JsonDict], pods: list[JsonDict]) -> None:
        super().__init__()
        self.items = {"gpunodes": gpunodes, "/pods": pods}

    def send(self, req: Request) -> JsonDict:
        for key, items in self.items.items():
            if req.method == "GET" and "/leases" not in req.path and req.path.endswith(key):
                return {"items": copy.deepcopy(items), "metadata": {"resourceVersion": "7"}}
        return super().send(req)


@pytest.mark.parametrize("source", [LEARNED, BUILTIN])
def test_a_replica_turning_ready_judges_against_the_workload_of_the_api_state(source: str) -> None:
    pinned = []
    for i in range(MIN_LEARNED_PODS):
        p = pod(f"p{i}", 500)
        p["metadata"]["annotations"]["gpupack.io/gpu-model"] = "T4"
        pinned.append(p)
    api = ListingApiserver([gpunode("a1", model="T4", mem=15109), gpunode("b1")], pinned)
    settings = Settings(lease_namespace="sys", identity="me", workload=source)
    rt = KubeRuntime(api, settings, clock=lambda: 0.0)
    rt.elector.tick()
    step_all(rt)
    assert rt.ready() == (True, "ready")
    wl = workload_of(rt.policy)
    assert wl is not None and dict(wl.fleet) == {"T4": 2, "V100M16": 2}
    if source == LEARNED:
        assert [s.models for s in wl.shapes] == [T4]
    else:
        assert wl.shapes == default_workload().shapes
    assert rt.binder.policy is rt.policy and rt.rankings.policy is rt.policy
