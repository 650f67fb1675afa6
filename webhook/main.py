"""The webhook's FastAPI app: POST /mutate and /mutate/pod-security/<level> (AdmissionReview v1), /healthz,
/readyz, /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pydantic_core
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.core import log, wire
from app.core.quota import Fleet
from app.service.asgi import request_body
from webhook import metrics as webhook_metrics
from webhook import mutate, podsecurity
from webhook.metrics import WEBHOOK_REVIEW_SECONDS, WEBHOOK_REVIEWS, WebhookOutcome
from webhook.schemas import AdmissionReview
from webhook.settings import Settings

_log = log.get("gpupack.webhook")
# Each outcome's counter, looked up once rather than by label on every review.
_REVIEWS_BY_OUTCOME = {outcome: WEBHOOK_REVIEWS.labels(outcome.value) for outcome in WebhookOutcome}


def create_app(
    settings: Settings, ready: Callable[[], bool] | None = None, fleet: Callable[[], Fleet] | None = None
) -> FastAPI:
    """The app; `ready` (default: always) decides /readyz; `fleet` gives the GPUs the cluster has at each
    review (webhook.fleet; default: none known, the settings' fallback memory only)."""
    errors = settings.validate()
    if errors:
        raise ValueError("invalid webhook settings: " + "; ".join(map(str, errors)))
    # The hot path is a bare ASGI endpoint that WebhookApp calls before FastAPI's middleware and router
    # (no dependency solving, the body parsed and validated once); the routes below answer the rest
    # (GET /mutate: 405), and _document() describes it in /openapi.json.
    endpoint = MutateEndpoint(settings, fleet)
    app = WebhookApp(endpoint, title="gpupack admission webhook", docs_url=None, redoc_url=None)
    registry = webhook_metrics.registry()
    app.state.metrics_registry = registry
    app.router.routes += [
        Route("/mutate", endpoint, methods=["POST"]),
        Route("/mutate/pod-security/{level}", endpoint, methods=["POST"]),
    ]
    _document(app)

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

    return app


_POD_SECURITY_PREFIX = "/mutate/pod-security/"


class WebhookApp(FastAPI):
    """The FastAPI app, with every POST to /mutate and /mutate/pod-security/<level> handed straight to
    the mutate endpoint: its middleware stack and router cost more CPU per review than the endpoint's own
    reading of the body. Any other request (another method or path) goes through FastAPI as usual."""

    def __init__(self, mutate_endpoint: MutateEndpoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mutate_endpoint = mutate_endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path == "/mutate":
                await self.mutate_endpoint.serve(receive, send, path, None)
                return
            # As the route "/mutate/pod-security/{level}" matches: one non-empty path segment.
            level = path.removeprefix(_POD_SECURITY_PREFIX)
            if level != path and level and "/" not in level:
                await self.mutate_endpoint.serve(receive, send, path, level)
                return
        await super().__call__(scope, receive, send)


class MutateEndpoint:
    """POST /mutate and /mutate/pod-security/<level> (AdmissionReview v1) as an ASGI app.

    Called on the loop: the work is a few hundred microseconds of pure CPU, cheaper than a thread hop.
    A body that is not an AdmissionReview v1 (or not JSON, or not UTF-8) is answered 422 naming the
    fields and counted as an error; a bug in the mutation denies with a pointer to the log.
    """

    def __init__(self, settings: Settings, fleet: Callable[[], Fleet] | None = None) -> None:
        self._settings = settings
        unknown = Fleet(fallback_memory_mib=settings.quota_gpu_memory_mib)
        self._fleet = fleet or (lambda: unknown)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(receive, send, scope["path"], scope["path_params"].get("level"))

    async def serve(self, receive: Receive, send: Send, path: str, pod_security: str | None) -> None:
        """Answer one request to `path`; `pod_security`: the level its path names, if any."""
        raw = await request_body(receive)
        status, body = self.answer(raw, pod_security, path)
        headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def answer(self, raw: bytes, pod_security: str | None, path: str) -> tuple[int, bytes]:
        """(HTTP status, JSON body) for one request body."""
        if pod_security is not None and pod_security not in podsecurity.LEVELS_WITHOUT_HOSTPATH:
            rule = "must be one of " + ", ".join(podsecurity.LEVELS_WITHOUT_HOSTPATH)
            return 404, _dumps({"error": f"level={pod_security!r}: {rule}"})
        try:
            review = AdmissionReview.model_validate_json(raw)
        except ValidationError as exc:
            return 422, _dumps(_malformed(exc, path))
        start = time.perf_counter()
        try:
            decision = mutate.decide(review, self._settings, pod_security, self._fleet())
        except Exception:  # a bug in our code: deny with a pointer to the log (failurePolicy is Fail anyway)
            _log.exception("review failed", extra={"uid": review.request.uid})
            decision = _internal_error(review.request.uid)
        _record(review, decision, start)
        return 200, _dumps(decision.response)


_JSON_HEADERS = ((b"content-type", b"application/json"),)


def _malformed(exc: ValidationError, path: str) -> dict[str, Any]:
    """The 422 answer naming each field (`body.<field>`, as the other services do); counted as an error."""
    WEBHOOK_REVIEWS.labels(WebhookOutcome.ERROR.value).inc()
    found = exc.errors(include_url=False, include_input=False, include_context=False)
    answer = wire.body({**err, "loc": ("body", *err["loc"])} for err in found)
    _log.warning(
        "malformed review", extra={"path": path, "outcome": "error", "problems": answer["detail"][:5]}
    )
    return answer


def _document(app: FastAPI) -> None:
    """Describe the bare /mutate endpoints in /openapi.json: AdmissionReview in, AdmissionReview out."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        review = AdmissionReview.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(review.pop("$defs", {}), AdmissionReview=review)
        ref = {"$ref": "#/components/schemas/AdmissionReview"}
        operation = {
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
            "responses": {
                "200": {"description": "The AdmissionReview answer", "content": {"application/json": {}}},
                "422": {"description": "Not an AdmissionReview v1: the fields and rules"},
            },
        }
        level = {"name": "level", "in": "path", "required": True, "schema": {"type": "string"}}
        schema["paths"]["/mutate"] = {
            "post": {
                "summary": "Mutate a pod that asks for a GPU share (AdmissionReview admission.k8s.io/v1)",
                "operationId": "mutate",
                **operation,
            }
        }
        schema["paths"]["/mutate/pod-security/{level}"] = {
            "post": {
                "summary": "/mutate for a namespace enforcing Pod Security `level` (baseline or restricted)",
                "operationId": "mutate_pod_security",
                "parameters": [level],
                **operation,
            }
        }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


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
    _REVIEWS_BY_OUTCOME[decision.outcome].inc()
    WEBHOOK_REVIEW_SECONDS.observe(elapsed)
    req = review.request
    meta = (req.object or {}).get("metadata")
    if not isinstance(meta, dict):  # only a Pod's shape is validated; other kinds may carry anything
        meta = {}
    log.info(
        _log,
        "review",
        {
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


def _dumps(content: Any) -> bytes:
    return pydantic_core.to_json(content)  # compact, as json.dumps with (",", ":"), at a fifth of the CPU


def _json_response(content: Any, status_code: int = 200) -> Response:
    return Response(_dumps(content), status_code=status_code, media_type="application/json")
