"""The assume cache: holds expire after the TTL on a pinned clock."""

from __future__ import annotations

from app.kube.assume import AssumeCache
from app.model import Allocation


def alloc(node: str = "n1", gpu: int = 0) -> Allocation:
    return Allocation(node=node, gpu_indexes=(gpu,), gpu_uuids=(), milli=500, memory_mib=100)


def test_hold_expires_after_ttl() -> None:
    now = [100.0]
    cache = AssumeCache(ttl_s=30, timer=lambda: now[0])
    cache.hold("u1", alloc())
    now[0] = 129.9
    assert cache.items() == {"u1": alloc()}
    now[0] = 130.0
    assert cache.items() == {}
    assert len(cache) == 0


def test_release_and_replace() -> None:
    now = [0.0]
    cache = AssumeCache(ttl_s=10, timer=lambda: now[0])
    cache.hold("u1", alloc(gpu=0))
    cache.hold("u1", alloc(gpu=1))  # a re-bind replaces the earlier hold
    assert cache.get("u1") == alloc(gpu=1)
    assert cache.release("u1") == alloc(gpu=1)
    assert cache.release("u1") is None
    assert cache.get("u1") is None
