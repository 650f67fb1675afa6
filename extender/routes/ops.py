"""GET /healthz, /readyz, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.deps import ReadyDep, RuntimeDep

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz(rt: RuntimeDep, response: Response) -> dict[str, str]:
    """Liveness: 503 when a worker thread (informer, lease) is dead or stuck, so the replica restarts."""
    ok, reason = rt.alive()
    if not ok:
        response.status_code = 503
        return {"status": "failing", "reason": reason}
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ready: ReadyDep, response: Response) -> dict[str, str]:
    """200 only on the leader with live informers, so a Service sends the scheduler to the leader."""
    ok, reason = ready
    if not ok:
        response.status_code = 503
    return {"status": "ready" if ok else "not ready", "reason": reason}


@router.get("/metrics")
def metrics(request: Request) -> Response:
    # The app's own registry: the extender's series only (several apps in one process, as in tests,
    # each have theirs).
    body = generate_latest(request.app.state.metrics_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
