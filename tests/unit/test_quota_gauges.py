"""The extender's quota gauges: ResourceQuotas from an informer, exported as used and hard per namespace."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from app.kube.quotas import QuotaStore
from extender import metrics

MILLI = "requests.gpupack.io/quota-gpu-milli"


def rq(namespace: str, name: str, used: str, hard: str = "2k") -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"hard": {MILLI: hard}},
        "status": {"hard": {MILLI: hard, "pods": "10"}, "used": {MILLI: used, "pods": "2"}},
    }


def test_store_follows_the_informer() -> None:
    store = QuotaStore()
    store.replace([rq("a", "gpu", "500"), rq("b", "gpu", "0")])
    store.upsert(rq("a", "gpu", "1500"))  # the quota controller recounted
    store.delete(rq("b", "gpu", "0"))
    store.upsert(rq("c", "team", "1k", hard="1k"))
    assert [(u.namespace, u.quota, int(u.used), int(u.hard)) for u in store.uses()] == [
        ("a", "gpu", 1500, 2000),
        ("c", "team", 1000, 1000),
    ]
    store.replace([])
    assert store.uses() == []


def test_collector_exports_used_and_hard_per_namespace_quota_and_resource() -> None:
    store = QuotaStore()
    store.replace([rq("team-a", "gpu", "1500")])
    registry = metrics.registry(lambda: metrics.ExtenderGauges(quotas=tuple(store.uses())))
    text = generate_latest(registry).decode()
    labels = f'namespace="team-a",quota="gpu",resource="{MILLI}"'
    assert f"gpupack_extender_namespace_quota_used{{{labels}}} 1500.0" in text
    assert f"gpupack_extender_namespace_quota_hard{{{labels}}} 2000.0" in text
    assert 'resource="pods"' not in text  # gpupack resources only
