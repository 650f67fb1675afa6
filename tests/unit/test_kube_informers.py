"""The list + watch informer against a scripted fake of app.kube (no client library, no sleeps)."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, TypedDict

import pytest

from app.core.errors import KubeError
from app.kube.calls import JsonDict, Request, read_reply
from app.kube.informers import Informer, InformerConfig, object_key
from extender.config import Settings as ExtenderSettings
from extender.runtime import informer_config


def obj(name: str, rv: str, ns: str = "default") -> JsonDict:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


class FakeKube:
    """Answers list calls from `pages` and watch calls from `streams` (an item may be an exception)."""

    def __init__(self) -> None:
        self.pages: list[JsonDict | Exception] = []
        self.streams: list[list[JsonDict] | Exception] = []
        self.sent: list[Request] = []
        self.watched: list[tuple[str, dict[str, Any], int]] = []

    def send(self, req: Request) -> JsonDict:
        self.sent.append(req)
        page = self.pages.pop(0)
        if isinstance(page, Exception):
            raise page
        reply: JsonDict = read_reply(req, json.dumps(page).encode())  # as the client reads the bytes
        return reply

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]:
        self.watched.append((path, dict(query), timeout_s))
        stream = self.streams.pop(0)
        if isinstance(stream, Exception):
            raise stream
        yield from stream


class Recorder:
    def __init__(self) -> None:
        self.store: dict[str, JsonDict] = {}
        self.replaced = 0

    def listing(self) -> None:
        pass

    def replace(self, objs: list[JsonDict]) -> None:
        self.replaced += 1
        self.store = {object_key(o): o for o in objs}

    def upsert(self, o: JsonDict) -> None:
        self.store[object_key(o)] = o

    def delete(self, o: JsonDict) -> None:
        self.store.pop(object_key(o), None)


def make(kube: FakeKube, now: list[float], sleeps: list[float], **cfg: Any) -> tuple[Informer, Recorder]:
    rec = Recorder()
    inf = Informer(
        kube,
        "/api/v1/pods",
        rec,
        name="pods",
        label_selector="gpupack.io/managed=true",
        config=replace(informer_config(ExtenderSettings()), page_limit=2, **cfg),
        sleep=sleeps.append,
        clock=lambda: now[0],
    )
    return inf, rec


def test_paginated_list_then_watch_resumes_from_last_version() -> None:
    kube = FakeKube()
    kube.pages = [
        {"items": [obj("a", "1"), obj("b", "2")], "metadata": {"continue": "c1", "resourceVersion": "10"}},
        {"items": [obj("c", "3")], "metadata": {"resourceVersion": "10"}},
    ]
    kube.streams = [
        [
            {"type": "ADDED", "object": obj("d", "11")},
            {"type": "MODIFIED", "object": obj("a", "12")},
            {"type": "DELETED", "object": obj("b", "13")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
        ],
        [],
    ]
    now: list[float] = [0.0]
    sleeps: list[float] = []
    inf, rec = make(kube, now, sleeps)
    inf.step()
    assert inf.synced.is_set() and rec.replaced == 1
    assert [r.query for r in kube.sent] == [
        {"labelSelector": "gpupack.io/managed=true", "limit": 2},
        {"labelSelector": "gpupack.io/managed=true", "limit": 2, "continue": "c1"},
    ]
    assert set(rec.store) == {"default/a", "default/b", "default/c"}
    inf.step()
    assert kube.watched[0][1] == {"resourceVersion": "10", "labelSelector": "gpupack.io/managed=true"}
    assert set(rec.store) == {"default/a", "default/c", "default/d"}
    assert rec.store["default/a"]["metadata"]["resourceVersion"] == "12"
    assert inf.resource_version == "20"  # the bookmark moved it on
    inf.step()
    assert kube.watched[1][1]["resourceVersion"] == "20"
    assert sleeps == []


def test_gone_relists_without_backoff() -> None:
    kube = FakeKube()
    kube.pages = [
        {"items": [], "metadata": {"resourceVersion": "5"}},
        {"items": [obj("x", "9")], "metadata": {"resourceVersion": "9"}},
    ]
    kube.streams = [KubeError(410, "Expired", "too old resource version")]
    now: list[float] = [0.0]
    sleeps: list[float] = []
    inf, rec = make(kube, now, sleeps)
    inf.step()
    inf.step()  # watch -> 410
    inf.step()  # relist
    assert rec.replaced == 2 and set(rec.store) == {"default/x"}
    assert inf.resource_version == "9"
    assert sleeps == []


def test_errors_back_off_exponentially_with_a_cap_and_keep_the_version() -> None:
    kube = FakeKube()
    kube.pages = [{"items": [], "metadata": {"resourceVersion": "5"}}]
    down = KubeError(0, "Unreachable", "connection refused")
    kube.streams = [down, down, down, down, []]
    now: list[float] = [0.0]
    sleeps: list[float] = []
    inf, _ = make(kube, now, sleeps, backoff_initial_s=1.0, backoff_max_s=3.0)
    inf.step()
    for _ in range(5):
        inf.step()
    assert sleeps == [1.0, 2.0, 3.0, 3.0]
    assert all(w[1]["resourceVersion"] == "5" for w in kube.watched)
    assert inf.healthy


def test_periodic_resync_relists_and_watch_timeout_stops_at_resync() -> None:
    kube = FakeKube()
    kube.pages = [
        {"items": [], "metadata": {"resourceVersion": "1"}},
        {"items": [], "metadata": {"resourceVersion": "2"}},
    ]
    kube.streams = [[]]
    now: list[float] = [0.0]
    sleeps: list[float] = []
    inf, rec = make(kube, now, sleeps, resync_s=100.0, watch_timeout_s=300)
    inf.step()
    now[0] = 40.0
    inf.step()
    assert kube.watched[0][2] == 60  # the watch ends when the resync is due
    now[0] = 100.0
    inf.step()
    assert rec.replaced == 2


@pytest.mark.parametrize("code", [403, 500])
def test_list_failure_is_not_synced(code: int) -> None:
    kube = FakeKube()
    kube.pages = [KubeError(code, "x", "y")]
    inf, _ = make(kube, [0.0], [])
    inf.step()
    assert not inf.synced.is_set() and not inf.healthy


def test_any_exception_is_retried_with_backoff_and_forces_a_relist() -> None:
    kube = FakeKube()
    kube.pages = [
        {"items": [obj("a", "1")], "metadata": {"resourceVersion": "5"}},
        {"items": [obj("b", "7")], "metadata": {"resourceVersion": "7"}},
    ]
    kube.streams = [RuntimeError("urllib3 ProtocolError leaked")]
    now: list[float] = [0.0]
    sleeps: list[float] = []
    inf, rec = make(kube, now, sleeps, backoff_initial_s=1.0)
    inf.step()
    inf.step()  # the watch raises something that is not a KubeError: no exception escapes
    assert sleeps == [1.0] and not inf.healthy and inf.failures == 1
    assert inf.last_error == "RuntimeError: urllib3 ProtocolError leaked"
    inf.step()  # the view may have missed an event: relist, not resume
    assert rec.replaced == 2 and set(rec.store) == {"default/b"}
    assert inf.healthy and inf.failures == 0 and inf.last_error == ""


def test_a_failing_handler_does_not_kill_the_informer() -> None:
    kube = FakeKube()
    kube.pages = [{"items": [], "metadata": {"resourceVersion": "1"}}] * 2
    kube.streams = [[{"type": "ADDED", "object": obj("a", "2")}]]
    now: list[float] = [0.0]
    sleeps: list[float] = []
    inf, rec = make(kube, now, sleeps)

    def broken(o: JsonDict) -> None:
        raise KeyError("spec")

    rec.upsert = broken  # type: ignore[method-assign]
    inf.step()
    inf.step()
    assert not inf.healthy and inf.last_error == "KeyError: 'spec'"
    inf.step()
    assert rec.replaced == 2 and inf.healthy


def test_run_survives_every_kind_of_failure_until_stopped() -> None:
    kube = FakeKube()
    kube.pages = [{"items": [], "metadata": {"resourceVersion": "1"}}] * 4
    inf, _ = make(kube, [0.0], [])
    kube.streams = [
        KubeError(0, "Unreachable", "connection refused"),
        OSError("reset by peer"),
        ValueError("bad json"),
    ]
    real_watch = kube.watch

    def watch_then_stop(path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300) -> Any:
        if not kube.streams:
            inf.stop()
            return iter([])
        return real_watch(path, query, timeout_s)

    kube.watch = watch_then_stop  # type: ignore[method-assign]
    inf.run()  # returns only because of stop(): three failures did not end it
    assert len(kube.watched) == 3 and inf.lists == 3


def test_liveness_of_the_view_follows_the_last_proof_with_a_bound() -> None:
    kube = FakeKube()
    kube.pages = [{"items": [], "metadata": {"resourceVersion": "1"}}]
    down = KubeError(0, "Timeout", "read timed out")
    kube.streams = [[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}}], down, down, []]
    now: list[float] = [0.0]
    inf, _ = make(kube, now, [], live_within_s=60.0, resync_s=1000.0)
    assert inf.live() == (False, "pods informer has not listed yet")
    inf.step()
    assert inf.live() == (True, "live")
    now[0] = 30.0
    inf.step()  # a bookmark proves the watch live at t=30
    now[0] = 80.0
    inf.step()
    assert inf.live()[0]  # one failure, but only 50 s since the last proof
    now[0] = 91.0
    inf.step()
    assert inf.live() == (False, "pods informer not live for 61s (last error: 0 Timeout: read timed out)")
    inf.step()  # the server ends a quiet watch cleanly: live again
    assert inf.live() == (True, "live")


def test_a_dead_or_stuck_thread_is_reported() -> None:
    now: list[float] = [0.0]
    inf, _ = make(FakeKube(), now, [], stuck_after_s=300.0)
    assert inf.alive() == (True, "not running")
    inf.thread = threading.Thread(target=lambda: None)
    inf.thread.start()
    inf.thread.join()
    inf.synced.set()
    inf.last_live_at = 0.0
    assert inf.alive() == (False, "pods informer thread is dead")
    assert inf.live() == (False, "pods informer thread is dead")
    alive = threading.Event()
    inf.thread = threading.Thread(target=alive.wait)
    inf.thread.start()
    try:
        now[0] = 299.0
        assert inf.alive() == (True, "alive")
        now[0] = 301.0
        assert inf.alive() == (False, "pods informer thread stuck for 301s")
    finally:
        alive.set()
        inf.thread.join()


def test_config_bounds_are_consistent() -> None:
    assert informer_config(ExtenderSettings()).validate() == []  # the extender's defaults
    errors = InformerConfig(
        resync_s=600.0, watch_timeout_s=90, live_within_s=60.0, stuck_after_s=30.0
    ).validate()
    assert errors == [
        "live_within_s=60.0: must exceed watch_timeout_s=90"
        " (a quiet watch proves itself live only when it ends)",
        "stuck_after_s=30.0: must exceed live_within_s=60.0",
    ]


class Named(TypedDict, total=False):
    metadata: Any


def test_a_shape_keeps_only_what_the_handler_needs_of_listed_and_watched_objects() -> None:
    kube = FakeKube()
    kube.pages = [
        {"items": [{**obj("a", "1"), "spec": {"big": "x" * 100}}], "metadata": {"resourceVersion": "5"}}
    ]
    kube.streams = [[{"type": "ADDED", "object": {**obj("b", "6"), "spec": {"big": "y"}}}]]
    rec = Recorder()
    inf = Informer(
        kube,
        "/api/v1/pods",
        rec,
        name="pods",
        config=informer_config(ExtenderSettings()),
        shape=Named,
    )
    inf.step()
    inf.step()
    assert rec.store == {"default/a": obj("a", "1"), "default/b": obj("b", "6")}


def test_the_garbage_collector_waits_while_any_list_runs_and_only_then() -> None:
    """Two informers list at once (as the extender's do at start): the collector is off while either
    reads its pages, on again after the last, and a failed list turns it back on too."""
    kube = FakeKube()
    seen: list[tuple[str, bool]] = []

    class Nested(Recorder):
        def replace(self, objs: list[JsonDict]) -> None:
            seen.append(("outer", gc.isenabled()))
            inner.step()  # a second list runs and ends inside the first
            seen.append(("after inner", gc.isenabled()))
            super().replace(objs)

    sleeps: list[float] = []
    config = informer_config(ExtenderSettings())
    outer = Informer(kube, "/api/v1/pods", Nested(), name="pods", config=config, sleep=sleeps.append)
    inner, _ = make(kube, [0.0], sleeps)
    kube.pages = [{"items": [obj("a", "1")]}, {"items": [obj("b", "2")]}, KubeError(0, "Unreachable", "x")]
    assert gc.isenabled()
    outer.step()
    assert seen == [("outer", False), ("after inner", False)] and gc.isenabled()
    outer.request_relist()
    outer.step()  # the page fails
    assert outer.failures == 1 and sleeps == [0.5] and gc.isenabled()
