"""POST /filter, /prioritize, /bind: translate the wire format to the pure core and back."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Response

from app import managed, request
from app.model import Demand
from extender import schemas, verbs
from extender.deps import BinderDep, RankingsDep, ReadyDep, RuntimeDep, StateDep
from extender.metrics import EXTENDER_BINDS, EXTENDER_REQUEST_SECONDS, BindOutcome, ExtenderVerb

router = APIRouter(tags=["scheduling"])


# A replica that is not Ready (a standby, or a leader whose view is not live) asks kube-scheduler to drop
# the connection: the scheduler keeps extender connections alive, and a Service only routes new ones, so
# without this it would keep asking the standby after a failover instead of reaching the new leader.
CLOSE = {"Connection": "close"}


def _uid(args: schemas.ExtenderArgs) -> str:
    meta = args.Pod.metadata
    return meta.uid if meta is not None else ""


# Plain `def`, run in the thread pool: they may wait on the cache lock (an informer applying a relist), and
# the event loop also answers the ops port's probes. Their dependencies are `async def` (no hop each).
@router.post("/filter")
def filter_(
    args: schemas.ExtenderArgs,
    rt: RuntimeDep,
    cache: StateDep,
    rankings: RankingsDep,
    ready: ReadyDep,
    *,
    response: Response,
) -> schemas.ExtenderFilterResult:
    t0 = time.perf_counter()
    try:
        if not ready[0]:
            response.headers.update(CLOSE)
            return schemas.ExtenderFilterResult(Error=f"gpupack extender not ready: {ready[1]}")
        names = args.node_names()
        if (unmanaged := managed.unmanaged_reason(args.pod())) is not None:
            # No node can fix this: the pod must be re-created through the webhook.
            return schemas.ExtenderFilterResult(
                NodeNames=[], FailedAndUnresolvableNodes=dict.fromkeys(names, unmanaged)
            )
        uid = _uid(args)
        demand = request.pod_demand(args.pod())
        if isinstance(demand, Demand):
            with rankings.standings(demand, exclude_uid=uid) as standings:
                out = verbs.filter_nodes(names, standings, rt.decide_in_filter)
        else:
            out = verbs.refuse_invalid(names, demand)
        if out.refusal is not None:
            cache.note_refusal(uid, out.refusal)
        else:
            cache.clear_refusal(uid)
        return schemas.ExtenderFilterResult(
            NodeNames=out.passed, FailedNodes=out.failed, FailedAndUnresolvableNodes=out.unresolvable
        )
    finally:
        EXTENDER_REQUEST_SECONDS.labels(ExtenderVerb.FILTER.value).observe(time.perf_counter() - t0)


@router.post("/prioritize")
def prioritize(
    args: schemas.ExtenderArgs, rankings: RankingsDep, ready: ReadyDep
) -> schemas.HostPriorityList:
    t0 = time.perf_counter()
    try:
        if not ready[0]:
            # The scheduler ignores prioritize errors, so a non-200 just means "no opinion".
            raise HTTPException(503, f"gpupack extender not ready: {ready[1]}", headers=CLOSE)
        names = args.node_names()
        demand = request.pod_demand(args.pod())
        if isinstance(demand, Demand):
            with rankings.standings(demand, exclude_uid=_uid(args)) as standings:
                scores = verbs.prioritize(names, standings)
        else:
            scores = [(n, 0) for n in names]
        return schemas.HostPriorityList([schemas.HostPriority(Host=n, Score=s) for n, s in scores])
    finally:
        EXTENDER_REQUEST_SECONDS.labels(ExtenderVerb.PRIORITIZE.value).observe(time.perf_counter() - t0)


@router.post("/bind")
def bind(
    args: schemas.ExtenderBindingArgs, binder: BinderDep, ready: ReadyDep, *, response: Response
) -> schemas.ExtenderBindingResult:
    t0 = time.perf_counter()
    try:
        if not ready[0]:
            EXTENDER_BINDS.labels(BindOutcome.ERROR.value).inc()
            response.headers.update(CLOSE)
            return schemas.ExtenderBindingResult(Error=f"gpupack extender not ready: {ready[1]}")
        result = binder.bind(args.PodNamespace, args.PodName, args.PodUID, args.Node)
        EXTENDER_BINDS.labels(result.outcome.value).inc()
        return schemas.ExtenderBindingResult(Error=result.error)
    finally:
        EXTENDER_REQUEST_SECONDS.labels(ExtenderVerb.BIND.value).observe(time.perf_counter() - t0)
