"""The env a pod's GPU container gets from its allocation: one table, read three ways (pure).

The webhook writes it into the pod as fieldRefs to the allocation annotations (the kubelet resolves them at
start, once the extender has written them at bind); the node side sets the same variables again, as values
read from the same annotations, when the container is created (a spec edited after admission cannot change
them); the agent's check compares a running process's env with them. All three read `gpu_env` below, so a
variable added here reaches the pod, the node and the check together.

Both *_VISIBLE_DEVICES carry the GPU UUIDs: NVIDIA's toolkit renumbers the devices it exposes from 0, so a
host index in CUDA_VISIBLE_DEVICES would name the wrong GPU, while CUDA accepts UUIDs either way. A missing
annotation resolves to "", which both read as "no GPU" (fails closed).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core import names


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One variable of the GPU container: read from an allocation annotation, or (`annotation` "") a fixed
    `value`. `always`: every GPU container has it, whatever its request (a check may miss nothing else)."""

    name: str
    annotation: str = ""
    value: str = ""
    always: bool = False


def gpu_env(*, burstable: bool, mps: bool, pipe_dir: str = names.MPS_PIPE_DIRECTORY) -> tuple[EnvVar, ...]:
    """The GPU container's env for a request that is (or is not) burstable and an MPS client. A burstable
    pod (gpu-memory-limit) also gets its hard cap; its MPS pinned limit is that cap (the allocation writes it
    so), its memory limit the request. `pipe_dir`: where the container finds the pod's MPS directory."""
    env = [
        EnvVar(names.ENV_NVIDIA_VISIBLE_DEVICES, names.ALLOC_GPU_UUIDS, always=True),
        EnvVar(names.ENV_CUDA_VISIBLE_DEVICES, names.ALLOC_GPU_UUIDS, always=True),
        EnvVar(names.ENV_MEMORY_LIMIT_MIB, names.ALLOC_MEMORY_LIMIT_MIB),
    ]
    if burstable:
        env.append(EnvVar(names.ENV_MEMORY_HARD_LIMIT_MIB, names.ALLOC_MEMORY_HARD_LIMIT_MIB))
    if mps:
        # Without MPS these would be inert, and without the pipe directory the client reaches no daemon.
        env += [
            EnvVar(names.ENV_MPS_THREAD_PERCENTAGE, names.ALLOC_THREAD_PERCENTAGE),
            EnvVar(names.ENV_MPS_MEMORY_LIMIT, names.ALLOC_MPS_MEMORY_LIMIT),
            EnvVar(names.ENV_MPS_PIPE_DIRECTORY, value=pipe_dir),
        ]
    return tuple(env)


# Every variable any GPU container may have from its allocation (what a check of a running process reads).
ANY_GPU_ENV = gpu_env(burstable=True, mps=True)
