"""The extender's answers pinned by golden files: filter, prioritize and explain over a cluster on file.

Each tests/golden/extender/<case>.input.json holds a cluster as the informers would deliver it (GPUNode
objects and pods, as served), the extender's settings, the wall clock, and one HTTP request as
kube-scheduler (or `kubectl get --raw`) sends it; <case>.output.json is the status and JSON body the
extender answers. `pytest --update-golden` rewrites the outputs (review the diff: it is what the
scheduler and the users' events see).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.placement import registry
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.calls import Request
from extender.binder import Binder
from extender.config import Settings
from extender.main import create_app
from tests.static_runtime import StaticRuntime

GOLDEN = Path(__file__).parents[1] / "golden" / "extender"
CASES = sorted(GOLDEN.glob("*.input.json"))


class NoApi:
    """Filter, prioritize and explain read the cache only; a call to the API would be a bug here."""

    def send(self, req: Request) -> dict[str, Any]:
        raise AssertionError(f"unexpected API call: {req.method} {req.path}")


def answer(case: dict[str, Any]) -> dict[str, Any]:
    """The extender's HTTP answer to the case's request, over the case's cluster at the case's time."""
    now = float(case["now"])
    cache = ClusterCache(AssumeCache(ttl_s=60, timer=lambda: 0.0), wall=lambda: now)
    cache.set_gpunodes(case["gpunodes"])
    for p in case["pods"]:
        cache.upsert_pod(p)
    settings = Settings(
        policy=case["settings"]["policy"], decide_in_filter=case["settings"]["decideInFilter"]
    )
    policy = registry.create(settings.policy)
    runtime = StaticRuntime(
        cache, policy, Binder(NoApi(), cache, policy), decide_in_filter=settings.decide_in_filter
    )
    client = TestClient(create_app(settings, runtime=runtime))
    req = case["request"]
    r = client.request(req["method"], req["path"], json=req.get("body"))
    return {"status": r.status_code, "body": r.json()}


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".input.json") for c in CASES])
def test_golden(case: Path, golden: Callable[[Path, Any], None]) -> None:
    golden(
        case.with_name(case.name.replace(".input.json", ".output.json")), answer(json.loads(case.read_text()))
    )


def test_golden_cases_cover_each_verb_and_outcome() -> None:
    requests = [json.loads(c.read_text())["request"] for c in CASES]
    assert {r["path"].split("?")[0] for r in requests} == {"/filter", "/prioritize", "/explain"}
    outputs = [json.loads(c.with_name(c.name.replace(".input", ".output")).read_text()) for c in CASES]
    assert {o["status"] for o in outputs} == {200, 404, 422}
    filters = [o["body"] for o, r in zip(outputs, requests, strict=True) if r["path"] == "/filter"]
    assert any(f.get("NodeNames") for f in filters)  # a node passes
    assert any(f.get("FailedNodes") for f in filters)  # capacity: preemption could help
    assert any(f.get("FailedAndUnresolvableNodes") for f in filters)  # model, agent, request
