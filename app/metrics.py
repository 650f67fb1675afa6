"""Every gpupack_* Prometheus metric, defined once.

Naming: gpupack_<component>_<noun>_<unit|total> (https://prometheus.io/docs/practices/naming/).
Rules: outcome labels are Enums whose every value is created at import time, so failure series
exist at zero before the first failure; counters and histograms never carry pod names or UUIDs;
node/GPU labels appear only on gauges (bounded by cluster size), and cluster-state gauges are
computed at scrape time by a custom collector, not inside request handlers.
Each component edits only its own section below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Latency buckets in seconds, sized for sub-millisecond to tens-of-milliseconds handlers; the
# scheduler's extender timeout (5 s) is the last meaningful edge.
FAST_HANDLER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# --- webhook ---


class WebhookOutcome(StrEnum):
    """What one AdmissionReview ended as."""

    MUTATED = "mutated"  # a GPU pod, allowed (with a patch, or none when a reinvocation finds it done)
    SKIPPED = "skipped"  # not ours: no gpu-fraction/gpu-memory annotation, not a pod CREATE
    DENIED = "denied"  # a GPU pod whose annotations break a rule
    ERROR = "error"  # malformed review (4xx) or a webhook bug


WEBHOOK_REVIEWS = Counter(
    "gpupack_webhook_reviews_total", "AdmissionReviews answered, by outcome.", ["outcome"]
)
for _outcome in WebhookOutcome:
    WEBHOOK_REVIEWS.labels(_outcome.value)
# The apiserver's timeout for us is 5 s (timeoutSeconds); a review takes well under a millisecond.
WEBHOOK_REVIEW_SECONDS = Histogram(
    "gpupack_webhook_review_duration_seconds",
    "Time to answer one AdmissionReview, from parsed body to response.",
    buckets=FAST_HANDLER_BUCKETS,
)
WEBHOOK_CERT_RELOADS = Counter(
    "gpupack_webhook_cert_reloads_total",
    "Serving certificate reloads after the files changed, by result.",
    ["result"],
)
for _result in ("ok", "failed"):
    WEBHOOK_CERT_RELOADS.labels(_result)

# --- extender ---


class ExtenderVerb(StrEnum):
    FILTER = "filter"
    PRIORITIZE = "prioritize"
    BIND = "bind"


class BindOutcome(StrEnum):
    BOUND = "bound"
    CONFLICT = "conflict"  # the pod changed under us (409): the scheduler retries it
    NO_FIT = "no_fit"  # the chosen node no longer had room when bind ran
    ERROR = "error"


class PendingReason(StrEnum):
    """Why a gpupack pod is still unbound, by class (never the pod's name)."""

    WAITING = "waiting"  # not refused yet: queued, or in flight
    NO_FIT = "no_fit"  # no GPU with enough free share or memory
    MODEL = "model"  # no node has an acceptable GPU model
    UNSCHEDULABLE = "unschedulable"  # agent heartbeat stale, no GPUNode, no healthy GPU
    INVALID = "invalid"  # the pod's GPU request cannot be read


# Same millisecond-sized buckets as the other fast handlers: filter over thousands of nodes runs in
# milliseconds, and the scheduler's extender timeout (5 s) is the last edge worth telling apart.
EXTENDER_REQUEST_SECONDS = Histogram(
    "gpupack_extender_request_duration_seconds",
    "Time to answer one kube-scheduler extender call, by verb.",
    ["verb"],
    buckets=FAST_HANDLER_BUCKETS,
)
EXTENDER_BINDS = Counter("gpupack_extender_binds_total", "Bind calls by outcome.", ["outcome"])
for _ext_verb in ExtenderVerb:
    EXTENDER_REQUEST_SECONDS.labels(_ext_verb.value)
for _ext_outcome in BindOutcome:
    EXTENDER_BINDS.labels(_ext_outcome.value)


@dataclass(frozen=True, slots=True)
class GpuGauge:
    node: str
    gpu: int
    model: str
    milli: int  # allocated compute share
    memory_mib: int  # allocated memory
    pods: int
    mig_profile: str = ""  # set for a MIG device (taken whole: milli is 0 or 1000)
    parent: int | None = None  # a MIG device's GPU index


@dataclass(frozen=True, slots=True)
class ExtenderGauges:
    """Cluster-state numbers the collector exports; computed from the extender's cache at scrape time."""

    gpus: tuple[GpuGauge, ...] = ()
    packing_efficiency: float = 0.0  # allocated share on GPUs in use / GPUs in use
    fragmented_milli: int = 0  # free share on partly used GPUs too small for the typical request
    typical_milli: int = 0  # the request size fragmentation is measured against
    gpus_free: int = 0
    pending: Mapping[str, int] = field(default_factory=dict)  # PendingReason value -> pods
    leader: bool = False


class ExtenderStateCollector(Collector):
    """Exports ExtenderGauges from `source` on every scrape."""

    def __init__(self, source: Callable[[], ExtenderGauges]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # unchecked: registration must not call the source before the cache exists

    def collect(self) -> Iterator[Metric]:
        g = self._source()
        gpu_labels = ["node", "gpu", "model"]
        milli = GaugeMetricFamily(
            "gpupack_extender_gpu_allocated_milli",
            "Compute share reserved per GPU (1000 = whole).",
            labels=gpu_labels,
        )
        mem = GaugeMetricFamily(
            "gpupack_extender_gpu_allocated_memory_mib",
            "GPU memory reserved per GPU, MiB.",
            labels=gpu_labels,
        )
        pods = GaugeMetricFamily("gpupack_extender_gpu_pods", "Pods sharing each GPU.", labels=gpu_labels)
        mig = GaugeMetricFamily(
            "gpupack_extender_mig_device_allocated",
            "1 for a MIG device a pod holds, 0 for a free one (gpu: parent GPU, mig: node-wide index).",
            labels=["node", "gpu", "mig", "profile"],
        )
        for x in g.gpus:
            labels = [x.node, str(x.gpu), x.model]
            milli.add_metric(labels, x.milli)
            mem.add_metric(labels, x.memory_mib)
            pods.add_metric(labels, x.pods)
            if x.mig_profile:
                mig.add_metric([x.node, str(x.parent), str(x.gpu), x.mig_profile], int(x.milli > 0))
        yield from (milli, mem, pods, mig)
        yield GaugeMetricFamily(
            "gpupack_extender_packing_efficiency_ratio",
            "Allocated share on GPUs in use divided by the number of GPUs in use.",
            value=g.packing_efficiency,
        )
        yield GaugeMetricFamily(
            "gpupack_extender_fragmented_milli",
            "Free share on partly used GPUs that the typical request cannot use.",
            value=g.fragmented_milli,
        )
        yield GaugeMetricFamily(
            "gpupack_extender_typical_request_milli",
            "The per-GPU request size fragmentation is measured against (most common allocated share).",
            value=g.typical_milli,
        )
        yield GaugeMetricFamily(
            "gpupack_extender_gpus_free", "GPUs with nothing allocated.", value=g.gpus_free
        )
        pending = GaugeMetricFamily(
            "gpupack_extender_pending_pods", "Unbound gpupack pods by reason class.", labels=["reason"]
        )
        for reason in PendingReason:
            pending.add_metric([reason.value], g.pending.get(reason.value, 0))
        yield pending
        yield GaugeMetricFamily(
            "gpupack_extender_leader", "1 on the replica holding the lease.", value=int(g.leader)
        )


# --- agent ---

import enum as _agent_enum  # noqa: E402  (imported here so each section stays self-contained)


class AgentWrite(_agent_enum.StrEnum):
    """Kubernetes API writes the node agent makes."""

    NODE_STATUS = "node_status"  # extended resources in node status (re-asserted every heartbeat)
    NODE_LABELS = "node_labels"
    NODE_CAPACITY = "node_capacity"  # annotation that makes kube-scheduler retry pods the extender refused
    CREATE = "create"  # the GPUNode object
    SPEC = "spec"
    STATUS = "status"
    EVENT = "event"  # a verification violation on a pod
    EVICTION = "eviction"


class AgentWriteResult(_agent_enum.StrEnum):
    OK = "ok"
    CONFLICT = "conflict"  # GPUNode already existed at create (agent restart): patched instead
    ERROR = "error"


class AgentViolation(_agent_enum.StrEnum):
    WRONG_GPU = "wrong_gpu"
    OVER_MEMORY = "over_memory"
    WRONG_CONTAINER = "wrong_container"
    NO_ALLOCATION = "no_allocation"


# NVML return code names the agent counts (agent.nvml.base.NvmlCode; a unit test keeps them equal).
AGENT_NVML_CODES = (
    "NVML_ERROR_UNINITIALIZED", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_CORRUPTED_INFOROM",
    "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED", "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_NO_DATA", "NVML_ERROR_UNKNOWN", "NVML_ERROR_OTHER",
)  # fmt: skip

# Per-GPU gauges carry the NVML index and UUID (bounded by the node's GPUs); Prometheus adds the node.
AGENT_GPU_MEMORY_USED_MIB = Gauge(
    "gpupack_agent_gpu_memory_used_mib", "GPU memory in use, by NVML, whoever uses it.", ["gpu", "uuid"]
)
AGENT_GPU_MEMORY_TOTAL_MIB = Gauge("gpupack_agent_gpu_memory_total_mib", "GPU memory size.", ["gpu", "uuid"])
AGENT_GPU_UTILIZATION_RATIO = Gauge(
    "gpupack_agent_gpu_utilization_ratio", "Share of time a kernel ran (NVML sample period).", ["gpu", "uuid"]
)
AGENT_GPU_HEALTHY = Gauge("gpupack_agent_gpu_healthy", "1 if the GPU is healthy, else 0.", ["gpu", "uuid"])
AGENT_GPU_PROCESSES = Gauge(
    "gpupack_agent_gpu_processes",
    "Compute processes on the GPU, by owner (pod or foreign).",
    ["gpu", "uuid", "owner"],
)
# Per-pod gauges: pods on this node only, removed when the pod's processes go.
AGENT_POD_MEMORY_USED_MIB = Gauge(
    "gpupack_agent_pod_memory_used_mib",
    "GPU memory used by a gpupack pod's processes.",
    ["namespace", "pod", "gpu"],
)
AGENT_POD_MEMORY_LIMIT_MIB = Gauge(
    "gpupack_agent_pod_memory_limit_mib",
    "The pod's allocated memory-limit-mib on that GPU.",
    ["namespace", "pod", "gpu"],
)
AGENT_HEARTBEAT_AGE_SECONDS = Gauge(
    "gpupack_agent_heartbeat_age_seconds",
    "Seconds since the GPUNode status was last written (computed at scrape).",
)
AGENT_MPS_UP = Gauge("gpupack_agent_mps_up", "1 while the MPS control daemon answers, else 0.")
AGENT_NVML_ERRORS = Counter(
    "gpupack_agent_nvml_errors_total", "NVML calls that failed, by return code.", ["code"]
)
for _code in AGENT_NVML_CODES:
    AGENT_NVML_ERRORS.labels(_code)
AGENT_WRITES = Counter(
    "gpupack_agent_kube_writes_total",
    "Kubernetes API writes by the agent, by kind and result.",
    ["kind", "result"],
)
for _kind in AgentWrite:
    for _res in AgentWriteResult:
        AGENT_WRITES.labels(_kind.value, _res.value)
AGENT_VIOLATIONS = Counter(
    "gpupack_agent_violations_total", "Allocation violations found (once per pod, kind and GPU).", ["kind"]
)
for _v in AgentViolation:
    AGENT_VIOLATIONS.labels(_v.value)
