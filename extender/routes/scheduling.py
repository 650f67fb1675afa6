"""POST /filter, /prioritize, /bind: translate the wire format to the pure core and back.

Filter and prioritize sit in kube-scheduler's path for every GPU pod, so they are bare ASGI endpoints
(`VerbEndpoint`) rather than FastAPI routes: the body parsed and validated against the schema in one
step, no dependency resolution and no FastAPI request handling per call (about a fifth of a warm call's
CPU at 5 000 nodes), the answer encoded once (filter's by its schema's `model_dump_json`, prioritize's
list by `json.dumps`). A malformed body is answered 422 naming the field, as FastAPI's routes are.

A warm call (the pod's shape is ranked already) is answered on the event loop: about a millisecond of
CPU, where the hop to the thread pool cost 0.15-0.2 ms more per call and a thread wake-up on a busy
machine. A call that ranks a new shape judges every node (up to hundreds of milliseconds at 5 000
nodes) and runs in the thread pool, so the loop keeps answering the ops port's probes meanwhile; so does
a call that would wait for it, or for an informer applying a relist to the cache.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec
from fastapi import APIRouter, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.core import log, wire
from app.core.model import Demand
from app.core.objects import read_json
from app.core.request import PodDemand
from app.service.asgi import request_body
from extender import schemas, verbs
from extender.deps import BinderDep, PendingDep, ReadyDep
from extender.metrics import EXTENDER_BINDS, EXTENDER_REQUEST_SECONDS, BindOutcome, ExtenderVerb
from extender.readings import Reading, Readings
from extender.runtime import Runtime

LOG = log.get("gpupack.extender")
router = APIRouter(tags=["scheduling"])


# A replica that is not Ready (a standby, or a leader whose view is not live) asks kube-scheduler to drop
# the connection: the scheduler keeps extender connections alive, and a Service only routes new ones, so
# without this it would keep asking the standby after a failover instead of reaching the new leader.
CLOSE = {"Connection": "close"}


class NotReadyError(Exception):
    """This replica answers no prioritize now (the reason is the message)."""


def _uid(args: schemas.ExtenderArgs) -> str:
    meta = args.Pod.metadata
    return meta.uid if meta is not None else ""


def _cold(rt: Runtime, demand: PodDemand) -> bool:
    """Whether answering `demand` may take long (a new shape judges every node; or it would wait for
    another request's, or for a relist): worth the thread pool, so the event loop is not held."""
    return isinstance(demand, Demand) and not rt.rankings.quick(demand)


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
        raise NotReadyError(why)
    names = args.node_names()
    if isinstance(demand, Demand):
        with rt.rankings.standings(demand, exclude_uid=_uid(args)) as standings:
            scores = verbs.prioritize(names, standings)
    else:
        scores = [(n, 0) for n in names]
    return scores


def _priorities(scores: list[tuple[str, int]]) -> bytes:
    """A HostPriorityList. Encoded directly: a pydantic model per node cost twice the time at 5 000 nodes
    (without decide-in-filter, prioritize gets every fitting node)."""
    return _dumps([{"Host": n, "Score": s} for n, s in scores])


class VerbEndpoint:
    """POST /filter or /prioritize as a bare ASGI app: the body parsed and validated once (`_parse`), no
    dependency solving, no FastAPI request handling.

    A body that is not the extender wire format (or not JSON) is answered 422 naming each field, as the
    other routes are (`extender.main._malformed`).
    """

    def __init__(self, verb: ExtenderVerb) -> None:
        self.verb = verb
        self._seconds = EXTENDER_REQUEST_SECONDS.labels(verb.value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(scope["app"].state, receive, send, scope["path"])

    async def serve(self, state: State, receive: Receive, send: Send, path: str) -> None:
        """Answer one request to `path` with the app state `state` (its runtime and pod readings)."""
        t0 = time.perf_counter()
        try:
            raw = await request_body(receive)
            status, body, headers = await self.answer(state, raw, path)
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [*headers, (b"content-type", b"application/json"), _length(body)],
                }
            )
            await send({"type": "http.response.body", "body": body})
        finally:
            self._seconds.observe(time.perf_counter() - t0)

    async def answer(self, state: State, raw: bytes, path: str) -> tuple[int, bytes, list[_Header]]:
        """(HTTP status, JSON body, headers) for one request body."""
        args = _parse(raw)
        if not isinstance(args, schemas.ExtenderArgs):
            status, answer = args
            LOG.warning("malformed request", extra={"path": path, "problems": answer["detail"][:5]})
            return status, _dumps(answer), []
        rt: Runtime = state.runtime
        readings: Readings = state.pod_readings
        if self.verb is ExtenderVerb.FILTER:
            pod = readings.of(args.pod())
            if _cold(rt, pod.demand):
                result, close = await run_in_threadpool(filter_answer, rt, args, pod)
            else:
                result, close = filter_answer(rt, args, pod)
            return 200, result.model_dump_json().encode(), [_CLOSE] if close else []
        demand = readings.demand(args.pod())
        try:
            if _cold(rt, demand):
                scores = await run_in_threadpool(prioritize_answer, rt, args, demand)
            else:
                scores = prioritize_answer(rt, args, demand)
        except NotReadyError as exc:
            # The scheduler ignores prioritize errors, so a non-200 just means "no opinion".
            return 503, _dumps({"detail": f"gpupack extender not ready: {exc}"}), [_CLOSE]
        return 200, _priorities(scores), []


_Header = tuple[bytes, bytes]
_CLOSE: _Header = (b"connection", b"close")


def _length(body: bytes) -> _Header:
    return (b"content-length", str(len(body)).encode())


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class _NamesRequest(msgspec.Struct):
    """A filter or prioritize body as kube-scheduler sends it to a nodeCacheCapable extender: the pod and
    the node names, no node list (null or absent); other fields are ignored, as ExtenderArgs ignores them."""

    Pod: dict[str, Any]
    NodeNames: list[str] | None = None
    Nodes: None = None


_NAMES_REQUEST = msgspec.json.Decoder(_NamesRequest)


def _parse(raw: bytes) -> schemas.ExtenderArgs | tuple[int, dict[str, Any]]:
    """The request, or (status, answer naming each bad field) as FastAPI's routes give them: 422 for a
    body missing, not JSON or not the wire format, 400 for one that cannot be decoded at all.

    The usual body is decoded by msgspec straight into the pod and the list of names (the names are
    most of a body at 5 000 nodes: 0.15 ms of CPU, where reading it to Python and validating it took
    0.27 ms). Any body it refuses, and one with a node list, is read by `_parse_read`: the same request,
    or the same errors, as before.
    """
    try:
        sent = _NAMES_REQUEST.decode(raw)
        return schemas.ExtenderArgs.of_pod_and_names(sent.Pod, sent.NodeNames)
    except (msgspec.MsgspecError, ValidationError):
        return _parse_read(raw)


def _parse_read(raw: bytes) -> schemas.ExtenderArgs | tuple[int, dict[str, Any]]:
    """`_parse` for any body: read as JSON (`read_json`), then validated against the schema."""
    if not raw:
        return 422, wire.body([{"loc": ("body",), "msg": "Field required", "type": "missing"}])
    try:
        data = read_json(raw)
    except json.JSONDecodeError as exc:
        problem = {"loc": ("body", exc.pos), "msg": "JSON decode error", "type": "json_invalid"}
        return 422, wire.body([problem])
    except ValueError:  # not UTF-8 (nor UTF-16/32)
        return 400, wire.unreadable("There was an error parsing the body")
    try:
        return schemas.ExtenderArgs.model_validate(data, from_attributes=True)  # FastAPI's messages
    except ValidationError as exc:
        found = exc.errors(include_url=False, include_input=False, include_context=False)
        return 422, wire.body({**err, "loc": ("body", *err["loc"])} for err in found)


# The verbs kube-scheduler calls for every pod, by path: `extender.main.ExtenderApp` hands a POST to one
# straight to it, before FastAPI's middleware and router; the routes answer the rest (GET /filter: 405).
VERBS = {"/filter": VerbEndpoint(ExtenderVerb.FILTER), "/prioritize": VerbEndpoint(ExtenderVerb.PRIORITIZE)}
VERB_ROUTES = [Route(path, endpoint, methods=["POST"]) for path, endpoint in VERBS.items()]


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
