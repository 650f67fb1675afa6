"""The webhook's FastAPI app: POST /mutate and /mutate/pod-security/<level> (AdmissionReview v1), /healthz,
/readyz, /metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from app import log, wire
from webhook import metrics as webhook_metrics
from webhook import mutate, podsecurity
from webhook.metrics import WEBHOOK_REVIEW_SECONDS, WEBHOOK_REVIEWS, WebhookOutcome
from webhook.schemas import AdmissionReview
from webhook.settings import Settings

_log = log.get("gpupack.webhook")


def create_app(settings: Settings, ready: Callable[[], bool] | None = None) -> FastAPI:
    """The app; `ready` (default: always) decides /readyz."""
    errors = settings.validate()
    if errors:
        raise ValueError("invalid webhook settings: " + "; ".join(map(str, errors)))
    app = FastAPI(title="gpupack admission webhook", docs_url=None, redoc_url=None)
    registry = webhook_metrics.registry()
    app.state.metrics_registry = registry

    @app.post(
        "/mutate",
        summary="Mutate a pod that asks for a GPU share (AdmissionReview admission.k8s.io/v1)",
        response_class=Response,
        responses={200: {"content": {"application/json": {}}}},
    )
    async def mutate_route(review: AdmissionReview) -> Response:
        return _review(review, None)

    def _review(review: AdmissionReview, pod_security: str | None) -> Response:
        # Called on the loop: the work is a few hundred microseconds of pure CPU, cheaper than a thread hop.
        start = time.perf_counter()
        body = review.model_dump(by_alias=True)
        try:
            decision = mutate.decide(body, settings, pod_security)
        except Exception:  # a bug in our code: deny with a pointer to the log (failurePolicy is Fail anyway)
            _log.exception("review failed", extra={"uid": review.request.uid})
            decision = _internal_error(review.request.uid)
        _record(review, decision, start)
        return _json_response(decision.response)

    @app.post(
        "/mutate/pod-security/{level}",
        summary="/mutate for a namespace that enforces Pod Security `level` (baseline or restricted)",
        response_class=Response,
        responses={200: {"content": {"application/json": {}}}},
    )
    async def mutate_pod_security_route(level: str, review: AdmissionReview) -> Response:
        if level not in podsecurity.LEVELS_WITHOUT_HOSTPATH:
            rule = "must be one of " + ", ".join(podsecurity.LEVELS_WITHOUT_HOSTPATH)
            return _json_response({"error": f"level={level!r}: {rule}"}, 404)
        return _review(review, level)

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness")
    async def readyz() -> Response:
        ok = ready() if ready is not None else True
        return _json_response({"status": "ok" if ok else "not ready"}, 200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_exception_handler(RequestValidationError, _malformed)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    return app


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """FastAPI answers a body it cannot decode (not UTF-8) with a bare 400; say which field: the body."""
    if exc.status_code == 400:
        WEBHOOK_REVIEWS.labels(WebhookOutcome.ERROR.value).inc()
        return _json_response(wire.unreadable(str(exc.detail)), 400)
    return await http_exception_handler(request, exc)


async def _malformed(request: Request, exc: RequestValidationError) -> Response:
    """A body that is not an AdmissionReview v1 (or not JSON): 422 naming the fields, counted as an error."""
    WEBHOOK_REVIEWS.labels(WebhookOutcome.ERROR.value).inc()
    answer = wire.body(exc.errors())
    _log.warning(
        "malformed review",
        extra={"path": request.url.path, "outcome": "error", "problems": answer["detail"][:5]},
    )
    return _json_response(answer, 422)


def _internal_error(uid: str) -> mutate.Decision:
    message = f"gpupack webhook internal error (see the webhook log for uid {uid})"
    status = {"status": "Failure", "code": 500, "reason": "InternalError", "message": message}
    response = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": False, "status": status},
    }
    return mutate.Decision(WebhookOutcome.ERROR, response, (message,))


def _record(review: AdmissionReview, decision: mutate.Decision, start: float) -> None:
    elapsed = time.perf_counter() - start
    WEBHOOK_REVIEWS.labels(decision.outcome.value).inc()
    WEBHOOK_REVIEW_SECONDS.observe(elapsed)
    req = review.request
    meta = (req.object or {}).get("metadata")
    if not isinstance(meta, dict):  # only a Pod's shape is validated; other kinds may carry anything
        meta = {}
    _log.info(
        "review",
        extra={
            "uid": req.uid,
            "namespace": req.namespace,
            "pod": req.name or meta.get("name") or meta.get("generateName", ""),
            "operation": req.operation,
            "dry_run": bool(req.dry_run),
            "outcome": decision.outcome.value,
            "ops": decision.ops,
            "messages": list(decision.messages),
            "duration_ms": round(elapsed * 1000, 3),
        },
    )


def _json_response(content: Any, status_code: int = 200) -> Response:
    body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status_code=status_code, media_type="application/json")
