"""The webhook app via TestClient: health, metrics, logs, and malformed bodies answered 4xx (never 5xx)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings

from app.core import names
from webhook import metrics as webhook_metrics
from webhook import mutate
from webhook.main import create_app
from webhook.settings import Settings

METRICS = webhook_metrics.registry()  # the same series the app serves


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings())) as c:
        yield c


def reviews(outcome: str) -> float:
    return METRICS.get_sample_value("gpupack_webhook_reviews_total", {"outcome": outcome}) or 0.0


def review(annotations: dict[str, str] | None = None, uid: str = "uid-7") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "team-a",
            "object": {"metadata": meta, "spec": {"containers": [{"name": "main", "image": "x"}]}},
        },
    }


def test_health_and_ready(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200


def test_not_ready_is_503() -> None:
    with TestClient(create_app(Settings(), ready=lambda: False)) as c:
        assert c.get("/readyz").status_code == 503


def test_metrics_exist_at_zero_before_any_review() -> None:
    text = TestClient(create_app(Settings())).get("/metrics").text
    for outcome in ("mutated", "skipped", "denied", "error"):
        assert f'gpupack_webhook_reviews_total{{outcome="{outcome}"}}' in text
    assert "gpupack_webhook_review_duration_seconds_bucket" in text


@pytest.mark.parametrize(
    ("annotations", "outcome", "allowed"),
    [
        pytest.param({names.GPU_FRACTION: "0.5"}, "mutated", True, id="mutated"),
        pytest.param(None, "skipped", True, id="skipped"),
        pytest.param({names.GPU_FRACTION: "2"}, "denied", False, id="denied"),
    ],
)
def test_mutate_counts_and_answers(
    client: TestClient, annotations: dict[str, str] | None, outcome: str, allowed: bool
) -> None:
    before = reviews(outcome)
    seconds_before = METRICS.get_sample_value("gpupack_webhook_review_duration_seconds_count") or 0.0
    resp = client.post("/mutate", json=review(annotations))
    assert resp.status_code == 200
    body = resp.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "uid-7"
    assert body["response"]["allowed"] is allowed
    assert reviews(outcome) == before + 1
    assert METRICS.get_sample_value("gpupack_webhook_review_duration_seconds_count") == seconds_before + 1


def test_patch_over_http_is_base64_jsonpatch(client: TestClient) -> None:
    response = client.post("/mutate", json=review({names.GPU_FRACTION: "0.5"})).json()["response"]
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/metadata/labels", "value": {names.LABEL_MANAGED: "true"}} in ops


def test_one_structured_log_line_per_review(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpupack.webhook"):
        client.post("/mutate", json=review({names.GPU_FRACTION: "7"}, uid="uid-log"))
    [record] = [r for r in caplog.records if r.getMessage() == "review"]
    fields = record.__dict__
    assert (fields["uid"], fields["namespace"], fields["pod"], fields["outcome"]) == (
        "uid-log",
        "team-a",
        "p",
        "denied",
    )
    assert fields["messages"] == ["gpu-fraction='7': must be a decimal in (0, 1] with at most 2 decimals"]
    assert isinstance(fields["duration_ms"], float)


def _without(key: str) -> dict[str, Any]:
    body = review({names.GPU_FRACTION: "0.5"})
    del body["request"][key]
    return body


def _pod_with(**changes: Any) -> dict[str, Any]:
    body = review({names.GPU_FRACTION: "0.5"})
    body["request"]["object"].update(changes)
    return body


MALFORMED = [
    pytest.param(b"", id="empty-body"),
    pytest.param(b"{", id="truncated-json"),
    pytest.param(b"\xff\xfe", id="not-utf8"),
    pytest.param(b"[]", id="json-list"),
    pytest.param(b"null", id="json-null"),
    pytest.param(b"{}", id="empty-object"),
    pytest.param(
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}, id="v1beta1"
    ),
    pytest.param({**review(), "kind": "Pod"}, id="wrong-kind"),
    pytest.param({k: v for k, v in review().items() if k != "request"}, id="no-request"),
    pytest.param(_without("uid"), id="no-uid"),
    pytest.param({**review(), "request": {**review()["request"], "uid": ""}}, id="empty-uid"),
    pytest.param(_without("kind"), id="no-request-kind"),
    pytest.param({**review(), "request": {**review()["request"], "operation": "PATCH"}}, id="bad-operation"),
    pytest.param(_pod_with(spec={"containers": "main"}), id="containers-not-a-list"),
    pytest.param(_pod_with(spec={}), id="spec-without-containers"),
    pytest.param(_pod_with(spec={"containers": [{"image": "x"}]}), id="container-without-name"),
    pytest.param(
        _pod_with(metadata={"annotations": {names.GPU_FRACTION: 0.5}}), id="annotation-not-a-string"
    ),
    pytest.param(_pod_with(metadata={"labels": ["a"]}), id="labels-not-a-map"),
    pytest.param(
        _pod_with(spec={"containers": [{"name": "m", "env": [{"value": "x"}]}]}),
        id="env-without-name",
    ),
    pytest.param(
        _pod_with(spec={"containers": [{"name": "m"}], "affinity": {"nodeAffinity": []}}),
        id="node-affinity-not-a-map",
    ),
    pytest.param(
        _pod_with(spec={"containers": [{"name": "m", "resources": {"limits": ["x"]}}]}),
        id="limits-not-a-map",
    ),
]


@pytest.mark.parametrize("body", MALFORMED)
def test_malformed_body_is_4xx_and_counted(client: TestClient, body: bytes | dict[str, Any]) -> None:
    before = reviews("error")
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = client.post("/mutate", content=content, headers={"content-type": "application/json"})
    assert 400 <= resp.status_code < 500, resp.text
    assert reviews("error") == before + 1
    assert "detail" in resp.json()


def test_other_kinds_are_skipped_whatever_their_shape(client: TestClient) -> None:
    body = review()
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    body["request"]["object"] = {"metadata": ["not", "a", "map"], "spec": 3}
    resp = client.post("/mutate", json=body)
    assert resp.status_code == 200
    assert resp.json()["response"] == {"uid": "uid-7", "allowed": True}


def test_internal_error_denies_with_500_status_not_http_500(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: Any) -> mutate.Decision:
        raise RuntimeError("bug")

    monkeypatch.setattr(mutate, "decide", boom)
    before = reviews("error")
    resp = client.post("/mutate", json=review({names.GPU_FRACTION: "0.5"}))
    assert resp.status_code == 200
    assert resp.json()["response"]["allowed"] is False
    assert resp.json()["response"]["status"]["code"] == 500
    assert reviews("error") == before + 1


def test_openapi_documents_both_mutate_endpoints_with_the_review_schema(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path in ("/mutate", "/mutate/pod-security/{level}"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/AdmissionReview"}
    # every reference resolves inside the document, so the fuzz below really sends AdmissionReviews
    refs = {ref for ref in json.dumps(doc).split('"') if ref.startswith("#/components/schemas/")}
    assert {ref.rsplit("/", 1)[1] for ref in refs} <= set(schemas)
    assert schemas["AdmissionReview"]["required"] == ["apiVersion", "kind", "request"]


def test_mutate_answers_only_post(client: TestClient) -> None:
    assert client.get("/mutate").status_code == 405
    assert client.put("/mutate/pod-security/baseline", json=review()).status_code == 405


def test_unknown_pod_security_level_is_404_naming_it(client: TestClient) -> None:
    resp = client.post("/mutate/pod-security/privileged", json=review({names.GPU_FRACTION: "0.5"}))
    assert resp.status_code == 404
    assert resp.json() == {"error": "level='privileged': must be one of baseline, restricted"}


def test_malformed_body_names_the_field_under_body(client: TestClient) -> None:
    resp = client.post("/mutate", json=_pod_with(spec={"containers": [{"image": "x"}]}))
    assert resp.status_code == 422
    [problem] = resp.json()["detail"]
    # The whole path of the field as the user sent it, down from the review's `request.object`.
    assert (problem["loc"], problem["type"]) == (
        ["body", "request", "object", "spec", "containers", 0, "name"],
        "missing",
    )


# --- property: whatever schemathesis sends, from the app's own OpenAPI, is never answered 5xx ---

_schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(Settings()))


@_schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_openapi_fuzz_finds_no_5xx(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])


@pytest.mark.parametrize(
    ("path", "status", "location"),
    [
        ("/mutate/", 307, "/mutate"),
        ("/mutate//", 307, "/mutate"),
        ("/mutate/pod-security/", 404, None),
        ("/mutate/pod-security//", 404, None),
        ("/mutate/pod-security/baseline/", 307, "/mutate/pod-security/baseline"),
        ("/mutate/other", 404, None),
    ],
)
def test_paths_near_mutate_are_answered_by_the_router(
    client: TestClient, path: str, status: int, location: str | None
) -> None:
    """Only /mutate and /mutate/pod-security/<one segment> take the fast path; the rest are redirected or
    404 exactly as FastAPI's routes answer them."""
    resp = client.post(path, json=review({names.GPU_FRACTION: "0.5"}), follow_redirects=False)
    assert resp.status_code == status
    assert resp.headers.get("location") == (f"http://testserver{location}" if location else None)


def test_an_encoded_level_is_read_decoded_and_named(client: TestClient) -> None:
    resp = client.post("/mutate/pod-security/base%20line", json=review({names.GPU_FRACTION: "0.5"}))
    assert (resp.status_code, resp.json()) == (
        404,
        {"error": "level='base line': must be one of baseline, restricted"},
    )
