"""What every component's Prometheus metrics share: the naming rules, latency buckets, one registry each.

Naming: gpupack_<component>_<noun>_<unit|total> (https://prometheus.io/docs/practices/naming/).
Each component defines its own series in its own `metrics` module (webhook.metrics, extender.metrics,
agent.metrics) without registering them globally, and its app serves a registry of only those, so no
process exports another component's series (a webhook reporting `gpupack_agent_mps_up 0` would fire the
MPS alert on every webhook replica).
Rules: outcome labels are Enums whose every value is created at import time, so failure series
exist at zero before the first failure; counters and histograms never carry pod names or UUIDs;
node/GPU labels appear only on gauges (bounded by cluster size), and cluster-state gauges are
computed at scrape time by a custom collector, not inside request handlers.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

# Latency buckets in seconds, sized for sub-millisecond to tens-of-milliseconds handlers; the
# scheduler's extender timeout (5 s) is the last meaningful edge.
FAST_HANDLER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def precreate(metric: MetricWrapperBase, *labels: Iterable[str]) -> None:
    """Create every combination of the given label values now, so each series exists at zero."""
    combos: list[tuple[str, ...]] = [()]
    for values in labels:
        combos = [(*combo, str(v)) for combo in combos for v in values]
    for combo in combos:
        metric.labels(*combo)


def counter(name: str, documentation: str, **labels: Iterable[str]) -> Counter:
    """A counter in no registry yet, every combination of its `labels` values created at zero."""
    metric = Counter(name, documentation, list(labels), registry=None)
    precreate(metric, *labels.values())
    return metric


def gauge(name: str, documentation: str, *labels: str) -> Gauge:
    """A gauge in no registry yet (its component's registry serves it)."""
    return Gauge(name, documentation, labels, registry=None)


def component_registry(*collectors: Collector) -> CollectorRegistry:
    """A registry with the process's runtime series (process_*, python_*) and `collectors`, nothing else."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return registry
