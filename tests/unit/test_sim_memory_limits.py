"""The simulated NVML's per-cgroup GPU memory limits follow NVIDIA's contract
(nvmlDevice{Get,Set}MemoryLimits_v1 and MPS v3 memory partitioning); the limiter sets, reads back and
clears them per container."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from agent.enforce.limiter import Limiter, Record
from agent.nvml.base import MEMORY_LIMIT_MAX, NvmlCode, NvmlError
from agent.simgpu.simlimits import Refused
from agent.simgpu.simulated import SimulatedNvml

MIB = 1 << 20
ROOT = "/sys/fs/cgroup"
POD = f"{ROOT}/kubepods/burstable/pod1"
LEAF = f"{POD}/c1"


def gpu_set(tmp_path: Path, driver: str = "615.25", **gpu: object) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"driver_version": driver, "gpus": [{"model": "A100-40GB", **gpu}]}))
    return path


def sim(
    tmp_path: Path, driver: str = "615.25", privileged: bool = True, state: bool = True, **gpu: object
) -> SimulatedNvml:
    s = SimulatedNvml(
        gpu_set(tmp_path, driver, **gpu),
        "n1",
        state_dir=tmp_path / "state" if state else None,
        privileged=privileged,
    )
    s.init()
    return s


def code(fn: object, *args: object) -> NvmlCode:
    with pytest.raises(NvmlError) as exc:
        fn(*args)  # type: ignore[operator]
    return exc.value.code


def test_set_then_get_reads_back_soft_hard_and_current_used(tmp_path: Path) -> None:
    s = sim(tmp_path)
    got = s.memory_limits(0, LEAF)
    assert (got.soft_bytes, got.hard_bytes, got.current_used_bytes) == (0, MEMORY_LIMIT_MAX, 0)  # unlimited
    s.set_memory_limits(0, LEAF, 4096 * MIB, 8192 * MIB)
    uuid = s.uuid(0)
    assert s.allocate(uuid, LEAF, "p1", 1000 * MIB) == 1000 * MIB
    got = s.memory_limits(0, LEAF)
    assert (got.soft_bytes, got.hard_bytes, got.current_used_bytes) == (4096 * MIB, 8192 * MIB, 1000 * MIB)
    # another process sharing the state directory (the allocator, the MPS daemon pod) sees the same driver
    other = SimulatedNvml(s.path, "n1", state_dir=tmp_path / "state", privileged=False)
    other.init()
    assert other.memory_limits(0, LEAF).hard_bytes == 8192 * MIB


def test_allocations_past_the_hard_limit_are_refused_and_freed_with_their_context(tmp_path: Path) -> None:
    s = sim(tmp_path)
    uuid = s.uuid(0)
    s.set_memory_limits(0, LEAF, 4096 * MIB, 8192 * MIB)
    assert s.allocate(uuid, LEAF, "p1", 4096 * MIB) == 4096 * MIB
    assert s.allocate(uuid, LEAF, "p2", 4096 * MIB) == 8192 * MIB  # up to the limit, over two processes
    refused = s.allocate(uuid, LEAF, "p1", 1)
    assert isinstance(refused, Refused) and refused.reason.startswith("CUDA_ERROR_OUT_OF_MEMORY: hard limit")
    s.limits.release(uuid, "p2")
    assert s.allocate(uuid, LEAF, "p1", 4096 * MIB) == 8192 * MIB
    # an unlimited cgroup is bounded by the GPU alone
    whole = s.allocate(uuid, f"{ROOT}/other", "p3", 40960 * MIB)
    assert isinstance(whole, Refused) and "the GPU has" in whole.reason


def test_a_child_cgroup_counts_against_its_nearest_limited_ancestor(tmp_path: Path) -> None:
    s = sim(tmp_path)
    uuid = s.uuid(0)
    s.set_memory_limits(0, POD, 0, 1024 * MIB)
    assert s.allocate(uuid, LEAF, "p1", 1024 * MIB) == 1024 * MIB
    assert isinstance(s.allocate(uuid, f"{POD}/c2", "p2", 1), Refused)
    assert s.memory_limits(0, POD).current_used_bytes == 1024 * MIB  # the pod's usage includes its leaves


def test_soft_zero_and_hard_max_clear_the_cgroup(tmp_path: Path) -> None:
    s = sim(tmp_path)
    s.set_memory_limits(0, LEAF, 4096 * MIB, 8192 * MIB)
    s.set_memory_limits(0, LEAF, 0, MEMORY_LIMIT_MAX)
    assert s.memory_limits(0, LEAF).cleared
    assert s.limits.limited(s.uuid(0)) == {}


@pytest.mark.parametrize(
    ("driver", "gpu", "expect"),
    [
        ("550.54.15", {}, NvmlCode.NOT_SUPPORTED),  # below r615
        ("614.99", {}, NvmlCode.NOT_SUPPORTED),
        ("615.25", {"mig": {"enabled": True, "devices": [{"profile": "1g.5gb"}]}}, NvmlCode.NOT_SUPPORTED),
    ],
)
def test_drivers_below_r615_and_mig_gpus_refuse_limits(
    tmp_path: Path, driver: str, gpu: dict[str, object], expect: NvmlCode
) -> None:
    s = sim(tmp_path, driver, **gpu)
    assert code(s.memory_limits, 0, LEAF) is expect
    assert code(s.set_memory_limits, 0, LEAF, 0, MIB) is expect


@pytest.mark.parametrize(
    "namespace", ["kubepods/c1", "/sys/fs/cgroup", "/sys/fs/cgroup/a/../b", "/elsewhere/c1", ""]
)
def test_a_namespace_that_is_no_cgroup_below_the_root_is_not_found(tmp_path: Path, namespace: str) -> None:
    assert code(sim(tmp_path).set_memory_limits, 0, namespace, 0, MIB) is NvmlCode.NOT_FOUND


def test_setting_needs_root_and_soft_at_most_hard(tmp_path: Path) -> None:
    assert code(sim(tmp_path, privileged=False).set_memory_limits, 0, LEAF, 0, MIB) is NvmlCode.NO_PERMISSION
    s = sim(tmp_path)
    assert code(s.set_memory_limits, 0, LEAF, 2 * MIB, MIB) is NvmlCode.INVALID_ARGUMENT
    assert code(s.set_memory_limits, 0, LEAF, -1, MIB) is NvmlCode.INVALID_ARGUMENT
    assert sim(tmp_path, privileged=False).memory_limits(0, LEAF).cleared  # reading needs no privilege


def test_a_hybrid_nodes_unified_root_is_accepted_only_where_configured(tmp_path: Path) -> None:
    s = SimulatedNvml(gpu_set(tmp_path), "n1", privileged=True, cgroup_root="/sys/fs/cgroup/unified")
    s.init()
    s.set_memory_limits(0, "/sys/fs/cgroup/unified/kubepods/c1", 0, MIB)
    assert code(s.set_memory_limits, 0, LEAF, 0, MIB) is NvmlCode.NOT_FOUND


def test_the_limiter_sets_reads_back_clears_and_sweeps(tmp_path: Path) -> None:
    s = sim(tmp_path)
    uuid = s.uuid(0)
    limiter = Limiter(lambda: s, tmp_path / "records")
    record = Record("c1", "pod-1", LEAF, (uuid,), 4096, 8192)
    assert limiter.apply(record) == ""
    assert s.limits.limited(uuid)[LEAF]["hard"] == 8192 * MIB
    assert limiter.read("c1") is not None  # kept on disk: a restarted agent still clears it
    cleared = Limiter(lambda: s, tmp_path / "records").clear("c1")  # as a restarted agent would
    assert cleared is not None and cleared.namespace == LEAF
    assert s.limits.limited(uuid) == {} and limiter.read("c1") is None
    # a GPU not on the node, or NVML refusing, fails the container and leaves nothing set
    assert "not on this node" in limiter.apply(Record("c2", "pod-1", LEAF, ("GPU-nope",), 1, 2))
    assert "NVML_ERROR_INVALID_ARGUMENT" in limiter.apply(Record("c3", "pod-1", LEAF, (uuid,), 9, 2))
    assert s.limits.limited(uuid) == {} and limiter.all() == []
    # the sweep clears containers of pods gone from the node, sparing young records
    assert limiter.apply(Record("c4", "pod-gone", LEAF, (uuid,), 1, 2)) == ""
    assert limiter.apply(Record("c5", "pod-here", f"{POD}/c5", (uuid,), 1, 2)) == ""
    assert limiter.sweep({"pod-here"}, older_than_s=60) == []
    swept = limiter.sweep({"pod-here"}, older_than_s=60, now=time.time() + 61)
    assert [r.container_id for r in swept] == ["c4"]
    assert list(s.limits.limited(uuid)) == [f"{POD}/c5"]


def test_the_limiter_waits_for_nvml(tmp_path: Path) -> None:
    limiter = Limiter(lambda: None, tmp_path / "records")
    assert "not initialised" in limiter.apply(Record("c1", "p", LEAF, ("GPU-a",), 1, 2))
