"""The webhook's Prometheus series (gpupack_webhook_*), served only by the webhook's /metrics."""

from __future__ import annotations

import os
from enum import StrEnum

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from app.service.metrics import FAST_HANDLER_BUCKETS, component_registry, counter


class WebhookOutcome(StrEnum):
    """What one AdmissionReview ended as."""

    MUTATED = "mutated"  # a GPU pod, allowed (with a patch, or none when a reinvocation finds it done)
    SKIPPED = "skipped"  # not ours: no gpu-fraction/gpu-memory annotation, not a pod CREATE
    DENIED = "denied"  # a GPU pod whose annotations break a rule
    ERROR = "error"  # malformed review (4xx) or a webhook bug


class CertReload(StrEnum):
    OK = "ok"
    FAILED = "failed"


WEBHOOK_REVIEWS = counter(
    "gpupack_webhook_reviews_total", "AdmissionReviews answered, by outcome.", outcome=WebhookOutcome
)
# The apiserver's timeout for us is 5 s (timeoutSeconds); a review takes well under a millisecond.
WEBHOOK_REVIEW_SECONDS = Histogram(
    "gpupack_webhook_review_duration_seconds",
    "Time to answer one AdmissionReview, from parsed body to response.",
    buckets=FAST_HANDLER_BUCKETS,
    registry=None,
)
WEBHOOK_CERT_RELOADS = counter(
    "gpupack_webhook_cert_reloads_total",
    "Serving certificate reloads after the files changed, by result.",
    result=CertReload,
)


def count_cert_reload(result: str) -> None:
    """app.service.tls.ReloadingContext's on_reload: one reload of the serving certificate, "ok" or
    "failed"."""
    WEBHOOK_CERT_RELOADS.labels(result).inc()


def registry() -> CollectorRegistry:
    """A registry of the webhook's series (and the process's runtime ones) only.

    With several worker processes (`serve --workers N`, which sets PROMETHEUS_MULTIPROC_DIR before the
    series above are made), every worker writes its series to that directory and this registry serves
    their sum, whichever worker is scraped. The process_*/python_* series are then left out: they would
    describe only the one worker that answered the scrape.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        summed = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(summed, path=directory)  # type: ignore[no-untyped-call]
        return summed
    return component_registry(WEBHOOK_REVIEWS, WEBHOOK_REVIEW_SECONDS, WEBHOOK_CERT_RELOADS)
