"""Verification: each gpupack pod's processes on the GPUs of its allocation, within its memory limit."""

from __future__ import annotations

from typing import Any

from agent.enforce import verify
from agent.enforce.cgroup import PodRef
from agent.enforce.verify import Kind
from agent.nvml.base import MigDeviceInfo, ProcessInfo
from agent.nvml.sample import GpuSample, NodeSample
from app.core.model import Allocation, mig_index
from app.core.pods import PodInfo, pod_info

T0 = 1_700_000_000.0
GPU0, GPU1 = "GPU-0000", "GPU-1111"


def pod(
    uid: str,
    alloc: Allocation | None,
    *,
    containers: dict[str, str] | None = None,
    ann: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations = dict(alloc.to_annotations()) if alloc else {}
    annotations.update(ann or {})
    statuses = [{"name": n, "containerID": f"containerd://{cid}"} for cid, n in (containers or {}).items()]
    return {
        "metadata": {"uid": uid, "namespace": "ml", "name": f"pod-{uid}", "annotations": annotations},
        "spec": {"containers": [{"name": "main"}, {"name": "sidecar"}]},
        "status": {"containerStatuses": statuses},
    }


def node(*procs: tuple[int, int, int]) -> NodeSample:
    """GPUs 0 and 1 with (gpu index, pid, MiB) processes."""
    gpus = []
    for idx, uuid in enumerate((GPU0, GPU1)):
        ps = tuple(ProcessInfo(pid, mib) for g, pid, mib in procs if g == idx)
        gpus.append(
            GpuSample(
                index=idx,
                uuid=uuid,
                product_name="Tesla T4",
                model="T4",
                memory_total_mib=15109,
                processes=ps,
            )
        )
    return NodeSample(gpus=tuple(gpus))


def alloc(*indexes: int, mib: int = 4000, uuids: bool = True) -> Allocation:
    u = tuple((GPU0, GPU1)[i] for i in indexes) if uuids else ()
    return Allocation("n1", indexes, u, 250, mib)


def pods(*objs: dict[str, Any]) -> dict[str, PodInfo]:
    return {p.uid: p for p in (pod_info(o) for o in objs)}


def test_pod_within_its_allocation_is_fine_and_usage_is_reported() -> None:
    v = verify.verify(
        node((0, 10, 1500), (0, 11, 500)),
        {10: PodRef("a", ""), 11: PodRef("a", "")},
        pods(pod("a", alloc(0))),
    )
    assert v.violations == ()
    (u,) = v.usage
    assert (u.gpu_uuid, u.used_mib, u.limit_mib, u.pids) == (GPU0, 2000, 4000, (10, 11))
    assert v.owners == {10: "a", 11: "a"}


def test_over_memory() -> None:
    v = verify.verify(
        node((0, 10, 3000), (0, 11, 1001)),
        {10: PodRef("a", ""), 11: PodRef("a", "")},
        pods(pod("a", alloc(0))),
    )
    (bad,) = v.violations
    assert bad.kind is Kind.OVER_MEMORY
    assert bad.message == f"processes 10,11 use 4001 MiB on GPU 0 ({GPU0}), over the 4000 MiB limit"


def test_a_burstable_pod_may_use_up_to_its_hard_limit_and_its_use_above_the_request_is_borrowed() -> None:
    burstable = Allocation("n1", (0,), (GPU0,), 250, 4000, hard_limit_mib=8000)
    within = verify.verify(node((0, 10, 6000)), {10: PodRef("a", "")}, pods(pod("a", burstable)))
    assert within.violations == ()
    (u,) = within.usage
    assert (u.limit_mib, u.borrowed_mib) == (4000, 2000)
    over = verify.verify(node((0, 10, 8001)), {10: PodRef("a", "")}, pods(pod("a", burstable)))
    (bad,) = over.violations
    assert bad.kind is Kind.OVER_MEMORY
    assert bad.message == (
        f"processes 10 use 8001 MiB on GPU 0 ({GPU0}), over the 8000 MiB hard limit (request 4000 MiB)"
    )
    # A pod without a limit borrows nothing while within its request.
    plain = verify.verify(node((0, 10, 3000)), {10: PodRef("a", "")}, pods(pod("a", alloc(0))))
    assert plain.usage[0].borrowed_mib == 0


def test_wrong_gpu_by_uuid_and_by_index() -> None:
    for a in (alloc(0), alloc(0, uuids=False)):
        v = verify.verify(node((1, 20, 100)), {20: PodRef("a", "")}, pods(pod("a", a)))
        (bad,) = v.violations
        assert bad.kind is Kind.WRONG_GPU and bad.gpu_uuid == GPU1 and bad.pids == (20,)
        assert v.usage[0].limit_mib is None


def test_multi_gpu_allocation_covers_both_gpus() -> None:
    v = verify.verify(
        node((0, 1, 10), (1, 2, 10)), {1: PodRef("a", ""), 2: PodRef("a", "")}, pods(pod("a", alloc(0, 1)))
    )
    assert v.violations == ()
    assert len(v.usage) == 2


def test_second_container_using_a_gpu() -> None:
    cids = {"c-main": "main", "c-side": "sidecar"}
    v = verify.verify(
        node((0, 1, 10), (0, 2, 10)),
        {1: PodRef("a", "c-main"), 2: PodRef("a", "c-side")},
        pods(pod("a", alloc(0), containers=cids)),
    )
    (bad,) = v.violations
    assert (bad.kind, bad.pids) == (Kind.WRONG_CONTAINER, (2,))
    assert "container(s) sidecar" in bad.message


def test_gpu_container_named_by_annotation() -> None:
    cids = {"c-main": "main", "c-side": "sidecar"}
    p = pod("a", alloc(0), containers=cids, ann={"gpu-fraction-container-name": "sidecar"})
    v = verify.verify(node((0, 2, 10)), {2: PodRef("a", "c-side")}, pods(p))
    assert v.violations == ()


def test_init_container_named_by_annotation_is_the_gpu_container() -> None:
    """KAI's example gives the share to an init container; its runtime ID comes from initContainerStatuses."""
    p = pod("a", alloc(0), containers={"c-main": "main"}, ann={"gpu-fraction-container-name": "gpu-init"})
    p["status"]["initContainerStatuses"] = [{"name": "gpu-init", "containerID": "containerd://c-init"}]
    ok = verify.verify(node((0, 1, 10)), {1: PodRef("a", "c-init")}, pods(p))
    assert ok.violations == ()
    bad = verify.verify(
        node((0, 1, 10), (0, 2, 10)), {1: PodRef("a", "c-init"), 2: PodRef("a", "c-main")}, pods(p)
    )
    assert [(v.kind, v.pids) for v in bad.violations] == [(Kind.WRONG_CONTAINER, (2,))]


def test_gpupack_pod_without_allocation_and_with_a_corrupt_one() -> None:
    corrupt = pod("b", None, ann={"gpupack.io/node": "n1", "gpupack.io/gpu-indexes": "x"})
    v = verify.verify(
        node((0, 1, 10), (1, 2, 10)), {1: PodRef("a", ""), 2: PodRef("b", "")}, pods(pod("a", None), corrupt)
    )
    kinds = {(x.pod.uid, x.kind) for x in v.violations}
    assert kinds == {("a", Kind.NO_ALLOCATION), ("b", Kind.NO_ALLOCATION)}
    assert "gpupack.io/gpu-indexes='x'" in next(x.message for x in v.violations if x.pod.uid == "b")


def test_foreign_and_non_gpupack_processes_are_attributed_not_judged() -> None:
    v = verify.verify(
        node((0, 1, 9000), (0, 2, 9000)), {1: None, 2: PodRef("other", "")}, pods(pod("a", alloc(0)))
    )
    assert v.violations == () and v.usage == ()
    assert v.owners == {1: "", 2: "other"}
    assert v.foreign_pids == (1,)


def test_event_body() -> None:
    v = verify.verify(node((1, 20, 100)), {20: PodRef("a", "")}, pods(pod("a", alloc(0))))
    req = verify.event(v.violations[0], "n1", T0)
    assert (req.method, req.path) == ("POST", "/api/v1/namespaces/ml/events")
    assert req.body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "pod-a.", "namespace": "ml"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "pod-a", "namespace": "ml", "uid": "a"},
        "reason": "GpupackWrongGPU",
        "message": f"processes 20 run on GPU 1 ({GPU1}) but the allocation is {GPU0} "
        "(is NVIDIA_VISIBLE_DEVICES honoured by the container runtime?)",
        "type": "Warning",
        "source": {"component": "gpupack-agent", "host": "n1"},
        "reportingComponent": "gpupack-agent",
        "reportingInstance": "n1",
        "firstTimestamp": "2023-11-14T22:13:20Z",
        "lastTimestamp": "2023-11-14T22:13:20Z",
        "count": 1,
    }


def test_eviction_and_pod_list_requests() -> None:
    v = verify.verify(node((1, 20, 100)), {20: PodRef("a", "")}, pods(pod("a", alloc(0))))
    ev = verify.eviction(v.violations[0])
    assert (ev.method, ev.path) == ("POST", "/api/v1/namespaces/ml/pods/pod-a/eviction")
    assert ev.body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "pod-a", "namespace": "ml"},
    }
    lst = verify.list_pods("n1")
    assert (lst.method, lst.path) == ("GET", "/api/v1/pods")
    assert dict(lst.query) == {
        "fieldSelector": "spec.nodeName=n1",
        "labelSelector": "gpupack.io/managed=true",
        "resourceVersion": "0",
    }


def mig_node(*procs: tuple[int, int, int]) -> NodeSample:
    """GPU 0 in MIG mode with MIG devices in slots 0 and 1 (1g.10gb); (slot, pid, MiB) processes on them."""
    migs = tuple(MigDeviceInfo(slot, f"MIG-{slot}", 9728, 0, "1g.10gb") for slot in (0, 1))
    ps = tuple(ProcessInfo(pid, mib, f"MIG-{slot}") for slot, pid, mib in procs)
    gpu = GpuSample(
        index=0,
        uuid=GPU0,
        product_name="NVIDIA A100-SXM4-80GB",
        model="A100-80GB",
        memory_total_mib=81920,
        mig_enabled=True,
        mig_devices=migs,
        processes=ps,
    )
    return NodeSample(gpus=(gpu,))


def test_a_pod_on_its_mig_device_is_checked_against_that_devices_uuid() -> None:
    mine = Allocation("n1", (mig_index(0, 1),), ("MIG-1",), 1000, 9728)
    refs = {30: PodRef("a", ""), 31: PodRef("b", "")}
    other = Allocation("n1", (mig_index(0, 0),), ("MIG-0",), 1000, 9728)
    v = verify.verify(mig_node((1, 30, 9000), (1, 31, 100)), refs, pods(pod("a", mine), pod("b", other)))
    assert [(u.pod.uid, u.gpu_uuid, u.gpu_index, u.limit_mib) for u in v.usage] == [
        ("a", "MIG-1", 101, 9728),
        ("b", "MIG-1", 101, None),
    ]
    (bad,) = v.violations
    assert (bad.kind, bad.pod.uid, bad.gpu_uuid) == (Kind.WRONG_GPU, "b", "MIG-1")
    assert bad.message.startswith("processes 31 run on MIG device 101 (MIG-1) but the allocation is MIG-0")
    over = verify.verify(mig_node((1, 30, 9729)), refs, pods(pod("a", mine)))
    assert [b.kind for b in over.violations] == [Kind.OVER_MEMORY]


def test_an_unhealthy_gpu_tells_only_the_pods_allocated_on_it() -> None:
    from app.kube.gpunode import GpuStatus

    gpus = [
        GpuStatus(uuid=GPU0, index=0, healthy=True),
        GpuStatus(uuid=GPU1, index=1, healthy=False, reason="XID 79"),
    ]
    running = pods(
        pod("a", alloc(0)), pod("b", alloc(1)), pod("c", alloc(0, 1)), pod("d", alloc(1, uuids=False))
    )
    told = verify.unhealthy(gpus, running)
    assert sorted(v.pod.uid for v in told) == ["b", "c", "d"]
    assert {(v.kind, v.gpu_uuid, v.gpu_index) for v in told} == {(Kind.GPU_UNHEALTHY, GPU1, 1)}
    assert "GPU 1 (GPU-1111) of this pod's allocation is unhealthy: XID 79." in told[0].message
    assert verify.REASONS[Kind.GPU_UNHEALTHY] == "GpupackGPUUnhealthy"
    assert (
        verify.unhealthy(
            [GpuStatus(uuid=GPU0, index=0, healthy=True), GpuStatus(uuid=GPU1, index=1, healthy=True)],
            running,
        )
        == ()
    )
