"""agent.enforce.memlimits: the container's cgroup from its cgroupsPath, its limits, and whether a node can
(pure)."""

from __future__ import annotations

import pytest

from agent.enforce import memlimits
from agent.enforce.memlimits import Capability, Limits
from app.core.model import Allocation
from app.core.request import GpuRequest

UID = "0b7e6a3c-1111-2222-3333-444455556666"
CID = "4f" * 32


@pytest.mark.parametrize(
    ("path", "leaf"),
    [
        # cgroupfs driver: the path itself
        (f"/kubepods/besteffort/pod{UID}/{CID}", f"/kubepods/besteffort/pod{UID}/{CID}"),
        (f"/kubepods/pod{UID}/{CID}", f"/kubepods/pod{UID}/{CID}"),
        # systemd driver: slice:prefix:name, the slice expanded into its parents
        (
            f"kubepods-burstable-pod{UID.replace('-', '_')}.slice:cri-containerd:{CID}",
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"
            f"/cri-containerd-{CID}.scope",
        ),
        ("kubepods.slice:crio:abc", "/kubepods.slice/crio-abc.scope"),
        ("-.slice::abc", "/abc.scope"),
        (":docker:abc", "/system.slice/docker-abc.scope"),
        ("machine.slice::my.slice", "/my.slice"),
    ],
)
def test_the_leaf_is_found_for_both_cgroup_drivers(path: str, leaf: str) -> None:
    assert memlimits.leaf(path) == leaf


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/",
        "relative/path",
        "/a/../b",
        "a-.slice:p:n",
        "kubepods:p:n",
        "x.slice:p",
        "a.slice:p:",
        "a.slice:p:n/x",
    ],
)
def test_a_cgroups_path_that_names_no_leaf_is_refused(path: str) -> None:
    assert memlimits.leaf(path) is None


def request(limit: int | None) -> GpuRequest:
    return GpuRequest(container="main", count=1, milli=None, memory_mib=4096, memory_limit_mib=limit)


def test_hard_is_the_pods_cap_as_allocated_and_soft_its_share() -> None:
    # KAI's gpu-fraction.limit: no MiB in the request, the cap made at bind on the GPU the pod got
    kai = Allocation("n", (0,), ("GPU-a",), milli=100, memory_mib=4096, hard_limit_mib=6144)
    assert memlimits.limits_of(request(None), kai) == Limits(soft_mib=4096, hard_mib=6144)
    plain = Allocation("n", (0,), ("GPU-a",), milli=100, memory_mib=4096)
    assert memlimits.limits_of(request(8192), plain) == Limits(4096, 8192)  # a cap not written at bind
    assert memlimits.limits_of(request(None), plain) == Limits(4096, 4096)  # no burst: the share is the cap
    assert Limits(4096, 8192).hard_bytes == 8192 << 20


MOUNTS_V2 = "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNTS_HYBRID = (
    "25 1 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n"
    "41 25 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "42 25 0:39 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
)
MOUNTS_V1 = "42 25 0:39 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"


def test_where_cgroup_v2_is_mounted() -> None:
    assert memlimits.cgroup2_mount(MOUNTS_V2) == "/sys/fs/cgroup"
    assert memlimits.cgroup2_mount(MOUNTS_HYBRID) == "/sys/fs/cgroup/unified"
    assert memlimits.cgroup2_mount(MOUNTS_V1) == ""


@pytest.mark.parametrize(
    ("driver", "bound", "mountinfo", "simulated", "expect"),
    [
        ("615.25", True, MOUNTS_V2, False, Capability(True, "", "/sys/fs/cgroup")),
        ("550.54.15", True, MOUNTS_V2, False, "older than r615"),
        ("615.25", False, MOUNTS_V2, False, "nvidia-ml-py < 13.615"),
        ("615.25", True, MOUNTS_V1, False, "cgroup v1 only"),
        ("615.25", True, MOUNTS_HYBRID, False, "a hybrid node"),
        ("615.25", True, MOUNTS_HYBRID, True, Capability(True, "", "/sys/fs/cgroup/unified")),
        ("", True, MOUNTS_V2, False, "driver ? is older"),
    ],
)
def test_a_node_can_carry_limits_only_with_r615_the_binding_and_cgroup_v2(
    driver: str, bound: bool, mountinfo: str, simulated: bool, expect: Capability | str
) -> None:
    got = memlimits.capability(
        driver, memlimits.host_capability(bound, memlimits.cgroup2_mount(mountinfo), simulated)
    )
    if isinstance(expect, Capability):
        assert got == expect
    else:
        assert not got.available and expect in got.reason
    assert memlimits.per_cgroup_memory_limits(driver, bound, mountinfo, simulated) == got.available


def test_the_v2_entry_of_proc_cgroup() -> None:
    assert memlimits.v2_line("12:cpu:/x\n0::/kubepods/pod1/abc\n") == "/kubepods/pod1/abc"
    assert memlimits.v2_line("12:cpu:/x\n") is None


def test_namespace_names_follow_mps_v3_rules() -> None:
    name = memlimits.namespace_name(CID)
    assert name == "c_" + CID[:24]
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_")
    assert len(f"/tmp/nvidia-mps/gpupack/{name}/control") < 108  # a unix socket path's limit
    assert memlimits.namespace_name("AB-cd") == "c_ab_cd"
