"""The extender's wiring: create_app(settings, runtime) and the uvicorn entry point."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from app import log
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

    app = FastAPI(title="gpupack extender", lifespan=lifespan)
    app.state.runtime = rt
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExtenderStateCollector(lambda: gauges_of(rt)))
    app.state.metrics_registry = registry
    for router in (scheduling.router, ops.router, state.router):
        app.include_router(router)
    return app


def serve(settings: Settings) -> None:
    import uvicorn

    log.setup(settings.log_level)
    app = create_app(settings)
    # One worker: the assume cache and the bind lock are per process.
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
