"""ClusterCache: GPUNodes + pod annotations + assume holds -> Nodes; pod demand; staleness."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import names, podview
from app.core.errors import RequestError
from app.core.model import Allocation, Demand
from app.core.pods import pod_info
from app.core.request import pod_demand
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.gpunode import GPUNode, GPUNodeSpec, GPUNodeStatus, GpuSpec, GpuStatus
from app.kube.stores import node_order_key

NOW = 1_700_000_000.0


def gpunode(
    name: str, gpus: int = 2, mem: int = 16_384, beat: float = NOW, model: str = "V100M16"
) -> dict[str, Any]:
    spec = GPUNodeSpec(
        node_name=name,
        gpus=tuple(
            GpuSpec(uuid=f"GPU-{name}-{i}", index=i, model=model, product_name="Tesla", memory_mib=mem)
            for i in range(gpus)
        ),
    )
    status = GPUNodeStatus(
        heartbeat_time=beat,
        gpus=tuple(
            GpuStatus(uuid=f"GPU-{name}-{i}", index=i, healthy=True, memory_free_mib=mem) for i in range(gpus)
        ),
    )
    return GPUNode.of(name, spec, status).wire()


def alloc(node: str, *gpus: int, milli: int = 500, mem: int = 8192) -> Allocation:
    return Allocation(node, tuple(gpus), tuple(f"GPU-{node}-{g}" for g in gpus), milli, mem)


def pod(
    name: str,
    uid: str,
    *,
    milli: int = 500,
    count: int = 1,
    node: str = "",
    allocation: Allocation | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    ann = {names.GPU_FRACTION: f"{milli / 1000:.2f}", names.GPU_FRACTION_NUM_DEVICES: str(count)}
    if allocation is not None:
        ann.update(allocation.to_annotations())
    res = {names.RESOURCE_GPU_MILLI: str(milli * count)}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": ann, "resourceVersion": "1"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}],
        },
        "status": {"phase": phase},
    }


def cache(now: list[float] | None = None, ttl_now: list[float] | None = None) -> ClusterCache:
    clock = now or [NOW]
    tclock = ttl_now or [0.0]
    return ClusterCache(
        AssumeCache(ttl_s=60, timer=lambda: tclock[0]), heartbeat_timeout_s=90, wall=lambda: clock[0]
    )


def used(c: ClusterCache, node: str, exclude: str = "") -> list[int]:
    n = c.node(node, exclude_uid=exclude)
    assert n is not None
    return [g.milli_used for g in n.gpus]


def test_bound_and_unbound_annotated_pods_count_finished_and_mismatched_do_not() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    c.set_pods(
        [
            pod("bound", "u1", node="n1", allocation=alloc("n1", 0), phase="Running"),
            pod("inflight", "u2", allocation=alloc("n1", 1, milli=250)),
            pod("done", "u3", node="n1", allocation=alloc("n1", 0), phase="Succeeded"),
            pod("moved", "u4", node="n2", allocation=alloc("n1", 1)),
        ]
    )
    assert used(c, "n1") == [500, 250]
    c.delete_pod(pod("bound", "u1"))
    assert used(c, "n1") == [0, 250]
    c.upsert_pod(pod("inflight", "u2", allocation=alloc("n1", 1, milli=250), phase="Failed"))
    assert used(c, "n1") == [0, 0]


def test_hold_counts_until_echo_and_replaces_a_stale_annotation() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    c.set_pods([pod("p", "u1", allocation=alloc("n1", 0))])  # stale annotation from an earlier attempt
    c.assume.hold("u1", alloc("n1", 1))
    assert used(c, "n1") == [0, 500]  # the hold wins over the stale annotation, never both
    c.upsert_pod(pod("p", "u1", allocation=alloc("n1", 1)))  # patch echo, not bound yet
    assert c.assume.get("u1") is not None and used(c, "n1") == [0, 500]
    c.upsert_pod(pod("p", "u1", node="n1", allocation=alloc("n1", 1)))  # binding echo
    assert c.assume.get("u1") is None and used(c, "n1") == [0, 500]


def test_a_relist_that_shows_the_binding_ends_the_hold_and_an_absent_pod_keeps_it() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    c.assume.hold("u1", alloc("n1", 1))
    c.assume.hold("u2", alloc("n1", 0))
    c.set_pods([pod("p", "u1", allocation=alloc("n1", 1))])  # patched, not bound yet: still held
    assert c.assume.get("u1") is not None
    c.set_pods([pod("p", "u1", node="n1", allocation=alloc("n1", 1))])  # the relist carries the echo
    assert c.assume.get("u1") is None and used(c, "n1") == [500, 500]
    assert c.assume.get("u2") is not None  # absent from the list, which may predate the pod


def test_exclude_uid_removes_the_pods_own_share() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    c.set_pods(
        [pod("p", "u1", allocation=alloc("n1", 0)), pod("q", "u2", node="n1", allocation=alloc("n1", 0))]
    )
    assert used(c, "n1") == [1000, 0]
    assert used(c, "n1", exclude="u1") == [500, 0]
    c.assume.hold("u1", alloc("n1", 1))
    assert used(c, "n1", exclude="u1") == [500, 0]
    # Mid-bind: the allocation's annotation came back through the watch, the binding not yet, so the hold
    # stays and equals what the pod store counts; the pod's own share is still taken away, once.
    c.assume.hold("u1", alloc("n1", 0))
    assert used(c, "n1") == [1000, 0]
    assert used(c, "n1", exclude="u1") == [500, 0]


def test_expired_hold_stops_counting() -> None:
    tclock = [0.0]
    c = cache(ttl_now=tclock)
    c.set_gpunodes([gpunode("n1")])
    c.assume.hold("u9", alloc("n1", 0))
    assert used(c, "n1") == [500, 0]
    tclock[0] = 60.0
    assert used(c, "n1") == [0, 0]


def test_stale_heartbeat_makes_node_unschedulable() -> None:
    now = [NOW]
    c = cache(now)
    c.set_gpunodes([gpunode("n1", beat=NOW - 90), gpunode("n2", beat=NOW - 91)])
    n1, n2 = c.node("n1"), c.node("n2")
    assert n1 is not None and n1.schedulable
    assert n2 is not None and not n2.schedulable
    assert n2.unschedulable_reason == "gpupack agent heartbeat is 91s old (limit 90s)"


def test_gpunode_without_status_is_unschedulable_and_unknown_node_is_none() -> None:
    c = cache()
    obj = gpunode("n1")
    del obj["status"]
    c.upsert_gpunode(obj)
    n = c.node("n1")
    assert n is not None and not n.schedulable
    assert c.node("nope") is None


def test_natural_node_order() -> None:
    c = cache()
    c.set_gpunodes([gpunode(n) for n in ("gpu-node-10", "gpu-node-2", "gpu-node-1")])
    assert list(c.nodes()) == ["gpu-node-1", "gpu-node-2", "gpu-node-10"]
    assert sorted(["b10", "b9", "a"], key=node_order_key) == ["a", "b9", "b10"]


def test_demand_from_annotations_and_from_resources() -> None:
    assert pod_demand(podview.read(pod("p", "u", milli=250, count=2))) == Demand(count=2, milli=250)
    bare = pod("p", "u", milli=100, count=3)
    bare["metadata"]["annotations"] = {names.GPU_FRACTION_NUM_DEVICES: "3"}
    assert pod_demand(podview.read(bare)) == Demand(count=3, milli=100)
    mem = pod("p", "u")
    mem["metadata"]["annotations"] = {}
    mem["spec"]["containers"][0]["resources"] = {"limits": {names.RESOURCE_GPU_MEMORY_MIB: "4096"}}
    assert pod_demand(podview.read(mem)) == Demand(count=1, memory_mib=4096)


@pytest.mark.parametrize(
    ("resource", "raw", "count", "expected"),
    [
        # The apiserver hands quantities back in canonical form: "1000" is stored as "1k".
        (names.RESOURCE_GPU_MILLI, "1k", 1, Demand(count=1, milli=1000)),
        (names.RESOURCE_GPU_MILLI, "1k", 2, Demand(count=2, milli=500)),
        (names.RESOURCE_GPU_MEMORY_MIB, "16k", 2, Demand(count=2, memory_mib=8000)),
    ],
    ids=["whole-gpu", "two-halves", "memory-16k"],
)
def test_demand_reads_canonical_quantities(resource: str, raw: str, count: int, expected: Demand) -> None:
    p = pod("p", "u")
    p["metadata"]["annotations"] = {names.GPU_FRACTION_NUM_DEVICES: str(count)}
    p["spec"]["containers"][0]["resources"] = {"limits": {resource: raw}}
    assert pod_demand(podview.read(p)) == expected


@pytest.mark.parametrize(
    ("annotations", "resources", "expected"),
    [
        (
            {},
            {},
            RequestError(
                names.RESOURCE_GPU_MILLI,
                "",
                "the pod requests neither gpupack.io/gpu-milli nor gpupack.io/gpu-memory-mib",
            ),
        ),
        (
            {},
            {names.RESOURCE_GPU_MILLI: "1.5"},
            RequestError(
                names.RESOURCE_GPU_MILLI, "1.5", "must be a whole, non-negative quantity (container 'c')"
            ),
        ),
        (
            {},
            {names.RESOURCE_GPU_MILLI: "500m"},
            RequestError(
                names.RESOURCE_GPU_MILLI, "500m", "must be a whole, non-negative quantity (container 'c')"
            ),
        ),
        (
            {},
            {names.RESOURCE_GPU_MILLI: "many"},
            RequestError(
                names.RESOURCE_GPU_MILLI, "many", "must be a whole, non-negative quantity (container 'c')"
            ),
        ),
        (
            {names.GPU_FRACTION_NUM_DEVICES: "2"},
            {names.RESOURCE_GPU_MILLI: "301"},
            RequestError(names.RESOURCE_GPU_MILLI, "301", "does not split evenly over 2 devices"),
        ),
        (
            {names.GPU_FRACTION_NUM_DEVICES: "2"},
            {names.RESOURCE_GPU_MILLI: "3000"},
            RequestError(names.RESOURCE_GPU_MILLI, "3000", "is more than 1000 per device over 2 devices"),
        ),
        (
            {},
            {names.RESOURCE_GPU_MILLI: "500", names.RESOURCE_GPU_MEMORY_MIB: "4096"},
            RequestError(
                names.RESOURCE_GPU_MEMORY_MIB,
                "4096",
                "must not be requested together with gpupack.io/gpu-milli; pick one",
            ),
        ),
    ],
    ids=["none", "not-integer", "milli-suffix", "not-a-quantity", "uneven", "over-one-gpu", "both"],
)
def test_demand_errors(
    annotations: dict[str, str], resources: dict[str, str], expected: RequestError
) -> None:
    p = pod("p", "u")
    p["metadata"]["annotations"] = annotations
    p["spec"]["containers"][0]["resources"] = {"limits": resources}
    assert pod_demand(podview.read(p)) == (expected,)


def test_demand_of_an_annotated_pod_uses_the_webhook_rules() -> None:
    p = pod("p", "u")
    p["metadata"]["annotations"] = {names.GPU_FRACTION: "2"}
    got = pod_demand(podview.read(p))
    assert isinstance(got, tuple) and [e.field for e in got] == [names.GPU_FRACTION]
    assert got[0].value == "2"


def test_demand_from_resources_canonicalises_gpu_models() -> None:
    """Without annotations the models are read as the webhook reads them (NVML aliases -> catalogue)."""
    p = pod("p", "u", milli=500)
    p["metadata"]["annotations"] = {names.GPU_MODEL: "Tesla T4|T4|A100"}
    got = pod_demand(podview.read(p))
    assert isinstance(got, Demand) and got.models == frozenset({"T4", "A100"})


def test_pod_info_pending_and_corrupt_allocation() -> None:
    p = pod("p", "u", allocation=alloc("n1", 0))
    p["metadata"]["annotations"][names.ALLOC_GPU_MILLI] = "lots"
    info = pod_info(p)
    assert info.alloc is None and info.pending and info.key == "ns/p"


# --- host CPU and memory, and pods that are ours without the label ---


def node_obj(name: str, cpu: str = "32", mem: str = "128Gi") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": mem, "pods": "110"}}}


def plain_pod(uid: str, node: str, cpu: str, mem: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}],
        },
        "status": {"phase": phase},
    }


def host_free(c: ClusterCache, node: str, exclude: str = "") -> tuple[int | None, int | None]:
    n = c.node(node, exclude_uid=exclude)
    assert n is not None
    return n.cpu_milli_free, n.memory_mib_free


def test_node_cpu_and_memory_free_count_every_bound_pod() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1"), gpunode("n2")])
    assert host_free(c, "n1") == (None, None)  # no Node object yet: not tracked
    c.set_nodes([node_obj("n1"), node_obj("n2", cpu="8", mem="16Gi")])
    c.set_pods(
        [
            plain_pod("a", "n1", "4", "8Gi"),
            plain_pod("b", "n1", "500m", "1Gi"),
            plain_pod("done", "n1", "8", "8Gi", phase="Succeeded"),
            plain_pod("pending", "", "8", "8Gi", phase="Pending"),
        ]
    )
    assert host_free(c, "n1") == (32_000 - 4500, 131_072 - 9216)
    assert host_free(c, "n2") == (8000, 16_384)
    c.upsert_pod(plain_pod("b", "n1", "500m", "1Gi", phase="Failed"))  # finished: frees its request
    assert host_free(c, "n1") == (32_000 - 4000, 131_072 - 8192)
    c.delete_pod(plain_pod("a", "n1", "4", "8Gi"))
    assert host_free(c, "n1") == (32_000, 131_072)
    c.upsert_node(node_obj("n1", cpu="16"))
    assert host_free(c, "n1") == (16_000, 131_072)
    # Plain pods are accounted for CPU only: they never become gpupack pods in the cache.
    assert c.pods() == []


def test_a_held_pod_is_charged_its_cpu_until_its_bound_pod_shows_up() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    c.set_nodes([node_obj("n1")])
    p = pod("p", "u1")
    p["spec"]["containers"][0]["resources"]["requests"].update({"cpu": "6", "memory": "10Gi"})
    c.set_pods([p])
    info = c.pod("u1")
    assert info is not None and isinstance(info.demand, Demand)
    assert (info.demand.cpu_milli, info.demand.host_memory_mib) == (6000, 10_240)
    c.assume.hold("u1", alloc("n1", 0))
    assert host_free(c, "n1") == (26_000, 131_072 - 10_240)
    assert host_free(c, "n1", exclude="u1") == (32_000, 131_072)  # its own hold never blocks it
    bound = pod("p", "u1", node="n1", allocation=alloc("n1", 0), phase="Running")
    bound["spec"]["containers"][0]["resources"]["requests"].update({"cpu": "6", "memory": "10Gi"})
    c.upsert_pod(bound)  # the watch echo: charged through the bound pod now, once
    assert host_free(c, "n1") == (26_000, 131_072 - 10_240)
    assert used(c, "n1") == [500, 0]


def test_removing_the_managed_label_does_not_forget_the_share() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    p = pod("p", "u1", node="n1", allocation=alloc("n1", 0, milli=600), phase="Running")
    p["metadata"]["labels"] = {names.LABEL_MANAGED: "true"}
    c.set_pods([p])
    assert used(c, "n1") == [600, 0]
    del p["metadata"]["labels"]
    c.upsert_pod(p)
    assert used(c, "n1") == [600, 0]


def test_an_explicit_mps_isolation_makes_mps_required() -> None:
    p = pod("p", "u1")
    assert isinstance(d := pod_demand(podview.read(p)), Demand) and not d.needs_mps
    p["metadata"]["annotations"][names.ISOLATION] = "mps"
    assert isinstance(d := pod_demand(podview.read(p)), Demand) and d.needs_mps
    p["metadata"]["annotations"][names.ISOLATION] = "none"
    assert isinstance(d := pod_demand(podview.read(p)), Demand) and not d.needs_mps


def test_the_demand_the_verbs_parse_carries_the_pods_cpu_and_memory() -> None:
    # filter, prioritize and bind parse the pod in the scheduler's request with pod_demand: without its
    # CPU, policies that weigh node CPU (binpack, fragaware) would score differently from the simulator.
    p = pod("p", "u1", milli=160)
    p["spec"]["containers"][0]["resources"]["requests"].update({"cpu": "6", "memory": "22888Mi"})
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "8"}}}]
    assert pod_demand(podview.read(p)) == Demand(count=1, milli=160, cpu_milli=8000, host_memory_mib=22888)


def test_a_node_update_that_keeps_allocatable_keeps_the_cached_view() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1")])
    c.set_nodes([node_obj("n1")])
    first = c.node("n1")
    ready = node_obj("n1")
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    c.upsert_node(ready)
    assert c.node("n1") is first  # same object: memoised placement answers stay valid
    c.upsert_node(node_obj("n1", cpu="16"))
    assert c.node("n1") is not first
    assert host_free(c, "n1")[0] == 16_000


def test_a_relist_releases_holds_of_pods_deleted_before_it_started() -> None:
    ttl = [0.0]
    c = cache(ttl_now=ttl)
    c.set_gpunodes([gpunode("n1")])
    c.set_pods([pod("gone", "u1"), pod("kept", "u2")])
    c.assume.hold("u1", alloc("n1", 0))  # its pod is deleted while the watch is cut
    c.assume.hold("u2", alloc("n1", 1))  # its pod is still pending: the hold must stay
    ttl[0] = 5.0
    c.pods_listing()
    ttl[0] = 6.0
    c.assume.hold("u3", alloc("n1", 1, milli=250))  # bound after the list started: not in it yet
    c.set_pods([pod("kept", "u2")])
    assert set(c.assume.items()) == {"u2", "u3"}
    assert used(c, "n1") == [0, 750]
    # A list the cache was not told about (e.g. `gpupack top`'s one-off) releases nothing.
    c.set_pods([])
    assert set(c.assume.items()) == {"u2", "u3"}


def test_a_heartbeat_keeps_the_view_and_a_changed_inventory_replaces_it() -> None:
    c = cache()
    c.set_gpunodes([gpunode("n1"), gpunode("n2")])
    c.set_pods([])
    first = c.frame(None)
    assert first.full and set(first.changed) == {"n1", "n2"} and first.adjusted == {}
    view = c.node("n1")
    c.upsert_gpunode(gpunode("n1", beat=NOW + 5))  # heartbeat only
    assert c.node("n1") is view
    assert c.frame(first.token).changed == {}
    sick = gpunode("n1", beat=NOW + 10)
    sick["status"]["gpus"][1]["healthy"] = False
    c.upsert_gpunode(sick)
    after = c.frame(first.token)
    n1 = after.changed["n1"]
    assert not after.full and set(after.changed) == {"n1"} and n1 is not None
    assert [g.healthy for g in n1.gpus] == [True, False]


def test_a_bind_makes_one_new_gpu_in_the_nodes_view_and_a_new_inventory_none_old() -> None:
    """A rebuilt view keeps the GPU objects whose reservation did not change (fewer objects for the
    garbage collector to walk after every bind), and never keeps one from an earlier inventory."""
    c = cache()
    c.set_gpunodes([gpunode("n1", gpus=4)])
    c.set_pods(
        [
            pod("a", "ua", node="n1", allocation=alloc("n1", 0)),
            pod("b", "ub", node="n1", allocation=alloc("n1", 1)),
        ]
    )
    before = c.node("n1")
    c.upsert_pod(pod("c", "uc", node="n1", allocation=alloc("n1", 1)))
    after = c.node("n1")
    assert before is not None and after is not None and after is not before
    assert [g.milli_used for g in after.gpus] == [500, 1000, 0, 0]
    assert [a is b for a, b in zip(before.gpus, after.gpus, strict=True)] == [True, False, True, True]
    c.delete_pod(pod("c", "uc", node="n1", allocation=alloc("n1", 1)))
    assert [g.milli_used for g in c.node("n1").gpus] == [500, 500, 0, 0]  # type: ignore[union-attr]
    sick = gpunode("n1", gpus=4, beat=NOW + 10)
    sick["status"]["gpus"][0]["healthy"] = False
    c.upsert_gpunode(sick)
    replaced = c.node("n1")
    assert replaced is not None and [g.healthy for g in replaced.gpus] == [False, True, True, True]
    assert [g.milli_used for g in replaced.gpus] == [500, 500, 0, 0]
    assert not any(a is b for a, b in zip(after.gpus[:2], replaced.gpus[:2], strict=True))


def test_frame_names_what_changed_and_what_one_request_sees_differently() -> None:
    clock = [NOW]
    c = cache(now=clock)
    c.set_gpunodes([gpunode("n1"), gpunode("n2"), gpunode("n10", beat=NOW - 200)])
    c.set_pods([pod("a", "ua", node="n1", allocation=alloc("n1", 0), phase="Running")])
    start = c.frame(None, exclude_uid="ua")
    assert start.rank == {"n1": 0, "n2": 1, "n10": 2}
    # The pod's own share is taken off n1 for its own request; n10's heartbeat is stale.
    assert set(start.adjusted) == {"n1", "n10"}
    own, stale = start.adjusted["n1"], start.adjusted["n10"]
    assert own is not None and [g.milli_used for g in own.gpus] == [0, 0]
    assert stale is not None and not stale.schedulable
    c.assume.hold("ub", alloc("n2", 1, milli=300))
    c.upsert_pod(pod("c", "uc", node="n2", allocation=alloc("n2", 0), phase="Running"))
    later = c.frame(start.token)
    assert not later.full and set(later.changed) == {"n2"}
    assert set(later.adjusted) == {"n2", "n10"}  # the hold is not in n2's view, only in this request's
    clock[0] += 95  # n1 and n2 go stale too (limit 90 s)
    assert set(c.frame(later.token).adjusted) == {"n1", "n2", "n10"}
    c.upsert_gpunode(gpunode("n3"))  # a new node moves the order: readers start over
    assert c.frame(later.token).full


def test_a_dead_agent_stays_stale_in_every_request_while_the_others_age_and_beat() -> None:
    clock = [NOW]
    c = cache(now=clock)  # limit 90 s
    c.set_gpunodes([gpunode("dead", beat=NOW - 200), gpunode("n1", beat=NOW - 10), gpunode("n2")])
    c.set_pods([])
    token = c.frame(None).token
    for _ in range(3):  # the same answer request after request, not only on the first
        assert set(c.frame(token).adjusted) == {"dead"}
    clock[0] += 79.5  # n1 is within a second of its limit: judged per request from now on
    assert set(c.frame(token).adjusted) == {"dead"}  # still fresh
    clock[0] += 1.0  # n1 is 90.5 s old
    assert set(c.frame(token).adjusted) == {"dead", "n1"}
    c.upsert_gpunode(gpunode("n1", beat=clock[0]))  # n1's agent beats again; so does the dead one
    assert set(c.frame(token).adjusted) == {"dead"}
    c.upsert_gpunode(gpunode("dead", beat=clock[0]))
    assert c.frame(token).adjusted == {}
    clock[0] += 10.0  # n2 (beat at NOW) is past its limit: 90.5 s old
    assert set(c.frame(token).adjusted) == {"n2"}
    stale = c.frame(token).adjusted["n2"]
    assert stale is not None and not stale.schedulable


def test_a_relist_that_finds_what_the_watch_delivered_changes_no_view() -> None:
    c = cache()
    objs = [gpunode("n1"), gpunode("n2"), gpunode("n3")]
    pods = [
        pod("a", "ua", node="n1", allocation=alloc("n1", 0), phase="Running"),
        pod("b", "ub", node="n2", allocation=alloc("n2", 1), phase="Running"),
    ]
    c.set_gpunodes(objs)
    c.set_pods(pods)
    start = c.frame(None)
    views = {n: c.node(n) for n in ("n1", "n2", "n3")}
    c.set_gpunodes(objs)
    c.set_pods(pods)
    c.set_nodes([])
    assert c.frame(start.token).changed == {}
    assert all(c.node(n) is views[n] for n in views)
    # A relist that shows a pod gone and another GPU's inventory changed touches just those nodes.
    sick = gpunode("n3")
    sick["status"]["gpus"][0]["healthy"] = False
    c.set_gpunodes([objs[0], objs[1], sick])
    c.set_pods(pods[:1])
    c.set_nodes([{"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}}}])
    after = c.frame(start.token)
    assert not after.full and set(after.changed) == {"n1", "n2", "n3"}
    assert used(c, "n2") == [0, 0] and c.node("n1") is not views["n1"]


# A pod's step: (uid, node or "" for unbound, GPU indexes, milli, memory MiB, phase) or a deletion.
pod_steps = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["u1", "u2", "u3", "u4"]),
            st.sampled_from(["n1", "n2", ""]),
            st.lists(st.integers(0, 3), min_size=1, max_size=2).map(tuple),
            st.sampled_from([0, 100, 250, 1000]),
            st.sampled_from([0, 1024, 4096]),
            st.sampled_from(["Running", "Pending", "Succeeded"]),
        ),
        st.sampled_from(["u1", "u2", "u3", "u4"]),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(steps=pod_steps, relist_at=st.integers(0, 25))
def test_each_view_reserves_exactly_its_counted_pods_after_any_events(
    steps: list[Any], relist_at: int
) -> None:
    # The views keep each GPU's reserved sums as pods come, move, finish and go (and through a relist):
    # after every event a node is its GPUNode with the counted pods' allocations reserved, pod by pod.
    c = cache()
    c.set_gpunodes([gpunode("n1", gpus=3), gpunode("n2", gpus=3)])
    live: dict[str, dict[str, Any]] = {}
    for at, step in enumerate(steps):
        if isinstance(step, str):
            if step in live:
                c.delete_pod(live.pop(step))
        else:
            uid, node, gpus, milli, mem, phase = step
            placed = alloc(node, *gpus, milli=milli, mem=mem) if node else None
            live[uid] = pod(uid, uid, milli=milli, node=node, allocation=placed, phase=phase)
            c.upsert_pod(live[uid])
        if at == relist_at:
            c.set_pods(list(live.values()))
        counted = [p.alloc for p in c.pods() if p.alloc is not None]
        for name in ("n1", "n2"):
            base = c.inventory()[0 if name == "n1" else 1]
            assert base.name == name
            assert c.node(name) == base.reserve(a for a in counted if a.node == name)
