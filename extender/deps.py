"""FastAPI dependencies: the process runtime and what handlers take from it, as Annotated aliases.

All `async def`: they only read attributes, and FastAPI runs a plain `def` dependency in its thread
pool, a thread hop per dependency per request (most of a warm filter's time before this).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.core.placement import Policy
from app.kube.cache import ClusterCache
from extender.binder import Binder
from extender.runtime import Runtime
from extender.stats import PendingReasons


async def get_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_cache(rt: RuntimeDep) -> ClusterCache:
    return rt.cache


async def get_policy(rt: RuntimeDep) -> Policy:
    return rt.policy


async def get_binder(rt: RuntimeDep) -> Binder:
    return rt.binder


async def get_pending(rt: RuntimeDep) -> PendingReasons:
    return rt.pending


async def get_readiness(rt: RuntimeDep) -> tuple[bool, str]:
    return rt.ready()


StateDep = Annotated[ClusterCache, Depends(get_cache)]
PolicyDep = Annotated[Policy, Depends(get_policy)]
BinderDep = Annotated[Binder, Depends(get_binder)]
PendingDep = Annotated[PendingReasons, Depends(get_pending)]
ReadyDep = Annotated[tuple[bool, str], Depends(get_readiness)]
