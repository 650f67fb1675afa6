"""POST /filter, /prioritize, /bind: translate the wire format to the pure core and back.

Filter and prioritize sit in kube-scheduler's path for every GPU pod, so their handlers are lean:
`async def` taking the request itself (no dependency resolution per call), the answer encoded once
(filter's by its schema's `model_dump_json`, prioritize's list by `json.dumps`), with no response-model
validation. A malformed body is still FastAPI's: the body parameter is validated against the schema
and answered 422 naming the field.

A warm call (the pod's shape is ranked already) is answered on the event loop: about a millisecond of
CPU, where the hop to the thread pool cost 0.15-0.2 ms more per call and a thread wake-up on a busy
machine. A call that ranks a new shape judges every node (up to hundreds of milliseconds at 5 000
nodes) and runs in the thread pool, so the loop keeps answering the ops port's probes meanwhile; so does
a call that would wait for it, or for an informer applying a relist to the cache.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from app.core.model import Demand
from app.core.request import PodDemand
from extender import schemas, verbs
from extender.deps import BinderDep, PendingDep, ReadyDep
from extender.metrics import EXTENDER_BINDS, EXTENDER_REQUEST_SECONDS, BindOutcome, ExtenderVerb
from extender.readings import Reading, Readings
from extender.runtime import Runtime

router = APIRouter(tags=["scheduling"])


# A replica that is not Ready (a standby, or a leader whose view is not live) asks kube-scheduler to drop
# the connection: the scheduler keeps extender connections alive, and a Service only routes new ones, so
# without this it would keep asking the standby after a failover instead of reaching the new leader.
CLOSE = {"Connection": "close"}
JSON = "application/json"


def _uid(args: schemas.ExtenderArgs) -> str:
    meta = args.Pod.metadata
    return meta.uid if meta is not None else ""


def _json(answer: BaseModel, headers: dict[str, str] | None = None) -> Response:
    return Response(answer.model_dump_json(), media_type=JSON, headers=headers)


def _cold(rt: Runtime, demand: PodDemand) -> bool:
    """Whether answering `demand` may take long (a new shape judges every node; or it would wait for
    another request's, or for a relist): worth the thread pool, so the event loop is not held."""
    return isinstance(demand, Demand) and not rt.rankings.quick(demand)


def _reading(req: Request, args: schemas.ExtenderArgs) -> Reading:
    """The pod of the call, read once per pod version (see extender.readings)."""
    readings: Readings = req.app.state.pod_readings
    return readings.of(args.pod())


def filter_answer(
    rt: Runtime, args: schemas.ExtenderArgs, pod: Reading
) -> tuple[schemas.ExtenderFilterResult, bool]:
    """The filter result, and whether the connection should close (a replica that is not Ready)."""
    ready, why = rt.ready()
    if not ready:
        return schemas.ExtenderFilterResult(Error=f"gpupack extender not ready: {why}"), True
    names = args.node_names()
    if pod.unmanaged is not None:
        # No node can fix this: the pod must be re-created through the webhook.
        unresolvable = dict.fromkeys(names, pod.unmanaged)
        return schemas.ExtenderFilterResult(NodeNames=[], FailedAndUnresolvableNodes=unresolvable), False
    uid = _uid(args)
    demand = pod.demand
    if isinstance(demand, Demand):
        with rt.rankings.standings(demand, exclude_uid=uid) as standings:
            out = verbs.filter_nodes(names, standings, rt.decide_in_filter)
    else:
        out = verbs.refuse_invalid(names, demand)
    if out.refusal is not None:
        rt.pending.note(uid, out.refusal)
    else:
        rt.pending.clear(uid)
    result = schemas.ExtenderFilterResult(
        NodeNames=out.passed, FailedNodes=out.failed, FailedAndUnresolvableNodes=out.unresolvable
    )
    return result, False


def prioritize_answer(rt: Runtime, args: schemas.ExtenderArgs, demand: PodDemand) -> list[tuple[str, int]]:
    """(node, 0..10) for each node of the request, in its order."""
    ready, why = rt.ready()
    if not ready:
        # The scheduler ignores prioritize errors, so a non-200 just means "no opinion".
        raise HTTPException(503, f"gpupack extender not ready: {why}", headers=CLOSE)
    names = args.node_names()
    if isinstance(demand, Demand):
        with rt.rankings.standings(demand, exclude_uid=_uid(args)) as standings:
            scores = verbs.prioritize(names, standings)
    else:
        scores = [(n, 0) for n in names]
    return scores


def _priorities(scores: list[tuple[str, int]]) -> Response:
    """A HostPriorityList. Encoded directly: a pydantic model per node cost twice the time at 5 000 nodes
    (without decide-in-filter, prioritize gets every fitting node)."""
    body = json.dumps([{"Host": n, "Score": s} for n, s in scores], separators=(",", ":"))
    return Response(body, media_type=JSON)


@router.post("/filter")
async def filter_(args: schemas.ExtenderArgs, req: Request) -> Response:
    t0 = time.perf_counter()
    try:
        rt: Runtime = req.app.state.runtime
        pod = _reading(req, args)
        if _cold(rt, pod.demand):
            result, close = await run_in_threadpool(filter_answer, rt, args, pod)
        else:
            result, close = filter_answer(rt, args, pod)
        return _json(result, CLOSE if close else None)
    finally:
        EXTENDER_REQUEST_SECONDS.labels(ExtenderVerb.FILTER.value).observe(time.perf_counter() - t0)


@router.post("/prioritize")
async def prioritize(args: schemas.ExtenderArgs, req: Request) -> Response:
    t0 = time.perf_counter()
    try:
        rt: Runtime = req.app.state.runtime
        readings: Readings = req.app.state.pod_readings
        demand = readings.demand(args.pod())
        if _cold(rt, demand):
            return _priorities(await run_in_threadpool(prioritize_answer, rt, args, demand))
        return _priorities(prioritize_answer(rt, args, demand))
    finally:
        EXTENDER_REQUEST_SECONDS.labels(ExtenderVerb.PRIORITIZE.value).observe(time.perf_counter() - t0)


@router.post("/bind")
def bind(
    args: schemas.ExtenderBindingArgs,
    binder: BinderDep,
    ready: ReadyDep,
    pending: PendingDep,
    *,
    response: Response,
) -> schemas.ExtenderBindingResult:
    t0 = time.perf_counter()
    try:
        if not ready[0]:
            EXTENDER_BINDS.labels(BindOutcome.ERROR.value).inc()
            response.headers.update(CLOSE)
            return schemas.ExtenderBindingResult(Error=f"gpupack extender not ready: {ready[1]}")
        result = binder.bind(args.PodNamespace, args.PodName, args.PodUID, args.Node)
        if result.outcome is BindOutcome.BOUND:
            pending.clear(args.PodUID)
        EXTENDER_BINDS.labels(result.outcome.value).inc()
        return schemas.ExtenderBindingResult(Error=result.error)
    finally:
        EXTENDER_REQUEST_SECONDS.labels(ExtenderVerb.BIND.value).observe(time.perf_counter() - t0)
