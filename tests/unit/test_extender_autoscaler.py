"""The leader's scale-up loop against an in-memory apiserver: placeholders follow the pending pods."""

from __future__ import annotations

import itertools
from typing import Any

from app.core.autoscale import placeholders as ph
from app.core.autoscale.plan import Pool
from app.core.errors import KubeError
from app.core.placement import registry
from app.kube.cache import ClusterCache
from app.kube.calls import Request
from app.kube.gpunode import GPUNode, GPUNodeSpec, GpuSpec
from extender.autoscaler import PRIORITY_CLASSES, AutoscaleConfig, Autoscaler
from tests.unit.test_kube_cache import NOW, alloc, gpunode, pod

NS = "gpupack-system"
MODEL = "A100-80GB"


class Apiserver:
    """Pods in gpupack's namespace (create with generateName, list by label, delete) and PriorityClasses."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.priority_classes: list[str] = []
        self.names = (f"{ph.NAME_PREFIX}{i}" for i in itertools.count())

    def send(self, req: Request) -> dict[str, Any]:
        if req.method == "POST" and req.path == PRIORITY_CLASSES:
            name = req.body["metadata"]["name"]
            if name in self.priority_classes:
                raise KubeError(409, "AlreadyExists", name)
            self.priority_classes.append(name)
            return req.body
        if req.method == "POST" and req.path == f"/api/v1/namespaces/{NS}/pods":
            name = next(self.names)
            self.pods[name] = {**req.body, "metadata": {**req.body["metadata"], "name": name}}
            return self.pods[name]
        if req.method == "GET" and req.path == f"/api/v1/namespaces/{NS}/pods":
            assert req.query["labelSelector"] == f"{ph.LABEL_PLACEHOLDER}=true"
            return {"items": list(self.pods.values())}
        if req.method == "DELETE":
            name = req.path.rsplit("/", 1)[1]
            if self.pods.pop(name, None) is None:
                raise KubeError(404, "NotFound", name)
            return {}
        raise AssertionError(f"unexpected call {req.method} {req.path}")

    def shapes(self) -> list[int]:
        return sorted(int(p["metadata"]["labels"][ph.LABEL_GPUS]) for p in self.pods.values())

    def bind(self, name: str, node: str) -> None:
        self.pods[name]["spec"]["nodeName"] = node


def gpunode_spec(name: str, gpus: int) -> GPUNodeSpec:
    """What an agent writes when it creates its GPUNode, before its first status."""
    return GPUNodeSpec(
        node_name=name,
        gpus=tuple(
            GpuSpec(uuid=f"GPU-{name}-{i}", index=i, model=MODEL, product_name="A100", memory_mib=81_920)
            for i in range(gpus)
        ),
    )


def setup(
    leading: list[bool] | None = None, live: list[str] | None = None
) -> tuple[Apiserver, ClusterCache, Autoscaler, list[float]]:
    """`live`: why the view is not live ("" when it is), changed by the test as informers go stale."""
    api = Apiserver()
    cache = ClusterCache(wall=lambda: NOW)
    full = gpunode("n0", gpus=8, mem=81_920, model=MODEL)
    cache.set_gpunodes([full])
    for i in range(8):
        cache.upsert_pod(
            pod(f"busy{i}", f"b{i}", milli=1000, node="n0", allocation=alloc("n0", i, milli=1000, mem=81_920))
        )
    clock = [0.0]
    lead = leading if leading is not None else [True]
    config = AutoscaleConfig(pools=(Pool(MODEL, 8),), namespace=NS, grace_s=5.0)
    why = live if live is not None else [""]
    scaler = Autoscaler(
        api,
        cache,
        registry.create("binpack"),
        config,
        can_write=lambda: lead[0],
        views_live=lambda: (not why[0], why[0]),
        clock=lambda: clock[0],
    )
    return api, cache, scaler, clock


def one_node_asked_and_bound(
    api: Apiserver, cache: ClusterCache, scaler: Autoscaler, clock: list[float]
) -> str:
    """Eight whole-GPU pods wait past the grace period: one placeholder asks for a node, which arrives as
    "n1" and takes it. Returns the placeholder's name."""
    for i in range(8):
        cache.upsert_pod(pod(f"a{i}", f"a{i}", milli=1000))
    scaler.tick()
    clock[0] = 6.0
    scaler.tick()
    (first,) = api.pods
    api.bind(first, "n1")
    return first


def test_pending_shares_become_one_placeholder_sized_by_packing_and_go_once_bound() -> None:
    api, cache, scaler, clock = setup()
    for i in range(5):
        cache.upsert_pod(pod(f"p{i}", f"u{i}", milli=300))
    scaler.tick()
    assert api.pods == {}  # within the grace period: kube-scheduler gets its chance first
    clock[0] = 6.0
    result = scaler.tick()
    assert result is not None and result.plan.gpus == 2
    assert api.shapes() == [2] and api.priority_classes == [ph.PRIORITY_CLASS]
    clock[0] = 12.0
    scaler.tick()
    assert api.shapes() == [2]  # the same plan: nothing created or deleted
    # The autoscaler's node arrives (the placeholder binds there), then its agent publishes the GPUs.
    api.bind(next(iter(api.pods)), "n1")
    cache.set_gpunodes(
        [gpunode("n0", gpus=8, mem=81_920, model=MODEL), gpunode("n1", gpus=8, mem=81_920, model=MODEL)]
    )
    clock[0] = 18.0
    scaler.tick()
    assert api.pods == {}  # withdrawn: the pending pods fit on n1 now
    for i in range(5):
        cache.upsert_pod(
            pod(f"p{i}", f"u{i}", milli=300, node="n1", allocation=alloc("n1", i // 3, milli=300))
        )
    scaler.tick()
    assert api.pods == {}


def test_a_second_wave_of_the_same_shape_asks_again_once_the_first_node_is_published() -> None:
    api, cache, scaler, clock = setup()
    first = one_node_asked_and_bound(api, cache, scaler, clock)
    cache.upsert_gpunode(gpunode("n1", gpus=8, mem=81_920, model=MODEL))
    for i in range(8):  # the first wave bound on n1, filling it
        cache.upsert_pod(
            pod(f"a{i}", f"a{i}", milli=1000, node="n1", allocation=alloc("n1", i, milli=1000, mem=81_920))
        )
    for i in range(8):  # a second wave of the same shape
        cache.upsert_pod(pod(f"b{i}", f"wave2-{i}", milli=1000))
    scaler.tick()
    clock[0] = 12.0
    scaler.tick()
    assert first not in api.pods and api.shapes() == [8]


def test_a_node_on_its_way_is_filled_before_another_is_asked_for() -> None:
    """Pods that arrive while the first placeholder's node comes up: they go on that node in the plan, and
    only what overflows it is asked for (not a fresh node for every pod pending in each round)."""
    api, cache, scaler, clock = setup()
    for i in range(3):
        cache.upsert_pod(pod(f"a{i}", f"a{i}", milli=1000))
    scaler.tick()
    clock[0] = 6.0
    scaler.tick()
    (first,) = api.pods
    assert api.shapes() == [3]
    for i in range(10):  # a second wave while that node is on its way: 5 fit beside the 3, 5 overflow
        cache.upsert_pod(pod(f"b{i}", f"wave-{i}", milli=1000))
    clock[0] = 12.0
    scaler.tick()  # the second wave is seen; it waits its grace period
    clock[0] = 18.0
    scaler.tick()
    assert first in api.pods  # still awaited: the plan puts pending pods on its node
    assert sorted(api.shapes()) == [3, 5]  # 3 + 5 on the way, 5 more asked for: 13 GPUs, 2 nodes
    api.bind(first, "n1")  # its node registers; its GPUs are not published yet
    clock[0] = 24.0
    scaler.tick()
    assert first in api.pods and sorted(api.shapes()) == [3, 5]  # the same two nodes, nothing added


def test_a_node_whose_agent_has_not_reported_yet_is_still_on_its_way() -> None:
    """An agent creates its GPUNode first and writes the status (its GPUs' health, the heartbeat) next. In
    between nothing fits on the node: its placeholder still stands for it, and nothing more is asked for
    the pods that will go there (seen live: a 5-GPU node asked for while three arrived for 21 GPUs)."""
    api, cache, scaler, clock = setup()
    first = one_node_asked_and_bound(api, cache, scaler, clock)
    spec_only = GPUNode.of("n1", gpunode_spec("n1", 8)).wire()
    cache.upsert_gpunode(spec_only)
    assert cache.unreported() == {"n1"}
    clock[0] = 12.0
    result = scaler.tick()
    assert result is not None and result.plan.gpus == 0 and result.plan.fit_now == ()
    assert list(api.pods) == [first]  # kept, nothing added
    cache.upsert_gpunode(gpunode("n1", gpus=8, mem=81_920, model=MODEL))  # the agent's first report
    assert cache.unreported() == frozenset()
    clock[0] = 18.0
    result = scaler.tick()
    assert result is not None and len(result.plan.fit_now) == 8 and api.pods == {}


def test_pods_being_bound_are_not_asked_for_again() -> None:
    """Between the extender's bind and the watch echo, a pod still reads pending while its hold already
    takes its GPU on the new node: it must count once, or a node is asked for pods that have one."""
    api, cache, scaler, clock = setup()
    cache.upsert_gpunode(gpunode("n1", gpus=8, mem=81_920, model=MODEL))
    for i in range(8):
        cache.upsert_pod(pod(f"a{i}", f"a{i}", milli=1000))
    for i in range(3):  # three binds in flight on n1: holds taken, no echo yet
        cache.assume.hold(f"a{i}", alloc("n1", i, milli=1000, mem=81_920))
    scaler.tick()
    clock[0] = 6.0
    result = scaler.tick()
    assert result is not None and result.plan.gpus == 0 and len(result.plan.fit_now) == 5
    assert api.pods == {}


def test_deleted_pending_pods_withdraw_their_placeholder() -> None:
    api, cache, scaler, clock = setup()
    cache.upsert_pod(pod("p", "u1", milli=1000, count=3))
    scaler.tick()
    clock[0] = 10.0
    scaler.tick()
    assert api.shapes() == [3]
    cache.delete_pod(pod("p", "u1", milli=1000, count=3))
    scaler.tick()
    assert api.pods == {}


def test_a_standby_writes_nothing_and_forgets_its_clock() -> None:
    leading = [False]
    api, cache, scaler, clock = setup(leading)
    cache.upsert_pod(pod("p", "u1", milli=500))
    clock[0] = 100.0
    assert scaler.tick() is None and api.pods == {}
    leading[0] = True
    scaler.tick()  # a new leader starts the grace period over: it never saw the pod pending before
    assert api.pods == {}
    clock[0] = 106.0
    scaler.tick()
    assert api.shapes() == [1]


def test_stale_placeholders_left_by_an_old_leader_are_withdrawn() -> None:
    api, _cache, scaler, _clock = setup()
    body = ph.body(ph.Request(Pool(MODEL, 8), 4, ("ns/gone",)), NS)
    api.send(Request("POST", f"/api/v1/namespaces/{NS}/pods", body))
    scaler.tick()
    assert api.pods == {}


def test_a_stale_view_neither_asks_for_nodes_nor_withdraws_what_pods_wait_for() -> None:
    """Watches cut while leading: the pods the view shows pending may be bound by now, and the placeholders
    it would withdraw may still be needed; the loop waits for a live view and then plans from it."""
    stale = [""]
    api, cache, scaler, clock = setup(live=stale)
    cache.upsert_pod(pod("p", "u1", milli=1000, count=3))
    scaler.tick()
    clock[0] = 10.0
    scaler.tick()
    assert api.shapes() == [3]
    stale[0] = "pods informer not live: no event for 40s (last error: connection refused)"
    cache.upsert_pod(pod("q", "u2", milli=1000, count=2))
    cache.delete_pod(pod("p", "u1", milli=1000, count=3))
    clock[0] = 30.0
    before = dict(api.pods)
    assert scaler.tick() is None
    assert api.pods == before  # nothing created, nothing withdrawn
    stale[0] = ""
    assert scaler.tick() is not None  # live again: p's placeholder goes; q's wait starts now
    assert api.pods == {}
    clock[0] = 36.0
    scaler.tick()
    assert api.shapes() == [2]
