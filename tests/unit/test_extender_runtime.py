"""KubeRuntime readiness and liveness from its real informers and elector, stepped by hand (fake clock)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Mapping

from app.core.errors import KubeError
from app.kube.calls import JsonDict, Request
from extender.config import Settings
from extender.runtime import KubeRuntime


class Apiserver:
    """Empty pod, Node and GPUNode lists, one Lease; `down` makes every call fail like a dead connection."""

    def __init__(self) -> None:
        self.lease: JsonDict | None = None
        self.down: Exception | None = None

    def send(self, req: Request) -> JsonDict:
        if self.down is not None:
            raise self.down
        if "/leases" in req.path:
            if req.method == "GET":
                if self.lease is None:
                    raise KubeError(404, "NotFound", "no lease")
                return copy.deepcopy(self.lease)
            self.lease = copy.deepcopy(req.body)
            self.lease["metadata"]["resourceVersion"] = "1"
            return copy.deepcopy(self.lease)
        assert req.method == "GET"
        return {"items": [], "metadata": {"resourceVersion": "7"}}

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]:
        if self.down is not None:
            raise self.down
        yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}


def runtime(api: Apiserver, now: list[float]) -> KubeRuntime:
    settings = Settings(lease_namespace="sys", identity="me", watch_timeout_s=45, live_within_s=60.0)
    return KubeRuntime(api, settings, clock=lambda: now[0])


def step_all(rt: KubeRuntime) -> None:
    rt.elector.tick()
    for inf in rt.informers:
        inf._sleep = lambda s: None  # the backoff is the informer tests' business
        inf.step()


def test_ready_needs_the_lease_and_live_views_and_follows_an_outage() -> None:
    api, now = Apiserver(), [0.0]
    rt = runtime(api, now)
    unlisted = "; ".join(f"{n} informer has not listed yet" for n in ("gpunodes", "pods", "nodes"))
    assert rt.ready() == (False, f"not the leader; {unlisted}")
    rt.elector.tick()
    assert rt.ready() == (False, unlisted)
    step_all(rt)
    assert rt.ready() == (True, "ready")
    assert rt.binder.can_write()
    api.down = ConnectionResetError(104, "Connection reset by peer")  # not even a KubeError
    now[0] = 5.0
    step_all(rt)
    assert rt.ready() == (True, "ready")  # one blip inside the renew deadline and the live bound
    now[0] = 11.0
    step_all(rt)
    assert rt.ready() == (False, "not the leader")
    assert not rt.binder.can_write()  # in-flight binds stop writing too
    assert rt.alive() == (True, "alive")  # nothing died: a restart would not help
    api.down = None
    now[0] = 20.0
    step_all(rt)
    assert rt.ready() == (True, "ready")


def test_a_stale_view_makes_the_leader_not_ready() -> None:
    api, now = Apiserver(), [0.0]
    rt = runtime(api, now)
    step_all(rt)
    step_all(rt)
    api.down = KubeError(0, "Timeout", "read timed out")
    real_send = api.send

    def only_leases(req: Request) -> JsonDict:
        if "/leases" in req.path:
            api.down = None
            try:
                return real_send(req)
            finally:
                api.down = KubeError(0, "Timeout", "read timed out")
        return real_send(req)

    api.send = only_leases  # type: ignore[method-assign]
    now[0] = 61.0
    step_all(rt)
    stale = "informer not live for 61s (last error: 0 Timeout: read timed out)"
    assert rt.ready() == (False, "; ".join(f"{n} {stale}" for n in ("gpunodes", "pods", "nodes")))


def test_alive_reports_a_dead_worker_thread() -> None:
    api, now = Apiserver(), [0.0]
    rt = runtime(api, now)
    assert rt.alive() == (True, "alive")
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    rt.informers[1].thread = dead
    assert rt.alive() == (False, "pods informer thread is dead")
    rt.informers[1].thread = None
    rt.elector.thread = dead
    assert rt.alive() == (False, "lease thread is dead")


def test_a_stale_view_pauses_the_scale_up_loop_while_the_lease_holds() -> None:
    """The leader keeps its lease but its watches time out: it plans no scale-up from the old view, and
    plans again once the views are live."""
    api, now = Apiserver(), [0.0]
    settings = Settings(
        lease_namespace="sys",
        identity="me",
        watch_timeout_s=45,
        live_within_s=60.0,
        autoscale_pools=("A100-80GB:8",),
    )
    rt = KubeRuntime(api, settings, clock=lambda: now[0])
    step_all(rt)
    step_all(rt)
    assert rt.autoscaler is not None
    assert rt.autoscaler.tick() is not None  # live: it plans (nothing pending, nothing asked)
    timeout = KubeError(0, "Timeout", "read timed out")
    real_send = api.send

    def only_leases(req: Request) -> JsonDict:
        if "/leases" not in req.path:
            return real_send(req)
        down, api.down = api.down, None
        try:
            return real_send(req)
        finally:
            api.down = down

    api.send = only_leases  # type: ignore[method-assign]
    api.down = timeout
    now[0] = 61.0
    step_all(rt)
    assert rt.elector.can_write()  # still the leader: the lease renews
    assert rt.autoscaler.tick() is None
    api.down = None
    now[0] = 62.0
    step_all(rt)
    assert rt.ready() == (True, "ready")
    assert rt.autoscaler.tick() is not None
