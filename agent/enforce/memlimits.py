"""Per-cgroup GPU memory limits at the node: which cgroup, which limits, and whether the node can (pure).

NVIDIA's MPS v3 memory partitioning (driver r615+) enforces a soft limit (guaranteed share) and a hard limit
(allocations past it fail with CUDA_ERROR_OUT_OF_MEMORY) per cgroup v2 directory, set through NVML
`nvmlDeviceSetMemoryLimits_v1` before the container's first allocation. gpupack sets them on the
container's own leaf cgroup, the only place where CUDA also reports the limit as the GPU's total
(docs/node-side.md, "Enforced memory"):

- `leaf(cgroups_path)`: the leaf below the cgroup v2 root from the OCI spec's `linux.cgroupsPath`, in the
  cgroupfs form (`/kubepods/burstable/pod<uid>/<id>`) or the systemd form (`<slice>:<prefix>:<name>`);
- `limits_of(request, allocation)`: hard = the pod's cap as its allocation records it, else its share;
  soft = its share (its request);
- `capability(...)`: whether the node can carry per-cgroup limits at all, and why not. Helper for the
  agent's GPUNode report: `per_cgroup_memory_limits(driver_version, bound, mountinfo)`.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from agent.nvml.base import MEMORY_LIMITS_DRIVER_MAJOR
from app.core.model import Allocation
from app.core.request import GpuRequest

MIB = 1 << 20
V2_ROOT = "/sys/fs/cgroup"  # where NVIDIA requires the cgroup v2 hierarchy
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+")


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one container on each GPU of its allocation, MiB."""

    soft_mib: int
    hard_mib: int

    @property
    def soft_bytes(self) -> int:
        return self.soft_mib * MIB

    @property
    def hard_bytes(self) -> int:
        return self.hard_mib * MIB


def limits_of(request: GpuRequest, allocation: Allocation) -> Limits:
    """Hard = the pod's cap as its allocation records it (a burstable limit, KAI's fraction or portion
    limit: a fraction limit becomes MiB only on the GPU the pod was bound to), else the request's own
    limit (an allocation written without its cap), else its share; soft = its share (the request)."""
    share = allocation.memory_mib
    if allocation.hard_limit_mib is not None:
        hard = allocation.hard_limit_mib
    else:
        hard = request.memory_limit_mib if request.memory_limit_mib is not None else share
    return Limits(soft_mib=min(share, hard), hard_mib=hard)


def _slice_path(slice_name: str) -> str | None:
    """systemd's slice nesting: `a-b-c.slice` is /a.slice/a-b.slice/a-b-c.slice; `-.slice` is the root."""
    if slice_name in ("", "-.slice"):
        return ""
    if not slice_name.endswith(".slice") or not _UNIT.fullmatch(slice_name):
        return None
    stem = slice_name.removesuffix(".slice")
    if not stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        return None
    parts = stem.split("-")
    return "".join("/" + "-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def leaf(cgroups_path: str) -> str | None:
    """The container's cgroup below the v2 root (e.g. "/kubepods/besteffort/pod<uid>/<id>"), or None for a
    cgroupsPath this cannot place (relative, `..`, a malformed systemd triple)."""
    if cgroups_path.startswith("/"):  # cgroupfs driver: the path itself
        norm = posixpath.normpath(cgroups_path)
        if norm != cgroups_path.rstrip("/") or norm == "/" or "/../" in f"{norm}/":
            return None
        return norm
    parts = cgroups_path.split(":")
    if len(parts) != 3:
        return None
    slice_name, prefix, name = parts
    parent = _slice_path(slice_name or "system.slice")
    if parent is None or not name or not _UNIT.fullmatch(name) or (prefix and not _UNIT.fullmatch(prefix)):
        return None
    if name.endswith(".slice"):  # runc: a name that is a slice is the unit itself
        inner = _slice_path(name)
        return inner or None
    unit = f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
    return f"{parent}/{unit}"


def v2_line(proc_cgroup: str) -> str | None:
    """The `0::<path>` entry of a /proc/<pid>/cgroup file (the process's cgroup v2 directory), or None."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or None
    return None


def cgroup2_mount(mountinfo: str) -> str:
    """Where the cgroup v2 hierarchy is mounted (/proc/self/mountinfo), "" where it is not (a v1-only node).
    A hybrid node mounts it at /sys/fs/cgroup/unified."""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and tail.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return fields[4]
    return ""


@dataclass(frozen=True, slots=True)
class Capability:
    """Whether this node can carry per-cgroup GPU memory limits; `reason` says why not ("" when it can)."""

    available: bool
    reason: str = ""
    cgroup_root: str = ""  # the cgroup v2 root the limits are keyed under


def driver_supports(driver_version: str) -> bool:
    major = driver_version.split(".", maxsplit=1)[0]
    return major.isdigit() and int(major) >= MEMORY_LIMITS_DRIVER_MAJOR


def host_capability(bound: bool, mount: str, simulated: bool = False) -> Capability:
    """What the node itself must offer for per-cgroup limits, whatever its driver (see `capability`)."""
    if not bound:
        return Capability(
            False, "the NVML binding lacks nvmlDeviceSetMemoryLimits_v1 (nvidia-ml-py < 13.615)"
        )
    if not mount:
        return Capability(False, "no cgroup v2 hierarchy on this node (cgroup v1 only)")
    if mount != V2_ROOT and not simulated:
        return Capability(False, f"cgroup v2 is mounted at {mount}, not {V2_ROOT} (a hybrid node)")
    return Capability(True, "", mount)


def capability(driver_version: str, host: Capability) -> Capability:
    """Per-cgroup limits need driver r615+ on top of what the node offers (`host_capability`: an NVML binding
    with the calls, and cgroup v2 at /sys/fs/cgroup, NVIDIA's requirement; a simulated GPU also accepts a
    hybrid node's /sys/fs/cgroup/unified, the test bed: no real driver reads it)."""
    if not driver_supports(driver_version):
        return Capability(
            False, f"driver {driver_version or '?'} is older than r{MEMORY_LIMITS_DRIVER_MAJOR}"
        )
    return host


def per_cgroup_memory_limits(
    driver_version: str, bound: bool, mountinfo: str, simulated: bool = False
) -> bool:
    """The GPUNode fact "per-cgroup memory limits available" from the agent's NVML and the host's mounts."""
    return capability(driver_version, host_capability(bound, cgroup2_mount(mountinfo), simulated)).available


NAMESPACE_ID_CHARS = 24  # of the container ID: unique on a node, short enough for socket paths


def namespace_name(container_id: str) -> str:
    """The MPS v3 namespace of one container: lowercase letters, digits and `_` (at most 64 characters).

    Short: the namespace's control socket is `<pipe dir>/<server>/<namespace>/control`, and a unix socket path
    has at most 107 bytes; 24 characters of a container ID (96 bits) tell a node's containers apart."""
    clean = re.sub(r"[^a-z0-9_]", "_", container_id.lower())
    return f"c_{clean[:NAMESPACE_ID_CHARS]}"
