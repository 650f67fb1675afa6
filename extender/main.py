"""The extender's wiring: create_app(settings, runtime) and the uvicorn entry point."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio.to_thread
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from app.core import log, wire
from app.kube.client import Kube
from app.service.tls import ReloadingContext
from extender import metrics
from extender.config import Settings
from extender.readings import Readings
from extender.routes import ops, scheduling, state
from extender.runtime import KubeRuntime, Runtime, gauges_of

LOG = log.get("gpupack.extender")
# Verbs that call the API (bind) run in the server's thread pool: this many at once (anyio's default,
# set here so the connection pool below is sized from the same number).
REQUEST_THREADS = 40
# Calls beside them: the informers' watches (GPUNodes, pods, Nodes, ResourceQuotas), the lease, events and
# the autoscaler's placeholders, with room to spare.
BACKGROUND_CALLS = 10
API_CONNECTIONS = REQUEST_THREADS + BACKGROUND_CALLS


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """The ASGI app. Without `runtime`, one is built from `settings` (API access, informers, lease)."""
    errors = settings.validate()
    if errors:
        raise ValueError("invalid extender settings: " + "; ".join(map(str, errors)))
    rt: Runtime = (
        runtime
        if runtime is not None
        else KubeRuntime(Kube.connect(settings.kubeconfig, connections=API_CONNECTIONS), settings)
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = REQUEST_THREADS
        if isinstance(rt, KubeRuntime):
            rt.start()
        LOG.info("extender started", extra={"policy": settings.policy, "identity": settings.identity})
        try:
            yield
        finally:
            if isinstance(rt, KubeRuntime):
                rt.stop()

    # No /docs, /redoc, /openapi.json: the API is kube-scheduler's wire format, not for browsing.
    app = ExtenderApp(
        title="gpupack extender", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.runtime = rt
    app.state.pod_readings = Readings()
    app.state.metrics_registry = metrics.registry(lambda: gauges_of(rt))
    app.router.routes += scheduling.VERB_ROUTES
    for router in (scheduling.router, ops.router, state.router):
        app.include_router(router)
    app.add_exception_handler(RequestValidationError, _malformed)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    return app


class ExtenderApp(FastAPI):
    """The FastAPI app, with every POST to /filter and /prioritize handed straight to its verb endpoint:
    FastAPI's middleware stack and router cost about 0.05 ms of CPU per call, on each of the two calls
    kube-scheduler makes per pod. Any other request (another method or path) goes through FastAPI."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            verb = scheduling.VERBS.get(scope["path"])
            if verb is not None:
                await verb.serve(self.state, receive, send, scope["path"])
                return
        await super().__call__(scope, receive, send)


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


def create_ops_app(app: FastAPI) -> FastAPI:
    """The plain-HTTP app for probes and Prometheus: /healthz, /readyz, /metrics of `app`'s runtime.

    It shares `app`'s runtime and metrics registry. kube-scheduler's endpoints and the read-only state
    (pod names of every namespace) are not on it: they need the client certificate.
    """
    ops_app = FastAPI(title="gpupack extender ops", docs_url=None, redoc_url=None, openapi_url=None)
    ops_app.state.runtime = app.state.runtime
    ops_app.state.metrics_registry = app.state.metrics_registry
    ops_app.include_router(ops.router)
    return ops_app


def serve(settings: Settings) -> None:
    """Both listeners in one process and one event loop: mutual TLS on `port`, plain HTTP on `ops_port`."""
    log.setup(settings.log_level)
    run(*servers(create_app(settings), settings))


def servers(app: FastAPI, settings: Settings) -> tuple[uvicorn.Server, uvicorn.Server]:
    """(main, ops): `app` on `port` behind mutual TLS, its probes and metrics on `ops_port` in plain HTTP."""
    cert, key, client_ca = settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file
    if not (cert and key and client_ca):
        raise ValueError("invalid extender settings: " + "; ".join(map(str, settings.serving_errors())))
    tls = ReloadingContext(cert, key, check_interval=settings.cert_check_interval_s, client_ca=client_ca)
    common: dict[str, Any] = {"host": settings.host, "log_config": None, "access_log": False}
    main = uvicorn.Server(
        uvicorn.Config(
            app, port=settings.port, ssl_context_factory=lambda _config, _default: tls.context, **common
        )
    )
    ops_app = create_ops_app(app)
    return main, _OpsServer(uvicorn.Config(ops_app, port=settings.ops_port, lifespan="off", **common))


def run(main: uvicorn.Server, ops_server: uvicorn.Server) -> None:
    """Serve both until the main server stops (SIGTERM/SIGINT, or `should_exit`); one worker, because
    the assume cache and the bind lock are per process."""

    async def both() -> None:
        ops_task = asyncio.create_task(ops_server.serve())
        try:
            await main.serve()
        finally:
            ops_server.should_exit = True
            await ops_task

    # The loop uvicorn's own `Server.run` would pick: uvloop when installed (a dependency), else asyncio.
    with asyncio.Runner(loop_factory=main.config.get_loop_factory()) as runner:
        runner.run(both())


class _OpsServer(uvicorn.Server):
    """Leaves the signal handlers to the main server (of two servers setting them, only the last stops)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
