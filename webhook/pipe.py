"""Where the GPU container reaches the node's MPS pipe directory: the user's own mount, or ours (pure).

A pod written for KAI-Scheduler's MPS mode already mounts the host's `/tmp/nvidia-mps` itself, under any
volume name and at any path. Adding a second mount of it would make the pod invalid (`mountPath must be
unique`) or mount the pipe twice, so such a mount is reused and CUDA_MPS_PIPE_DIRECTORY points at it.
A user mount of some *other* volume at names.MPS_PIPE_DIRECTORY is refused.

Where the container has no mount of its own, what the webhook writes (`writes`) depends on the node side:
- with gpupack's RuntimeClass (chart `nodeSide.enabled`, the default): only `spec.runtimeClassName`; the
  handler on the node mounts the pod's *own* MPS directory at names.MPS_PIPE_DIRECTORY when the container
  is created (docs/node-side.md). No hostPath in the pod, so the share passes Pod Security `baseline`;
- without it (legacy): a hostPath volume of the whole pipe directory (under a name no volume of the pod
  has yet) and a mount at names.MPS_PIPE_DIRECTORY; the pod then needs a `privileged` namespace.

`plan` reads the pod's view; `writes` says what the plan needs written, and `ops` is all of it as patch ops.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Final

from app.core import names
from app.core.errors import RequestError
from app.core.podview import ContainerView, PodView

VOLUME: Final = "gpupack-mps-pipe"  # the name of the volume we add, or the stem of a free one

Op = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PipeMount:
    """The GPU container's mount of the pipe directory, and what the patch must add to get it."""

    volume: str  # the name of the hostPath volume
    path: str  # the mount path in the container: the value of CUDA_MPS_PIPE_DIRECTORY
    add_volume: bool  # the pod has no volume of the host dir yet
    add_mount: bool  # the GPU container does not mount it yet


@dataclass(frozen=True, slots=True)
class Writes:
    """What the patch writes for the GPU container's MPS pipe directory."""

    pipe_dir: str  # the value of CUDA_MPS_PIPE_DIRECTORY in the container
    runtime_class: str | None = None  # spec.runtimeClassName: the node side adds the pod's MPS directory
    volume: dict[str, Any] | None = None  # a hostPath volume to add to the pod (legacy)
    mount: dict[str, Any] | None = None  # a volumeMount to add to the container (legacy)

    @property
    def host_path(self) -> bool:
        """The pod reaches the pipe directory through a hostPath volume (its own, or one we add)."""
        return self.runtime_class is None


def writes(planned: PipeMount, host_dir: str, runtime_class: str | None) -> Writes:
    """What to write for `planned`: the user's own hostPath mount is kept as it is; otherwise the RuntimeClass
    when `runtime_class` names one, else (legacy) our hostPath volume and mount."""
    if not planned.add_mount:
        return Writes(planned.path)
    if runtime_class:
        return Writes(names.MPS_PIPE_DIRECTORY, runtime_class=runtime_class)
    volume = {"name": planned.volume, "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}
    mount = {"name": planned.volume, "mountPath": planned.path}
    return Writes(planned.path, volume=volume if planned.add_volume else None, mount=mount)


def runtime_class_clash(pod: PodView, wrote: Writes) -> RequestError | None:
    """A runtimeClassName of the pod's own where the share needs gpupack's: refused, never overwritten."""
    have = pod.runtime_class_name
    if wrote.runtime_class is None or have in (None, "", wrote.runtime_class):
        return None
    return RequestError(
        "spec.runtimeClassName",
        str(have),
        f"must be {wrote.runtime_class!r} or unset for an MPS share: gpupack's RuntimeClass gives the GPU "
        "container its pod's own MPS directory at the node, and its handler runs the node's configured "
        "runtime (NVIDIA's included, see docs/node-side.md); remove it, or annotate "
        f"{names.ISOLATION}: none",
    )


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
    mounts = container.mounts
    for mount in mounts:
        if mount.volume in volumes and mount.whole_dir:
            return PipeMount(mount.volume, mount.path, add_volume=False, add_mount=False)
    for mount in mounts:
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


def ops(wrote: Writes, pod: PodView, container: ContainerView) -> tuple[list[Op], list[Op]]:
    """What `wrote` puts in the patch: (the container's mount op, the pod's volume and runtimeClassName
    ops), each empty when not needed."""
    mount_ops: list[Op] = []
    if wrote.mount is not None:
        # Mounts are not keyed by name (one volume may be mounted twice), so append as planned.
        path = f"{container.pointer}/volumeMounts"
        mount_ops.append(
            {"op": "add", "path": f"{path}/-", "value": wrote.mount}
            if container.mounts
            else {"op": "add", "path": path, "value": [wrote.mount]}
        )
    pod_ops: list[Op] = []
    if wrote.volume is not None:
        pod_ops.append(
            {"op": "add", "path": "/spec/volumes/-", "value": wrote.volume}
            if pod.volumes
            else {"op": "add", "path": "/spec/volumes", "value": [wrote.volume]}
        )
    if wrote.runtime_class and pod.runtime_class_name != wrote.runtime_class:
        pod_ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": wrote.runtime_class})
    return mount_ops, pod_ops
