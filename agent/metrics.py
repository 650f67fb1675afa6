"""The node agent's Prometheus series (gpupack_agent_*), served only by the agent's /metrics.

Label values come from the agent's own enums (verify.Kind, NvmlCode), so there is one list of each.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Histogram

from agent.enforce.verify import Kind
from agent.enforce.watchdog import Rule
from agent.nvml.base import NvmlCode
from app.service.metrics import component_registry, counter, gauge, precreate


class AgentWrite(StrEnum):
    """Kubernetes API writes the node agent makes."""

    NODE_STATUS = "node_status"  # extended resources in node status (re-asserted every heartbeat)
    NODE_LABELS = "node_labels"
    NODE_CAPACITY = "node_capacity"  # annotation that makes kube-scheduler retry pods the extender refused
    CREATE = "create"  # the GPUNode object
    SPEC = "spec"
    STATUS = "status"
    EVENT = "event"  # a verification violation on a pod
    EVICTION = "eviction"


class AgentWriteResult(StrEnum):
    OK = "ok"
    CONFLICT = "conflict"  # GPUNode already existed at create (agent restart): patched instead
    ERROR = "error"


class EnvCheck(StrEnum):
    """Outcome of the container-start check of one process of a gpupack pod (agent.enforce.envcheck)."""

    OK = "ok"
    MISMATCH = "mismatch"


class Question(StrEnum):
    """What the RuntimeClass handler asked the agent (agent.runtime.nodeside.parse_message)."""

    CREATE = "create"  # a container's create: its grant (one apiserver read) and MPS directory
    START = "start"  # the createRuntime hook: per-cgroup limits set before the first process
    STOP = "stop"  # a running container's stop: its MPS clients drained first
    DELETE = "delete"  # the container's delete: what the node set up for it goes
    MALFORMED = "malformed"  # a line the agent could not read (refused with the reason)


class DrainOutcome(StrEnum):
    """What the drain before a stop of an MPS container did (agent.mpsdaemon.drain)."""

    DRAINED = "drained"  # its clients were ended through the daemon before the signal
    NO_CLIENTS = "no_clients"  # none of its processes was an MPS client
    INCOMPLETE = "incomplete"  # the daemon did not end them in time, or did not answer: stopped anyway
    OFF = "off"  # draining turned off (--mps-drain-timeout 0)


_GPU = ("gpu", "uuid")  # the NVML index and UUID (bounded by the node's GPUs); Prometheus adds the node
_POD = ("namespace", "pod", "gpu")  # pods on this node only, removed when the pod's processes go

GPU_MEMORY_USED_MIB = gauge(
    "gpupack_agent_gpu_memory_used_mib", "GPU memory in use, by NVML, whoever uses it.", *_GPU
)
GPU_MEMORY_TOTAL_MIB = gauge("gpupack_agent_gpu_memory_total_mib", "GPU memory size.", *_GPU)
GPU_UTILIZATION_RATIO = gauge(
    "gpupack_agent_gpu_utilization_ratio", "Share of time a kernel ran (NVML sample period).", *_GPU
)
GPU_HEALTHY = gauge("gpupack_agent_gpu_healthy", "1 if the GPU is healthy, else 0.", *_GPU)
GPU_PROCESSES = gauge(
    "gpupack_agent_gpu_processes", "Compute processes on the GPU, by owner (pod or foreign).", *_GPU, "owner"
)
GPU_MEMORY_BORROWED_MIB = gauge(
    "gpupack_agent_gpu_memory_borrowed_mib",
    "GPU memory gpupack pods use above their requests (burstable pods up to their limits), summed per GPU.",
    *_GPU,
)
POD_MEMORY_USED_MIB = gauge(
    "gpupack_agent_pod_memory_used_mib", "GPU memory used by a gpupack pod's processes.", *_POD
)
POD_MEMORY_LIMIT_MIB = gauge(
    "gpupack_agent_pod_memory_limit_mib", "The pod's allocated memory-limit-mib on that GPU.", *_POD
)
HEARTBEAT_AGE_SECONDS = gauge(
    "gpupack_agent_heartbeat_age_seconds",
    "Seconds since the GPUNode status was last written (computed at scrape).",
)
MPS_UP = gauge("gpupack_agent_mps_up", "1 while the MPS control daemon answers, else 0.")
NVML_ERRORS = counter(
    "gpupack_agent_nvml_errors_total", "NVML calls that failed, by return code.", code=NvmlCode
)
WRITES = counter(
    "gpupack_agent_kube_writes_total",
    "Kubernetes API writes by the agent, by kind and result.",
    kind=AgentWrite,
    result=AgentWriteResult,
)
VIOLATIONS = counter(
    "gpupack_agent_violations_total", "Allocation violations found (once per pod, kind and GPU).", kind=Kind
)

ENV_CHECKS = counter(
    "gpupack_agent_env_checks_total",
    "Processes of gpupack pods whose GPU env was checked against the allocation at start, by result.",
    result=EnvCheck,
)

MPS_STOP_DRAINS = counter(
    "gpupack_agent_mps_stop_drains_total",
    "Stops of MPS containers seen by the runtime handler, by what ending their clients through the MPS "
    "daemon first did.",
    outcome=DrainOutcome,
)

WATCHDOG_ENDED = counter(
    "gpupack_agent_watchdog_ended_total",
    "Processes on shared GPUs the watchdog ended (SIGKILL, MPS clients through the daemon first), by rule.",
    rule=Rule,
)
# From the process's start to the signal: a sampling interval (5 s) plus the time to the next cycle is the
# usual figure; the upper buckets catch processes the watchdog could not end at once.
WATCHDOG_RAN_SECONDS = Histogram(
    "gpupack_agent_watchdog_process_runtime_seconds",
    "How long each process the watchdog ended had run (its start to the signal).",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=None,
)

# The agent's answer to one question of the RuntimeClass handler, from the line read to the answer ready:
# it is part of every GPU container's start and stop, so the buckets are sized in milliseconds up to the
# handler's own timeout (10 s), where the handler gives up and fails the create.
NODE_ANSWER_SECONDS = Histogram(
    "gpupack_agent_node_answer_seconds",
    "How long the agent took to answer each question of the RuntimeClass handler, by question.",
    ["question"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=None,
)
precreate(NODE_ANSWER_SECONDS, Question)
# One agent cycle (NVML readings, the GPUNode, the pod listing, the watchdog): tens of milliseconds on a
# quiet node; the upper buckets reach past the sampling interval (5 s), where cycles start to fall behind.
CYCLE_SECONDS = Histogram(
    "gpupack_agent_cycle_seconds",
    "How long each agent cycle took (its wall time), and, as the sum, how much of the time cycles ran.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=None,
)

COLLECTORS = (
    GPU_MEMORY_USED_MIB, GPU_MEMORY_TOTAL_MIB, GPU_UTILIZATION_RATIO, GPU_HEALTHY, GPU_PROCESSES,
    GPU_MEMORY_BORROWED_MIB,
    POD_MEMORY_USED_MIB, POD_MEMORY_LIMIT_MIB, HEARTBEAT_AGE_SECONDS, MPS_UP, NVML_ERRORS, WRITES, VIOLATIONS,
    ENV_CHECKS, MPS_STOP_DRAINS, WATCHDOG_ENDED, WATCHDOG_RAN_SECONDS, NODE_ANSWER_SECONDS, CYCLE_SECONDS,
)  # fmt: skip


def registry() -> CollectorRegistry:
    """A registry of the agent's series (and the process's runtime ones) only."""
    return component_registry(*COLLECTORS)
