"""The extender's Prometheus series (gpupack_extender_*), served only by the extender's /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.core.quota import QuotaUse
from app.service.metrics import FAST_HANDLER_BUCKETS, component_registry, counter, precreate


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
    registry=None,
)
precreate(EXTENDER_REQUEST_SECONDS, ExtenderVerb)
EXTENDER_BINDS = counter("gpupack_extender_binds_total", "Bind calls by outcome.", outcome=BindOutcome)


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
    quotas: tuple[QuotaUse, ...] = ()  # gpupack resources capped by a namespace's ResourceQuota


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
        yield from _quota_families(g.quotas)


def _quota_families(quotas: tuple[QuotaUse, ...]) -> Iterator[Metric]:
    """Use and hard limit of each gpupack resource a ResourceQuota caps, in the resource's own unit.

    Bounded by namespaces x quotas x the few gpupack resources; the unit is in the resource label
    (`...-milli`: 1000 = one GPU; `...-mib`: MiB).
    """
    what = {
        "used": "What a namespace uses of a gpupack resource its ResourceQuota caps (quota status.used).",
        "hard": "The limit a namespace's ResourceQuota sets on a gpupack resource (quota status.hard).",
    }
    used, hard = (
        GaugeMetricFamily(
            f"gpupack_extender_namespace_quota_{k}", text, labels=["namespace", "quota", "resource"]
        )
        for k, text in what.items()
    )
    for q in quotas:
        key = [q.namespace, q.quota, q.resource]
        used.add_metric(key, float(q.used))
        hard.add_metric(key, float(q.hard))
    yield from (used, hard)


def registry(source: Callable[[], ExtenderGauges]) -> CollectorRegistry:
    """A registry of the extender's series (and the process's runtime ones) only; gauges from `source`."""
    return component_registry(EXTENDER_REQUEST_SECONDS, EXTENDER_BINDS, ExtenderStateCollector(source))
