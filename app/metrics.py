"""Every gpupack_* Prometheus metric, defined once.

Naming: gpupack_<component>_<noun>_<unit|total> (https://prometheus.io/docs/practices/naming/).
Rules: outcome labels are Enums whose every value is created at import time, so failure series
exist at zero before the first failure; counters and histograms never carry pod names or UUIDs;
node/GPU labels appear only on gauges (bounded by cluster size), and cluster-state gauges are
computed at scrape time by a custom collector, not inside request handlers.
Each component edits only its own section below.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram  # noqa: F401  (used by the sections below)

# Latency buckets in seconds, sized for sub-millisecond to tens-of-milliseconds handlers; the
# scheduler's extender timeout (5 s) is the last meaningful edge.
FAST_HANDLER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# --- webhook ---

# --- extender ---

# --- agent ---
