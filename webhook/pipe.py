"""Where the GPU container reaches the node's MPS pipe directory: the user's own mount, or ours (pure).

A pod written for KAI-Scheduler's MPS mode already mounts the host's `/tmp/nvidia-mps` itself, under any
volume name and at any path. Adding a second mount of it would make the pod invalid (`mountPath must be
unique`) or mount the pipe twice, so such a mount is reused and CUDA_MPS_PIPE_DIRECTORY points at it.
Only where the container has none do we add a volume (under a name no volume of the pod has yet) and a
mount at names.MPS_PIPE_DIRECTORY; a user mount of some *other* volume at that path is refused.

`plan` reads the pod's view; `ops` is all that the plan writes into the patch.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Final

from app import names
from app.errors import RequestError
from app.podview import ContainerView, PodView

VOLUME: Final = "gpupack-mps-pipe"  # the name of the volume we add, or the stem of a free one

Op = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PipeMount:
    """The GPU container's mount of the pipe directory, and what the patch must add to get it."""

    volume: str  # the name of the hostPath volume
    path: str  # the mount path in the container: the value of CUDA_MPS_PIPE_DIRECTORY
    add_volume: bool  # the pod has no volume of the host dir yet
    add_mount: bool  # the GPU container does not mount it yet


def _norm(path: str | None) -> str:
    return posixpath.normpath(path) if path else ""


def host_dir_volumes(pod: PodView, host_dir: str) -> tuple[str, ...]:
    """The names of the pod's hostPath volumes of `host_dir` (trailing slashes and `.` do not matter)."""
    return tuple(v.name for v in pod.volumes if v.name is not None and _norm(v.host_path) == _norm(host_dir))


def free_volume_name(pod: PodView) -> str:
    """VOLUME, or VOLUME-2, -3, ...: the first that no volume of the pod is called."""
    taken = {v.name for v in pod.volumes}
    name, n = VOLUME, 1
    while name in taken:
        n += 1
        name = f"{VOLUME}-{n}"
    return name


def plan(pod: PodView, container: ContainerView, host_dir: str) -> PipeMount | RequestError:
    """How `container` gets the pipe dir, or why it cannot without a clash."""
    volumes = host_dir_volumes(pod, host_dir)
    for mount in container.mounts:
        if mount.volume in volumes and mount.whole_dir:
            return PipeMount(mount.volume, mount.path, add_volume=False, add_mount=False)
    for mount in container.mounts:
        if _norm(mount.path) == _norm(names.MPS_PIPE_DIRECTORY):
            return RequestError(
                f"{container.where}.volumeMounts[{mount.volume}]",
                mount.path,
                f"is where gpupack mounts the node's MPS pipe directory (hostPath {host_dir}) for the GPU "
                f"share; make that volume a hostPath of {host_dir} (any name and path work: gpupack then "
                "uses your mount), mount it elsewhere, or annotate the pod gpupack.io/isolation: none",
            )
    if volumes:
        return PipeMount(volumes[0], names.MPS_PIPE_DIRECTORY, add_volume=False, add_mount=True)
    return PipeMount(free_volume_name(pod), names.MPS_PIPE_DIRECTORY, add_volume=True, add_mount=True)


def ops(
    planned: PipeMount, pod: PodView, container: ContainerView, host_dir: str
) -> tuple[list[Op], list[Op]]:
    """What the plan writes: (the container's mount op, the pod's volume op), each empty when not needed."""
    mount_ops: list[Op] = []
    if planned.add_mount:
        # Mounts are not keyed by name (one volume may be mounted twice), so append as planned.
        mount = {"name": planned.volume, "mountPath": planned.path}
        path = f"{container.pointer}/volumeMounts"
        mount_ops.append(
            {"op": "add", "path": f"{path}/-", "value": mount}
            if container.mounts
            else {"op": "add", "path": path, "value": [mount]}
        )
    volume_ops: list[Op] = []
    if planned.add_volume:
        volume = {"name": planned.volume, "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}
        volume_ops.append(
            {"op": "add", "path": "/spec/volumes/-", "value": volume}
            if pod.volumes
            else {"op": "add", "path": "/spec/volumes", "value": [volume]}
        )
    return mount_ops, volume_ops
