"""extender.readings: the pod of a scheduling call is read once per (uid, resourceVersion)."""

from __future__ import annotations

from typing import Any

from app.core import names
from app.core.model import Demand
from extender.readings import Readings


def pod(fraction: str, uid: str = "u1", rv: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "annotations": {names.GPU_FRACTION: fraction},
        "labels": {names.LABEL_MANAGED: "true"},
    }
    if uid:
        meta["uid"] = uid
    if rv:
        meta["resourceVersion"] = rv
    return {"metadata": meta, "spec": {"containers": [{"name": "c"}]}}


def test_one_version_is_read_once_and_a_new_version_again() -> None:
    readings = Readings()
    first = readings.of(pod("0.5"))
    assert first.demand == Demand(count=1, milli=500)
    # The same uid and resourceVersion name the same pod: /prioritize gets /filter's reading.
    assert readings.of(pod("0.5")) is first
    assert readings.of(pod("0.25", rv="2")).demand == Demand(count=1, milli=250)


def test_a_pod_without_uid_or_version_is_read_every_time() -> None:
    readings = Readings()
    assert readings.of(pod("0.5", rv="")).demand == Demand(count=1, milli=500)
    assert readings.of(pod("0.25", rv="")).demand == Demand(count=1, milli=250)
    assert readings.of(pod("0.5", uid="")).demand == Demand(count=1, milli=500)
    assert readings.of(pod("0.25", uid="")).demand == Demand(count=1, milli=250)


def test_the_reading_says_why_an_unmanaged_pod_is_refused() -> None:
    bare = pod("0.5")
    bare["metadata"]["labels"] = {}
    reading = Readings().of(bare)
    assert reading.unmanaged is not None and reading.unmanaged.startswith(
        "not admitted by the gpupack webhook"
    )


def test_the_oldest_reading_goes_first() -> None:
    readings = Readings(limit=2)
    oldest = readings.of(pod("0.5", uid="a"))
    readings.of(pod("0.5", uid="b"))
    readings.of(pod("0.5", uid="c"))
    assert readings.of(pod("0.5", uid="a")) is not oldest  # read again: it had been dropped


def test_prioritize_takes_the_demand_of_filters_reading() -> None:
    readings = Readings()
    first = readings.of(pod("0.5"))
    assert readings.demand(pod("0.5")) is first.demand
    # A version /filter has not read is read for its demand alone, and not kept.
    assert readings.demand(pod("0.25", rv="9")) == Demand(count=1, milli=250)
    assert readings.of(pod("0.5", rv="9")).demand == Demand(count=1, milli=500)
