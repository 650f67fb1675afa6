"""Lease leader election: acquire, renew, expire, take over, conflict, release (fake clock, fake app.kube)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping

from app.errors import KubeError
from app.kube.client import JsonDict, Request
from app.kube.lease import LeaderElector, LeaseConfig

PATH = "/apis/coordination.k8s.io/v1/namespaces/sys/leases/l"


class LeaseStore:
    """An apiserver for one Lease: 404 until created, 409 on a stale resourceVersion."""

    def __init__(self) -> None:
        self.obj: JsonDict | None = None
        self.rv = 0
        self.down = False
        self.writes = 0

    def send(self, req: Request) -> JsonDict:
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
