"""Lease leader election: acquire, renew, expire, take over, conflict, release (fake clock, fake app.kube)."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from app.core.errors import KubeError
from app.kube.calls import JsonDict, Request
from app.kube.lease import LeaderElector, LeaseConfig

PATH = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/l"


class LeaseStore:
    """An apiserver for one Lease: 404 until created, 409 on a stale resourceVersion."""

    def __init__(self) -> None:
        self.obj: JsonDict | None = None
        self.rv = 0
        self.down = False
        self.crash: Exception | None = None  # raised as is: not a KubeError
        self.writes = 0
        self.on_send: Callable[[Request], None] = lambda req: None

    def send(self, req: Request) -> JsonDict:
        self.on_send(req)
        if self.crash is not None:
            raise self.crash
        if self.down:
            raise KubeError(0, "Unreachable", "down")
        if req.method == "GET":
            if self.obj is None:
                raise KubeError(404, "NotFound", "no lease")
            return copy.deepcopy(self.obj)
        if req.method == "POST":
            if self.obj is not None:
                raise KubeError(409, "AlreadyExists", "exists")
            return self._store(req.body)
        assert req.method == "PUT" and req.path == PATH
        assert self.obj is not None
        if req.body["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified")
        return self._store(req.body)

    def _store(self, body: JsonDict) -> JsonDict:
        self.rv += 1
        self.writes += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(self.obj)

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]:
        raise AssertionError("leases are not watched")

    @property
    def holder(self) -> str:
        assert self.obj is not None
        return str(self.obj["spec"]["holderIdentity"])


def elector(store: LeaseStore, who: str, now: list[float], events: list[str] | None = None) -> LeaderElector:
    log = events if events is not None else []
    return LeaderElector(
        store,
        LeaseConfig(
            namespace="sys",
            name="l",
            identity=who,
            lease_duration_s=15,
            renew_deadline_s=10,
            retry_period_s=2,
        ),
        wall=lambda: 1_700_000_000 + now[0],
        clock=lambda: now[0],
        on_started=lambda: log.append(f"{who}+"),
        on_stopped=lambda: log.append(f"{who}-"),
    )


def test_first_candidate_creates_and_second_waits_for_expiry() -> None:
    store, now = LeaseStore(), [0.0]
    events: list[str] = []
    a, b = elector(store, "a", now, events), elector(store, "b", now, events)
    assert a.tick() and store.holder == "a"
    assert store.obj is not None and store.obj["spec"]["leaseTransitions"] == 0
    assert not b.tick()
    for t in (2.0, 4.0, 6.0):
        now[0] = t
        assert a.tick()
        assert not b.tick()
    assert events == ["a+"]


def test_takeover_after_leader_stops_renewing() -> None:
    store, now = LeaseStore(), [0.0]
    events: list[str] = []
    a, b = elector(store, "a", now, events), elector(store, "b", now, events)
    a.tick()
    b.tick()  # b first observes the record at t=0
    now[0] = 14.9
    assert not b.tick()  # not yet expired by b's own clock
    assert not a.is_leader  # a has not renewed for more than its renew deadline
    now[0] = 15.0
    assert b.tick() and store.holder == "b"
    assert store.obj is not None and store.obj["spec"]["leaseTransitions"] == 1
    assert not a.tick()  # a sees b holding a fresh lease and stays down
    assert events == ["a+", "b+", "a-"]  # a learns it lost at its next tick


def test_renewal_seen_by_standby_resets_its_expiry_clock() -> None:
    store, now = LeaseStore(), [0.0]
    a, b = elector(store, "a", now), elector(store, "b", now)
    a.tick()
    b.tick()
    now[0] = 10.0
    a.tick()  # renew: a new renewTime
    b.tick()  # b observes the change at t=10
    now[0] = 20.0
    assert not b.tick()  # only 10 s since b saw a change
    now[0] = 25.0
    assert b.tick()


def test_conflicting_write_loses_and_api_outage_steps_down_after_renew_deadline() -> None:
    store, now = LeaseStore(), [0.0]
    events: list[str] = []
    a = elector(store, "a", now, events)
    assert a.tick()
    store.down = True
    now[0] = 9.0
    assert a.tick()  # still inside the renew deadline
    now[0] = 10.0
    assert not a.tick()
    assert events == ["a+", "a-"]


def test_concurrent_update_conflict_does_not_lead() -> None:
    store, now = LeaseStore(), [0.0]
    a = elector(store, "a", now)
    a.tick()
    real_send = store.send

    def racing_send(req: Request) -> JsonDict:
        if req.method == "PUT":
            assert store.obj is not None
            store.obj["metadata"]["resourceVersion"] = "999"  # someone else wrote in between
        return real_send(req)

    b = elector(store, "b", now)
    now[0] = 100.0
    b.tick()  # observes at t=100
    now[0] = 116.0
    store.send = racing_send  # type: ignore[method-assign]
    assert not b.tick()
    assert store.holder == "a"


def test_release_hands_over_without_waiting() -> None:
    store, now = LeaseStore(), [0.0]
    a, b = elector(store, "a", now), elector(store, "b", now)
    a.tick()
    b.tick()
    a.release()
    assert not a.is_leader and store.holder == ""
    now[0] = 1.0
    assert b.tick() and store.holder == "b"


def test_any_exception_is_survived_and_leadership_comes_back() -> None:
    store, now = LeaseStore(), [0.0]
    events: list[str] = []
    a = elector(store, "a", now, events)
    assert a.tick()
    store.crash = ConnectionRefusedError(111, "Connection refused")
    now[0] = 5.0
    assert a.tick() and a.can_write()  # inside the renew deadline
    assert a.last_error == "ConnectionRefusedError: [Errno 111] Connection refused"
    now[0] = 10.0
    assert not a.tick() and not a.can_write()
    store.crash = None
    now[0] = 12.0
    assert a.tick() and a.can_write()  # still the holder: renews and leads again
    assert a.last_error == ""
    assert events == ["a+", "a-", "a+"]


def test_can_write_expires_by_the_clock_without_a_tick() -> None:
    store, now = LeaseStore(), [0.0]
    a = elector(store, "a", now)
    a.tick()
    now[0] = 9.9
    assert a.can_write()
    now[0] = 10.0
    assert not a.can_write()  # the lease thread may be dead or stuck: the clock alone fences


def test_leadership_counts_from_when_the_renewal_was_sent() -> None:
    store, now = LeaseStore(), [0.0]
    a = elector(store, "a", now)

    def slow(req: Request) -> None:
        if req.method == "POST":
            now[0] += 4.0  # the create took 4 s on the wire

    store.on_send = slow
    assert a.tick()
    now[0] = 9.9
    assert a.can_write()
    now[0] = 10.0
    assert not a.can_write()  # 10 s after sending, though only 6 s after the reply


def test_a_failing_callback_does_not_break_the_elector() -> None:
    store, now = LeaseStore(), [0.0]

    def boom() -> None:
        raise RuntimeError("relist failed")

    a = LeaderElector(
        store,
        LeaseConfig(
            namespace="sys",
            name="l",
            identity="a",
            lease_duration_s=15,
            renew_deadline_s=10,
            retry_period_s=2,
        ),
        wall=lambda: 1_700_000_000 + now[0],
        clock=lambda: now[0],
        on_started=boom,
    )
    assert a.tick() and a.can_write()


def test_run_loop_keeps_going_through_an_outage_on_a_real_thread() -> None:
    store = LeaseStore()
    store.crash = OSError("connection reset by peer")
    a = LeaderElector(
        store,
        LeaseConfig(
            namespace="sys",
            name="l",
            identity="a",
            lease_duration_s=2,
            renew_deadline_s=1.0,
            retry_period_s=0.02,
        ),
    )
    a.start()
    try:
        deadline = time.monotonic() + 5
        while a.last_error == "" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a.last_error.startswith("OSError") and not a.is_leader
        assert a.alive() == (True, "alive")
        store.crash = None
        while not a.is_leader and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a.is_leader and store.holder == "a"
    finally:
        a.stop()
        assert a.thread is not None
        a.thread.join(timeout=5)


def test_a_dead_or_stuck_loop_is_reported() -> None:
    store, now = LeaseStore(), [0.0]
    a = elector(store, "a", now)
    assert a.alive() == (True, "not running")
    a.thread = threading.Thread(target=lambda: None)
    a.thread.start()
    a.thread.join()
    assert a.alive() == (False, "lease thread is dead")
    gate = threading.Event()
    a.thread = threading.Thread(target=gate.wait)
    a.thread.start()
    try:
        a.tick()
        now[0] = 121.0
        assert a.alive() == (False, "lease thread stuck for 121s")
    finally:
        gate.set()
        a.thread.join()
