"""FastAPI dependencies: the process runtime and what handlers take from it, as Annotated aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.kube.cache import ClusterCache
from app.placement import Policy
from extender.binder import Binder
from extender.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_cache(rt: RuntimeDep) -> ClusterCache:
    return rt.cache


def get_policy(rt: RuntimeDep) -> Policy:
    return rt.policy


def get_binder(rt: RuntimeDep) -> Binder:
    return rt.binder


def get_readiness(rt: RuntimeDep) -> tuple[bool, str]:
    return rt.ready()


StateDep = Annotated[ClusterCache, Depends(get_cache)]
PolicyDep = Annotated[Policy, Depends(get_policy)]
BinderDep = Annotated[Binder, Depends(get_binder)]
ReadyDep = Annotated[tuple[bool, str], Depends(get_readiness)]
