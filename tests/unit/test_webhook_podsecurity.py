"""MPS shares and Pod Security: refused with our message where the level forbids the pipe mount."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core import names
from webhook.main import create_app
from webhook.settings import Settings


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings())) as c:
        yield c


def review(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-ps",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "team-b",
            "object": {
                "metadata": {"name": "p", "namespace": "team-b", "annotations": annotations},
                "spec": {"containers": [{"name": "main", "image": "x"}]},
            },
        },
    }


@pytest.mark.parametrize("level", ["baseline", "restricted"])
@pytest.mark.parametrize("isolation", [None, "mps"])
def test_mps_share_refused_where_the_level_forbids_hostpath(
    client: TestClient, level: str, isolation: str | None
) -> None:
    annotations = {names.GPU_FRACTION: "0.5"}
    if isolation is not None:
        annotations[names.ISOLATION] = isolation
    got = client.post(f"/mutate/pod-security/{level}", json=review(annotations)).json()["response"]
    assert got["allowed"] is False
    assert got["status"]["code"] == 422
    message = got["status"]["message"]
    written = isolation or ""
    assert message.startswith(f"{names.ISOLATION}={written!r}: an MPS share")
    assert f"Pod Security level {level!r} enforced in namespace 'team-b' refuses" in message
    assert f"annotate {names.ISOLATION}: 'none'" in message


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_share_without_mps_is_mutated_at_those_levels_with_no_volume(client: TestClient, level: str) -> None:
    annotations = {names.GPU_FRACTION: "0.5", names.ISOLATION: "none"}
    got = client.post(f"/mutate/pod-security/{level}", json=review(annotations)).json()["response"]
    assert got["allowed"] is True and got["patchType"] == "JSONPatch"
    plain = client.post("/mutate", json=review(annotations)).json()["response"]
    assert got["patch"] == plain["patch"]  # the same mutation as anywhere else: no hostPath added


def test_plain_route_still_mutates_an_mps_share(client: TestClient) -> None:
    got = client.post("/mutate", json=review({names.GPU_FRACTION: "0.5"})).json()["response"]
    assert got["allowed"] is True


def test_unknown_level_is_a_404_naming_it(client: TestClient) -> None:
    resp = client.post("/mutate/pod-security/privileged", json=review({names.GPU_FRACTION: "0.5"}))
    assert resp.status_code == 404
    assert resp.json() == {"error": "level='privileged': must be one of baseline, restricted"}
