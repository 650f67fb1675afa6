"""The extender's wiring: create_app(settings, runtime) and the uvicorn entry point."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException

from app import log, wire
from app.kube.client import Kube
from app.metrics import ExtenderStateCollector
from extender.config import Settings
from extender.routes import ops, scheduling, state
from extender.runtime import KubeRuntime, Runtime, gauges_of

LOG = log.get("gpupack.extender")


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """The ASGI app. Without `runtime`, one is built from `settings` (API access, informers, lease)."""
    errors = settings.validate()
    if errors:
        raise ValueError("invalid extender settings: " + "; ".join(errors))
    rt: Runtime = runtime if runtime is not None else KubeRuntime(Kube.connect(settings.kubeconfig), settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if isinstance(rt, KubeRuntime):
            rt.start()
        LOG.info("extender started", extra={"policy": settings.policy, "identity": settings.identity})
        try:
            yield
        finally:
            if isinstance(rt, KubeRuntime):
                rt.stop()

    # No /docs, /redoc, /openapi.json: the API is kube-scheduler's wire format, not for browsing.
    app = FastAPI(
        title="gpupack extender", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.runtime = rt
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExtenderStateCollector(lambda: gauges_of(rt)))
    app.state.metrics_registry = registry
    for router in (scheduling.router, ops.router, state.router):
        app.include_router(router)
    app.add_exception_handler(RequestValidationError, _malformed)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    return app


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """FastAPI answers a body it cannot decode (not UTF-8) with a bare 400; say which field: the body."""
    if exc.status_code == 400:
        return JSONResponse(wire.unreadable(str(exc.detail)), status_code=400)
    return await http_exception_handler(request, exc)


async def _malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that does not fit the extender wire format: 422 naming each bad field, never a 500."""
    answer = wire.body(exc.errors())
    LOG.warning("malformed request", extra={"path": request.url.path, "problems": answer["detail"][:5]})
    return JSONResponse(answer, status_code=422)


def serve(settings: Settings) -> None:
    import uvicorn

    log.setup(settings.log_level)
    app = create_app(settings)
    # One worker: the assume cache and the bind lock are per process.
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
