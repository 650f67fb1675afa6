"""Reporter: what it writes and when (change threshold, rate limit, heartbeat), with a pinned clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent.main import reporter_config
from agent.report.reporter import Reporter, capacity_grew, significant_change
from agent.settings import Settings
from app.core import names
from app.core.errors import KubeError
from app.kube import gpunode
from app.kube.calls import Request
from app.kube.gpunode import GPUNodeSpec, GPUNodeStatus, GpuSpec, GpuStatus, MpsStatus, ProcessStatus

T0 = 1_700_000_000.0
SPEC = GPUNodeSpec(
    node_name="n1",
    driver_version="550",
    gpus=tuple(
        GpuSpec(uuid=f"GPU-{x}", index=i, model="T4", product_name="Tesla T4", memory_mib=15109)
        for i, x in enumerate("ab")
    ),
)


def status(now: float, used: int = 0, healthy: bool = True, pids: tuple[int, ...] = ()) -> GPUNodeStatus:
    a = GpuStatus(
        uuid="GPU-a",
        index=0,
        healthy=True,
        memory_used_mib=used,
        memory_free_mib=15109 - used,
        processes=tuple(ProcessStatus(pid=p, pod_uid="") for p in pids),
    )
    b = GpuStatus(uuid="GPU-b", index=1, healthy=healthy, memory_used_mib=0, memory_free_mib=15109)
    return GPUNodeStatus(heartbeat_time=now, gpus=(a, b))


class FakeKube:
    """Records requests; answers like the API server for the few calls the reporter makes."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.labels: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.fail: dict[tuple[str, str], KubeError] = {}  # (method, path) → error, raised until removed

    def send(self, req: Request) -> dict[str, Any]:
        self.requests.append(req)
        err = self.fail.get((req.method, req.path))
        if err is not None:
            raise err
        if req.path == "/api/v1/nodes/n1" and req.method == "PATCH":
            self.labels.update(req.body["metadata"].get("labels", {}))
            self.annotations.update(req.body["metadata"].get("annotations", {}))
        if req.path.startswith("/api/v1/nodes/n1"):
            return {"metadata": {"name": "n1", "uid": "node-uid", "labels": dict(self.labels)}}
        return {}

    def kinds(self) -> list[str]:
        out = [f"{r.method} {r.path}" for r in self.requests]
        self.requests.clear()
        return out


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def reporter(kube: FakeKube, **cfg: Any) -> Reporter:
    """A reporter at the agent's default cadence (its settings), but for `cfg`."""
    config = replace(reporter_config(Settings(node="n1")), **cfg)
    return Reporter("n1", kube.send, config)


NODE_STATUS = "PATCH /api/v1/nodes/n1/status"
GPUNODE_STATUS = "PATCH /apis/gpupack.io/v1alpha1/gpunodes/n1/status"
NODE_LABELS = "PATCH /api/v1/nodes/n1"
CREATE = "POST /apis/gpupack.io/v1alpha1/gpunodes"
SPEC_PATCH = "PATCH /apis/gpupack.io/v1alpha1/gpunodes/n1"


def test_first_tick_writes_everything_in_order(kube: FakeKube) -> None:
    r = reporter(kube)
    assert r.tick(SPEC, status(T0), T0) == ["node", "spec", "status", "node_capacity"]
    assert kube.requests[2].body["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    assert kube.kinds() == [NODE_STATUS, NODE_LABELS, CREATE, GPUNODE_STATUS, NODE_LABELS]
    assert kube.annotations == {names.NODE_ANNOTATION_CAPACITY_CHANGED: gpunode.format_time(T0)}


def test_steady_state_is_two_writes_per_heartbeat(kube: FakeKube) -> None:
    r = reporter(kube, heartbeat_s=30, min_interval_s=5)
    r.tick(SPEC, status(T0), T0)
    kube.kinds()
    writes = 0
    for t in range(1, 121):  # two minutes, ticking every second, nothing changing
        r.tick(SPEC, status(T0 + t), T0 + t)
        writes += len(kube.kinds())
    assert writes == 8  # 4 heartbeats x (node status + GPUNode status); labels already right
    assert r.last_heartbeat == T0 + 120


def test_small_memory_drift_waits_for_the_heartbeat(kube: FakeKube) -> None:
    r = reporter(kube, memory_threshold_mib=256)
    r.tick(SPEC, status(T0), T0)
    kube.kinds()
    assert r.tick(SPEC, status(T0 + 10, used=255), T0 + 10) == []
    assert r.tick(SPEC, status(T0 + 11, used=256), T0 + 11) == ["status"]


def test_changes_are_rate_limited_then_written(kube: FakeKube) -> None:
    r = reporter(kube, min_interval_s=5)
    r.tick(SPEC, status(T0), T0)
    kube.kinds()
    assert r.tick(SPEC, status(T0 + 1, pids=(7,)), T0 + 1) == []  # too soon after the last write
    assert r.tick(SPEC, status(T0 + 4.9, pids=(7, 8)), T0 + 4.9) == []
    assert r.tick(SPEC, status(T0 + 5, pids=(7, 8)), T0 + 5) == ["status"]
    body = kube.requests[-1].body["status"]
    assert [p["pid"] for p in body["gpus"][0]["processes"]] == [7, 8]


def test_health_change_rewrites_resources_and_status(kube: FakeKube) -> None:
    r = reporter(kube)
    r.tick(SPEC, status(T0), T0)
    kube.kinds()
    assert r.tick(SPEC, status(T0 + 6, healthy=False), T0 + 6) == ["node", "status"]
    node_patch = kube.requests[0]
    assert node_patch.body["status"]["capacity"] == {
        "gpupack.io/gpu-milli": "1000",
        "gpupack.io/gpu-memory-mib": "15109",
    }


def test_labels_are_rewritten_when_the_node_lost_them(kube: FakeKube) -> None:
    r = reporter(kube)
    r.tick(SPEC, status(T0), T0)
    kube.labels.clear()  # node object re-created
    kube.kinds()
    r.tick(SPEC, status(T0 + 30), T0 + 30)
    assert NODE_LABELS in kube.kinds()


def test_spec_change_is_patched(kube: FakeKube) -> None:
    r = reporter(kube)
    r.tick(SPEC, status(T0), T0)
    kube.kinds()
    mig = SPEC.model_copy(
        update={"gpus": (SPEC.gpus[0].model_copy(update={"mps_capable": True}), SPEC.gpus[1])}
    )
    assert r.tick(mig, status(T0 + 1), T0 + 1) == ["spec"]
    assert kube.requests[-1].body == {"spec": mig.wire()}


def test_existing_gpunode_after_restart_is_patched_not_recreated(kube: FakeKube) -> None:
    kube.fail[("POST", "/apis/gpupack.io/v1alpha1/gpunodes")] = KubeError(409, "AlreadyExists", "exists")
    r = reporter(kube)
    assert r.tick(SPEC, status(T0), T0) == ["node", "spec", "status", "node_capacity"]
    assert [k for k in kube.kinds() if "gpunodes" in k] == [CREATE, SPEC_PATCH, GPUNODE_STATUS]


def test_missing_crd_is_retried_after_min_interval_not_every_tick(kube: FakeKube) -> None:
    kube.fail[("POST", "/apis/gpupack.io/v1alpha1/gpunodes")] = KubeError(
        404, "NotFound", "the server could not find"
    )
    r = reporter(kube, min_interval_s=5)
    assert r.tick(SPEC, status(T0), T0) == ["node"]
    kube.kinds()
    for t in (1, 2, 3, 4):
        assert r.tick(SPEC, status(T0 + t), T0 + t) == []
    assert kube.kinds() == []
    del kube.fail[("POST", "/apis/gpupack.io/v1alpha1/gpunodes")]
    assert r.tick(SPEC, status(T0 + 5), T0 + 5) == ["spec", "status", "node_capacity"]


def test_deleted_gpunode_is_recreated_with_status(kube: FakeKube) -> None:
    r = reporter(kube)
    r.tick(SPEC, status(T0), T0)
    path = "/apis/gpupack.io/v1alpha1/gpunodes/n1/status"
    kube.fail[("PATCH", path)] = KubeError(404, "NotFound", "gone")
    assert "status" not in r.tick(SPEC, status(T0 + 30), T0 + 30)
    del kube.fail[("PATCH", path)]
    assert r.tick(SPEC, status(T0 + 35), T0 + 35) == ["spec", "status", "node_capacity"]


def test_status_write_failure_keeps_the_old_heartbeat(kube: FakeKube) -> None:
    r = reporter(kube)
    r.tick(SPEC, status(T0), T0)
    kube.fail[("PATCH", "/apis/gpupack.io/v1alpha1/gpunodes/n1/status")] = KubeError(
        0, "Unreachable", "refused"
    )
    r.tick(SPEC, status(T0 + 30), T0 + 30)
    assert r.last_heartbeat == T0


@pytest.mark.parametrize(
    ("new", "why"),
    [
        (status(T0, used=300), "GPU 0 memory"),
        (status(T0, healthy=False), "GPU 1 health"),
        (status(T0, pids=(5,)), "GPU 0 processes"),
        (status(T0).model_copy(update={"mps": MpsStatus(state="running", isolation="mps")}), "MPS"),
        (status(T0).model_copy(update={"env_device_selection": "disabled"}), "node"),
        (status(T0).model_copy(update={"gpus": status(T0).gpus[:1]}), "GPU count"),
        (status(T0 + 999, used=100), ""),
    ],
)
def test_significant_change(new: GPUNodeStatus, why: str) -> None:
    assert significant_change(status(T0), new, 256) == why
    assert significant_change(None, new, 256) == "first status"


# --- scheduler nudge: pods the extender turned down are retried only on a Node event ---


def _gpu(index: int, healthy: bool = True, used: int | None = 0) -> GpuStatus:
    return GpuStatus(uuid=f"GPU-{index}", index=index, healthy=healthy, memory_used_mib=used)


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        pytest.param(None, (_gpu(0),), "agent started", id="first-status"),
        pytest.param(
            (_gpu(0, used=9000),), (_gpu(0, used=8744),), "GPU 0 memory freed", id="freed-at-threshold"
        ),
        pytest.param((_gpu(0, used=9000),), (_gpu(0, used=8745),), "", id="freed-below-threshold"),
        pytest.param((_gpu(0, used=100),), (_gpu(0, used=9000),), "", id="memory-taken"),
        pytest.param((_gpu(0, healthy=False),), (_gpu(0),), "GPU 0 healthy", id="gpu-recovered"),
        pytest.param((_gpu(0),), (_gpu(0, healthy=False),), "", id="gpu-lost"),
        pytest.param((_gpu(0, used=None),), (_gpu(0, used=0),), "", id="memory-unknown-before"),
    ],
)
def test_capacity_grew(old: tuple[GpuStatus, ...] | None, new: tuple[GpuStatus, ...], why: str) -> None:
    before = None if old is None else GPUNodeStatus(heartbeat_time=T0, gpus=old)
    after = GPUNodeStatus(heartbeat_time=T0 + 30, gpus=new)
    assert capacity_grew(before, after, threshold_mib=256, stale_after_s=90) == why


def test_capacity_grew_after_a_heartbeat_gap_longer_than_stale() -> None:
    old = GPUNodeStatus(heartbeat_time=T0, gpus=(_gpu(0),))
    assert capacity_grew(old, old.model_copy(update={"heartbeat_time": T0 + 90}), 256, 90) == ""
    assert (
        capacity_grew(old, old.model_copy(update={"heartbeat_time": T0 + 91}), 256, 90) == "heartbeat resumed"
    )


def test_freed_memory_bumps_the_node_annotation_once(kube: FakeKube) -> None:
    r = reporter(kube)
    r.tick(SPEC, status(T0, used=9000), T0)
    kube.kinds()
    assert "node_capacity" not in r.tick(SPEC, status(T0 + 30, used=9000), T0 + 30)  # plain heartbeat
    assert r.tick(SPEC, status(T0 + 40, used=100), T0 + 40) == ["status", "node_capacity"]
    assert kube.annotations[names.NODE_ANNOTATION_CAPACITY_CHANGED] == gpunode.format_time(T0 + 40)


def test_foreign_memory_counts_processes_of_no_gpupack_pod() -> None:
    from agent.nvml.base import ProcessInfo
    from agent.nvml.sample import GpuSample
    from agent.report.reporter import foreign_mib

    procs = (ProcessInfo(1, 4000), ProcessInfo(2, 3000), ProcessInfo(3, 900))
    g = GpuSample(0, "GPU-0", "Tesla V100", "V100M16", 16_384, memory_used_mib=8400, processes=procs)
    owners = {1: "gpupack-pod", 2: "other-plugin-pod", 3: ""}
    assert foreign_mib(g, owners, {"gpupack-pod"}) == 3900  # another plugin's pod and a host process
    assert foreign_mib(g, owners, {"gpupack-pod", "other-plugin-pod"}) == 900
    assert foreign_mib(replace(g, processes=(ProcessInfo(3, None),)), owners, ()) is None  # unreadable
    assert foreign_mib(replace(g, memory_used_mib=None), owners, ()) is None
    assert foreign_mib(replace(g, processes=()), owners, ()) == 0
