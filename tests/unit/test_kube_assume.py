"""The assume cache: holds expire after the TTL on a pinned clock."""

from __future__ import annotations

from app.core.model import Allocation
from app.kube.assume import AssumeCache


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


def test_a_replaced_hold_expires_by_its_new_time_and_older_holds_by_theirs() -> None:
    now = [0.0]
    cache = AssumeCache(ttl_s=10, timer=lambda: now[0])
    cache.hold("u1", alloc(gpu=0))
    now[0] = 5.0
    cache.hold("u2", alloc(gpu=1))
    now[0] = 8.0
    cache.hold("u1", alloc(gpu=2))  # re-held: its clock starts again, behind u2's
    now[0] = 15.0
    assert cache.items() == {"u1": alloc(gpu=2)}  # u2 (held at 5) expired at 15
    now[0] = 18.0
    assert cache.get("u1") is None and len(cache) == 0


def test_holds_beyond_maxsize_drop_the_oldest() -> None:
    cache = AssumeCache(ttl_s=60, maxsize=2, timer=lambda: 0.0)
    for i in range(3):
        cache.hold(f"u{i}", alloc(gpu=i))
    assert cache.items() == {"u1": alloc(gpu=1), "u2": alloc(gpu=2)}


def test_release_absent_drops_only_holds_older_than_the_list() -> None:
    now = [0.0]
    cache = AssumeCache(ttl_s=60, timer=lambda: now[0])
    cache.hold("gone", alloc(gpu=0))
    cache.hold("kept", alloc(gpu=1))
    now[0] = 2.0
    cache.hold("late", alloc(gpu=2))  # taken after the list started: the list could not show it
    assert cache.release_absent({"kept"}, listed_at=1.0) == ["gone"]
    assert set(cache.items()) == {"kept", "late"}
