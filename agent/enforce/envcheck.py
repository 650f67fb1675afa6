"""The container-start check: the env a gpupack pod's container runs with, against its allocation (pure).

The kubelet fills the GPU container's env from the allocation annotations (DESIGN.md, "What the system
writes"); every other container of the pod gets NVIDIA_VISIBLE_DEVICES=void. A process whose env says
otherwise was started with other values than the kubelet gave (an entrypoint that exports its own, an
image that overrides them) and may use GPUs or limits it was not given. `mismatches` names each variable
that differs; the agent checks every new process of a gpupack pod once and raises a Warning Event.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core import allocenv, names
from app.core.pods import PodInfo


def parse_environ(raw: bytes) -> dict[str, str]:
    """/proc/<pid>/environ: NUL-separated NAME=value entries (the last of a repeated name wins, as getenv)."""
    out: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            out[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def mismatches(pod: PodInfo, container: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """Each variable of `env` (a process of `container`) that is not what the pod's allocation gives it,
    as "NAME='have' (allocation: 'want')"; empty when it matches or the pod has no allocation to compare."""
    if container != pod.gpu_container:
        have = env.get(names.ENV_NVIDIA_VISIBLE_DEVICES, "")
        return (
            () if have == names.NO_GPU else (_differs(names.ENV_NVIDIA_VISIBLE_DEVICES, have, names.NO_GPU),)
        )
    if pod.allocation is None:
        return ()
    want = pod.allocation.to_annotations()
    out = []
    # Each variable read from the allocation: those every GPU container has, and the others where present
    # (the MPS and burstable ones depend on the request).
    for var in allocenv.ANY_GPU_ENV:
        if not var.annotation or (var.name not in env and not var.always):
            continue
        have = env.get(var.name, "")
        if have != want.get(var.annotation, ""):
            out.append(_differs(var.name, have, want.get(var.annotation, "")))
    return tuple(out)


def _differs(var: str, have: str, want: str) -> str:
    return f"{var}={have!r} (allocation: {want!r})"
