"""Every name gpupack shares with Kubernetes: annotation keys, labels, resources, env vars, the CRD."""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "gpupack.io"

# --- what the user writes (pod annotations; KAI/Run:ai compatible names) ---
GPU_FRACTION: Final = "gpu-fraction"
GPU_MEMORY: Final = "gpu-memory"
GPU_MEMORY_LIMIT: Final = f"{DOMAIN}/gpu-memory-limit"  # per-GPU hard cap above the request (burstable)
GPU_FRACTION_NUM_DEVICES: Final = "gpu-fraction-num-devices"
GPU_FRACTION_CONTAINER_NAME: Final = "gpu-fraction-container-name"
GPU_MODEL: Final = f"{DOMAIN}/gpu-model"
ISOLATION: Final = f"{DOMAIN}/isolation"
# The least GPU memory enforcement the pod accepts (app.core.isolation.MemoryEnforcement; KAI has no such
# name).
MEMORY_ENFORCEMENT: Final = f"{DOMAIN}/memory-enforcement"
MIG_PROFILE: Final = f"{DOMAIN}/mig-profile"  # a whole MIG device of this profile (e.g. "1g.10gb")
MOVABLE: Final = f"{DOMAIN}/movable"  # "false": `gpupack repack` never evicts the pod
# KAI-Scheduler's NvFractions names (app.core.nvfractions reads them as gpupack's request; never written):
# nvidia.com/container.<container>.gpu-memory.request|limit and the compute mode, which KAI's docs spell
# two ways: per container (the gpu-sharing operator) and per pod (KAI's own docs).
KAI_CONTAINER_PREFIX: Final = "nvidia.com/container."
KAI_MEMORY_REQUEST: Final = "gpu-memory.request"  # after "<prefix><container>."
KAI_MEMORY_LIMIT: Final = "gpu-memory.limit"
KAI_COMPUTE_MODE: Final = "gpu-compute.mode"
KAI_POD_COMPUTE_MODE: Final = "kai.scheduler/gpu-compute-sharing-mode"
# KAI-Scheduler 0.18's limits above the request (app.core.request reads them; never written): the share of
# each GPU's memory a gpu-fraction pod may burst to, per pod or per container, and a gpu-memory pod's memory
# limit (a quantity with a unit).
KAI_FRACTION_LIMIT: Final = "gpu-fraction.limit"
KAI_GPU_MEMORY_LIMIT: Final = "gpu-memory.limit"
KAI_PORTION_PREFIX: Final = "kai.scheduler/container."
KAI_PORTION_LIMIT: Final = "gpu-memory.portion.limit"  # after "<KAI_PORTION_PREFIX><container>."

# --- the allocation, written by the extender at bind: the single source of truth ---
ALLOC_NODE: Final = f"{DOMAIN}/node"
ALLOC_GPU_UUIDS: Final = f"{DOMAIN}/gpu-uuids"
ALLOC_GPU_INDEXES: Final = f"{DOMAIN}/gpu-indexes"
ALLOC_GPU_MILLI: Final = f"{DOMAIN}/gpu-milli"
ALLOC_MEMORY_LIMIT_MIB: Final = f"{DOMAIN}/memory-limit-mib"
ALLOC_THREAD_PERCENTAGE: Final = f"{DOMAIN}/thread-percentage"
ALLOC_MPS_MEMORY_LIMIT: Final = f"{DOMAIN}/mps-memory-limit"
ALLOC_MEMORY_HARD_LIMIT_MIB: Final = f"{DOMAIN}/memory-hard-limit-mib"  # burstable pods only: the cap per GPU
ALLOCATION_ANNOTATIONS: Final = (
    ALLOC_NODE,
    ALLOC_GPU_UUIDS,
    ALLOC_GPU_INDEXES,
    ALLOC_GPU_MILLI,
    ALLOC_MEMORY_LIMIT_MIB,
    ALLOC_THREAD_PERCENTAGE,
    ALLOC_MPS_MEMORY_LIMIT,
    ALLOC_MEMORY_HARD_LIMIT_MIB,
)

# --- labels ---
LABEL_MANAGED: Final = f"{DOMAIN}/managed"  # pod label set by the webhook on pods it gave a GPU share
NODE_LABEL_ENABLED: Final = f"{DOMAIN}/enabled"
NODE_LABEL_GPU_MODEL: Final = f"{DOMAIN}/gpu-model"
NODE_LABEL_GPU_MEMORY_MAX_MIB: Final = f"{DOMAIN}/gpu-memory-max-mib"
# Node annotation the agent bumps when its node can take more than before. kube-scheduler does not watch
# GPUNodes, so without a Node event a pod the extender turned down would wait for an unrelated event.
NODE_ANNOTATION_CAPACITY_CHANGED: Final = f"{DOMAIN}/capacity-changed-at"

# --- extended resources (node status by the agent; container requests by the webhook) ---
RESOURCE_GPU_MILLI: Final = f"{DOMAIN}/gpu-milli"
RESOURCE_GPU_MEMORY_MIB: Final = f"{DOMAIN}/gpu-memory-mib"
RESOURCE_PREFIX: Final = f"{DOMAIN}/"  # every extended resource of ours starts with it
# Quota-only resources (app.core.quota): the webhook charges every GPU request to both; no node advertises
# them, kube-scheduler ignores them (ignoredByScheduler) and a namespace's ResourceQuota caps them.
RESOURCE_QUOTA_GPU_MILLI: Final = f"{DOMAIN}/quota-gpu-milli"
RESOURCE_QUOTA_GPU_MEMORY_MIB: Final = f"{DOMAIN}/quota-gpu-memory-mib"

# --- env vars the webhook adds to the GPU container ---
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
# Its value in every container but the GPU container: the NVIDIA container toolkit then exposes no GPU,
# even where the image defaults to "all".
NO_GPU: Final = "void"
ENV_CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
ENV_MPS_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEMORY_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MEMORY_LIMIT_MIB: Final = "GPUPACK_MEMORY_LIMIT_MIB"
ENV_MEMORY_HARD_LIMIT_MIB: Final = "GPUPACK_MEMORY_HARD_LIMIT_MIB"  # burstable pods only
MPS_PIPE_DIRECTORY: Final = "/tmp/nvidia-mps"  # path inside the container and default host dir

# --- the GPUNode custom resource ---
GPUNODE_GROUP: Final = DOMAIN
GPUNODE_VERSION: Final = "v1alpha1"
GPUNODE_PLURAL: Final = "gpunodes"
GPUNODE_KIND: Final = "GPUNode"
